package stack

import (
	"sync/atomic"
	"time"
)

// Spin decides how long a wait may poll before it sleeps, when the user
// did not fix it (VMAXDP_RX_POLL, VMAXDP_SELECT_POLL at their default,
// "auto"). VMA's fixed counts assume a core per polling thread; on a
// machine where the application, its peer and the kernel share a few
// cores, a thread that polls takes the CPU from whoever would produce
// what it waits for, and everything gets slower than the kernel. So a
// wait polls only while polling pays:
//
//   - it learns how long waits take to find work (a moving average of
//     the time from the first empty look to the work, whether the work
//     came while polling or after a sleep), and polls up to twice that,
//     never more than SpinMax; waits much longer than SpinMax sleep at
//     once, since a wake-up costs little against them;
//   - a thread that finds it lost its CPU while polling (two looks at the
//     clock further apart than SpinLostCPU, where polling takes well under
//     a microsecond) was pushed off by another runnable thread: polling
//     competes with the work it waits for, so waits sleep at once for a
//     while, 1 ms doubling to 64 ms while it keeps happening.
//
// A Spin is shared by the waits of one socket or multiplexer; its updates
// are racy by design (a lost update only nudges a heuristic) and lock free.
type Spin struct {
	avg    atomic.Int64 // ns: moving average of how long waits took to find work
	cool   atomic.Int64 // unix ns before which waits do not poll
	strike atomic.Int32 // waits in a row that lost their CPU while polling
}

// SpinMax bounds a wait's polling; SpinLostCPU is the gap between two
// looks at the clock that says the polling thread lost its CPU.
const (
	SpinMax     = 50 * time.Microsecond
	SpinLostCPU = 20 * time.Microsecond
	// spinFloor is polled even when waits are short: it covers the time
	// the producer takes from a datagram's send to its arrival.
	spinFloor = 2 * time.Microsecond
	// spinCheck: the clock is read every spinCheck polls.
	spinCheck = 8
)

// Budget is how long a wait beginning at now (unix ns) may poll: 0 means
// sleep at once.
func (s *Spin) Budget(now int64) time.Duration {
	if now < s.cool.Load() {
		return 0
	}
	a := time.Duration(s.avg.Load())
	switch {
	case a > 4*SpinMax:
		return 0
	case 2*a+spinFloor > SpinMax:
		return SpinMax
	}
	return 2*a + spinFloor
}

// Done records a wait that began at start and found work at end (unix
// ns); lostCPU says whether it lost its CPU while it polled.
func (s *Spin) Done(start, end int64, lostCPU bool) {
	a := s.avg.Load()
	s.avg.Store(a + (end-start-a)/8)
	if !lostCPU {
		s.strike.Store(0)
		return
	}
	k := min(s.strike.Add(1), 7)
	s.cool.Store(end + int64(time.Millisecond)<<(k-1))
}

// SpinClock watches one wait's polling: call Tick on every poll; it reads
// the clock every spinCheck polls and says when the budget is spent.
type SpinClock struct {
	Start, last, now int64
	budget           int64
	n                int
	LostCPU          bool
}

// Begin starts watching a wait at now with budget.
func (c *SpinClock) Begin(now int64, budget time.Duration) {
	*c = SpinClock{Start: now, last: now, now: now, budget: int64(budget)}
}

// Now is the time (unix ns) the clock was last read.
func (c *SpinClock) Now() int64 { return c.now }

// Stop ends the wait's polling: every Tick from now on says stop (a wait
// that slept looks once after its wake-up, then sleeps again).
func (c *SpinClock) Stop() { c.budget = 0 }

// Tick counts a poll and reports whether the wait should stop polling.
func (c *SpinClock) Tick() bool {
	if c.budget <= 0 {
		return true
	}
	if c.n++; c.n%spinCheck != 0 {
		return false
	}
	c.now = time.Now().UnixNano()
	if c.now-c.last > int64(SpinLostCPU) {
		c.LostCPU = true
		return true
	}
	c.last = c.now
	return c.now-c.Start >= c.budget
}
