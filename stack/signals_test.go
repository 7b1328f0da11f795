package stack

import (
	"testing"
	"time"
)

// TestResched: a thread's waits let Go's scheduler run at most once every
// reschedEvery, a clock that steps back does not stop them for good, and
// a wait of a Go program (no Signals) never does.
func TestResched(t *testing.T) {
	var s Signals
	w := s.Begin(false)
	t0 := time.Now().UnixNano()
	for _, step := range []struct {
		at   int64
		want int64 // resched after the call
	}{
		{t0, t0},
		{t0 + int64(reschedEvery) - 1, t0},
		{t0 + int64(reschedEvery), t0 + int64(reschedEvery)},
		{t0 - int64(time.Hour), t0 - int64(time.Hour)},
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
