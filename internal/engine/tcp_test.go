package engine

import (
	"bytes"
	"testing"
)

// TestConsumed: a send that netstack took in part goes on with the bytes
// it did not take, whatever buffer boundary the part ends in, empty
// buffers included.
func TestConsumed(t *testing.T) {
	bufs := func() [][]byte { return [][]byte{[]byte("ab"), {}, []byte("cde"), []byte("f")} }
	for n := 0; n <= 6; n++ {
		left := bytes.Join(consumed(bufs(), n), nil)
		if want := []byte("abcdef")[n:]; !bytes.Equal(left, want) {
			t.Errorf("consumed(%d) left %q, want %q", n, left, want)
		}
	}
	if left := consumed(bufs(), 2); len(left) != 2 || string(left[0]) != "cde" {
		t.Errorf("consumed(2) = %q: the empty buffer after a whole one must go too", left)
	}
}
