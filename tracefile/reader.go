package tracefile

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"
)

var (
	// ErrNotTrace: the input does not start with the trace file magic.
	ErrNotTrace = errors.New("not a nettrace file")
	// ErrVersion: the file has a format version this reader does not know.
	ErrVersion = errors.New("unsupported trace file version")
	// ErrTruncated: the file ends inside a record or without an End record.
	ErrTruncated = errors.New("trace file truncated")
	// ErrCorrupt: a record fails its checksum or is malformed.
	ErrCorrupt = errors.New("trace file corrupt")
)

// Record is one record as read. Payload aliases the reader's buffer and is
// valid until the next call to Next.
type Record struct {
	Type    RecordType
	Offset  int64 // of the record header in the file
	Payload []byte
}

// Decode decodes a JSON record into v.
func (r *Record) Decode(v any) error {
	if err := json.Unmarshal(r.Payload, v); err != nil {
		return fmt.Errorf("%s record at offset %d: %v: %w", r.Type, r.Offset, err, ErrCorrupt)
	}
	return nil
}

// Reader reads a trace file record by record. It keeps the interfaces and
// symbols it has passed, so that events can be explained as they stream.
type Reader struct {
	r      *bufio.Reader
	off    int64
	buf    []byte
	meta   Meta
	end    *End
	hdr    [8]byte // a field: a local would escape through io.ReadFull
	ifaces map[[2]uint32]string
	syms   []Symbol // sorted by Addr
	events int64
	ver    uint32
	ev     Event     // of the last event
	tasks  taskCache // version 2: comm and dev per CPU
	batch  Record    // version 3: the Events record being read
	dec    eventDecoder
	state  eventState // what the batch's events are encoded against
}

// NewReader reads the header and the Meta record of a trace file.
func NewReader(r io.Reader) (*Reader, error) {
	tr := &Reader{r: bufio.NewReaderSize(r, 1<<20), ifaces: make(map[[2]uint32]string)}
	var h [16]byte
	if n, err := io.ReadFull(tr.r, h[:]); err != nil {
		if n < len(Magic) || string(h[:len(Magic)]) != Magic {
			return nil, fmt.Errorf("%d-byte input: %w", n, ErrNotTrace)
		}
		return nil, fmt.Errorf("header cut at %d bytes: %w", n, ErrTruncated)
	}
	if string(h[:len(Magic)]) != Magic {
		return nil, fmt.Errorf("magic %q: %w", h[:len(Magic)], ErrNotTrace)
	}
	tr.ver = le.Uint32(h[8:])
	if tr.ver < 1 || tr.ver > Version {
		return nil, fmt.Errorf("version %d, this nettrace reads versions 1 to %d: %w", tr.ver, Version, ErrVersion)
	}
	tr.off = int64(len(h))
	rec, err := tr.Next()
	if err == io.EOF {
		return nil, fmt.Errorf("no meta record: %w", ErrTruncated)
	}
	if err != nil {
		return nil, err
	}
	if rec.Type != TypeMeta {
		return nil, fmt.Errorf("first record is %s at offset %d, want meta: %w", rec.Type, rec.Offset, ErrCorrupt)
	}
	if err := rec.Decode(&tr.meta); err != nil {
		return nil, err
	}
	return tr, nil
}

// Meta returns the recording's description.
func (tr *Reader) Meta() *Meta { return &tr.meta }

// End returns the End record once Next has passed it, else nil.
func (tr *Reader) End() *End { return tr.end }

// Events returns how many events Next has returned.
func (tr *Reader) Events() int64 { return tr.events }

// Event returns the event of the event record Next returned last. It is
// overwritten by the next call to Next, and its Data aliases the reader's
// buffer until then.
func (tr *Reader) Event() *Event { return &tr.ev }

