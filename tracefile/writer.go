package tracefile

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Writer writes a trace file. It is not safe for concurrent use.
type Writer struct {
	w      *bufio.Writer
	hdr    [8]byte // fields, not locals, so that writing allocates nothing
	crc    [4]byte
	events []byte     // the Events record being gathered
	state  eventState // what its events are encoded against
	err    error
}

// NewWriter writes the file header and meta to w.
func NewWriter(w io.Writer, meta *Meta) (*Writer, error) {
	tw := &Writer{w: bufio.NewWriterSize(w, 1<<20), events: make([]byte, 0, eventsBatch+1024)}
	tw.state.reset()
	var h [16]byte
	copy(h[:], Magic)
	le.PutUint32(h[8:], Version)
	if _, err := tw.w.Write(h[:]); err != nil {
		return nil, fmt.Errorf("trace file header: %w", err)
	}
	if err := tw.WriteJSON(TypeMeta, meta); err != nil {
		return nil, err
	}
	return tw, nil
}

// ErrEventRecord: events are written with WriteEvent, which encodes them
// as this version of the format does.
var ErrEventRecord = errors.New("event records are written with WriteEvent")

// WriteRecord writes one record other than an event. The events written
// before it are written before it. The first error sticks: later writes
// return it, so that a caller may check once.
func (tw *Writer) WriteRecord(t RecordType, payload []byte) error {
	if t == TypeEvent || t == TypeEvents {
		return ErrEventRecord
	}
	if err := tw.flushEvents(); err != nil {
		return err
	}
	return tw.writeRecord(t, payload)
}

func (tw *Writer) writeRecord(t RecordType, payload []byte) error {
	if tw.err != nil {
		return tw.err
	}
	if len(payload) > MaxRecord {
		return fmt.Errorf("%s record of %d bytes exceeds %d", t, len(payload), MaxRecord)
	}
	h, c := tw.hdr[:], tw.crc[:]
	le.PutUint32(h[0:], uint32(t))
	le.PutUint32(h[4:], uint32(len(payload)))
	le.PutUint32(c, crc32.Update(crc32.Update(0, castagnoli, h), castagnoli, payload))
	tw.w.Write(h)
	tw.w.Write(payload)
	if _, err := tw.w.Write(c); err != nil {
		tw.err = fmt.Errorf("write %s record: %w", t, err)
	}
	return tw.err
}

// WriteEvent adds an event to the Events record being gathered, which is
// written once it holds eventsBatch bytes, before any other record, and by
// Flush.
func (tw *Writer) WriteEvent(e *Event) error {
	if tw.err != nil {
		return tw.err
	}
	if tw.state.full() {
		if err := tw.flushEvents(); err != nil {
			return err
		}
	}
	b, err := tw.state.appendEvent(tw.events, e)
	if err != nil {
		return fmt.Errorf("write event: %w", err)
	}
	tw.events = b
	if len(b) >= eventsBatch {
		return tw.flushEvents()
	}
	return nil
}

// flushEvents writes the Events record being gathered, if any.
func (tw *Writer) flushEvents() error {
	if len(tw.events) == 0 {
		return tw.err
	}
	err := tw.writeRecord(TypeEvents, tw.events)
	tw.events = tw.events[:0]
	tw.state.reset()
	return err
}

// WriteJSON writes v as a JSON record of type t.
func (tw *Writer) WriteJSON(t RecordType, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s record: %w", t, err)
	}
	return tw.WriteRecord(t, b)
}

// Flush writes buffered records to the underlying writer.
func (tw *Writer) Flush() error {
	if err := tw.flushEvents(); err != nil {
		return err
	}
	if err := tw.w.Flush(); err != nil {
		tw.err = fmt.Errorf("flush trace file: %w", err)
	}
	return tw.err
}

// Close writes the End record and flushes. It does not close the
// underlying writer.
func (tw *Writer) Close(end *End) error {
	if err := tw.WriteJSON(TypeEnd, end); err != nil {
		return err
	}
	return tw.Flush()
}
