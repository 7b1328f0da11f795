package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/recordtest"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

const golden = "../../testdata/nettrace/drops.ntrace"

// The script output of a committed recording is pinned, in every format.
func TestScriptGolden(t *testing.T) {
	for _, format := range []string{"text", "json", "perfetto"} {
		t.Run(format, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if err := run(context.Background(), []string{"script", "-i", golden, "-format", format}, &out, &errOut); err != nil {
				t.Fatal(err)
			}
			want := strings.TrimSuffix(golden, ".ntrace") + "." + format
			if *update {
				if err := os.WriteFile(want, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			w, err := os.ReadFile(want)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out.Bytes(), w) {
				t.Errorf("nettrace script -format %s differs from %s (go test -update rewrites it):\n%s", format, want, out.String())
			}
		})
	}
}

// A recording cut anywhere still prints what it holds and says it is
// incomplete; a flipped byte is an error naming the offset; nothing panics.
func TestScriptDamagedFiles(t *testing.T) {
	data, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cut := filepath.Join(dir, "cut.ntrace")
	if err := os.WriteFile(cut, data[:len(data)*2/3], 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"script", "-i", cut}, &out, &errOut); err != nil {
		t.Fatalf("truncated file: %v", err)
	}
	if !strings.Contains(out.String(), "INCOMPLETE") || !strings.Contains(errOut.String(), "incomplete recording") {
		t.Errorf("truncated file not reported as incomplete:\n%s\n%s", out.String(), errOut.String())
	}

	bad := bytes.Clone(data)
	bad[len(bad)/2] ^= 0xff
	corrupt := filepath.Join(dir, "corrupt.ntrace")
	if err := os.WriteFile(corrupt, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	err = run(context.Background(), []string{"script", "-i", corrupt}, &out, &errOut)
	if !errors.Is(err, tracefile.ErrCorrupt) || !strings.Contains(err.Error(), "offset") {
		t.Errorf("corrupt file: %v, want an ErrCorrupt naming the offset", err)
	}
	notTrace := filepath.Join(dir, "perf.data")
	os.WriteFile(notTrace, []byte("PERFILE2 and more bytes"), 0o644)
	if err := run(context.Background(), []string{"script", "-i", notTrace}, &out, &errOut); !errors.Is(err, tracefile.ErrNotTrace) {
		t.Errorf("perf.data: %v, want ErrNotTrace", err)
	}
}

// Bad flags are refused before anything is attached, naming the flag.
func TestBadFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"record", "-e", "nosuchevent"}, `"nosuchevent"`},
		{[]string{"record", "-proto", "sctpx"}, "-proto"},
		{[]string{"record", "-ring-size", "3"}, "-ring-size"},
		{[]string{"record", "-src", "2001:db8::1"}, "-src"},
		{[]string{"record", "-port", "70000"}, "-port"},
		{[]string{"script", "-format", "xml", "-i", golden}, "-format"},
		{[]string{"pcap", "-i", golden}, "-o"},
		{[]string{"frobnicate"}, `"frobnicate"`},
		{[]string{"report", "-i", golden, "-flow", "udp 1.2.3.4"}, "-flow"},
		{[]string{"report", "-i", golden, "-time", "5,1"}, "-time"},
		{[]string{"report", "-i", golden, "-cpu", "x"}, "-cpu"},
		{[]string{"report", "-i", golden, "-json", "-html"}, "-html"},
		{[]string{"report", "-i", golden, "-top", "0"}, "-top"},
		{[]string{"report", "-i", "/nonexistent.ntrace"}, "/nonexistent.ntrace"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), c.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("nettrace %s: error %v, want one naming %s", strings.Join(c.args, " "), err, c.want)
		}
	}
}

