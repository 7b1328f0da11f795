package tracefile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
)

// readEvents reads every event of a complete file, their Data copied.
func readEvents(t testing.TB, b []byte) []Event {
	t.Helper()
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var evs []Event
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return evs
		}
		if err != nil {
			t.Fatalf("after %d events: %v", len(evs), err)
		}
		if rec.Type == TypeEvent {
			e := *r.Event()
			e.Data = bytes.Clone(e.Data)
			evs = append(evs, e)
		}
	}
}

// sameEvents fails unless got are the events want(0), want(1), ...
func sameEvents(t testing.TB, got []Event, n int, want func(int) *Event) {
	t.Helper()
	if len(got) != n {
		t.Fatalf("read %d events, want %d", len(got), n)
	}
	for i := range got {
		g, w := got[i], *want(i)
		if !bytes.Equal(g.Data, w.Data) {
			t.Fatalf("event %d data = %x, want %x", i, g.Data, w.Data)
		}
		g.Data, w.Data = nil, nil
		if !reflect.DeepEqual(g, w) {
			t.Fatalf("event %d = %+v, want %+v", i, g, w)
		}
	}
}

// Files of versions 1 (raw events) and 2 (an event record each, compact)
// still read, event for event.
func TestVersion1(t *testing.T) {
	sameEvents(t, readEvents(t, writeV1(t, 50)), 50, testEvent)
}

// writeV2 writes a version 2 trace of n events: an event record each,
// compact.
func writeV2(t testing.TB, n int) []byte {
	var c taskCache
	return writeOld(t, 2, n, func(i int) []byte {
		e := testEvent(i)
		last, _ := c.at(e.CPU)
		return appendCompact(nil, e, last)
	})
}

func TestVersion2(t *testing.T) {
	sameEvents(t, readEvents(t, writeV2(t, 50)), 50, testEvent)
}

// An Events record is a version 3 thing: in an older file it is corrupt.
func TestEventsInVersion2(t *testing.T) {
	b := writeTrace(t, 5, true)
	le.PutUint32(b[8:], 2)
	if _, err := readAll(b); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("events record in a version 2 file: %v, want ErrCorrupt", err)
	}
}

// rxEvent and pollEvent are a receive path's typical pair on one CPU:
// netif_receive_skb of a 64-byte UDP datagram (106 bytes captured) and
// napi_poll. Packet i differs from the one before in the IP id and
// checksum, the UDP checksum and the payload's sequence number.
func rxEvent(i int) *Event {
	e := &Event{Time: 1e12 + uint64(i)*1300, CPU: 1, PID: 7, TID: 7, Skb: 0xffff888100000000 + uint64(i%64)*256,
		Netns: 4026531840, Ifindex: 2, Len: 106, Protocol: 0x800, Flags: FlagEthernet, Data: make([]byte, 106)}
	copy(e.Comm[:], "sockperf")
	copy(e.Dev[:], "vmxb")
	for j := range e.Data {
		e.Data[j] = byte(j)
	}
	le.PutUint16(e.Data[18:], uint16(i))    // IP id
	le.PutUint16(e.Data[24:], uint16(i*7))  // IP checksum
	le.PutUint16(e.Data[40:], uint16(i*13)) // UDP checksum
	le.PutUint32(e.Data[46:], uint32(i))    // sequence number
	return e
}

func pollEvent(i int) *Event {
	e := &Event{Time: 1e12 + uint64(i)*1300 + 400, CPU: 1, PID: 7, TID: 7, Location: 0xffff888100001000,
		Netns: 4026531840, Ifindex: 2, Arg: [4]int32{1, 64}, Probe: 2}
	copy(e.Comm[:], "sockperf")
	copy(e.Dev[:], "vmxb")
	return e
}

