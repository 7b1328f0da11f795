// Package record is nettrace record's pipeline: collectors (probes/) to a
// trace file (tracefile/), with the symbols, interface names, losses and
// counter snapshots that make the file explain itself later.
//
// It must not format events for people: that is tracefmt/'s job.
package record

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/ksym"
	"github.com/vmaxdp/vmaxdp/internal/snapshot"
	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

// Options configure a recording.
type Options struct {
	Probes probes.Options
	// Interval between loss, counter and aggregate records; 0 means 1 s.
	Interval time.Duration
	// Command is what is being recorded, for the file's meta.
	Command []string
	// Version of the recorder, for the file's meta.
	Version string
	// Ready, when set, is called once the probes are attached.
	Ready func(notes []string)
	// Progress, when set, is called every interval.
	Progress func(Progress)
	// StatsDir is where vmaxdp processes publish their counters files
	// (VMAXDP_STATS_DIR), recorded with the other counters; "": none.
	StatsDir string
}

// Progress is the state of a recording.
type Progress struct {
	Elapsed time.Duration
	Events  uint64 // written to the file
	Lost    uint64 // counted as lost by the kernel side
	Bytes   int64  // written to the file
}

// Summary is what a finished recording did.
type Summary struct {
	Progress
}

// Run records into out until ctx is done; context.Cause(ctx) becomes the
// End record's reason. The file is complete (has an End record) unless
// writing failed.
func Run(ctx context.Context, out io.Writer, opts *Options) (*Summary, error) {
	interval := opts.Interval
	if interval <= 0 {
		interval = time.Second
	}
	c, err := probes.Open(&opts.Probes)
	if err != nil {
		return nil, err
	}
	defer c.Close()

	meta, err := newMeta(c, opts)
	if err != nil {
		return nil, err
	}
	syms, err := ksym.Load()
	if err != nil {
		meta.Notes = append(meta.Notes, fmt.Sprintf("locations not symbolized: %v", err))
	}
	nss, err := snapshot.Namespaces()
	if err != nil {
		meta.Notes = append(meta.Notes, err.Error())
	}
	defer func() {
		for i := range nss {
			nss[i].Close()
		}
	}()
	cw := &countingWriter{w: out}
	tw, err := tracefile.NewWriter(cw, meta) // the notes are complete now
	if err != nil {
		return nil, err
	}
	r := &recorder{c: c, tw: tw, syms: syms, nss: nss, statsDir: opts.StatsDir, aggregate: opts.Probes.Aggregate,
		ifaces: make(map[[2]uint32]bool), locs: make(map[uint64]bool), loss: make(map[[2]uint32]tracefile.LossEntry)}
	start := time.Now()
	r.tick() // the counters before anything is recorded
	if opts.Ready != nil {
		opts.Ready(meta.Notes)
	}
	next := start.Add(interval)
	ring := c.Ring()
	batch := func() (int, error) {
		n, err := ring.Batch(r.event)
		if err != nil {
			return n, fmt.Errorf("read nettrace ring buffer: %w", err)
		}
		return n, nil
	}
	for {
		// The clock and ctx are looked at once per batch, and whenever the
		// ring is empty: a busy ring must not starve the snapshots, nor
		// cost a clock read per event.
		n, err := batch()
		if err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			break
		}
		now := time.Now()
		if !now.Before(next) {
			r.tick()
			next = now.Add(interval)
			if opts.Progress != nil {
				opts.Progress(Progress{Elapsed: now.Sub(start), Events: r.events, Lost: r.lost, Bytes: cw.n})
			}
		}
		if n == 0 {
			if err := ring.Wait(wakeAt(now, next)); err != nil {
				return nil, err
			}
		}
	}
	// With the probes detached nothing writes to the ring or the counters
	// any more: the ring drains to empty and the last snapshot is exact
	// (written + lost = seen, aggregates = events).
	if err := c.Detach(); err != nil {
		return nil, fmt.Errorf("detach probes: %w", err)
	}
	for {
		n, err := batch()
		if err != nil {
			return nil, err
		}
		if n == 0 {
			break
		}
	}
	r.tick()
	end := &tracefile.End{Time: monotonic(), Stopped: stopReason(ctx)}
	for _, a := range c.Attached() {
		t := tracefile.ProbeTotals{Probe: uint16(a.ID)}
		for k, l := range r.loss {
			if k[0] == uint32(a.ID) {
				t.Events += l.Events
				t.Lost += l.Lost
			}
		}
		end.Probes = append(end.Probes, t)
	}
	if err := tw.Close(end); err != nil {
		return nil, err
	}
	return &Summary{Progress: Progress{Elapsed: time.Since(start), Events: r.events, Lost: r.lost, Bytes: cw.n}}, r.err
}

