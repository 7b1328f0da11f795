package tracefile

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// Since version 3, events travel in Events records of many events each,
// every event written as what changed since the event before it of the
// same probe on the same CPU in that record: on a busy path consecutive
// events differ in their time, their skb and a few words of the packet.
// bench/nettrace.sh's events average 26 bytes, against 128 in version 2
// and 196 in version 1. Writing fewer bytes is what mattered: the copy into
// the page cache was the recorder's largest cost, and `nettrace record`
// takes from the traced workload what it spends (bench/nettrace.sh).
// General-purpose compression (s2) cut the bytes as much but cost the
// same CPU again.
//
//	events = event+
//	event  = probe:uvarint cpu:uvarint changed:uvarint dtime:varint field*
//
// uvarint and varint (zig-zag) are encoding/binary's. dtime is the time
// minus that of the CPU's previous event in the record (for the CPU's
// first, the time itself); times and skbs wrap at 64 bits, so that one
// going back is a small negative delta. Then, in this order, each field
// whose bit is set in changed; a field whose bit is clear has the value of
// the previous event of the same probe and CPU in the record, or zero for
// the first:
//
//	0 skb:varint (minus the previous skb)  1 data  2 len:uvarint
//	3 pid:uvarint  4 tid:uvarint  5 location:u64  6 sk:u64  7 netns:uvarint
//	8 ifindex:uvarint  9 reason:uvarint  10 protocol:uvarint  11 flags:uvarint
//	12-15 arg[0..3]:varint  16 comm:[16]  17 dev:[16]
//
//	data = caplen:uvarint words:uvarint word*
//
// The packet's bytes are cut in 8-byte words (the last may be shorter);
// bit i of words set means word i follows, clear that it equals word i of
// the previous event's data. The encoder's state is reset at every record,
// so that each Events record decodes on its own.
const (
	chSkb = 1 << iota
	chData
	chLen
	chPID
	chTID
	chLocation
	chSk
	chNetns
	chIfindex
	chReason
	chProtocol
	chFlags
	chArg0
	chArg1
	chArg2
	chArg3
	chComm
	chDev
	chAll = 1<<18 - 1
)

// MaxProbe bounds a version 3 event's probe id, and MaxEventSlots the
// probes and CPUs one Events record may interleave, so that a corrupt
// record cannot make a reader hold state without bound.
const (
	MaxProbe      = 1 << 10
	MaxEventSlots = 4096
)

// eventsBatch is how many bytes of events a writer gathers before it
// writes them as one record.
const eventsBatch = 64 << 10

// slot is the previous event of one probe on one CPU, with its own copy of
// the packet bytes (ev.Data is unused).
type slot struct {
	ev   Event
	n    int // bytes in data
	data [MaxCapLen]byte
}

func (sl *slot) packet() []byte { return sl.data[:sl.n] }

// eventState is what an Events record's events are encoded against, for a
// writer or a reader. It is reset at every record: gen tells the entries
// of the current record from stale ones, so a reset clears nothing, and
// slots are kept for the next record.
type eventState struct {
	gen   uint32
	cpus  []cpuState
	slots []*slot // the first used are the current record's, in order of first use
	used  int
}

type cpuState struct {
	gen    uint32
	time   uint64
	probes []slotRef // by probe
}

type slotRef struct {
	gen uint32
	i   uint32 // index in slots
}

func (s *eventState) reset() {
	s.gen++
	s.used = 0
}

// at returns the CPU's state and the probe's slot for the current record.
func (s *eventState) at(cpu, probe uint32) (*cpuState, *slot, error) {
	if cpu >= MaxCPU {
		return nil, nil, fmt.Errorf("event on cpu %d (max %d): %w", cpu, MaxCPU-1, ErrCorrupt)
	}
	if probe >= MaxProbe {
		return nil, nil, fmt.Errorf("event of probe %d (max %d): %w", probe, MaxProbe-1, ErrCorrupt)
	}
	if int(cpu) >= len(s.cpus) {
		s.cpus = append(s.cpus, make([]cpuState, int(cpu)+1-len(s.cpus))...)
	}
	c := &s.cpus[cpu]
	if c.gen != s.gen {
		c.gen, c.time = s.gen, 0
	}
	if int(probe) >= len(c.probes) {
		c.probes = append(c.probes, make([]slotRef, int(probe)+1-len(c.probes))...)
	}
	r := &c.probes[probe]
	if r.gen == s.gen {
		return c, s.slots[r.i], nil
	}
	if s.used >= MaxEventSlots {
		return nil, nil, fmt.Errorf("more than %d probe and CPU pairs in one events record: %w", MaxEventSlots, ErrCorrupt)
	}
	if s.used == len(s.slots) {
		s.slots = append(s.slots, new(slot))
	}
	r.gen, r.i = s.gen, uint32(s.used)
	sl := s.slots[s.used]
	s.used++
	sl.ev, sl.n = Event{}, 0
	return c, sl, nil
}

