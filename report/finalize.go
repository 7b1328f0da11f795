package report

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmaxdp/vmaxdp/tracefmt"
)

func (b *builder) report(incomplete error) *Report {
	m := b.meta
	end := b.last
	rep := &Report{
		Schema: SchemaVersion,
		Filter: b.opts.Filter.String(),
		Recording: Recording{
			Tool: m.Tool + " " + m.Version, Kernel: m.Kernel, Hostname: m.Hostname, Command: m.Command,
			Mode: m.Mode, Filter: m.Filter, Notes: m.Notes,
			Start: time.Unix(0, m.ClockRealtime),
		},
		Untracked: b.untracked,
	}
	if incomplete != nil {
		rep.Incomplete = incomplete.Error()
	}
	if e := b.r.End(); e != nil {
		end = max(end, e.Time)
		rep.Recording.Stopped = e.Stopped
	}
	if end > b.start {
		rep.Recording.Duration = time.Duration(end - b.start)
	}
	b.secs = max(rep.Recording.Duration.Seconds(), 1e-9)
	b.markAmbiguous()

	// Events per probe: the End record's totals, else the last loss record.
	seen := map[uint16][2]uint64{}
	if e := b.r.End(); e != nil {
		for _, p := range e.Probes {
			seen[p.Probe] = [2]uint64{p.Events, p.Lost}
		}
	} else {
		for k, l := range b.loss {
			v := seen[uint16(k[0])]
			seen[uint16(k[0])] = [2]uint64{v[0] + l.Events, v[1] + l.Lost}
		}
	}
	for _, p := range m.Probes {
		ps := ProbeSummary{Name: p.Name, Attach: p.Attach, Seen: seen[p.ID][0], Lost: seen[p.ID][1]}
		if st := b.probe(p.ID); st != nil {
			ps.Events = st.written
		}
		if ps.Seen > 0 {
			ps.LostShare = float64(ps.Lost) / float64(ps.Seen)
		}
		rep.Probes = append(rep.Probes, ps)
	}

	top := b.opts.Top
	if top <= 0 {
		top = 10
	}
	d := &rep.Drops
	d.Total = b.drops
	d.ByReason = topRows(b, &b.byReason, top, func(k uint32) (string, string) { return b.reasonName(k), "" })
	d.ByLocation = topRows(b, &b.byLocation, top, func(k uint64) (string, string) { return b.location(k), "" })
	d.ByDevice = topRows(b, &b.byDevice, top, func(k devKey) (string, string) { return b.devLabel(k), "" })
	d.ByFlow = topRows(b, &b.byFlow, top, func(k flowKey) (string, string) {
		return flowString(k.proto, k.src.String(), k.dst.String()), b.reasonName(k.reason)
	})
	d.OverTime = b.dropSeries.export()
	rep.Rates = b.rates.export()

	b.napiReport(rep)
	for i, h := range b.stages {
		rep.Stages = append(rep.Stages, Stage{Name: stageNames[i][0], From: stageNames[i][1], To: stageNames[i][2], Latency: h.latency()})
	}
	for k, s := range b.counters {
		if s.total > 0 {
			rep.Counters = append(rep.Counters, CounterDelta{Source: k.source, Device: k.device, Netns: k.netns, Name: k.name, Delta: s.total})
		}
	}
	slices.SortFunc(rep.Counters, compareCounters)
	b.intervalReport(rep)
	rep.Findings = b.findings(rep)
	nonNil(rep)
	return rep
}

// nonNil gives every list of the JSON schema a value, so that scripts see
// [] rather than null.
func nonNil(r *Report) {
	for _, s := range []*[]Row{&r.Drops.ByReason, &r.Drops.ByLocation, &r.Drops.ByDevice, &r.Drops.ByFlow} {
		if *s == nil {
			*s = []Row{}
		}
	}
	if r.Findings == nil {
		r.Findings = []Finding{}
	}
	if r.Probes == nil {
		r.Probes = []ProbeSummary{}
	}
	if r.Counters == nil {
		r.Counters = []CounterDelta{}
	}
	if r.Intervals == nil {
		r.Intervals = []Interval{}
	}
	if r.NAPI.Polls == nil {
		r.NAPI.Polls = []NapiRow{}
	}
	if r.NAPI.Work == nil {
		r.NAPI.Work = []uint64{}
	}
	if r.NAPI.Softirq == nil {
		r.NAPI.Softirq = []SoftirqRow{}
	}
	if r.NAPI.Softnet == nil {
		r.NAPI.Softnet = []SoftnetRow{}
	}
	for i := range r.Findings {
		if r.Findings[i].Evidence == nil {
			r.Findings[i].Evidence = []string{}
		}
	}
}

