package probes

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/vmaxdp/vmaxdp/bpf"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

// Filter selects what the collectors record; zero fields match anything.
// Flow fields match IPv4 packets only; events without a packet (napi_poll,
// softirq, xdp_*) are kept by a flow filter, since they are the context of
// the flows recorded. A netns or interface filter keeps the device events
// of that namespace or interface and leaves out softirq events, which
// belong to a CPU, not a device.
type Filter struct {
	Netns   uint32 // network namespace inode
	Ifindex uint32 // in Netns when set
	L4Proto uint8  // IPPROTO_*
	Src     netip.Addr
	Dst     netip.Addr
	Host    netip.Addr // either address
	SrcPort uint16
	DstPort uint16
	Port    uint16 // either port
}

// String returns the filter in nettrace record's flag syntax.
func (f *Filter) String() string {
	var parts []string
	add := func(cond bool, format string, v any) {
		if cond {
			parts = append(parts, fmt.Sprintf(format, v))
		}
	}
	add(f.Netns != 0, "netns=%d", f.Netns)
	add(f.Ifindex != 0, "ifindex=%d", f.Ifindex)
	add(f.L4Proto != 0, "proto=%d", f.L4Proto)
	add(f.Src.IsValid(), "src=%s", f.Src)
	add(f.Dst.IsValid(), "dst=%s", f.Dst)
	add(f.Host.IsValid(), "host=%s", f.Host)
	add(f.SrcPort != 0, "sport=%d", f.SrcPort)
	add(f.DstPort != 0, "dport=%d", f.DstPort)
	add(f.Port != 0, "port=%d", f.Port)
	return strings.Join(parts, " ")
}

// Options configure a Collector.
type Options struct {
	// Probes to attach; nil means all.
	Probes []*Probe
	Filter Filter
	// Aggregate counts events in a BPF map instead of recording each one.
	Aggregate bool
	// RingSize is the ring buffer size in bytes, a power of two multiple of
	// the page size; 0 means 16 MiB.
	RingSize uint32
	// CapLen is how many bytes of each packet to capture, at most
	// tracefile.MaxCapLen; 0 means the most.
	CapLen int
}

// Attached is a probe that is collecting, and how it was attached.
type Attached struct {
	*Probe
	Attach string
}

// Collector runs the selected probes.
type Collector struct {
	objs     *ebpf.Collection
	links    []link.Link
	rd       *Ring
	attached []Attached
	notes    []string
	ncpu     int
	caplen   int
}

// Open loads and attaches the collectors. A probe the kernel cannot serve
// is left out with a note (Notes); Open fails only when none is left.
func Open(opts *Options) (*Collector, error) {
	if opts == nil {
		opts = &Options{}
	}
	sel := opts.Probes
	if sel == nil {
		for i := range All {
			sel = append(sel, &All[i])
		}
	}
	spec, err := bpf.LoadNettrace()
	if err != nil {
		return nil, fmt.Errorf("load nettrace BPF spec: %w", err)
	}
	c := &Collector{caplen: capLen(opts)}
	f := KernelFeatures()
	if f.Kprobe != nil && f.Fentry != nil {
		c.notes = append(c.notes, fmt.Sprintf("%v; %v: attaching tracepoints (tp_btf) only", f.Kprobe, f.Fentry))
	}
	want := map[string]*Probe{}
	for _, p := range sel {
		if err := checkArgs(p); err != nil {
			c.notes = append(c.notes, fmt.Sprintf("%v: not attached", err))
			continue
		}
		want[p.Program] = p
	}
	for name := range spec.Programs {
		if want[name] == nil {
			delete(spec.Programs, name)
		}
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("no probe can attach: %s: %w", strings.Join(c.notes, "; "), ErrNotSupported)
	}
	if err := setConfig(spec, opts); err != nil {
		return nil, err
	}
	spec.Maps["events"].MaxEntries = ringSize(opts)

	objs, err := ebpf.NewCollection(spec)
	if err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load nettrace collectors: %+v", ve)
		}
		return nil, fmt.Errorf("load nettrace collectors: %w", err)
	}
	c.objs = objs
	for _, p := range sel {
		if want[p.Program] == nil {
			continue
		}
		l, err := link.AttachTracing(link.TracingOptions{Program: objs.Programs[p.Program], AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			c.notes = append(c.notes, fmt.Sprintf("%s: attach tp_btf: %v: not attached", p.Name, err))
			continue
		}
		c.links = append(c.links, l)
		c.attached = append(c.attached, Attached{p, "tp_btf"})
	}
	if len(c.attached) == 0 {
		c.Close()
		return nil, fmt.Errorf("no probe attached: %s: %w", strings.Join(c.notes, "; "), ErrNotSupported)
	}
	if c.rd, err = newRing(objs.Maps["events"]); err != nil {
		c.Close()
		return nil, fmt.Errorf("nettrace ring buffer: %w", err)
	}
	if c.ncpu, err = ebpf.PossibleCPU(); err != nil {
		c.Close()
		return nil, fmt.Errorf("possible CPUs: %w", err)
	}
	return c, nil
}

