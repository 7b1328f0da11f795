package stack

import (
	"testing"
	"time"
)

// TestResched: a busy thread's waits (less than reschedBusy apart) let
// Go's scheduler run at most once every reschedEvery, a thread whose waits
// are far apart never, a clock that steps back does not stop them for
// good, and a wait of a Go program (no Signals) never does.
func TestResched(t *testing.T) {
	var s Signals
	w := s.Begin(false)
	t0 := time.Now().UnixNano()
	busy := int64(reschedBusy) - 1
	for _, step := range []struct {
		at   int64
		want int64 // resched after the call
	}{
		{t0, 0},                  // the first wait: not busy yet
		{t0 + busy, t0 + busy},   // busy, and never rescheduled
		{t0 + 2*busy, t0 + busy}, // within reschedEvery
		{t0 + 2*busy + 2*int64(reschedBusy), t0 + busy}, // far apart: idle
		{t0 + int64(reschedEvery) + 10*int64(reschedBusy), t0 + busy},
		{t0 + int64(reschedEvery) + 10*int64(reschedBusy) + busy, t0 + int64(reschedEvery) + 10*int64(reschedBusy) + busy},
		{t0 - int64(time.Hour), t0 + int64(reschedEvery) + 10*int64(reschedBusy) + busy}, // stepped back: not busy
		{t0 - int64(time.Hour) + busy, t0 - int64(time.Hour) + busy},
	} {
		w.Resched(step.at)
		if s.resched != step.want {
			t.Errorf("Resched(t0%+d): last at t0%+d, want t0%+d", step.at-t0, s.resched-t0, step.want-t0)
		}
	}
	var none *Signals
	nw := none.Begin(false)
	nw.Resched(t0)
	(*SignalWait)(nil).Resched(t0)
}
