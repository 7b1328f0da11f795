package report

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"
)

// textWidth is the width text output wraps prose at.
const textWidth = 100

// WriteText writes the report for a terminal.
func (r *Report) WriteText(w io.Writer) error {
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	if r.Incomplete != "" {
		p("INCOMPLETE RECORDING: %s; the report covers what was written before the cut.\n", r.Incomplete)
	}
	rec := &r.Recording
	p("nettrace report: %s, kernel %s on %s, %s recording of %s", rec.Start.Format("2006-01-02 15:04:05"), rec.Kernel, rec.Hostname, rec.Mode, dur(rec.Duration))
	if rec.Stopped != "" {
		p(" (stopped: %s)", rec.Stopped)
	}
	p("\n")
	if len(rec.Command) > 0 {
		p("command: %s\n", strings.Join(rec.Command, " "))
	}
	if rec.Filter != "" {
		p("recorded with filter: %s\n", rec.Filter)
	}
	if r.Filter != "" {
		p("report filter: %s\n", r.Filter)
	}
	for _, n := range rec.Notes {
		p("note: %s\n", n)
	}

	p("\nFINDINGS\n")
	if len(r.Findings) == 0 {
		p("  nothing to report: no drops, no losses, no counter that signals trouble.\n")
	}
	for i, f := range r.Findings {
		p("%2d. [%s] %s\n", i+1, f.Severity, f.Title)
		for j, e := range f.Evidence {
			label := ""
			if j == 0 {
				label = "evidence:"
			}
			p("      %-9s %s\n", label, e)
		}
		p("%s", wrap("      why:      ", f.Explanation))
		p("%s", wrap("      fix:      ", f.Fix))
	}

	p("\nEVENTS\n  %-30s %12s %12s %10s %7s\n", "probe", "written", "seen", "lost", "lost%")
	for _, ps := range r.Probes {
		p("  %-30s %12d %12d %10d %6.1f%%\n", ps.Name, ps.Events, ps.Seen, ps.Lost, 100*ps.LostShare)
	}

	d := &r.Drops
	p("\nDROPS: %d", d.Total)
	if r.Recording.Duration > 0 {
		p(" (%.1f/s)", float64(d.Total)/r.Recording.Duration.Seconds())
	}
	p("\n")
	for _, t := range []struct {
		name string
		rows []Row
	}{{"reason", d.ByReason}, {"location", d.ByLocation}, {"device", d.ByDevice}, {"flow", d.ByFlow}} {
		if len(t.rows) == 0 {
			continue
		}
		reasonCol := "reason"
		if t.name == "reason" {
			reasonCol = ""
		}
		p("  %-52s %10s %10s %9s %9s  %s\n", "by "+t.name, "count", "rate/s", "first s", "last s", reasonCol)
		for _, row := range t.rows {
			p("  %-52s %10d %10.1f %9.3f %9.3f  %s\n", row.Key, row.Count, row.Rate, row.First, row.Last, row.Reason)
		}
	}
	if len(d.OverTime.Counts) > 0 {
		p("  over time, one column per %s:\n", dur(d.OverTime.Bucket))
		for _, k := range slices.Sorted(maps.Keys(d.OverTime.Counts)) {
			p("  %-30s %s\n", k, sparkline(d.OverTime.Counts[k]))
		}
	}

	n := &r.NAPI
	if len(n.Polls) > 0 || len(n.Softirq) > 0 || len(n.Softnet) > 0 {
		p("\nNAPI AND SOFTIRQ\n")
	}
	if len(n.Polls) > 0 {
		p("  %-24s %4s %10s %10s %9s %7s %10s\n", "device", "cpu", "polls", "work", "work/poll", "budget", "exhausted")
		for _, row := range n.Polls {
			p("  %-24s %4d %10d %10d %9.1f %7d %10d\n", row.Device, row.CPU, row.Polls, row.Work, float64(row.Work)/float64(max(row.Polls, 1)), row.Budget, row.Exhausted)
		}
		p("  work per poll: %s\n", workHistogram(n.Work))
	}
	if len(n.Softirq) > 0 {
		p("  %-8s %4s %10s %10s %10s %10s %10s %12s\n", "softirq", "cpu", "raised", "runs", "p50", "p99", "max", "total time")
		for _, s := range n.Softirq {
			p("  %-8s %4d %10d %10d %10s %10s %10s %12s\n", s.Vec, s.CPU, s.Raised, s.Runs, dur(s.Time.P50), dur(s.Time.P99), dur(s.Time.Max), dur(s.Time.Total))
		}
	}
	if len(n.Softnet) > 0 {
		p("  %-8s %12s %10s %13s   (/proc/net/softnet_stat, change over the recording)\n", "softnet", "processed", "dropped", "time_squeeze")
		for _, s := range n.Softnet {
			p("  %-8s %12d %10d %13d\n", s.CPU, s.Processed, s.Dropped, s.TimeSqueeze)
		}
	}

	var stages []Stage
	for _, s := range r.Stages {
		if s.Latency.Count > 0 {
			stages = append(stages, s)
		}
	}
	if len(stages) > 0 {
		p("\nSTAGES (per packet, by skb address; percentiles within 6.25%%)\n")
		p("  %-34s %10s %10s %10s %10s %10s\n", "stage", "count", "p50", "p90", "p99", "max")
		for _, s := range stages {
			l := &s.Latency
			p("  %-34s %10d %10s %10s %10s %10s\n", s.Name, l.Count, dur(l.P50), dur(l.P90), dur(l.P99), dur(l.Max))
		}
		if r.Untracked > 0 {
			p("  %d packets were no longer followed: more than %d in flight without an end event\n", r.Untracked, MaxInFlight)
		}
	}

	if ivs, more := notableIntervals(r.Intervals, textIntervals); len(ivs) > 0 {
		p("\nINTERVALS (kernel drops next to the counters of the same interval; the %d with most trouble)\n", len(ivs))
		for _, iv := range ivs {
			var parts []string
			for _, k := range slices.Sorted(maps.Keys(iv.Drops)) {
				parts = append(parts, fmt.Sprintf("%s %d", k, iv.Drops[k]))
			}
			drops := "no drop event"
			if len(parts) > 0 {
				drops = "drops " + strings.Join(parts, ", ")
			}
			p("  %7.3f-%7.3f s  %s\n", iv.Start, iv.End, drops)
			for _, c := range iv.Counters {
				p("  %17s %s %s %s +%d\n", "", c.Source, counterName(c), c.Name, c.Delta)
			}
			for _, note := range iv.Notes {
				p("%s", wrap("                    => ", note))
			}
		}
		if more > 0 {
			p("  (%d more intervals in -json)\n", more)
		}
	}
	if len(r.Counters) > 0 {
		p("\nCOUNTERS THAT MOVED (signals of trouble; --json lists all %d)\n", len(r.Counters))
		ws, wd := 8, 24 // columns widen for long names (a vmaxdp socket's)
		for _, c := range r.Counters {
			if interesting(c.Source, c.Name) {
				ws, wd = max(ws, len(c.Source)), max(wd, len(counterName(c)))
			}
		}
		for _, c := range r.Counters {
			if interesting(c.Source, c.Name) {
				p("  %-*s %-*s %-32s +%d\n", ws, c.Source, wd, counterName(c), c.Name, c.Delta)
			}
		}
	}
	return bw.Flush()
}

