package report

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/tracefile"
	"github.com/vmaxdp/vmaxdp/tracefmt"
)

// Options configure Build.
type Options struct {
	Filter Filter
	// Top is how many rows each table keeps (default 10).
	Top int
}

// Bounds on what Build keeps, whatever the recording's length.
const (
	MaxKeys      = 1 << 16 // distinct keys of one table; more go to "other"
	MaxInFlight  = 1 << 18 // packets followed through the stages at once
	maxBuckets   = 240     // points of a time series
	maxIntervals = 100000  // counter intervals (27 h at 1 s)
	maxCPUs      = 4096
)

// Drop reasons of XDP events, next to the kernel's enum skb_drop_reason.
const (
	reasonXDPException   = 1 << 30 // | action
	reasonXDPRedirectErr = 1 << 31 // | -err
)

// Stages, in Report.Stages order.
const (
	stRaiseEntry = iota
	stEntryReceive
	stBacklog
	stDelivered
	stDropped
	stConsumed
	stQueueXmit
	stXmitPeer
	stXmitFree
	numStages
)

var stageNames = [numStages][3]string{
	{"softirq raise to entry (NET_RX)", "irq:softirq_raise", "irq:softirq_entry"},
	{"softirq entry to receive", "irq:softirq_entry", "net:netif_receive_skb"},
	{"backlog (netif_rx to receive)", "net:netif_rx", "net:netif_receive_skb"},
	{"receive to delivered", "net:netif_receive_skb", "skb:skb_copy_datagram_iovec"},
	{"receive to dropped", "net:netif_receive_skb", "skb:kfree_skb"},
	{"receive to consumed", "net:netif_receive_skb", "skb:consume_skb"},
	{"queue to xmit", "net:net_dev_queue", "net:net_dev_xmit"},
	{"xmit to peer receive", "net:net_dev_xmit", "net:netif_receive_skb"},
	{"xmit to freed", "net:net_dev_xmit", "skb:consume_skb/kfree_skb"},
}

const (
	vecNetTX = 2
	vecNetRX = 3
	numVecs  = 10
)

type devKey struct {
	netns, ifindex uint32
}

type flowKey struct {
	reason uint32
	proto  uint8
	src    netip.AddrPort
	dst    netip.AddrPort
}

type rxFlowKey struct {
	dev      devKey
	proto    uint8
	src, dst netip.AddrPort
}

type napiKey struct {
	dev devKey
	cpu uint32
}

type counterKey struct {
	source, device, name string
	netns                uint32
}

// row accumulates one table line.
type row struct {
	count       uint64
	first, last uint64
	reasons     map[uint32]uint64 // by_location, by_device: which reasons
}

func (r *row) add(t uint64, reason uint32, n uint64, withReasons bool) {
	if r.count == 0 {
		r.first = t
	}
	r.count += n
	r.last = max(r.last, t)
	if withReasons {
		if r.reasons == nil {
			r.reasons = map[uint32]uint64{}
		}
		r.reasons[reason] += n
	}
}

type table[K comparable] struct {
	rows  map[K]*row
	other row
}

func (t *table[K]) add(k K, time uint64, reason uint32, n uint64, withReasons bool) {
	r := t.rows[k]
	if r == nil {
		if len(t.rows) >= MaxKeys {
			t.other.add(time, reason, n, false)
			return
		}
		if t.rows == nil {
			t.rows = map[K]*row{}
		}
		r = &row{}
		t.rows[k] = r
	}
	r.add(time, reason, n, withReasons)
}

// skbState is what is known of a packet in flight; times are absolute ns.
type skbState struct {
	queued, xmit, enqueued, received uint64
}

type cpuState struct {
	raise, entry [numVecs]uint64
	raised, runs [numVecs]uint64
	time         [numVecs]hist
}

type napiStat struct {
	polls, work, exhausted uint64
	budget                 int32
}

type counterState struct {
	prev, total uint64
}

type interval struct {
	start, end uint64
	drops      map[uint32]uint64
	counters   []CounterDelta
}

// series counts per key per time bucket; when time runs past maxBuckets
// the buckets double in width, so memory stays fixed.
type series struct {
	width uint64
	rows  map[string][]uint64
}