func compareCounters(a, b CounterDelta) int {
	return cmp.Or(cmp.Compare(a.Source, b.Source), cmp.Compare(a.Netns, b.Netns), cmp.Compare(a.Device, b.Device), cmp.Compare(a.Name, b.Name))
}

func flowString(proto uint8, src, dst string) string {
	return tracefmt.ProtoName(proto) + " " + src + " > " + dst
}

func (b *builder) location(addr uint64) string {
	if s, off, ok := b.r.Symbolize(addr); ok {
		return fmt.Sprintf("%s+0x%x", s.Name, off)
	}
	return fmt.Sprintf("0x%x", addr)
}

// topRows turns a table into its n most frequent rows, and an "others" row
// when it capped its keys. name gives a key's label and, for tables keyed
// by reason, the reason; else a row's reason is its most frequent one.
func topRows[K comparable](b *builder, t *table[K], n int, name func(K) (key, reason string)) []Row {
	var out []Row
	for k, r := range t.rows {
		key, reason := name(k)
		out = append(out, b.row(key, reason, r))
	}
	slices.SortFunc(out, func(a, b Row) int { return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Key, b.Key)) })
	out = out[:min(n, len(out))]
	if t.other.count > 0 {
		out = append(out, b.row(fmt.Sprintf("(others, beyond %d keys)", MaxKeys), "", &t.other))
	}
	return out
}

func (b *builder) row(key, reason string, r *row) Row {
	out := Row{Key: key, Reason: reason, Count: r.count, Rate: float64(r.count) / b.secs,
		First: time.Duration(b.rel(r.first)).Seconds(), Last: time.Duration(b.rel(r.last)).Seconds()}
	var best uint64
	for k, n := range r.reasons {
		if name := b.reasonName(k); n > best || (n == best && name < out.Reason) {
			best, out.Reason = n, name
		}
	}
	return out
}

// markAmbiguous finds the device names the report shows that are used in
// more than one namespace.
func (b *builder) markAmbiguous() {
	for k := range b.byDevice.rows {
		b.devName(k)
	}
	for k := range b.napi {
		b.devName(k.dev)
	}
	for k := range b.redirects {
		b.devName(k.dev)
	}
	netns := map[string]uint32{}
	b.ambiguous = map[string]bool{}
	for k, name := range b.devNames {
		if ns, ok := netns[name]; ok && ns != k.netns {
			b.ambiguous[name] = true
		}
		netns[name] = k.netns
	}
}

// devLabel names a device, with its namespace when the name is ambiguous.
func (b *builder) devLabel(k devKey) string {
	n := b.devName(k)
	if b.ambiguous[n] {
		return fmt.Sprintf("%s (netns %d)", n, k.netns)
	}
	return n
}

func (s *series) export() Series {
	if s.rows == nil {
		s.rows = map[string][]uint64{}
	}
	return Series{Bucket: time.Duration(s.width), Counts: s.rows}
}

func (b *builder) napiReport(rep *Report) {
	n := &rep.NAPI
	for k, s := range b.napi {
		n.Polls = append(n.Polls, NapiRow{Device: b.devLabel(k.dev), CPU: k.cpu, Polls: s.polls, Work: s.work, Budget: s.budget, Exhausted: s.exhausted})
	}
	slices.SortFunc(n.Polls, func(a, b NapiRow) int {
		return cmp.Or(cmp.Compare(b.Polls, a.Polls), cmp.Compare(a.Device, b.Device), cmp.Compare(a.CPU, b.CPU))
	})
	last := -1
	for i, c := range b.napiWork {
		if c > 0 {
			last = i
		}
	}
	n.Work = append([]uint64(nil), b.napiWork[:last+1]...)
	for cpu, c := range b.cpus {
		if c == nil {
			continue
		}
		for v := range numVecs {
			if c.raised[v] > 0 || c.runs[v] > 0 {
				n.Softirq = append(n.Softirq, SoftirqRow{CPU: uint32(cpu), Vec: tracefmt.SoftirqName(int32(v)), Raised: c.raised[v], Runs: c.runs[v], Time: c.time[v].latency()})
			}
		}
	}
	soft := map[string]*SoftnetRow{}
	for k, s := range b.counters {
		if k.source != "softnet" || s.total == 0 {
			continue
		}
		r := soft[k.device]
		if r == nil {
			r = &SoftnetRow{CPU: k.device}
			soft[k.device] = r
		}
		switch k.name {
		case "processed":
			r.Processed = s.total
		case "dropped":
			r.Dropped = s.total
		case "time_squeeze":
			r.TimeSqueeze = s.total
		}
	}
	for _, r := range soft {
		n.Softnet = append(n.Softnet, *r)
	}
	slices.SortFunc(n.Softnet, func(a, b SoftnetRow) int {
		return cmp.Or(cmp.Compare(len(a.CPU), len(b.CPU)), cmp.Compare(a.CPU, b.CPU))
	})
}

