package tracefile

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

func testMeta() *Meta {
	return &Meta{Tool: "nettrace", Kernel: "6.18.0", Mode: "events", CapLen: 128,
		Probes:      []Probe{{ID: 3, Name: "skb:kfree_skb", Attach: "tp_btf"}},
		DropReasons: map[uint32]string{3: "NO_SOCKET"}}
}

// testEvent varies what a compact event may leave out: zero fields, the
// CPU, and the comm and dev from one event on a CPU to the next.
func testEvent(i int) *Event {
	e := &Event{Time: uint64(1e9 + i), Skb: 0xffff888100000000 + uint64(i), Location: 0xffffffff81000010, PID: 7, TID: 8, CPU: uint32(i % 3),
		Netns: 4026531840, Ifindex: 2, Len: 84, Reason: 3, Probe: 3, Protocol: 0x800, Arg: [4]int32{-1, 2, 3, 4}, Flags: FlagEthernet}
	if i%4 == 0 {
		e.Skb, e.Location, e.Reason, e.Arg[1], e.Flags = 0, 0, 0, 0, 0
	}
	copy(e.Comm[:], []string{"sockperf", "ksoftirqd/1"}[i/7%2])
	if i%5 != 0 {
		copy(e.Dev[:], "vmxb")
	}
	e.Data = bytes.Repeat([]byte{byte(i)}, i%(MaxCapLen+1))
	return e
}

// appendRaw encodes e as the kernel lays out struct event: the event
// payload of version 1 files.
func appendRaw(b []byte, e *Event) []byte {
	var h [EventHeadSize]byte
	n := min(len(e.Data), MaxCapLen)
	le.PutUint64(h[0:], e.Time)
	le.PutUint64(h[8:], e.Skb)
	le.PutUint64(h[16:], e.Location)
	le.PutUint64(h[24:], e.Sk)
	le.PutUint32(h[32:], e.PID)
	le.PutUint32(h[36:], e.TID)
	le.PutUint32(h[40:], e.CPU)
	le.PutUint32(h[44:], e.Netns)
	le.PutUint32(h[48:], e.Ifindex)
	le.PutUint32(h[52:], e.Len)
	le.PutUint32(h[56:], e.Reason)
	le.PutUint16(h[60:], e.Probe)
	le.PutUint16(h[62:], e.Protocol)
	for i, a := range e.Arg {
		le.PutUint32(h[64+4*i:], uint32(a))
	}
	copy(h[80:96], e.Comm[:])
	copy(h[96:112], e.Dev[:])
	le.PutUint16(h[112:], uint16(n))
	le.PutUint16(h[114:], e.Flags)
	b = append(b, h[:]...)
	return append(b, e.Data[:n]...)
}

// writeTrace writes n events framed by the other record kinds.
func writeTrace(t testing.TB, n int, end bool) []byte {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.WriteJSON(TypeInterface, Interface{Netns: 4026531840, Ifindex: 2, Name: "vmxb"}))
	must(w.WriteJSON(TypeSymbol, Symbol{Addr: 0xffffffff81000000, Name: "__udp4_lib_rcv"}))
	for i := range n {
		must(w.WriteEvent(testEvent(i)))
	}
	must(w.WriteJSON(TypeLoss, Loss{Time: 5, Entries: []LossEntry{{Probe: 3, CPU: 1, Events: uint64(n), Lost: 2}}}))
	if end {
		must(w.Close(&End{Time: 9, Stopped: "test", Probes: []ProbeTotals{{Probe: 3, Events: uint64(n), Lost: 2}}}))
	} else {
		must(w.Flush())
	}
	return buf.Bytes()
}

func readAll(b []byte) (events int, err error) {
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return events, nil
		}
		if err != nil {
			return events, err
		}
		if rec.Type == TypeEvent {
			events++
		}
	}
}

func TestRoundTrip(t *testing.T) {
	b := writeTrace(t, 300, true)
	r, err := NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if r.Meta().DropReasons[3] != "NO_SOCKET" || r.Meta().Probes[0].Name != "skb:kfree_skb" {
		t.Fatalf("meta = %+v", r.Meta())
	}
	i := 0
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Type != TypeEvent {
			continue
		}
		got := *r.Event()
		want := testEvent(i)
		if !bytes.Equal(got.Data, want.Data) {
			t.Fatalf("event %d data = %x, want %x", i, got.Data, want.Data)
		}
		got.Data, want.Data = nil, nil
		if !reflect.DeepEqual(got, *want) {
			t.Fatalf("event %d = %+v, want %+v", i, got, *want)
		}
		i++
	}
	if i != 300 || r.Events() != 300 {
		t.Fatalf("read %d events, reader counted %d, want 300", i, r.Events())
	}
	if r.End() == nil || r.End().Probes[0].Lost != 2 {
		t.Fatalf("end = %+v", r.End())
	}
	if r.Interface(4026531840, 2) != "vmxb" {
		t.Fatalf("interface not kept")
	}
	if s, off, ok := r.Symbolize(0xffffffff81000010); !ok || s.Name != "__udp4_lib_rcv" || off != 0x10 {
		t.Fatalf("symbolize = %v %x %v", s, off, ok)
	}
}