func (s *series) add(rel uint64, key string, n uint64) {
	if s.width == 0 {
		s.width = uint64(100 * time.Millisecond)
		s.rows = map[string][]uint64{}
	}
	b := rel / s.width
	for b >= maxBuckets {
		s.width *= 2
		for k, r := range s.rows {
			for i := range r {
				if i%2 == 0 {
					r[i/2] = r[i]
				} else {
					r[i/2] += r[i]
				}
			}
			s.rows[k] = r[:(len(r)+1)/2]
		}
		b = rel / s.width
	}
	r := s.rows[key]
	if uint64(len(r)) <= b {
		r = append(r, make([]uint64, b+1-uint64(len(r)))...)
		s.rows[key] = r
	}
	r[b] += n
}

type builder struct {
	opts *Options
	r    *tracefile.Reader
	meta *tracefile.Meta
	// probes is indexed by the file's probe IDs.
	probes []probeState
	start  uint64  // CLOCK_MONOTONIC of the recording's start
	secs   float64 // the recording's duration; set by report
	last   uint64  // latest time seen
	from   uint64  // absolute bounds of the time filter
	to     uint64

	loss map[[2]uint32]tracefile.LossEntry

	drops      uint64
	byReason   table[uint32]
	byLocation table[uint64]
	byDevice   table[devKey]
	byFlow     table[flowKey]
	rxFlows    table[rxFlowKey] // packets the kernel received, for the not-offloaded rule
	devNames   map[devKey]string
	ambiguous  map[string]bool   // device names in several namespaces; set by report
	reasons    map[uint32]string // reason names, made once
	dropSeries series
	rates      series

	// evidence the rules use
	sockets   map[uint64]sockInfo // udp_fail_queue_rcv_skb, by struct sock
	redirects map[redirectKey]uint64
	aborted   map[int32]uint64 // XDP program id

	napi     map[napiKey]*napiStat
	napiWork [65]uint64
	cpus     []*cpuState

	skbs      map[uint64]skbState
	stages    [numStages]hist
	untracked uint64

	counters  map[counterKey]*counterState
	snapTime  uint64
	intervals []interval
	pending   map[uint32]uint64 // drops after the last snapshot

	agg map[tracefile.AggEntry]uint64 // aggregate mode: previous cumulative counts
}

// probeState is one probe of the file.
type probeState struct {
	kind    probes.ID
	known   bool   // a probe this nettrace knows by name
	written uint64 // events in the file (aggregate mode: counted)
}

type sockInfo struct {
	count          uint64
	rcvbuf, rmem   int32
	rc             int32
	dst            netip.AddrPort
	netns, ifindex uint32
}

type redirectKey struct {
	dev   devKey
	err   int32
	mapID int32
	index int32
}

// Build reads a recording and reports on it. A recording cut short gives a
// report marked Incomplete, not an error; a corrupt one gives an error
// naming the record's offset.
func Build(r *tracefile.Reader, opts *Options) (*Report, error) {
	if opts == nil {
		opts = &Options{}
	}
	b := &builder{
		opts: opts, r: r, meta: r.Meta(), loss: map[[2]uint32]tracefile.LossEntry{},
		devNames: map[devKey]string{}, reasons: map[uint32]string{}, sockets: map[uint64]sockInfo{}, redirects: map[redirectKey]uint64{},
		aborted: map[int32]uint64{}, napi: map[napiKey]*napiStat{}, skbs: map[uint64]skbState{},
		counters: map[counterKey]*counterState{}, pending: map[uint32]uint64{}, agg: map[tracefile.AggEntry]uint64{},
	}
	for _, p := range b.meta.Probes {
		if int(p.ID) >= len(b.probes) {
			b.probes = append(b.probes, make([]probeState, int(p.ID)+1-len(b.probes))...)
		}
		for _, q := range probes.All {
			if q.Name == p.Name {
				b.probes[p.ID] = probeState{kind: q.ID, known: true}
			}
		}
	}
	b.start = uint64(max(b.meta.ClockMonotonic, 0))
	b.from = b.start + uint64(opts.Filter.From)
	if opts.Filter.To != 0 {
		b.to = b.start + uint64(opts.Filter.To)
	}
	var incomplete error
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if errors.Is(err, tracefile.ErrTruncated) {
			incomplete = err
			break
		}
		if err != nil {
			return nil, err
		}
		if err := b.record(&rec); err != nil {
			return nil, fmt.Errorf("%s record at offset %d: %w", rec.Type, rec.Offset, err)
		}
	}
	return b.report(incomplete), nil
}

