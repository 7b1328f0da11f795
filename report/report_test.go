package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

const golden = "../testdata/nettrace/drops.ntrace"

func build(t testing.TB, data []byte, opts *Options) *Report {
	t.Helper()
	r, err := tracefile.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Build(r, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func readGolden(t *testing.T) []byte {
	data, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// The golden recording: five datagrams to a closed port.
func TestGoldenNoSocket(t *testing.T) {
	rep := build(t, readGolden(t), nil)
	if rep.Incomplete != "" || rep.Drops.Total != 5 {
		t.Fatalf("incomplete %q, %d drops; want complete, 5", rep.Incomplete, rep.Drops.Total)
	}
	f := rep.Findings[0]
	if f.Rule != "no_socket" || f.Count != 5 || !strings.Contains(f.Title, "udp 198.18.0.2:9") || !strings.Contains(f.Fix, "198.18.0.2:9") {
		t.Fatalf("top finding %+v", f)
	}
	if !slicesContains(f.Evidence, "snmp Udp.NoPorts +5") || !slicesContains(f.Evidence, "__udp4_lib_rcv+0x") {
		t.Errorf("evidence %q lacks the counter or the location", f.Evidence)
	}
	for _, g := range rep.Findings[1:] {
		if g.Severity == "error" {
			t.Errorf("second error finding %+v", g)
		}
	}
	if rep.Drops.ByDevice[0].Key != "vmxb" || rep.Drops.ByLocation[0].Reason != "NO_SOCKET" || len(rep.Drops.ByFlow) != 5 {
		t.Errorf("tables: %+v", rep.Drops)
	}
	var noted bool
	for _, iv := range rep.Intervals {
		for _, n := range iv.Notes {
			noted = noted || strings.Contains(n, "NO_SOCKET drops and snmp Udp.NoPorts")
		}
	}
	if !noted {
		t.Errorf("no interval lines NO_SOCKET up with Udp.NoPorts: %+v", rep.Intervals)
	}
}

func slicesContains(list []string, sub string) bool {
	for _, s := range list {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

func TestFilters(t *testing.T) {
	data := readGolden(t)
	mustFlow := func(s string) *FlowFilter {
		f, err := ParseFlow(s)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	for _, c := range []struct {
		name string
		f    Filter
		want uint64
	}{
		{"reason match", Filter{Reasons: ParseReasons("no_socket")}, 5},
		{"reason other", Filter{Reasons: ParseReasons("NETFILTER_DROP")}, 0},
		{"flow match", Filter{Flow: mustFlow("udp 198.18.0.1>*:9")}, 5},
		{"flow other port", Filter{Flow: mustFlow(">:10")}, 0},
		{"dev match", Filter{Dev: "vmxb"}, 5},
		{"dev other", Filter{Dev: "eth0"}, 0},
		{"time before", Filter{From: 0, To: 50 * time.Millisecond}, 0},
		{"time all", Filter{From: 0, To: time.Hour}, 5},
	} {
		rep := build(t, data, &Options{Filter: c.f})
		if rep.Drops.Total != c.want {
			t.Errorf("%s (%s): %d drops, want %d", c.name, rep.Filter, rep.Drops.Total, c.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, s := range []string{"udp", "sctp 1.2.3.4>", "1.2.3>", ">1.2.3.4:99999", "::1>"} {
		if _, err := ParseFlow(s); err == nil {
			t.Errorf("ParseFlow(%q) accepted", s)
		}
	}
	for _, s := range []string{"1", "x,2", "3,1", "-1,"} {
		if _, _, err := ParseTime(s); err == nil {
			t.Errorf("ParseTime(%q) accepted", s)
		}
	}
	if from, to, err := ParseTime("0.5,2s"); err != nil || from != 500*time.Millisecond || to != 2*time.Second {
		t.Errorf("ParseTime(0.5,2s) = %v %v %v", from, to, err)
	}
	if c, err := ParseCPUs("0,2-3"); err != nil || len(c) != 3 || !c[3] {
		t.Errorf("ParseCPUs = %v %v", c, err)
	}
	if _, err := ParseCPUs("a"); err == nil {
		t.Error("ParseCPUs(a) accepted")
	}
}

// A recording cut anywhere gives a report marked incomplete or a clear
// error, never a panic.
func TestTruncated(t *testing.T) {
	data := readGolden(t)
	for n := 16; n < len(data); n += 97 {
		r, err := tracefile.NewReader(bytes.NewReader(data[:n]))
		if err != nil {
			continue
		}
		rep, err := Build(r, nil)
		if err != nil {
			if !errors.Is(err, tracefile.ErrCorrupt) && !errors.Is(err, tracefile.ErrTruncated) {
				t.Fatalf("cut at %d: %v", n, err)
			}
			continue
		}
		if rep.Incomplete == "" {
			t.Fatalf("cut at %d of %d: report not marked incomplete", n, len(data))
		}
		var text bytes.Buffer
		if err := rep.WriteText(&text); err != nil || !strings.HasPrefix(text.String(), "INCOMPLETE RECORDING") {
			t.Fatalf("cut at %d: text starts %q (%v)", n, text.String()[:min(60, text.Len())], err)
		}
	}
}

// synthetic writes a recording with the events of fn.
func synthetic(t testing.TB, counters []tracefile.Counters, fn func(emit func(tracefile.Event))) []byte {
	var buf bytes.Buffer
	m := &tracefile.Meta{Tool: "nettrace", Mode: "events", ClockMonotonic: 1e9, CapLen: 128, DropReasons: map[uint32]string{2: "NO_SOCKET", 6: "SOCKET_RCVBUFF"}}
	for _, p := range probes.All {
		m.Probes = append(m.Probes, tracefile.Probe{ID: uint16(p.ID), Name: p.Name, Attach: "tp_btf"})
	}
	w, err := tracefile.NewWriter(&buf, m)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteJSON(tracefile.TypeInterface, tracefile.Interface{Netns: 1, Ifindex: 2, Name: "vmxb"})
	fn(func(e tracefile.Event) {
		e.Netns = 1
		if err := w.WriteEvent(&e); err != nil {
			t.Fatal(err)
		}
	})
	for _, c := range counters {
		w.WriteJSON(tracefile.TypeCounters, c)
	}
	if err := w.Close(&tracefile.End{Time: 3e9}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Stages, NAPI budget and an AF_XDP fill ring that ran dry, from a
// hand-written recording whose answers are known.
func TestSyntheticPaths(t *testing.T) {
	data := synthetic(t, []tracefile.Counters{
		{Time: 1e9, Source: "xsk", Netns: 1, Device: "vmxb/q0", Values: map[string]uint64{"rx_fill_ring_empty_descs": 0}},
		{Time: 2e9, Source: "xsk", Netns: 1, Device: "vmxb/q0", Values: map[string]uint64{"rx_fill_ring_empty_descs": 30}},
	}, func(emit func(tracefile.Event)) {
		ev := func(t uint64, id probes.ID, skb uint64) tracefile.Event {
			return tracefile.Event{Time: 1e9 + t, Probe: uint16(id), Skb: skb, Ifindex: 2, CPU: 1}
		}
		for i := range uint64(100) {
			base := i * 1e6
			skb := 0x1000 + i
			emit(ev(base, probes.NetDevQueue, skb))
			emit(ev(base+1000, probes.NetDevXmit, skb))
			s := ev(base+1500, probes.SoftirqEntry, 0)
			s.Arg[0] = vecNetRX
			emit(s)
			emit(ev(base+3000, probes.NetifReceiveSkb, skb))
			emit(ev(base+10000, probes.SkbCopyDatagramIovec, skb))
			p := ev(base+11000, probes.NapiPoll, 0)
			p.Arg[0], p.Arg[1] = 64, 64
			emit(p)
			s = ev(base+12000, probes.SoftirqExit, 0)
			s.Arg[0] = vecNetRX
			emit(s)
		}
		for i := range uint64(30) {
			e := ev(5e8+i, probes.XdpRedirectErr, 0)
			e.Arg = [4]int32{7, -12, 9, 0}
			emit(e)
		}
	})
	rep := build(t, data, nil)
	want := map[string]time.Duration{"queue to xmit": 1000, "xmit to peer receive": 2000, "softirq entry to receive": 1500, "receive to delivered": 7000}
	for _, s := range rep.Stages {
		if d, ok := want[s.Name]; ok {
			if s.Latency.Count != 100 || s.Latency.P50 > d || s.Latency.P50 < d*15/16 {
				t.Errorf("stage %s: %+v, want 100 at %v", s.Name, s.Latency, d)
			}
			delete(want, s.Name)
		}
	}
	if len(want) > 0 {
		t.Errorf("stages missing: %v", want)
	}
	if len(rep.NAPI.Polls) != 1 || rep.NAPI.Polls[0].Exhausted != 100 || rep.NAPI.Polls[0].Device != "vmxb" {
		t.Errorf("napi %+v", rep.NAPI.Polls)
	}
	if rep.Findings[0].Rule != "xsk_fill_ring_empty" || rep.Findings[0].Count != 30 ||
		!slicesContains(rep.Findings[0].Evidence, "rx_fill_ring_empty_descs +30") || !slicesContains(rep.Findings[0].Evidence, "err=-12 on vmxb") {
		t.Errorf("top finding %+v", rep.Findings[0])
	}
	var budget bool
	for _, f := range rep.Findings {
		budget = budget || (f.Rule == "napi_budget" && f.Severity == "warning")
	}
	if !budget {
		t.Errorf("every poll exhausted its budget, no napi_budget warning: %+v", rep.Findings)
	}
	if rep.Drops.ByReason[0].Key != "XDP_REDIRECT_ERR(ENOMEM)" {
		t.Errorf("by reason %+v", rep.Drops.ByReason)
	}
}

// Time series stay bounded: a long recording halves their resolution.
func TestSeriesBounded(t *testing.T) {
	var s series
	for i := range uint64(100000) {
		s.add(i*uint64(10*time.Millisecond), "x", 1)
	}
	if n := len(s.rows["x"]); n > maxBuckets {
		t.Fatalf("%d buckets", n)
	}
	var sum uint64
	for _, v := range s.rows["x"] {
		sum += v
	}
	if sum != 100000 {
		t.Fatalf("sum %d after compaction", sum)
	}
}

func TestHistogram(t *testing.T) {
	var h hist
	for v := range uint64(10000) {
		h.add(v * 100)
	}
	for _, q := range []float64{0.5, 0.9, 0.99} {
		got, want := float64(h.quantile(q)), q*999900
		if got > want*1.0001 || got < want*(1-1.0/16)-100 {
			t.Errorf("q%.2f = %.0f, want %.0f within 1/16", q, got, want)
		}
	}
}

func TestJSONSchema(t *testing.T) {
	var buf bytes.Buffer
	if err := build(t, readGolden(t), nil).WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["schema"] != SchemaVersion {
		t.Errorf("schema %v", m["schema"])
	}
	for _, k := range []string{"findings", "drops", "napi", "stages", "counters", "intervals", "probes"} {
		if m[k] == nil {
			t.Errorf("%s is null or missing", k)
		}
	}
}

// The HTML page, rendered by headless Chromium: every plot with data has
// marks the browser laid out.
func TestHTMLInChromium(t *testing.T) {
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("chromium not installed (make deps installs Debian's chromium package)")
	}
	data := synthetic(t, nil, func(emit func(tracefile.Event)) {
		for i := range uint64(50) {
			emit(tracefile.Event{Time: 1e9 + i*1e7, Probe: uint16(probes.NetifReceiveSkb), Skb: i + 1, Ifindex: 2})
			emit(tracefile.Event{Time: 1e9 + i*1e7 + 5000, Probe: uint16(probes.KfreeSkb), Skb: i + 1, Ifindex: 2, Reason: 2, Location: 1})
			p := tracefile.Event{Time: 1e9 + i*1e7 + 100, Probe: uint16(probes.NapiPoll), Ifindex: 2}
			p.Arg[0], p.Arg[1] = int32(i%5), 64
			emit(p)
		}
	})
	path := filepath.Join(t.TempDir(), "report.html")
	var page bytes.Buffer
	if err := build(t, data, nil).WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(page.Bytes(), []byte("http://")) || bytes.Contains(page.Bytes(), []byte("https://")) {
		t.Error("the page refers to the network; it must open offline")
	}
	cmd := exec.Command(bin, "--headless", "--no-sandbox", "--disable-gpu", "--user-data-dir="+t.TempDir(), "--dump-dom", "file://"+path)
	cmd.Stderr = nil
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	re := regexp.MustCompile(`aria-label="([^"]*)" data-drawn="(\d+)"`)
	got := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(string(out), -1) {
		got[m[1]] = m[2]
	}
	for _, plot := range []string{"Drops over time, by reason", "Packet rate per stage (events per probe)", "NAPI work per poll", "Stage latency"} {
		if n := got[plot]; n == "" || n == "0" {
			t.Errorf("plot %q: %q marks drawn (all: %v)", plot, n, got)
		}
	}
}

// Build never panics on damaged input.
func FuzzBuild(f *testing.F) {
	data, err := os.ReadFile(golden)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add(synthetic(f, nil, func(emit func(tracefile.Event)) {
		emit(tracefile.Event{Time: 2e9, Probe: uint16(probes.KfreeSkb), Skb: 1, Ifindex: 2, Reason: 6})
	}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := tracefile.NewReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		rep, err := Build(r, &Options{Filter: Filter{Dev: "vmxb"}})
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := rep.WriteText(&out); err != nil {
			t.Fatal(err)
		}
		if err := rep.WriteHTML(&out); err != nil {
			t.Fatal(err)
		}
	})
}

// TestVmaxdpSocketRules: the counters of vmaxdp's sockets that count
// drops no kernel event shows each give a finding that names the socket.
func TestVmaxdpSocketRules(t *testing.T) {
	for name, rule := range map[string]string{
		"rx_queue_drops": "vmaxdp_socket_queue_full",
		"tx_no_bufs":     "vmaxdp_tx_no_bufs",
		"tx_stamp_drops": "vmaxdp_tx_stamp_drops",
	} {
		b := &builder{counters: map[counterKey]*counterState{
			{source: "vmaxdp_socket", device: "vmxb/udp 198.18.0.2:123 pid 7", name: name}: {total: 3},
		}}
		out := b.ruleVmaxdpSocket(nil, nil)
		if len(out) != 1 || out[0].Rule != rule || out[0].Count != 3 || !strings.Contains(out[0].Title, "vmxb/udp 198.18.0.2:123") {
			t.Errorf("%s +3: findings %+v, want one %s naming the socket", name, out, rule)
		}
	}
}