// full says whether one more probe and CPU pair would not fit the record.
func (s *eventState) full() bool { return s.used >= MaxEventSlots }

// appendEvent appends e's encoding to b against the state, and updates it.
func (s *eventState) appendEvent(b []byte, e *Event) ([]byte, error) {
	c, sl, err := s.at(e.CPU, uint32(e.Probe))
	if err != nil {
		return b, err
	}
	p := &sl.ev
	var changed uint64
	if e.Skb != p.Skb {
		changed |= chSkb
	}
	data := e.Data[:min(len(e.Data), MaxCapLen)]
	if string(data) != string(sl.packet()) {
		changed |= chData
	}
	changed |= ne(e.Len, p.Len, chLen) | ne(e.PID, p.PID, chPID) | ne(e.TID, p.TID, chTID) |
		ne(e.Location, p.Location, chLocation) | ne(e.Sk, p.Sk, chSk) | ne(e.Netns, p.Netns, chNetns) |
		ne(e.Ifindex, p.Ifindex, chIfindex) | ne(e.Reason, p.Reason, chReason) |
		ne(e.Protocol, p.Protocol, chProtocol) | ne(e.Flags, p.Flags, chFlags)
	for i, a := range e.Arg {
		changed |= ne(a, p.Arg[i], chArg0<<i)
	}
	if e.Comm != p.Comm {
		changed |= chComm
	}
	if e.Dev != p.Dev {
		changed |= chDev
	}
	b = binary.AppendUvarint(b, uint64(e.Probe))
	b = binary.AppendUvarint(b, uint64(e.CPU))
	b = binary.AppendUvarint(b, changed)
	b = binary.AppendVarint(b, int64(e.Time-c.time))
	c.time = e.Time
	if changed&chSkb != 0 {
		b = binary.AppendVarint(b, int64(e.Skb-p.Skb))
	}
	if changed&chData != 0 {
		b = appendData(b, data, sl.packet())
		sl.n = copy(sl.data[:], data)
	}
	b = appendUvarintIf(b, changed, chLen, uint64(e.Len))
	b = appendUvarintIf(b, changed, chPID, uint64(e.PID))
	b = appendUvarintIf(b, changed, chTID, uint64(e.TID))
	if changed&chLocation != 0 {
		b = le.AppendUint64(b, e.Location)
	}
	if changed&chSk != 0 {
		b = le.AppendUint64(b, e.Sk)
	}
	b = appendUvarintIf(b, changed, chNetns, uint64(e.Netns))
	b = appendUvarintIf(b, changed, chIfindex, uint64(e.Ifindex))
	b = appendUvarintIf(b, changed, chReason, uint64(e.Reason))
	b = appendUvarintIf(b, changed, chProtocol, uint64(e.Protocol))
	b = appendUvarintIf(b, changed, chFlags, uint64(e.Flags))
	for i, a := range e.Arg {
		if changed&(chArg0<<i) != 0 {
			b = binary.AppendVarint(b, int64(a))
		}
	}
	if changed&chComm != 0 {
		b = append(b, e.Comm[:]...)
	}
	if changed&chDev != 0 {
		b = append(b, e.Dev[:]...)
	}
	*p = *e
	p.Data = nil
	return b, nil
}

func ne[T comparable](a, b T, bit uint64) uint64 {
	if a != b {
		return bit
	}
	return 0
}