// nettrace report on the golden recording: text, JSON and HTML, filters
// applied after the fact.
func TestReport(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"report", "-i", golden}, &out, &errOut); err != nil {
		t.Fatal(err, errOut.String())
	}
	if !strings.Contains(out.String(), "[error] 5 packets to udp 198.18.0.2:9, where no socket listens") {
		t.Errorf("text report:\n%s", out.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"report", "-i", golden, "-json", "-reason", "NETFILTER_DROP"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Filter string `json:"filter"`
		Drops  struct {
			Total int `json:"total"`
		} `json:"drops"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Drops.Total != 0 || rep.Filter != "reason NETFILTER_DROP" {
		t.Errorf("filtered JSON report: %+v %v", rep, err)
	}
	html := filepath.Join(t.TempDir(), "r.html")
	if err := run(context.Background(), []string{"report", "-i", golden, "-html", "-o", html}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(html); err != nil || !bytes.Contains(b, []byte("<svg class=\"plot\"")) {
		t.Errorf("HTML report: %v", err)
	}
}

// recordBed records with nettrace record's flags while traffic runs.
func recordBed(t *testing.T, args []string, traffic func() error) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "rec.ntrace")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var errOut bytes.Buffer
	go func() {
		done <- run(ctx, append([]string{"record", "-o", out, "-interval", "200ms"}, args...), &bytes.Buffer{}, &errOut)
	}()
	// The file's meta is written once the probes are attached.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if st, err := os.Stat(out); err == nil && st.Size() > 0 {
			break
		}
		select {
		case err := <-done:
			testutil.SkipIfNotSupported(t, err)
			t.Fatalf("record stopped early: %v\n%s", err, errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("record did not start in 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	terr := traffic()
	time.Sleep(300 * time.Millisecond)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("record: %v\n%s", err, errOut.String())
	}
	if terr != nil {
		t.Fatal(terr)
	}
	return out
}

// nettrace pcap writes what tshark reads back: each packet's flow, and the
// event, reason and location in its comment.
func TestPcapTshark(t *testing.T) {
	b := testutil.Bed(t, nil)
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (make deps installs it)")
	}
	const n, port = 10, 9
	file := recordBed(t, []string{"-e", "kfree_skb", "-netns", b.NSName(testbed.B), "-dport", strconv.Itoa(port)}, func() error { return testutil.SendUDP(b, port, n, 32) })
	pcap := filepath.Join(t.TempDir(), "drops.pcapng")
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"pcap", "-i", file, "-o", pcap}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tshark, "-r", pcap, "-T", "fields", "-e", "ip.src", "-e", "udp.dstport", "-e", "frame.comment")
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(got)), "\n")
	if len(lines) != n {
		t.Fatalf("tshark read %d packets, want %d:\n%s", len(lines), n, got)
	}
	for _, l := range lines {
		f := strings.Split(l, "\t")
		if len(f) != 3 || f[0] != b.Addr(testbed.A).String() || f[1] != strconv.Itoa(port) ||
			!strings.Contains(f[2], "skb:kfree_skb") || !strings.Contains(f[2], "reason: NO_SOCKET") || !strings.Contains(f[2], "location=__udp4_lib_rcv+0x") {
			t.Fatalf("tshark line %q: want %s, port %d, and a comment naming kfree_skb, NO_SOCKET and __udp4_lib_rcv", l, b.Addr(testbed.A), port)
		}
	}
}

// scriptLine is a perf script line: comm tid [cpu] secs.usecs: event: fields.
var scriptLine = regexp.MustCompile(`^\s*(.+?)\s+(\d+) \[(\d+)\]\s+(\d+)\.(\d+):\s+(\S+): (.*)$`)

type line struct {
	t    uint64 // µs
	key  string // everything but the time and the padding
	skb  string
	text string
}

var skbField = regexp.MustCompile(`skbaddr=(0x[0-9a-f]+)`)

func parseScript(t *testing.T, out []byte) []line {
	var ls []line
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		m := scriptLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		secs, _ := strconv.ParseUint(m[4], 10, 64)
		usecs, _ := strconv.ParseUint(m[5], 10, 64)
		l := line{t: secs*1e6 + usecs, key: strings.Join([]string{workerComm(m[1]), m[2], m[3], m[6], m[7]}, " "), text: sc.Text()}
		if s := skbField.FindStringSubmatch(m[7]); s != nil {
			l.skb = s[1]
		}
		ls = append(ls, l)
	}
	return ls
}

// workerComm is comm without the workqueue a kernel worker served when
// perf read its name from /proc at the start of its recording
// ("kworker/0:3-mm_percpu_wq", cut to 15 characters): the name in the
// kernel, which nettrace reads at each event, has none ("kworker/0:3").
func workerComm(comm string) string {
	if i := strings.IndexByte(comm, '-'); i > 0 && strings.HasPrefix(comm, "kworker/") {
		return comm[:i]
	}
	return comm
}

// perf record and nettrace record of the same events during the same
// workload agree, line for line, in perf script's layout.
func TestPerfParity(t *testing.T) {
	b := testutil.Bed(t, nil)
	perf, err := exec.LookPath("perf")
	if err != nil {
		t.Skip("perf not installed (make deps installs linux-perf)")
	}
	const n, port = 50, 9
	perfData := filepath.Join(t.TempDir(), "perf.data")
	// CLOCK_MONOTONIC, the clock of nettrace's events, so that the two
	// recordings can be cut to the same window.
	prec := exec.Command(perf, "record", "-q", "-k", "CLOCK_MONOTONIC", "-a", "-e", "skb:kfree_skb", "-e", "net:netif_receive_skb", "-o", perfData)
	var perfErr bytes.Buffer
	prec.Stderr = &perfErr
	if err := prec.Start(); err != nil {
		t.Fatal(err)
	}
	defer prec.Process.Kill()
	time.Sleep(time.Second) // perf attaches
	file := recordBed(t, []string{"-e", "kfree_skb,netif_receive_skb"}, func() error { return testutil.SendUDP(b, port, n, 32) })
	time.Sleep(200 * time.Millisecond)
	prec.Process.Signal(syscall.SIGINT)
	// perf ends itself with the SIGINT it was sent, after writing the file.
	if err := prec.Wait(); err != nil && prec.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGINT {
		t.Fatalf("perf record: %v\n%s", err, perfErr.String())
	}
	pout, err := exec.Command(perf, "script", "-i", perfData).Output()
	if err != nil {
		t.Fatalf("perf script: %v", err)
	}
	var nout, errOut bytes.Buffer
	if err := run(context.Background(), []string{"script", "-i", file}, &nout, &errOut); err != nil {
		t.Fatal(err)
	}
	// An exact comparison needs both complete: on a machine busy with other
	// tests either side may lose events, and then says so.
	stats, _ := exec.Command(perf, "report", "-i", perfData, "--stats").Output()
	if bytes.Contains(stats, []byte("LOST")) || strings.Contains(errOut.String(), "lost") {
		t.Skipf("events were lost (perf: %t, nettrace: %t): the machine is too busy for an exact comparison",
			bytes.Contains(stats, []byte("LOST")), strings.Contains(errOut.String(), "lost"))
	}
	// Our datagrams: the kfree_skb events with the bed's flow, found by
	// nettrace's own JSON (perf has no flow).
	var jout bytes.Buffer
	if err := run(context.Background(), []string{"script", "-i", file, "-format", "json", "-e", "kfree_skb"}, &jout, &errOut); err != nil {
		t.Fatal(err)
	}
	// Other packages' beds use the same addresses: the namespace tells ours.
	want := fmt.Sprintf(`"dst":"%s:%d"`, b.Addr(testbed.B), port)
	wantNS := fmt.Sprintf(`"netns":%d,`, recordtest.NetnsInode(t, b, testbed.B))
	var first, last uint64
	ours := 0
	for _, l := range strings.Split(jout.String(), "\n") {
		if !strings.Contains(l, want) || !strings.Contains(l, wantNS) {
			continue
		}
		var ts uint64
		fmt.Sscanf(l[strings.Index(l, `"time_ns":`)+len(`"time_ns":`):], "%d", &ts)
		if ours == 0 {
			first = ts / 1e3
		}
		last = ts / 1e3
		ours++
	}
	if ours != n {
		t.Fatalf("nettrace recorded %d drops of the bed's flow, want %d", ours, n)
	}
	// Compare both recordings inside our traffic's window, widened by 1 ms
	// for the two programs' timestamps; lines are compared without the time.
	window := func(ls []line) map[string]int {
		m := map[string]int{}
		for _, l := range ls {
			if l.t+1000 >= first && l.t <= last+1000 && (strings.Contains(l.key, "dev=vmxb") || strings.Contains(l.key, "__udp4_lib_rcv")) {
				m[l.key]++
			}
		}
		return m
	}
	pm, nm := window(parseScript(t, pout)), window(parseScript(t, nout.Bytes()))
	var diff []string
	for k, c := range pm {
		if nm[k] != c {
			diff = append(diff, fmt.Sprintf("perf %d, nettrace %d: %s", c, nm[k], k))
		}
	}
	for k, c := range nm {
		if _, ok := pm[k]; !ok {
			diff = append(diff, fmt.Sprintf("perf 0, nettrace %d: %s", c, k))
		}
	}
	sort.Strings(diff)
	if len(diff) > 0 {
		t.Fatalf("perf and nettrace disagree in the window [%d, %d] µs:\n%s", first, last, strings.Join(diff, "\n"))
	}
	total := 0
	for _, c := range pm {
		total += c
	}
	if total < 2*n {
		t.Fatalf("only %d matching lines for %d datagrams (kfree_skb + netif_receive_skb each)", total, n)
	}
}