// Version 3 writes a receive path's events in a fraction of version 2's
// bytes: what bench/nettrace.sh's recordings are made of.
func TestEventsSize(t *testing.T) {
	const n = 1000
	var s eventState
	s.reset()
	var v3 []byte
	var c taskCache
	v2 := 0
	for i := range n {
		for _, e := range []*Event{rxEvent(i), pollEvent(i)} {
			var err error
			if v3, err = s.appendEvent(v3, e); err != nil {
				t.Fatal(err)
			}
			last, _ := c.at(e.CPU)
			v2 += len(appendCompact(nil, e, last)) + 12 // and its record's framing
		}
	}
	if len(v3)*4 > v2 {
		t.Errorf("%d event pairs: version 3 %d bytes, version 2 %d: not a quarter", n, len(v3), v2)
	}
	t.Logf("%d event pairs: version 3 %.1f bytes a pair, version 2 %.1f", n, float64(len(v3))/n, float64(v2)/n)
}

// writeEvents writes a version 3 file of the events.
func writeEvents(t testing.TB, evs []*Event) []byte {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if err := w.WriteEvent(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(&End{Time: 9}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Events that change from one to the next in every way the encoding has
// (fields to zero and back, shorter and longer packets, time and skb going
// back, probes and CPUs interleaved) read back as written, across several
// Events records.
func TestEventsRoundTrip(t *testing.T) {
	const n = 40000
	want := func(i int) *Event {
		var e *Event
		switch i % 3 {
		case 0:
			e = rxEvent(i)
		case 1:
			e = pollEvent(i)
		default:
			e = testEvent(i)
		}
		if i%11 == 0 {
			e.Time, e.Skb = 5, 1
		}
		if i%13 == 0 {
			e.Data = e.Data[:len(e.Data)*(i%7)/7]
		}
		e.CPU = uint32(i % 5 * 1000)
		return e
	}
	evs := make([]*Event, n)
	for i := range evs {
		evs[i] = want(i)
	}
	b := writeEvents(t, evs)
	sameEvents(t, readEvents(t, b), n, want)
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	records := map[int64]bool{}
	for {
		rec, err := r.Next()
		if err != nil {
			break
		}
		if rec.Type == TypeEvent {
			records[rec.Offset] = true
		}
	}
	if len(records) < 2 {
		t.Errorf("%d events in %d events records, want several", n, len(records))
	}
}

// Records written between events stay between them.
func TestEventsOrder(t *testing.T) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.WriteEvent(testEvent(1)))
	must(w.WriteJSON(TypeInterface, Interface{Netns: 1, Ifindex: 2, Name: "a"}))
	must(w.WriteEvent(testEvent(2)))
	must(w.WriteEvent(testEvent(3)))
	must(w.Flush())
	must(w.WriteEvent(testEvent(4)))
	must(w.Close(&End{Time: 9}))
	r, err := NewReader(bytes.NewReader(buf.Bytes()))
	must(err)
	var got []string
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		must(err)
		s := rec.Type.String()
		if rec.Type == TypeEvent {
			s = fmt.Sprint(r.Event().Time - 1e9)
		}
		got = append(got, s)
	}
	if want := "1 interface 2 3 4 end"; strings.Join(got, " ") != want {
		t.Fatalf("records %q, want %q", strings.Join(got, " "), want)
	}
}

// More probe and CPU pairs than one Events record may hold are written in
// more records.
func TestEventsManySlots(t *testing.T) {
	const n = MaxEventSlots*2 + 5
	want := func(i int) *Event {
		e := testEvent(i)
		e.CPU, e.Probe = uint32(i%(MaxCPU/4)), uint16(i%MaxProbe)
		return e
	}
	evs := make([]*Event, n)
	for i := range evs {
		evs[i] = want(i)
	}
	sameEvents(t, readEvents(t, writeEvents(t, evs)), n, want)
}