// corroborating lists, per drop reason, the counters that count the same
// drops, and what it means when both move.
var corroborating = []struct {
	reason, source, counter, meaning string
}{
	{"NO_SOCKET", "snmp", "Udp.NoPorts", "datagrams to a port without a socket"},
	{"NO_SOCKET", "snmp", "Tcp.OutRsts", "segments to a port without a listener, answered with RST"},
	{"SOCKET_RCVBUFF", "snmp", "Udp.RcvbufErrors", "a socket's receive buffer was full"},
	{"CPU_BACKLOG", "softnet", "dropped", "the per-CPU backlog queue was full"},
	{"XDP_REDIRECT_ERR(ENOMEM)", "xsk", "rx_fill_ring_empty_descs", "an AF_XDP socket's fill ring was empty"},
	{"XDP_REDIRECT_ERR(ENOMEM)", "netdev", "rx_dropped", "the driver dropped the packets the XDP redirect could not place"},
	{"XDP_REDIRECT_ERR(ENOBUFS)", "xsk", "rx_ring_full", "an AF_XDP socket's RX ring was full"},
}

func (b *builder) intervalReport(rep *Report) {
	if len(b.pending) > 0 && b.last > b.snapTime {
		start := b.snapTime
		if start == 0 {
			start = b.start
		}
		b.intervals = append(b.intervals, interval{start: start, end: b.last, drops: b.pending})
	}
	for _, iv := range b.intervals {
		if len(iv.drops) == 0 && len(iv.counters) == 0 {
			continue
		}
		out := Interval{Start: time.Duration(b.rel(iv.start)).Seconds(), End: time.Duration(b.rel(iv.end)).Seconds(), Counters: iv.counters}
		if len(iv.drops) > 0 {
			out.Drops = map[string]uint64{}
			for r, n := range iv.drops {
				out.Drops[b.reasonName(r)] += n
			}
		}
		slices.SortFunc(out.Counters, compareCounters)
		matched := map[string]bool{}
		for _, c := range corroborating {
			n := out.Drops[c.reason]
			if n == 0 {
				continue
			}
			for _, cd := range out.Counters {
				if cd.Source == c.source && cd.Name == c.counter {
					out.Notes = append(out.Notes, fmt.Sprintf("%d %s drops and %s %s +%d on %s moved together: %s", n, c.reason, cd.Source, cd.Name, cd.Delta, counterName(cd), c.meaning))
					matched[c.reason] = true
				}
			}
		}
		for r, n := range out.Drops {
			if !matched[r] {
				out.Notes = append(out.Notes, fmt.Sprintf("%d %s drops with no counter moving with them", n, r))
			}
		}
		if len(out.Drops) == 0 {
			for _, cd := range out.Counters {
				if cd.Source == "netdev" && strings.HasPrefix(cd.Name, "rx_") && cd.Name != "rx_packets" && cd.Name != "rx_bytes" {
					out.Notes = append(out.Notes, fmt.Sprintf("netdev %s +%d on %s with no kernel drop event: dropped before the traced path (driver, XDP) or by a probe not recorded", cd.Name, cd.Delta, counterName(cd)))
				}
			}
		}
		for _, cd := range out.Counters {
			if cd.Source == "vmaxdp_socket" && cd.Name == "rx_queue_drops" {
				out.Notes = append(out.Notes, fmt.Sprintf("vmaxdp dropped %d datagrams of %s in its own receive queue: after the kernel's path, so no kernel event shows them", cd.Delta, counterName(cd)))
			}
		}
		slices.Sort(out.Notes)
		rep.Intervals = append(rep.Intervals, out)
	}
}

// counterName names where a counter lives: "vmxb", "cpu1", "netns 4026532281".
func counterName(c CounterDelta) string {
	switch {
	case c.Device != "":
		return c.Device
	case c.Netns != 0:
		return fmt.Sprintf("netns %d", c.Netns)
	}
	return "host"
}