func (b *builder) record(rec *tracefile.Record) error {
	switch rec.Type {
	case tracefile.TypeEvent:
		b.event(b.r.Event())
	case tracefile.TypeLoss:
		var l tracefile.Loss
		if err := rec.Decode(&l); err != nil {
			return err
		}
		for _, e := range l.Entries {
			b.loss[[2]uint32{uint32(e.Probe), e.CPU}] = e
		}
		b.last = max(b.last, l.Time)
	case tracefile.TypeCounters:
		var c tracefile.Counters
		if err := rec.Decode(&c); err != nil {
			return err
		}
		b.counter(&c)
	case tracefile.TypeAggregate:
		var a tracefile.Aggregate
		if err := rec.Decode(&a); err != nil {
			return err
		}
		b.aggregate(&a)
	}
	return nil
}

// probe returns the state of a probe the file declares and this nettrace
// knows, else nil.
func (b *builder) probe(id uint16) *probeState {
	if int(id) < len(b.probes) && b.probes[id].known {
		return &b.probes[id]
	}
	return nil
}

func (b *builder) inTime(t uint64) bool {
	return t >= b.from && (b.to == 0 || t <= b.to)
}

func (b *builder) rel(t uint64) uint64 {
	if t < b.start {
		return 0
	}
	return t - b.start
}

// devName names a device, learning names from events that carry one.
func (b *builder) devName(k devKey) string {
	if n, ok := b.devNames[k]; ok {
		return n
	}
	n := b.r.Interface(k.netns, k.ifindex)
	if n == "" {
		n = fmt.Sprintf("ifindex %d", k.ifindex)
	}
	b.devNames[k] = n
	return n
}

func (b *builder) devMatch(e *tracefile.Event) bool {
	if b.opts.Filter.Dev == "" {
		return true
	}
	return e.Ifindex != 0 && b.devName(devKey{e.Netns, e.Ifindex}) == b.opts.Filter.Dev
}

func (b *builder) event(e *tracefile.Event) {
	b.last = max(b.last, e.Time)
	p := b.probe(e.Probe)
	if p == nil {
		return
	}
	p.written++
	f := &b.opts.Filter
	if !b.inTime(e.Time) || (f.CPUs != nil && !f.CPUs[e.CPU]) {
		return
	}
	kind := p.kind
	switch kind {
	case probes.SoftirqRaise, probes.SoftirqEntry, probes.SoftirqExit:
		b.softirq(kind, e)
		b.rates.add(b.rel(e.Time), probes.All[kind].Name, 1)
		return
	case probes.NapiPoll:
		if b.devMatch(e) {
			b.napiPoll(e)
			b.rates.add(b.rel(e.Time), probes.All[kind].Name, 1)
		}
		return
	}
	if f.Dev != "" && !b.devMatch(e) {
		return
	}
	reason, isDrop := b.dropReason(kind, e)
	if f.Flow != nil || f.Reasons != nil {
		if f.Reasons != nil && (!isDrop || !f.Reasons[b.reasonName(reason)]) {
			return
		}
		if f.Flow != nil {
			fl, ok := tracefmt.DecodeFlow(e)
			if !ok || !f.Flow.match(&fl) {
				return
			}
		}
	}
	b.rates.add(b.rel(e.Time), probes.All[kind].Name, 1)
	if isDrop {
		b.drop(e, reason)
	}
	b.stage(kind, e)
	switch kind {
	case probes.UdpFailQueueRcvSkb, probes.SockRcvqueueFull:
		s := b.sockets[e.Sk]
		if s.count == 0 && len(b.sockets) >= MaxKeys {
			return
		}
		s.count++
		if kind == probes.UdpFailQueueRcvSkb {
			s.rc, s.rcvbuf, s.rmem = e.Arg[0], e.Arg[1], e.Arg[2]
		} else {
			s.rcvbuf, s.rmem = e.Arg[0], e.Arg[1]
		}
		if fl, ok := tracefmt.DecodeFlow(e); ok {
			s.dst = fl.Dst
		}
		s.netns, s.ifindex = e.Netns, e.Ifindex
		b.sockets[e.Sk] = s
	case probes.XdpRedirectErr:
		k := redirectKey{devKey{e.Netns, e.Ifindex}, e.Arg[1], e.Arg[2], e.Arg[3]}
		if _, ok := b.redirects[k]; ok || len(b.redirects) < MaxKeys {
			b.redirects[k]++
		}
	case probes.XdpException:
		if _, ok := b.aborted[e.Arg[0]]; ok || len(b.aborted) < MaxKeys {
			b.aborted[e.Arg[0]]++
		}
	}
}

