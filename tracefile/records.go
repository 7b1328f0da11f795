package tracefile

import (
	"encoding/binary"
	"fmt"
)

// Version is the format version this package writes. It reads this one
// and the ones before: version 1, whose events are the kernel's struct
// event as is, and version 2, whose events are a record each.
const Version = 3

// Magic opens every trace file.
const Magic = "NETTRACE"

// MaxRecord bounds a record's payload, so that a corrupt length cannot make
// a reader allocate without bound.
const MaxRecord = 16 << 20

// RecordType says what a record holds.
type RecordType uint32

// Record types; the values are part of the format.
const (
	TypeMeta      RecordType = 1
	TypeEvent     RecordType = 2
	TypeInterface RecordType = 3
	TypeSymbol    RecordType = 4
	TypeLoss      RecordType = 5
	TypeCounters  RecordType = 6
	TypeAggregate RecordType = 7
	TypeEnd       RecordType = 8
	TypeEvents    RecordType = 9
)

func (t RecordType) String() string {
	switch t {
	case TypeMeta:
		return "meta"
	case TypeEvent:
		return "event"
	case TypeInterface:
		return "interface"
	case TypeSymbol:
		return "symbol"
	case TypeLoss:
		return "loss"
	case TypeCounters:
		return "counters"
	case TypeAggregate:
		return "aggregate"
	case TypeEnd:
		return "end"
	case TypeEvents:
		return "events"
	}
	return fmt.Sprintf("type %d", uint32(t))
}

// Meta describes a recording; it is the first record of every file.
type Meta struct {
	Tool     string   `json:"tool"`
	Version  string   `json:"version"`
	Kernel   string   `json:"kernel"` // uname release
	Machine  string   `json:"machine"`
	Hostname string   `json:"hostname"`
	Command  []string `json:"command,omitempty"` // the command recorded, if any
	// ClockMonotonic and ClockRealtime were read back to back: event times
	// (CLOCK_MONOTONIC) convert to wall time through them.
	ClockMonotonic int64             `json:"clock_monotonic_ns"`
	ClockRealtime  int64             `json:"clock_realtime_ns"`
	Mode           string            `json:"mode"` // "events" or "aggregate"
	Filter         string            `json:"filter,omitempty"`
	CapLen         int               `json:"caplen"`
	Probes         []Probe           `json:"probes"`
	DropReasons    map[uint32]string `json:"drop_reasons"`
	// DropReasonSource says where DropReasons came from: "btf" or "tracefs".
	DropReasonSource string `json:"drop_reason_source"`
	// Notes are what the recorder said about missing kernel features.
	Notes []string `json:"notes,omitempty"`
}

// Probe is one collector of a recording.
type Probe struct {
	ID     uint16 `json:"id"`     // Event.Probe
	Name   string `json:"name"`   // "skb:kfree_skb"
	Attach string `json:"attach"` // "tp_btf", "kprobe", "fentry"
}

// ProbeByID returns the probe with id, or nil.
func (m *Meta) ProbeByID(id uint16) *Probe {
	for i := range m.Probes {
		if m.Probes[i].ID == id {
			return &m.Probes[i]
		}
	}
	return nil
}

// Interface names an interface of a network namespace.
type Interface struct {
	Netns   uint32 `json:"netns"`
	Ifindex uint32 `json:"ifindex"`
	Name    string `json:"name"`
}

// Symbol is a kernel symbol: a location resolves to the symbol with the
// highest address not above it.
type Symbol struct {
	Addr   uint64 `json:"addr"`
	Name   string `json:"name"`
	Module string `json:"module,omitempty"`
}

// Loss carries cumulative per-probe, per-CPU counts from the kernel, for
// the entries that changed since the previous Loss record.
type Loss struct {
	Time    uint64      `json:"time_ns"` // CLOCK_MONOTONIC
	Entries []LossEntry `json:"entries"`
}

// LossEntry counts one probe on one CPU since the recording started.
type LossEntry struct {
	Probe  uint16 `json:"probe"`
	CPU    uint32 `json:"cpu"`    // CPUAny: events the kernel did not hand to the probe
	Events uint64 `json:"events"` // passed the filters
	Lost   uint64 `json:"lost"`   // not recorded
}

// CPUAny is the CPU of a LossEntry that counts the tracepoint hits the
// kernel skipped because the probe was already running on that CPU (an
// interrupt nesting the same tracepoint): the kernel counts them per
// program, not per CPU. They are in both Events and Lost.
const CPUAny = ^uint32(0)