// textIntervals is how many intervals the text report shows.
const textIntervals = 12

// notableIntervals picks the intervals with the most drops and trouble
// counters (vmaxdp's own counters alone are not trouble), in time order.
func notableIntervals(all []Interval, n int) ([]Interval, int) {
	type scored struct {
		i     int
		score uint64
	}
	var cand []scored
	for i, iv := range all {
		var s uint64
		for _, d := range iv.Drops {
			s += d
		}
		for _, c := range iv.Counters {
			if c.Source != "vmaxdp" {
				s += c.Delta
			}
		}
		if s > 0 {
			cand = append(cand, scored{i, s})
		}
	}
	slices.SortStableFunc(cand, func(a, b scored) int { return cmp.Compare(b.score, a.score) })
	more := max(len(cand)-n, 0)
	cand = cand[:min(n, len(cand))]
	slices.SortFunc(cand, func(a, b scored) int { return cmp.Compare(a.i, b.i) })
	out := make([]Interval, len(cand))
	for j, c := range cand {
		out[j] = all[c.i]
	}
	return out, more
}

// wrap indents s after prefix and wraps it at textWidth.
func wrap(prefix, s string) string {
	var b strings.Builder
	line := prefix
	indent := strings.Repeat(" ", len(prefix))
	for _, w := range strings.Fields(s) {
		if len(line) > len(indent) && len(line)+1+len(w) > textWidth {
			b.WriteString(strings.TrimRight(line, " ") + "\n")
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += w
	}
	b.WriteString(line + "\n")
	return b.String()
}

func dur(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%.1fus", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.2fs", d.Seconds())
}

// sparkline draws counts with eight block heights, scaled to the maximum.
func sparkline(counts []uint64) string {
	blocks := []rune(" ▁▂▃▄▅▆▇█")
	var top uint64
	for _, c := range counts {
		top = max(top, c)
	}
	var b strings.Builder
	for _, c := range counts {
		i := 0
		if c > 0 {
			i = 1 + int(c*7/max(top, 1))
		}
		b.WriteRune(blocks[min(i, 8)])
	}
	return fmt.Sprintf("|%s| max %d", b.String(), top)
}

// workHistogram shows the share of polls per power-of-two range of work.
func workHistogram(work []uint64) string {
	var total uint64
	for _, c := range work {
		total += c
	}
	if total == 0 {
		return "no polls"
	}
	var parts []string
	for lo := 0; lo < len(work); {
		hi := max(lo*2, lo+1) // 0, 1, 2-3, 4-7, ...
		if lo == 0 {
			hi = 1
		}
		var c uint64
		for i := lo; i < min(hi, len(work)); i++ {
			c += work[i]
		}
		label := fmt.Sprint(lo)
		if hi-lo > 1 {
			label = fmt.Sprintf("%d-%d", lo, hi-1)
		}
		if lo == len(work)-1 && lo == 64 {
			label = "64+"
		}
		if c > 0 {
			parts = append(parts, fmt.Sprintf("%s: %.1f%%", label, 100*float64(c)/float64(total)))
		}
		lo = hi
	}
	return strings.Join(parts, "  ")
}
