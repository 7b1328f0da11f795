package probes

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

// ringOver lays records out as the kernel does (an 8-byte header whose
// length word carries the busy and discard bits, data padded to 8) in
// plain memory, with the positions in their own words: Batch's parsing,
// without a kernel to fill the ring.
func ringOver(records ...[]byte) (*Ring, []uint32) {
	const size = 4096
	r := &Ring{cons: make([]byte, 8), prodData: make([]byte, 8+size), mask: size - 1, publish: size / 16, epfd: -1}
	r.data = r.prodData[8:]
	var pos uint64
	var hdrs []uint32
	for _, rec := range records {
		hdrs = append(hdrs, uint32(pos))
		binary.NativeEndian.PutUint32(r.data[pos:], uint32(len(rec)))
		copy(r.data[pos+ringHdrSize:], rec)
		pos += ringHdrSize + (uint64(len(rec))+7)&^7
	}
	binary.NativeEndian.PutUint64(r.prodData, pos)
	return r, hdrs
}

func (r *Ring) setBits(hdr uint32, bits uint32) {
	l := binary.NativeEndian.Uint32(r.data[hdr:])
	binary.NativeEndian.PutUint32(r.data[hdr:], l|bits)
}

func readAll(t *testing.T, r *Ring) ([]string, error) {
	t.Helper()
	var got []string
	_, err := r.Batch(func(s []byte) error { got = append(got, string(s)); return nil })
	return got, err
}

func TestRingBatch(t *testing.T) {
	r, hdrs := ringOver([]byte("one"), []byte("twotwotwo"), []byte("three"), []byte("four"))
	r.setBits(hdrs[1], ringDiscard)
	r.setBits(hdrs[3], ringBusy)
	got, err := readAll(t, r)
	if err != nil || !slices.Equal(got, []string{"one", "three"}) {
		t.Fatalf("first batch: %q, %v; want one and three (two discarded, four busy)", got, err)
	}
	if cons := binary.NativeEndian.Uint64(r.cons); cons != uint64(hdrs[3]) {
		t.Fatalf("consumer at %d after the batch, want %d: the busy record's", cons, hdrs[3])
	}
	binary.NativeEndian.PutUint32(r.data[hdrs[3]:], 4) // committed: busy bit cleared
	if got, err := readAll(t, r); err != nil || !slices.Equal(got, []string{"four"}) {
		t.Fatalf("second batch: %q, %v; want four", got, err)
	}
	if got, err := readAll(t, r); err != nil || len(got) != 0 {
		t.Fatalf("empty ring: %q, %v", got, err)
	}
}

func TestRingCorrupt(t *testing.T) {
	r, hdrs := ringOver([]byte("one"), []byte("two"))
	binary.NativeEndian.PutUint32(r.data[hdrs[1]:], 1000) // past the producer
	got, err := readAll(t, r)
	if !errors.Is(err, ErrRingCorrupt) || !slices.Equal(got, []string{"one"}) {
		t.Fatalf("got %q, %v; want one, then ErrRingCorrupt", got, err)
	}
}