// Next returns the next record. The events of an Events record come one
// at a time, as records of TypeEvent whose Offset is the Events record's.
// At the end of a complete file it returns io.EOF; at the end of a file
// without an End record, an error wrapping ErrTruncated.
func (tr *Reader) Next() (Record, error) {
	if len(tr.dec.p) > 0 {
		return tr.nextEvent()
	}
	start := tr.off
	h := tr.hdr[:]
	n, err := io.ReadFull(tr.r, h)
	if err == io.EOF {
		if tr.end == nil && start > 16 {
			return Record{}, fmt.Errorf("ends at offset %d after %d events without an end record (recorder killed?): %w", start, tr.events, ErrTruncated)
		}
		return Record{}, io.EOF
	}
	if err != nil {
		return Record{}, fmt.Errorf("record header cut at offset %d (%d of 8 bytes): %w", start, n, ErrTruncated)
	}
	t := RecordType(le.Uint32(h[0:]))
	size := le.Uint32(h[4:])
	if size > MaxRecord {
		return Record{}, fmt.Errorf("%s record at offset %d claims %d bytes (max %d): %w", t, start, size, MaxRecord, ErrCorrupt)
	}
	if cap(tr.buf) < int(size)+4 {
		tr.buf = make([]byte, int(size)+4, max(int(size)+4, 4096))
	}
	b := tr.buf[:int(size)+4]
	if n, err := io.ReadFull(tr.r, b); err != nil {
		return Record{}, fmt.Errorf("%s record at offset %d cut after %d of %d bytes: %w", t, start, n, len(b), ErrTruncated)
	}
	payload := b[:size]
	crc := crc32.Update(crc32.Update(0, castagnoli, h), castagnoli, payload)
	if got := le.Uint32(b[size:]); got != crc {
		return Record{}, fmt.Errorf("%s record at offset %d: checksum %08x, want %08x: %w", t, start, got, crc, ErrCorrupt)
	}
	tr.off += int64(len(h) + len(b))
	rec := Record{Type: t, Offset: start, Payload: payload}
	if tr.end != nil {
		return Record{}, fmt.Errorf("%s record at offset %d after the end record: %w", t, start, ErrCorrupt)
	}
	switch t {
	case TypeEvent:
		// Decoded here, not on demand: a version 2 event may take its comm
		// and dev from the event before it on its CPU, whether or not the
		// caller looked at that one.
		if tr.ver == 1 {
			err = DecodeRawEvent(payload, &tr.ev)
		} else {
			err = decodeCompact(payload, &tr.ev, &tr.tasks)
		}
		if err != nil {
			return Record{}, fmt.Errorf("%s record at offset %d: %w", t, start, err)
		}
		tr.events++
	case TypeEvents:
		if tr.ver < 3 {
			return Record{}, fmt.Errorf("%s record at offset %d in a version %d file: %w", t, start, tr.ver, ErrCorrupt)
		}
		if len(payload) == 0 {
			return Record{}, fmt.Errorf("empty %s record at offset %d: %w", t, start, ErrCorrupt)
		}
		tr.batch = rec
		tr.dec = eventDecoder{p: payload}
		tr.state.reset()
		return tr.nextEvent()
	case TypeInterface:
		var i Interface
		if err := rec.Decode(&i); err != nil {
			return Record{}, err
		}
		tr.ifaces[[2]uint32{i.Netns, i.Ifindex}] = i.Name
	case TypeSymbol:
		var s Symbol
		if err := rec.Decode(&s); err != nil {
			return Record{}, err
		}
		tr.addSymbol(s)
	case TypeEnd:
		var e End
		if err := rec.Decode(&e); err != nil {
			return Record{}, err
		}
		tr.end = &e
	}
	return rec, nil
}

// nextEvent decodes the next event of the Events record being read.
func (tr *Reader) nextEvent() (Record, error) {
	start := tr.dec.off
	if err := tr.dec.next(&tr.state, &tr.ev); err != nil {
		tr.dec.p = nil
		return Record{}, fmt.Errorf("%s record at offset %d: %w", tr.batch.Type, tr.batch.Offset, err)
	}
	tr.events++
	return Record{Type: TypeEvent, Offset: tr.batch.Offset, Payload: tr.batch.Payload[start:tr.dec.off]}, nil
}

func (tr *Reader) addSymbol(s Symbol) {
	i := sort.Search(len(tr.syms), func(i int) bool { return tr.syms[i].Addr >= s.Addr })
	if i < len(tr.syms) && tr.syms[i].Addr == s.Addr {
		tr.syms[i] = s
		return
	}
	tr.syms = append(tr.syms, Symbol{})
	copy(tr.syms[i+1:], tr.syms[i:])
	tr.syms[i] = s
}

// Interface returns the name of ifindex in netns, "" when the file does
// not name it.
func (tr *Reader) Interface(netns, ifindex uint32) string {
	return tr.ifaces[[2]uint32{netns, ifindex}]
}

// Symbolize resolves a kernel address to the symbol that contains it and
// the offset into it; ok is false when the file names no symbol below addr.
func (tr *Reader) Symbolize(addr uint64) (sym *Symbol, off uint64, ok bool) {
	i := sort.Search(len(tr.syms), func(i int) bool { return tr.syms[i].Addr > addr })
	if i == 0 {
		return nil, 0, false
	}
	s := &tr.syms[i-1]
	return s, addr - s.Addr, true
}