// Malformed Events records are errors that name the event's byte, never
// panics.
func TestEventsCorrupt(t *testing.T) {
	var s eventState
	s.reset()
	good, err := s.appendEvent(nil, rxEvent(1))
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.appendEvent(nil, rxEvent(2))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		p    []byte
	}{
		{"cut", good[:len(good)-1]},
		{"cut in the fields", good[:6]},
		{"varint overflow", bytes.Repeat([]byte{0xff}, 11)},
		{"unknown field", []byte{0, 0, 0x80, 0x80, 0x40, 0}},
		{"cpu", binary.AppendUvarint([]byte{0}, MaxCPU)},
		{"probe", binary.AppendUvarint(nil, MaxProbe)},
		{"caplen", []byte{0, 0, chData, 0, 0x81, 1, 0}},
		{"words past caplen", []byte{0, 0, chData, 0, 8, 2, 1, 2, 3, 4, 5, 6, 7, 8}},
		{"word kept from no packet", []byte{0, 0, chData, 0, 8, 0}},
		{"an event against a state it lacks", second},
		{"arg beyond 32 bits", append(binary.AppendUvarint([]byte{0, 0}, chArg0), 0, 0xfe, 0xff, 0xff, 0xff, 0x3f)},
	} {
		st := eventState{}
		st.reset()
		d := eventDecoder{p: tc.p}
		var e Event
		err := error(nil)
		for err == nil && len(d.p) > 0 {
			err = d.next(&st, &e)
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tc.name, err)
		}
	}
}

// FuzzEvents decodes arbitrary Events record payloads: errors, never
// panics, and state bounded by MaxEventSlots.
func FuzzEvents(f *testing.F) {
	var s eventState
	s.reset()
	var seed []byte
	for i := range 6 {
		seed, _ = s.appendEvent(seed, testEvent(i))
		seed, _ = s.appendEvent(seed, rxEvent(i))
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		st := eventState{}
		st.reset()
		d := eventDecoder{p: b}
		var e Event
		for len(d.p) > 0 {
			if err := d.next(&st, &e); err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("%v, want ErrCorrupt", err)
				}
				return
			}
			if len(e.Data) > MaxCapLen || st.used > MaxEventSlots {
				t.Fatalf("event of %d bytes, %d slots", len(e.Data), st.used)
			}
		}
	})
}

// FuzzEventsRoundTrip writes events made of arbitrary bytes and reads them
// back as they were.
func FuzzEventsRoundTrip(f *testing.F) {
	f.Add(bytes.Repeat([]byte{1, 2, 3, 0, 0xff, 9, 200}, 40))
	f.Fuzz(func(t *testing.T, b []byte) {
		var want []*Event
		for len(b) >= 24 {
			e := &Event{Time: le.Uint64(b), Skb: le.Uint64(b[8:]), CPU: uint32(b[16] % 4), Probe: uint16(b[17] % 3),
				PID: uint32(b[18]), Len: uint32(b[19]) << 20, Arg: [4]int32{int32(int8(b[20])), 0, 0, -1 << 31},
				Flags: uint16(b[21])}
			if b[22]&1 != 0 {
				e.Location, e.Sk, e.Netns, e.Ifindex, e.Reason, e.Protocol = ^uint64(0), 1, 1<<31, 3, 7, 0x86dd
			}
			if b[22]&2 != 0 {
				copy(e.Comm[:], b[16:])
				copy(e.Dev[:], b[:16])
			}
			n := min(int(b[23]), len(b)-24, MaxCapLen)
			e.Data = b[24 : 24+n]
			want = append(want, e)
			b = b[24+n/2:]
		}
		if len(want) > 0 {
			sameEvents(t, readEvents(t, writeEvents(t, want)), len(want), func(i int) *Event { return want[i] })
		}
	})
}

// BenchmarkEvents writes and reads a receive path's events (rxEvent and
// pollEvent pairs): the recorder's and the script's cost per event.
func BenchmarkEvents(b *testing.B) {
	const pairs = 10000
	evs := make([]*Event, 0, 2*pairs)
	for i := range pairs {
		evs = append(evs, rxEvent(i), pollEvent(i))
	}
	w, err := NewWriter(io.Discard, testMeta())
	if err != nil {
		b.Fatal(err)
	}
	b.Run("write", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			if err := w.WriteEvent(evs[i%len(evs)]); err != nil {
				b.Fatal(err)
			}
		}
	})
	file := writeEvents(b, evs)
	b.Run("read", func(b *testing.B) {
		b.ReportAllocs()
		var r *Reader
		for b.Loop() {
			if r == nil {
				if r, err = NewReader(bytes.NewReader(file)); err != nil {
					b.Fatal(err)
				}
			}
			rec, err := r.Next()
			if err == io.EOF {
				r = nil
				continue
			}
			if err != nil {
				b.Fatal(err)
			}
			_ = rec
		}
	})
}
