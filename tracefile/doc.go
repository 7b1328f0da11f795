// Package tracefile reads and writes nettrace's trace files.
//
// A trace file is self-describing: whatever is needed to explain its
// events later, on another machine, travels with them (kernel release,
// clock anchor, drop-reason names, kernel symbols of the locations seen,
// interface names per network namespace, probes and how they were attached,
// counter snapshots). The package must not depend on BPF or on the running
// kernel: `nettrace script` and `nettrace report` read files anywhere.
//
// # Format, version 3
//
// All integers are little endian. The versions differ only in how events
// are written: version 1 wrote an Event record per event, the kernel's
// struct event as is; version 2 an Event record per event, compact
// (event.go); version 3 writes Events records of many events, each event
// as what changed since the previous one of its probe and CPU (events.go),
// a fifth of version 2's bytes. The reader reads all three.
//
//	file   = header record*
//	header = "NETTRACE" version:u32 flags:u32            (16 bytes)
//	record = type:u32 length:u32 payload[length] crc:u32
//
// crc is CRC-32C (Castagnoli) of the type, the length and the payload. A
// reader skips record types it does not know (after checking their crc),
// so that newer writers stay readable. Record types:
//
//	1 Meta       JSON, first record: see [Meta]
//	2 Event      versions 1 and 2, binary: one event; version 1: the raw layout of EventHeadSize bytes, then the captured bytes
//	3 Interface  JSON: a (netns, ifindex) seen for the first time, with its name
//	4 Symbol     JSON: a kernel symbol, written before the first event that needs it
//	5 Loss       JSON: cumulative events and losses per probe and CPU, when they changed
//	6 Counters   JSON: one counter snapshot (NIC, ethtool, SNMP, softnet, vmaxdp)
//	7 Aggregate  JSON: cumulative counts of the aggregate mode
//	8 End        JSON, last record: see [End]
//	9 Events     version 3, binary: events, in the order they were written (events.go)
//
// A file without an End record was cut short (killed recorder, full disk):
// [Reader] returns every complete record, then an error wrapping
// [ErrTruncated]. A record whose crc or length is wrong gives an error
// wrapping [ErrCorrupt] that names its offset (and, in an Events record,
// the event's byte in it). Reading streams: memory is bounded by the
// largest record (at most [MaxRecord] bytes) and by [MaxEventSlots].
package tracefile