// wakeAt is when a wait for events ends: the next snapshot, and at most
// 100 ms from now so that a cancelled ctx is seen.
func wakeAt(now, next time.Time) time.Time {
	if wake := now.Add(100 * time.Millisecond); wake.Before(next) {
		return wake
	}
	return next
}

func stopReason(ctx context.Context) string {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		return cause.Error()
	}
	return "stopped"
}

type recorder struct {
	c         *probes.Collector
	tw        *tracefile.Writer
	syms      *ksym.Table
	nss       []snapshot.Namespace
	statsDir  string
	aggregate bool
	ifaces    map[[2]uint32]bool
	locs      map[uint64]bool
	loss      map[[2]uint32]tracefile.LossEntry // by probe, cpu
	ev        tracefile.Event                   // reused: decoding allocates nothing
	events    uint64
	lost      uint64
	err       error // first snapshot error, reported at the end
}

func (r *recorder) event(raw []byte) error {
	ev := &r.ev
	if err := tracefile.DecodeRawEvent(raw, ev); err != nil {
		return fmt.Errorf("ring buffer sample: %w", err)
	}
	if ev.Ifindex != 0 {
		key := [2]uint32{ev.Netns, ev.Ifindex}
		if !r.ifaces[key] {
			r.ifaces[key] = true
			if err := r.tw.WriteJSON(tracefile.TypeInterface, tracefile.Interface{Netns: ev.Netns, Ifindex: ev.Ifindex, Name: ev.DevString()}); err != nil {
				return err
			}
		}
	}
	switch probes.ID(ev.Probe) {
	case probes.KfreeSkb, probes.ConsumeSkb:
		if loc := ev.Location; loc != 0 && !r.locs[loc] && r.syms != nil {
			r.locs[loc] = true
			if s, ok := r.syms.Lookup(loc); ok {
				if err := r.tw.WriteJSON(tracefile.TypeSymbol, s); err != nil {
					return err
				}
			}
		}
	}
	r.events++
	return r.tw.WriteEvent(ev)
}

// tick writes what changed in the loss counters, a counter snapshot and,
// in aggregate mode, the aggregates.
func (r *recorder) tick() {
	now := monotonic()
	stats, err := r.c.Stats()
	if err != nil {
		r.fail(err)
		return
	}
	loss := tracefile.Loss{Time: now}
	var lost uint64
	for _, s := range stats {
		k := [2]uint32{uint32(s.Probe), s.CPU}
		if r.loss[k] != s {
			r.loss[k] = s
			loss.Entries = append(loss.Entries, s)
		}
		lost += s.Lost
	}
	r.lost = lost
	if len(loss.Entries) > 0 {
		r.fail(r.tw.WriteJSON(tracefile.TypeLoss, loss))
	}
	recs, err := snapshot.Take(now, r.nss, r.statsDir)
	r.fail(err)
	for i := range recs {
		r.fail(r.tw.WriteJSON(tracefile.TypeCounters, &recs[i]))
	}
	if r.aggregate {
		agg, err := r.c.Aggregates()
		r.fail(err)
		if agg != nil {
			r.fail(r.tw.WriteJSON(tracefile.TypeAggregate, tracefile.Aggregate{Time: now, Entries: agg}))
		}
	}
	r.fail(r.tw.Flush())
}

func (r *recorder) fail(err error) {
	if err != nil && r.err == nil {
		r.err = err
	}
}

func newMeta(c *probes.Collector, opts *Options) (*tracefile.Meta, error) {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return nil, fmt.Errorf("uname: %w", err)
	}
	reasons, source, err := probes.DropReasons()
	notes := append([]string(nil), c.Notes()...)
	if err != nil {
		notes = append(notes, err.Error())
	}
	m := &tracefile.Meta{
		Tool:             "nettrace",
		Version:          opts.Version,
		Kernel:           unix.ByteSliceToString(uts.Release[:]),
		Machine:          unix.ByteSliceToString(uts.Machine[:]),
		Hostname:         unix.ByteSliceToString(uts.Nodename[:]),
		Command:          opts.Command,
		Mode:             "events",
		Filter:           opts.Probes.Filter.String(),
		CapLen:           c.CapLen(),
		DropReasons:      reasons,
		DropReasonSource: source,
		Notes:            notes,
	}
	if opts.Probes.Aggregate {
		m.Mode = "aggregate"
	}
	for _, a := range c.Attached() {
		m.Probes = append(m.Probes, tracefile.Probe{ID: uint16(a.ID), Name: a.Name, Attach: a.Attach})
	}
	m.ClockMonotonic = int64(monotonic())
	m.ClockRealtime = time.Now().UnixNano()
	return m, nil
}

// monotonic reads CLOCK_MONOTONIC, the clock of bpf_ktime_get_ns.
func monotonic() uint64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