// dropReason says whether an event is a drop, and why.
func (b *builder) dropReason(kind probes.ID, e *tracefile.Event) (uint32, bool) {
	switch kind {
	case probes.KfreeSkb:
		return e.Reason, true
	case probes.XdpException:
		return reasonXDPException | uint32(e.Arg[1])&0xff, true
	case probes.XdpRedirectErr:
		return reasonXDPRedirectErr | uint32(-e.Arg[1])&0xffff, true
	}
	return 0, false
}

// reasonName names a drop reason. Names are made once per reason: the
// reason filter and the drop series ask for one per dropped packet.
func (b *builder) reasonName(r uint32) string {
	if n, ok := b.reasons[r]; ok {
		return n
	}
	var n string
	switch {
	case r&reasonXDPRedirectErr != 0:
		name := unix.ErrnoName(syscall.Errno(r & 0xffff))
		if name == "" {
			name = fmt.Sprintf("errno %d", r&0xffff)
		}
		n = "XDP_REDIRECT_ERR(" + name + ")"
	case r&reasonXDPException != 0:
		n = "XDP_EXCEPTION(" + tracefmt.XDPAction(int32(r&0xff)) + ")"
	default:
		n = tracefmt.Reason(b.meta, r)
	}
	b.reasons[r] = n
	return n
}

func (b *builder) drop(e *tracefile.Event, reason uint32) {
	b.drops++
	t := e.Time
	b.byReason.add(reason, t, 0, 1, false)
	if e.Location != 0 {
		b.byLocation.add(e.Location, t, reason, 1, true)
	}
	if e.Ifindex != 0 {
		b.byDevice.add(devKey{e.Netns, e.Ifindex}, t, reason, 1, true)
	}
	if fl, ok := tracefmt.DecodeFlow(e); ok {
		b.byFlow.add(flowKey{reason, fl.Proto, fl.Src, fl.Dst}, t, 0, 1, false)
	}
	b.dropSeries.add(b.rel(t), b.reasonName(reason), 1)
	b.intervalDrop(t, reason, 1)
}

func (b *builder) intervalDrop(t uint64, reason uint32, n uint64) {
	if t > b.snapTime || len(b.intervals) == 0 {
		b.pending[reason] += n
		return
	}
	// A late event: the recorder wrote the snapshot before draining it.
	i := sort.Search(len(b.intervals), func(i int) bool { return b.intervals[i].end >= t })
	if i == len(b.intervals) {
		i--
	}
	iv := &b.intervals[i]
	if iv.drops == nil {
		iv.drops = map[uint32]uint64{}
	}
	iv.drops[reason] += n
}

func (b *builder) cpu(c uint32) *cpuState {
	if c >= maxCPUs {
		return nil
	}
	for int(c) >= len(b.cpus) {
		b.cpus = append(b.cpus, nil)
	}
	if b.cpus[c] == nil {
		b.cpus[c] = &cpuState{}
	}
	return b.cpus[c]
}