func setConfig(spec *ebpf.CollectionSpec, opts *Options) error {
	f := &opts.Filter
	caplen := capLen(opts)
	addr := func(a netip.Addr) (uint32, error) {
		if !a.IsValid() {
			return 0, nil
		}
		if !a.Is4() {
			return 0, fmt.Errorf("filter address %s: only IPv4 is filtered in the kernel", a)
		}
		b := a.As4()
		return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24, nil // network order in memory
	}
	vars := map[string]any{
		"cfg_netns":     f.Netns,
		"cfg_ifindex":   f.Ifindex,
		"cfg_l4proto":   f.L4Proto,
		"cfg_sport":     f.SrcPort,
		"cfg_dport":     f.DstPort,
		"cfg_port":      f.Port,
		"cfg_aggregate": boolByte(opts.Aggregate),
		"cfg_caplen":    uint32(caplen),
		// An eighth of the ring: the reader wakes well before it fills.
		"cfg_wakeup_bytes": uint64(ringSize(opts) / 8),
	}
	for name, a := range map[string]netip.Addr{"cfg_saddr": f.Src, "cfg_daddr": f.Dst, "cfg_host": f.Host} {
		v, err := addr(a)
		if err != nil {
			return err
		}
		vars[name] = v
	}
	for name, v := range vars {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("nettrace BPF spec has no variable %s", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
	}
	return nil
}

func capLen(opts *Options) int {
	if opts.CapLen <= 0 || opts.CapLen > tracefile.MaxCapLen {
		return tracefile.MaxCapLen
	}
	return opts.CapLen
}

func ringSize(opts *Options) uint32 {
	if opts.RingSize == 0 {
		return 16 << 20
	}
	return opts.RingSize
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// CapLen returns how many bytes of each packet the collectors capture.
func (c *Collector) CapLen() int { return c.caplen }

// Attached returns the probes that are collecting.
func (c *Collector) Attached() []Attached { return c.attached }

// Notes returns what Open had to say about missing kernel features and
// probes left out.
func (c *Collector) Notes() []string { return c.notes }

// Ring returns the ring buffer reader: Batch hands samples over in place,
// Wait blocks until the BPF side signals or a deadline passes.
func (c *Collector) Ring() *Ring { return c.rd }

// Stats returns per-probe, per-CPU events and losses since Open. A probe
// whose program the kernel skipped because it was already running on that
// CPU (an interrupt nesting the same tracepoint) gets one more entry, on
// tracefile.CPUAny: the kernel counts those per program only
// (recursion_misses), and they are lost events like any other.
func (c *Collector) Stats() ([]tracefile.LossEntry, error) {
	m := c.objs.Maps["probe_stats"]
	vals := make([]bpf.NettraceProbeCounters, c.ncpu)
	var out []tracefile.LossEntry
	for _, a := range c.attached {
		if err := m.Lookup(uint32(a.ID), &vals); err != nil {
			return nil, fmt.Errorf("read probe_stats[%s]: %w", a.Name, err)
		}
		for cpu, v := range vals {
			out = append(out, tracefile.LossEntry{Probe: uint16(a.ID), CPU: uint32(cpu), Events: v.Events, Lost: v.Lost})
		}
		st, err := c.objs.Programs[a.Program].Stats()
		if err != nil {
			return nil, fmt.Errorf("read %s program stats: %w", a.Name, err)
		}
		if st.RecursionMisses > 0 {
			out = append(out, tracefile.LossEntry{Probe: uint16(a.ID), CPU: tracefile.CPUAny, Events: st.RecursionMisses, Lost: st.RecursionMisses})
		}
	}
	return out, nil
}

// Aggregates returns the counts of the aggregate mode, summed over CPUs.
// agg_slots names the slot of each key in agg_counts, where each CPU
// counts; a key inserted after agg_slots was read shows at the next call.
func (c *Collector) Aggregates() ([]tracefile.AggEntry, error) {
	slots, counts := c.objs.Maps["agg_slots"], c.objs.Maps["agg_counts"]
	var (
		k    bpf.NettraceAggKey
		slot uint32
		v    = make([]uint64, c.ncpu)
		out  []tracefile.AggEntry
	)
	it := slots.Iterate()
	for it.Next(&k, &slot) {
		if err := counts.Lookup(slot, &v); err != nil {
			return nil, fmt.Errorf("read agg_counts[%d]: %w", slot, err)
		}
		var n uint64
		for _, x := range v {
			n += x
		}
		out = append(out, tracefile.AggEntry{Probe: k.Probe, Netns: k.Netns, Ifindex: k.Ifindex, Reason: k.Reason, Location: k.Location, Count: n})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read agg_slots: %w", err)
	}
	return out, nil
}

// Detach detaches the probes and keeps their maps, so that what they
// counted and wrote can still be read, and no longer changes: once Detach
// returns no program is running (closing a link waits for those in
// flight), and Ring drains to empty.
func (c *Collector) Detach() error {
	var errs []error
	for _, l := range c.links {
		errs = append(errs, l.Close())
	}
	c.links = nil
	return errors.Join(errs...)
}

// Close detaches the probes and frees their maps.
func (c *Collector) Close() error {
	errs := []error{c.Detach()}
	if c.rd != nil {
		errs = append(errs, c.rd.Close())
	}
	if c.objs != nil {
		c.objs.Close()
	}
	return errors.Join(errs...)
}