func appendUvarintIf(b []byte, changed, bit, v uint64) []byte {
	if changed&bit != 0 {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

// appendData appends data as the words that differ from prev's.
func appendData(b, data, prev []byte) []byte {
	var words uint64
	for i := 0; i < len(data); i += 8 {
		end := min(i+8, len(data))
		if end > len(prev) || string(data[i:end]) != string(prev[i:end]) {
			words |= 1 << (i / 8)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(data)))
	b = binary.AppendUvarint(b, words)
	for w := words; w != 0; w &= w - 1 {
		i := bits.TrailingZeros64(w) * 8
		b = append(b, data[i:min(i+8, len(data))]...)
	}
	return b
}

// eventDecoder reads the events of one Events record.
type eventDecoder struct {
	p   []byte
	off int // of p[0] in the record's payload
	err error
}

func (d *eventDecoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%s cut or malformed at byte %d: %w", what, d.off, ErrCorrupt)
	}
}

func (d *eventDecoder) uvarint(what string) uint64 {
	v, n := binary.Uvarint(d.p)
	if n <= 0 {
		d.fail(what)
		d.p = nil
		return 0
	}
	d.p, d.off = d.p[n:], d.off+n
	return v
}

// varint reads a zig-zag varint, as binary.AppendVarint writes it.
func (d *eventDecoder) varint(what string) int64 {
	u := d.uvarint(what)
	return int64(u>>1) ^ -int64(u&1)
}

func (d *eventDecoder) bytes(what string, n int) []byte {
	if n > len(d.p) {
		d.fail(what)
		d.p = nil
		return zeros[:n]
	}
	b := d.p[:n]
	d.p, d.off = d.p[n:], d.off+n
	return b
}

// zeros stands in for the bytes of a cut field, at most 16.
var zeros [16]byte

// uvarintIf reads the field flagged by bit into v when changed has it: an
// uvarint that must fit v.
func uvarintIf[T uint16 | uint32](d *eventDecoder, changed, bit uint64, what string, v *T) {
	if changed&bit != 0 {
		x := d.uvarint(what)
		if x > uint64(^T(0)) {
			d.fail(what)
		}
		*v = T(x)
	}
}

// next decodes the record's next event into e against the state. e.Data
// aliases the state until the next call.
func (d *eventDecoder) next(s *eventState, e *Event) error {
	start := d.off
	probe := d.uvarint("probe")
	cpu := d.uvarint("cpu")
	changed := d.uvarint("changed fields")
	dtime := d.varint("time")
	if d.err != nil {
		return d.err
	}
	if changed&^chAll != 0 {
		return fmt.Errorf("event at byte %d: unknown changed fields %#x: %w", start, changed&^chAll, ErrCorrupt)
	}
	if probe >= MaxProbe || cpu >= MaxCPU {
		return fmt.Errorf("event at byte %d: probe %d on cpu %d (max %d, %d): %w", start, probe, cpu, MaxProbe-1, MaxCPU-1, ErrCorrupt)
	}
	c, sl, err := s.at(uint32(cpu), uint32(probe))
	if err != nil {
		return fmt.Errorf("event at byte %d: %w", start, err)
	}
	p := &sl.ev
	p.Probe, p.CPU = uint16(probe), uint32(cpu)
	p.Time = c.time + uint64(dtime)
	c.time = p.Time
	if changed&chSkb != 0 {
		p.Skb += uint64(d.varint("skb"))
	}
	if changed&chData != 0 {
		d.data(sl)
	}
	uvarintIf(d, changed, chLen, "len", &p.Len)
	uvarintIf(d, changed, chPID, "pid", &p.PID)
	uvarintIf(d, changed, chTID, "tid", &p.TID)
	if changed&chLocation != 0 {
		p.Location = le.Uint64(d.bytes("location", 8))
	}
	if changed&chSk != 0 {
		p.Sk = le.Uint64(d.bytes("sk", 8))
	}
	uvarintIf(d, changed, chNetns, "netns", &p.Netns)
	uvarintIf(d, changed, chIfindex, "ifindex", &p.Ifindex)
	uvarintIf(d, changed, chReason, "reason", &p.Reason)
	uvarintIf(d, changed, chProtocol, "protocol", &p.Protocol)
	uvarintIf(d, changed, chFlags, "flags", &p.Flags)
	for i := range p.Arg {
		if changed&(chArg0<<i) != 0 {
			v := d.varint("arg")
			if int64(int32(v)) != v {
				d.fail("arg")
			}
			p.Arg[i] = int32(v)
		}
	}
	if changed&chComm != 0 {
		copy(p.Comm[:], d.bytes("comm", 16))
	}
	if changed&chDev != 0 {
		copy(p.Dev[:], d.bytes("dev", 16))
	}
	if d.err != nil {
		return fmt.Errorf("event at byte %d: %w", start, d.err)
	}
	*e = *p
	e.Data = sl.packet()
	return nil
}

// data decodes a changed packet into the slot, over the previous one.
func (d *eventDecoder) data(sl *slot) {
	n := d.uvarint("caplen")
	words := d.uvarint("data words")
	if d.err != nil {
		return
	}
	if n > MaxCapLen || words>>((n+7)/8) != 0 {
		d.fail("data")
		return
	}
	prev := sl.n
	for i := 0; i < int(n); i += 8 {
		end := min(i+8, int(n))
		if words&(1<<(i/8)) != 0 {
			copy(sl.data[i:end], d.bytes("data", end-i))
		} else if end > prev {
			d.fail("data (a word kept from a shorter packet)")
			return
		}
	}
	sl.n = int(n)
}