func (b *builder) softirq(kind probes.ID, e *tracefile.Event) {
	vec := e.Arg[0]
	c := b.cpu(e.CPU)
	if c == nil || vec < 0 || vec >= numVecs {
		return
	}
	switch kind {
	case probes.SoftirqRaise:
		c.raised[vec]++
		if c.raise[vec] == 0 {
			c.raise[vec] = e.Time
		}
	case probes.SoftirqEntry:
		c.runs[vec]++
		if vec == vecNetRX && c.raise[vec] != 0 && e.Time >= c.raise[vec] {
			b.stages[stRaiseEntry].add(e.Time - c.raise[vec])
		}
		c.raise[vec] = 0
		c.entry[vec] = e.Time
	case probes.SoftirqExit:
		if c.entry[vec] != 0 && e.Time >= c.entry[vec] {
			c.time[vec].add(e.Time - c.entry[vec])
		}
		c.entry[vec] = 0
	}
}

func (b *builder) napiPoll(e *tracefile.Event) {
	k := napiKey{devKey{e.Netns, e.Ifindex}, e.CPU}
	s := b.napi[k]
	if s == nil {
		if len(b.napi) >= MaxKeys {
			return
		}
		s = &napiStat{}
		b.napi[k] = s
	}
	work, budget := e.Arg[0], e.Arg[1]
	s.polls++
	s.work += uint64(max(work, 0))
	s.budget = budget
	if budget > 0 && work >= budget {
		s.exhausted++
	}
	b.napiWork[min(max(work, 0), int32(len(b.napiWork)-1))]++
}

// stage follows a packet by its skb address. veth hands the same skb from
// one namespace's transmit to the other's receive, so one packet may cross
// both paths.
func (b *builder) stage(kind probes.ID, e *tracefile.Event) {
	t := e.Time
	switch kind {
	case probes.NetDevQueue:
		b.track(e.Skb, skbState{queued: t})
	case probes.NetDevXmit:
		s := b.skbs[e.Skb]
		if s.queued != 0 && t >= s.queued {
			b.stages[stQueueXmit].add(t - s.queued)
		}
		b.track(e.Skb, skbState{xmit: t})
	case probes.NetifRx:
		s := b.skbs[e.Skb]
		s.enqueued = t
		b.track(e.Skb, s)
	case probes.NetifReceiveSkb:
		if fl, ok := tracefmt.DecodeFlow(e); ok {
			b.rxFlows.add(rxFlowKey{devKey{e.Netns, e.Ifindex}, fl.Proto, fl.Src, fl.Dst}, t, 0, 1, false)
		}
		s := b.skbs[e.Skb]
		if s.xmit != 0 && t >= s.xmit {
			b.stages[stXmitPeer].add(t - s.xmit)
		}
		if s.enqueued != 0 && t >= s.enqueued {
			b.stages[stBacklog].add(t - s.enqueued)
		}
		if c := b.cpu(e.CPU); c != nil && c.entry[vecNetRX] != 0 && t >= c.entry[vecNetRX] {
			b.stages[stEntryReceive].add(t - c.entry[vecNetRX])
		}
		b.track(e.Skb, skbState{received: t})
	case probes.SkbCopyDatagramIovec:
		if s, ok := b.skbs[e.Skb]; ok {
			if s.received != 0 && t >= s.received {
				b.stages[stDelivered].add(t - s.received)
			}
			delete(b.skbs, e.Skb)
		}
	case probes.KfreeSkb, probes.ConsumeSkb:
		if s, ok := b.skbs[e.Skb]; ok {
			switch {
			case s.received != 0 && t >= s.received && kind == probes.KfreeSkb:
				b.stages[stDropped].add(t - s.received)
			case s.received != 0 && t >= s.received:
				b.stages[stConsumed].add(t - s.received)
			case s.xmit != 0 && t >= s.xmit:
				b.stages[stXmitFree].add(t - s.xmit)
			}
			delete(b.skbs, e.Skb)
		}
	}
}

func (b *builder) track(skb uint64, s skbState) {
	if _, ok := b.skbs[skb]; !ok && len(b.skbs) >= MaxInFlight {
		// Packets whose end was not recorded (lost events, probes not
		// selected) pile up; forget them rather than grow.
		b.untracked += uint64(len(b.skbs))
		clear(b.skbs)
	}
	b.skbs[skb] = s
}

