package report

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmaxdp/vmaxdp/tracefmt"
)

func sorted(s []string) []string { slices.Sort(s); return s }

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
	secs := max(rep.Recording.Duration.Seconds(), 1e-9)
	rel := func(t uint64) float64 { return time.Duration(b.rel(t)).Seconds() }

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
		ps := ProbeSummary{Name: p.Name, Attach: p.Attach, Events: b.written[p.ID], Seen: seen[p.ID][0], Lost: seen[p.ID][1]}
		if ps.Seen > 0 {
			ps.LostShare = float64(ps.Lost) / float64(ps.Seen)
		}
		rep.Probes = append(rep.Probes, ps)
	}

	top := b.opts.Top
	if top <= 0 {
		top = 10
	}
	mkRow := func(key string, r *row) Row {
		out := Row{Key: key, Count: r.count, Rate: float64(r.count) / secs, First: rel(r.first), Last: rel(r.last)}
		var best uint64
		for reason, n := range r.reasons {
			if n > best || (n == best && b.reasonName(reason) < out.Reason) {
				best, out.Reason = n, b.reasonName(reason)
			}
		}
		return out
	}
	rows := func(n int, add func(func(string, *row)), other *row) []Row {
		var out []Row
		add(func(k string, r *row) { out = append(out, mkRow(k, r)) })
		slices.SortFunc(out, func(a, b Row) int { return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Key, b.Key)) })
		if len(out) > n {
			out = out[:n]
		}
		if other.count > 0 {
			out = append(out, mkRow(fmt.Sprintf("(others, beyond %d keys)", MaxKeys), other))
		}
		return out
	}
	d := &rep.Drops
	d.Total = b.drops
	d.ByReason = rows(top, func(f func(string, *row)) {
		for k, r := range b.byReason.rows {
			f(b.reasonName(k), r)
		}
	}, &b.byReason.other)
	d.ByLocation = rows(top, func(f func(string, *row)) {
		for k, r := range b.byLocation.rows {
			f(b.location(k), r)
		}
	}, &b.byLocation.other)
	d.ByDevice = rows(top, func(f func(string, *row)) {
		for k, r := range b.byDevice.rows {
			f(b.devLabel(k), r)
		}
	}, &b.byDevice.other)
	d.ByFlow = rows(top, func(f func(string, *row)) {
		for k, r := range b.byFlow.rows {
			row := *r
			row.reasons = map[uint32]uint64{k.reason: r.count}
			f(flowString(k.proto, k.src.String(), k.dst.String()), &row)
		}
	}, &b.byFlow.other)
	d.OverTime = b.dropSeries.export()
	rep.Rates = b.rates.export()

	b.napiReport(rep)
	for i, h := range b.stages {
		rep.Stages = append(rep.Stages, Stage{Name: stageNames[i][0], From: stageNames[i][1], To: stageNames[i][2], Latency: h.latency()})
	}
	for k, s := range b.counters {
		if s.total > 0 {
			rep.Counters = append(rep.Counters, CounterDelta{Source: k.source, Device: b.displayDevice(k.source, k.device), Netns: k.netns, Name: k.name, Delta: s.total})
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

// devLabel names a device, with its namespace when the name is ambiguous.
func (b *builder) devLabel(k devKey) string {
	n := b.devName(k)
	for o, name := range b.devNames {
		if name == n && o.netns != k.netns {
			return fmt.Sprintf("%s (netns %d)", n, k.netns)
		}
	}
	return n
}

func (s *series) export() Series {
	out := Series{Bucket: time.Duration(s.width), Counts: map[string][]uint64{}}
	for k, r := range s.rows {
		out.Counts[k] = r
	}
	return out
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
	vecNames := [numVecs]string{"HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"}
	for cpu, c := range b.cpus {
		if c == nil {
			continue
		}
		for v := range numVecs {
			if c.raised[v] > 0 || c.runs[v] > 0 {
				n.Softirq = append(n.Softirq, SoftirqRow{CPU: uint32(cpu), Vec: vecNames[v], Raised: c.raised[v], Runs: c.runs[v], Time: c.time[v].latency()})
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
		for i := range out.Counters {
			out.Counters[i].Device = b.displayDevice(out.Counters[i].Source, out.Counters[i].Device)
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
		slices.Sort(out.Notes)
		rep.Intervals = append(rep.Intervals, out)
	}
}

// vmaxdpDevice reads a steering program's pin directory name,
// "<netns inode>_<ifindex>".
func vmaxdpDevice(dir string) (devKey, bool) {
	ns, idx, ok := strings.Cut(dir, "_")
	netns, err1 := strconv.ParseUint(ns, 10, 32)
	ifindex, err2 := strconv.ParseUint(idx, 10, 32)
	return devKey{uint32(netns), uint32(ifindex)}, ok && err1 == nil && err2 == nil
}

// displayDevice names a counter's device for people: vmaxdp's pin
// directories become interface names when the file knows them.
func (b *builder) displayDevice(source, device string) string {
	if source != "vmaxdp" {
		return device
	}
	k, ok := vmaxdpDevice(device)
	switch {
	case !ok:
		return device
	case b.r.Interface(k.netns, k.ifindex) != "":
		return b.devLabel(k)
	}
	return fmt.Sprintf("ifindex %d (netns %d)", k.ifindex, k.netns)
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