// Counters is one snapshot of one counter source.
type Counters struct {
	Time   uint64            `json:"time_ns"` // CLOCK_MONOTONIC
	Source string            `json:"source"`  // "netdev", "ethtool", "snmp", "xsk", "softnet", "vmaxdp"
	Netns  uint32            `json:"netns,omitempty"`
	Device string            `json:"device,omitempty"`
	Values map[string]uint64 `json:"values"`
}

// Aggregate holds the cumulative counts of the aggregate mode.
type Aggregate struct {
	Time    uint64     `json:"time_ns"`
	Entries []AggEntry `json:"entries"`
}

// AggEntry counts the events of one probe with one reason, location and
// interface.
type AggEntry struct {
	Probe    uint16 `json:"probe"`
	Netns    uint32 `json:"netns"`
	Ifindex  uint32 `json:"ifindex"`
	Reason   uint32 `json:"reason"`
	Location uint64 `json:"location"`
	Count    uint64 `json:"count"`
}

// End closes a complete recording.
type End struct {
	Time    uint64        `json:"time_ns"`
	Stopped string        `json:"stopped"` // why recording stopped
	Probes  []ProbeTotals `json:"probes"`
}

// ProbeTotals sums a probe over all CPUs.
type ProbeTotals struct {
	Probe  uint16 `json:"probe"`
	Events uint64 `json:"events"`
	Lost   uint64 `json:"lost"`
}

// EventHeadSize is the size of a raw event before its captured bytes: the
// layout of bpf/nettrace.c's struct event, which is also the event payload
// of version 1 files.
const EventHeadSize = 120

// MaxCapLen is the most bytes of a packet an event carries.
const MaxCapLen = 128

// Event flags.
const (
	// FlagEthernet: Data starts at the Ethernet header, else at IPv4.
	FlagEthernet = 1
)

// Event is one kernel event. Data aliases the buffer it was decoded from.
type Event struct {
	Time     uint64 // CLOCK_MONOTONIC, ns
	Skb      uint64
	Location uint64 // kfree_skb/consume_skb caller; napi_poll: napi struct
	Sk       uint64
	PID      uint32
	TID      uint32
	CPU      uint32
	Netns    uint32
	Ifindex  uint32
	Len      uint32
	Reason   uint32
	Probe    uint16
	Protocol uint16
	Arg      [4]int32
	Comm     [16]byte
	Dev      [16]byte
	Flags    uint16
	Data     []byte
}

// CommString returns the task name.
func (e *Event) CommString() string { return cstring(e.Comm[:]) }

// DevString returns the device name, "" when the event has none.
func (e *Event) DevString() string { return cstring(e.Dev[:]) }

func cstring(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// ByteOrder is the byte order of every integer in a trace file.
var ByteOrder = binary.LittleEndian

var le = ByteOrder

// DecodeRawEvent decodes a raw event (a ring buffer sample of
// bpf/nettrace.c, or a version 1 event record's payload) into e.
func DecodeRawEvent(p []byte, e *Event) error {
	if len(p) < EventHeadSize {
		return fmt.Errorf("event of %d bytes, shorter than its %d-byte head: %w", len(p), EventHeadSize, ErrCorrupt)
	}
	caplen := int(le.Uint16(p[112:]))
	if caplen > MaxCapLen || EventHeadSize+caplen > len(p) {
		return fmt.Errorf("event claims %d captured bytes, has %d: %w", caplen, len(p)-EventHeadSize, ErrCorrupt)
	}
	e.Time = le.Uint64(p[0:])
	e.Skb = le.Uint64(p[8:])
	e.Location = le.Uint64(p[16:])
	e.Sk = le.Uint64(p[24:])
	e.PID = le.Uint32(p[32:])
	e.TID = le.Uint32(p[36:])
	e.CPU = le.Uint32(p[40:])
	e.Netns = le.Uint32(p[44:])
	e.Ifindex = le.Uint32(p[48:])
	e.Len = le.Uint32(p[52:])
	e.Reason = le.Uint32(p[56:])
	e.Probe = le.Uint16(p[60:])
	e.Protocol = le.Uint16(p[62:])
	for i := range e.Arg {
		e.Arg[i] = int32(le.Uint32(p[64+4*i:]))
	}
	copy(e.Comm[:], p[80:96])
	copy(e.Dev[:], p[96:112])
	e.Flags = le.Uint16(p[114:])
	e.Data = p[EventHeadSize : EventHeadSize+caplen]
	return nil
}