func (b *builder) counter(c *tracefile.Counters) {
	b.last = max(b.last, c.Time)
	if c.Time > b.snapTime {
		iv := interval{start: b.snapTime, end: c.Time}
		if len(b.intervals) == 0 {
			iv.start = b.start
		}
		if len(b.pending) > 0 {
			iv.drops, b.pending = b.pending, map[uint32]uint64{}
		}
		if len(b.intervals) < maxIntervals {
			b.intervals = append(b.intervals, iv)
		} else {
			last := &b.intervals[len(b.intervals)-1]
			last.end = iv.end
			for r, n := range iv.drops {
				if last.drops == nil {
					last.drops = map[uint32]uint64{}
				}
				last.drops[r] += n
			}
		}
		b.snapTime = c.Time
	}
	timeOK := b.inTime(c.Time)
	devOK := b.opts.Filter.Dev == "" || c.Device == "" || c.Device == b.opts.Filter.Dev ||
		strings.HasPrefix(c.Device, b.opts.Filter.Dev+"/") || c.Source == "softnet" || c.Source == "vmaxdp"
	for name, v := range c.Values {
		k := counterKey{c.Source, c.Device, name, c.Netns}
		s := b.counters[k]
		if s == nil {
			if len(b.counters) >= MaxKeys {
				continue
			}
			s = &counterState{}
			b.counters[k] = s
			if len(b.intervals) <= 1 {
				s.prev = v // the recording's first snapshot: the baseline
				continue
			}
			// A counter that appeared during the recording (a socket, a
			// queue, a device) started from zero within it.
		}
		d := v - s.prev
		if v < s.prev {
			d = v // the counter was reset (device or socket recreated)
		}
		s.prev = v
		if d == 0 || !timeOK || !devOK {
			continue
		}
		s.total += d
		if interesting(c.Source, name) {
			iv := &b.intervals[len(b.intervals)-1]
			iv.counters = append(iv.counters, CounterDelta{Source: c.Source, Device: c.Device, Netns: c.Netns, Name: name, Delta: d})
		}
	}
}

// interesting counters are the ones that say something went wrong (or,
// for vmaxdp, where traffic went); they are lined up with drops per interval.
func interesting(source, name string) bool {
	switch source {
	case "vmaxdp", "xsk":
		return true
	case "softnet":
		return name == "dropped" || name == "time_squeeze" || name == "flow_limit_count"
	}
	n := strings.ToLower(name)
	for _, w := range []string{"drop", "miss", "err", "fifo", "full", "empty", "squeeze", "fail", "noports", "discard", "invalid", "over", "no_bufs", "no_space"} {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// aggregate turns the aggregate mode's cumulative counts into drops.
func (b *builder) aggregate(a *tracefile.Aggregate) {
	b.last = max(b.last, a.Time)
	for _, e := range a.Entries {
		k := e
		k.Count = 0
		d := e.Count - min(e.Count, b.agg[k])
		b.agg[k] = e.Count
		p := b.probe(e.Probe)
		if p == nil || d == 0 || !b.inTime(a.Time) {
			continue
		}
		kind := p.kind
		p.written += d
		b.rates.add(b.rel(a.Time), probes.All[kind].Name, d)
		if kind != probes.KfreeSkb {
			continue
		}
		if b.opts.Filter.Reasons != nil && !b.opts.Filter.Reasons[b.reasonName(e.Reason)] {
			continue
		}
		dk := devKey{e.Netns, e.Ifindex}
		if b.opts.Filter.Dev != "" && (e.Ifindex == 0 || b.devName(dk) != b.opts.Filter.Dev) {
			continue
		}
		b.drops += d
		b.byReason.add(e.Reason, a.Time, 0, d, false)
		if e.Location != 0 {
			b.byLocation.add(e.Location, a.Time, e.Reason, d, true)
		}
		if e.Ifindex != 0 {
			b.byDevice.add(dk, a.Time, e.Reason, d, true)
		}
		b.dropSeries.add(b.rel(a.Time), b.reasonName(e.Reason), d)
		b.intervalDrop(a.Time, e.Reason, d)
	}
}
