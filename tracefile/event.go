package tracefile

import "fmt"

// Version 2 files hold an Event record per event, compact: a fixed part,
// then only the fields the event has, as flagged in present (version 1
// payloads are the kernel's struct event as is, [DecodeRawEvent]). The
// reader keeps reading them; version 3 writes Events records (events.go).
//
//	event   = probe:u16 present:u16 time:u64 cpu:u32 pid:u32 tid:u32 field*
//
// then, in this order, each field whose bit is set in present:
//
//	0 skb:u64  1 location:u64  2 sk:u64  3 netns:u32  4 ifindex:u32  5 len:u32
//	6 reason:u32  7 protocol:u16  8 flags:u16  9-12 arg[0..3]:i32
//	13 comm:[16]  14 dev:[16]  15 caplen:u16 data[caplen]
//
// An event without comm (dev) has the comm (dev) of the previous event on
// its CPU, or none if it is the CPU's first.
const (
	evSkb = 1 << iota
	evLocation
	evSk
	evNetns
	evIfindex
	evLen
	evReason
	evProtocol
	evFlags
	evArg0
	evArg1
	evArg2
	evArg3
	evComm
	evDev
	evData
)

// compactFixed is the size of the fixed part of a compact event.
const compactFixed = 2 + 2 + 8 + 4 + 4 + 4

// MaxCPU bounds an event's CPU number, so that a corrupt one cannot make a
// reader or writer allocate without bound (the kernel's own NR_CPUS limit
// is 8192).
const MaxCPU = 1 << 16

// lastTask is what a compact event may leave out: the previous event on
// the same CPU's comm and dev.
type lastTask struct{ comm, dev [16]byte }

// taskCache holds lastTask per CPU, for a writer or a reader.
type taskCache []lastTask

func (c *taskCache) at(cpu uint32) (*lastTask, error) {
	if cpu >= MaxCPU {
		return nil, fmt.Errorf("event on cpu %d (max %d): %w", cpu, MaxCPU-1, ErrCorrupt)
	}
	if int(cpu) >= len(*c) {
		*c = append(*c, make([]lastTask, int(cpu)+1-len(*c))...)
	}
	return &(*c)[cpu], nil
}

// decodeCompact decodes a compact event from p into e, taking what it
// leaves out from, and updating, cache.
func decodeCompact(p []byte, e *Event, cache *taskCache) error {
	if len(p) < compactFixed {
		return fmt.Errorf("event of %d bytes, shorter than its %d fixed bytes: %w", len(p), compactFixed, ErrCorrupt)
	}
	e.Probe = le.Uint16(p)
	present := le.Uint16(p[2:])
	e.Time = le.Uint64(p[4:])
	e.CPU = le.Uint32(p[12:])
	e.PID = le.Uint32(p[16:])
	e.TID = le.Uint32(p[20:])
	last, err := cache.at(e.CPU)
	if err != nil {
		return err
	}
	// need is the size of every flagged field but the data's, so that the
	// loads below need no check each.
	need := compactFixed
	for bit, size := range [16]int{8, 8, 8, 4, 4, 4, 4, 2, 2, 4, 4, 4, 4, 16, 16, 2} {
		if present&(1<<bit) != 0 {
			need += size
		}
	}
	if need > len(p) {
		return fmt.Errorf("event flags %#04x need %d bytes, it has %d: %w", present, need, len(p), ErrCorrupt)
	}
	f := fields{p: p[compactFixed:], present: present}
	e.Skb, e.Location, e.Sk = f.next(evSkb, 8), f.next(evLocation, 8), f.next(evSk, 8)
	e.Netns, e.Ifindex = uint32(f.next(evNetns, 4)), uint32(f.next(evIfindex, 4))
	e.Len, e.Reason = uint32(f.next(evLen, 4)), uint32(f.next(evReason, 4))
	e.Protocol, e.Flags = uint16(f.next(evProtocol, 2)), uint16(f.next(evFlags, 2))
	for i := range e.Arg {
		e.Arg[i] = int32(f.next(evArg0<<i, 4))
	}
	if present&evComm != 0 {
		copy(last.comm[:], f.p)
		f.p = f.p[16:]
	}
	if present&evDev != 0 {
		copy(last.dev[:], f.p)
		f.p = f.p[16:]
	}
	e.Comm, e.Dev = last.comm, last.dev
	n := int(f.next(evData, 2))
	if n > MaxCapLen || n > len(f.p) {
		return fmt.Errorf("event claims %d captured bytes, has %d: %w", n, len(f.p), ErrCorrupt)
	}
	if len(f.p) != n {
		return fmt.Errorf("event has %d bytes after its fields: %w", len(f.p)-n, ErrCorrupt)
	}
	e.Data = f.p
	return nil
}

// fields reads a compact event's flagged fields in order; the caller has
// checked that they are all there.
type fields struct {
	p       []byte
	present uint16
}

// next returns the field of size bytes flagged by bit, 0 when it is absent.
func (f *fields) next(bit uint16, size int) uint64 {
	if f.present&bit == 0 {
		return 0
	}
	var v uint64
	switch size {
	case 8:
		v = le.Uint64(f.p)
	case 4:
		v = uint64(le.Uint32(f.p))
	default:
		v = uint64(le.Uint16(f.p))
	}
	f.p = f.p[size:]
	return v
}
