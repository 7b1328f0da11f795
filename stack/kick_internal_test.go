package stack

import "testing"

// TestKickLatch: a kick asked for while another is under way is left to
// that one, which kicks again once done; and only then.
func TestKickLatch(t *testing.T) {
	var l kickLatch
	if !l.take(false) {
		t.Fatal("a free latch was not taken")
	}
	if l.take(false) {
		t.Fatal("a held latch was taken twice")
	}
	if !l.again() {
		t.Fatal("the holder does not kick again for the kick asked for meanwhile: its frames would stay on the ring")
	}
	if l.again() {
		t.Fatal("the holder kicks again though nobody asked")
	}
	if !l.take(false) {
		t.Fatal("the latch was not let go")
	}
	l.mu.Unlock()
}