// Every cut of a file reads up to its last complete record, then says it
// was truncated; nothing panics and nothing is reported as complete.
func TestTruncated(t *testing.T) {
	b := writeTrace(t, 20, true)
	full, err := readAll(b)
	if err != nil || full != 20 {
		t.Fatalf("full file: %d events, %v", full, err)
	}
	for cut := 0; cut < len(b)-1; cut++ {
		n, err := readAll(b[:cut])
		if err == nil {
			t.Fatalf("cut at %d of %d: no error, %d events", cut, len(b), n)
		}
		if cut >= 16 && !errors.Is(err, ErrTruncated) {
			t.Fatalf("cut at %d: %v, want ErrTruncated", cut, err)
		}
	}
	// Without an End record the file is incomplete even at a record boundary.
	if _, err := readAll(writeTrace(t, 5, false)); !errors.Is(err, ErrTruncated) {
		t.Fatalf("no end record: %v, want ErrTruncated", err)
	}
}

func TestCorrupt(t *testing.T) {
	b := writeTrace(t, 10, true)
	for _, off := range []int{16 + 8, len(b) / 2, len(b) - 6} {
		c := bytes.Clone(b)
		c[off] ^= 0x40
		if _, err := readAll(c); !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrTruncated) {
			t.Errorf("flipped byte %d: %v, want ErrCorrupt", off, err)
		}
	}
	c := bytes.Clone(b)
	le.PutUint32(c[8:], 99)
	if _, err := readAll(c); !errors.Is(err, ErrVersion) {
		t.Errorf("version 99: %v", err)
	}
	if _, err := readAll([]byte("PERFILE2xxxxxxxxxxxxxxxx")); !errors.Is(err, ErrNotTrace) {
		t.Errorf("perf.data: %v", err)
	}
	// A huge length must not be allocated.
	c = bytes.Clone(b)
	le.PutUint32(c[16+4:], 1<<31)
	if _, err := readAll(c); !errors.Is(err, ErrCorrupt) {
		t.Errorf("huge length: %v", err)
	}
}

// writeOld writes a trace of an older version whose events are a record
// each, payload(i) the payload of event i.
func writeOld(t testing.TB, version uint32, n int, payload func(int) []byte) []byte {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := w.writeRecord(TypeEvent, payload(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(&End{Time: 9}); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	le.PutUint32(b[8:], version)
	return b
}

// writeV1 writes a version 1 trace of n events: its event records are the
// kernel's struct event as is.
func writeV1(t testing.TB, n int) []byte {
	return writeOld(t, 1, n, func(i int) []byte { return appendRaw(nil, testEvent(i)) })
}

// Event records go through WriteEvent only: a payload of another layout
// would make the file unreadable.
func TestWriteRecordRefusesEvents(t *testing.T) {
	w, err := NewWriter(io.Discard, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteRecord(TypeEvent, appendRaw(nil, testEvent(1))); !errors.Is(err, ErrEventRecord) {
		t.Errorf("WriteRecord(TypeEvent): %v, want ErrEventRecord", err)
	}
	if err := w.WriteJSON(TypeEvent, testEvent(1)); !errors.Is(err, ErrEventRecord) {
		t.Errorf("WriteJSON(TypeEvent): %v, want ErrEventRecord", err)
	}
	if err := w.WriteRecord(TypeEvents, []byte{0, 0, 0, 0}); !errors.Is(err, ErrEventRecord) {
		t.Errorf("WriteRecord(TypeEvents): %v, want ErrEventRecord", err)
	}
}

// Malformed version 2 events are errors that name the record, never
// panics nor events read past their record.
func TestCompactCorrupt(t *testing.T) {
	e := testEvent(9)
	var c taskCache
	last, _ := c.at(e.CPU)
	good := appendCompact(nil, e, last)
	for _, tc := range []struct {
		name string
		p    []byte
	}{
		{"short", good[:compactFixed-1]},
		{"fields cut", good[:compactFixed+3]},
		{"data cut", good[:len(good)-1]},
		{"trailing", append(bytes.Clone(good), 0)},
		{"cpu", func() []byte { b := bytes.Clone(good); le.PutUint32(b[12:], MaxCPU); return b }()},
	} {
		var got Event
		var rc taskCache
		if err := decodeCompact(tc.p, &got, &rc); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", tc.name, err)
		}
	}
}

func FuzzReader(f *testing.F) {
	f.Add(writeTrace(f, 3, true))
	f.Add(writeTrace(f, 1, false))
	f.Add(writeV1(f, 3))
	f.Add(writeV2(f, 3))
	f.Add([]byte(Magic))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewReader(bytes.NewReader(b))
		if err != nil {
			return
		}
		for range 10000 {
			if _, err := r.Next(); err != nil {
				return
			}
		}
	})
}

func BenchmarkRead(b *testing.B) {
	data := writeTrace(b, 10000, true)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if n, err := readAll(data); err != nil || n != 10000 {
			b.Fatal(n, err)
		}
	}
}
