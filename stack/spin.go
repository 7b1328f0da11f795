package stack

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Spin decides how long a wait may poll before it sleeps, when the user
// did not fix it (VMAXDP_RX_POLL, VMAXDP_SELECT_POLL at their default,
// "auto"). VMA's fixed counts assume a core per polling thread; on a
// machine where the application, its peer and the kernel share a few
// cores, a thread that polls takes the CPU from whoever would make what
// it waits for, and everything gets slower than the kernel. So a wait
// polls only while polling pays, and never at the expense of another
// thread:
//
//   - it learns how long waits take to find work (a moving average of the
//     time from the first empty look to the work, whether the work came
//     while polling or after a sleep) and polls up to four times that and
//     spinFloor more, never more than SpinMax; waits much longer than
//     SpinMax sleep at once, since a wake-up costs little against them;
//   - a wait that has polled spinYieldAfter offers its CPU to any other
//     runnable thread (sched_yield, VMA_SELECT_POLL_YIELD's idea) every
//     spinYield polls: a thread that makes what the poller waits for (the
//     program's own sender thread, the peer, the kernel's softirq) runs at
//     once instead of at the end of the poller's time slice. dnsperf
//     under vmaxdp against knot on this two-CPU machine answered 0.90x the
//     kernel's queries per second polling without yielding, 1.42x with it;
//     sockperf ping-pong's waits are shorter than spinYieldAfter and never
//     yield.
//
// A Spin is shared by the waits of one socket or multiplexer; its updates
// are racy by design (a lost update only nudges a heuristic) and lock free.
type Spin struct {
	avg atomic.Int64 // ns: moving average of how long waits took to find work
}

// SpinMax bounds a wait's polling.
const SpinMax = 100 * time.Microsecond

const (
	// spinFloor is polled even when waits are short: waits vary (the
	// peer's scheduling, interrupts, this VM's host), and one that misses
	// its budget sleeps, which costs tens of microseconds. With twice the
	// average and no floor, a tenth of sockperf ping-pong's waits slept
	// and its latency went from 2.4 to 4 us.
	spinFloor = 20 * time.Microsecond
	// spinCheck: the clock is read every spinCheck polls.
	spinCheck = 8
	// spinYield, spinYieldAfter: see Spin.
	spinYield      = 32
	spinYieldAfter = 5 * time.Microsecond
)

// Budget is how long a wait may poll: 0 means sleep at once.
func (s *Spin) Budget() time.Duration {
	a := time.Duration(s.avg.Load())
	switch {
	case a > 4*SpinMax:
		return 0
	case 4*a+spinFloor > SpinMax:
		return SpinMax
	}
	return 4*a + spinFloor
}

// Done records a wait that began at start and found work at end (unix ns).
func (s *Spin) Done(start, end int64) {
	a := s.avg.Load()
	s.avg.Store(a + (end-start-a)/8)
}

// SpinClock watches one wait's polling: call Tick on every poll; it reads
// the clock every spinCheck polls, yields the CPU as Spin says, and says
// when the budget is spent.
type SpinClock struct {
	Start, now int64
	budget     int64
	n          int
}

// Begin starts watching a wait at now with budget.
func (c *SpinClock) Begin(now int64, budget time.Duration) {
	*c = SpinClock{Start: now, now: now, budget: int64(budget)}
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
	if c.now-c.Start > int64(spinYieldAfter) && c.n%spinYield == 0 {
		// With no other runnable thread here, it returns at once.
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		c.now = time.Now().UnixNano()
	}
	return c.now-c.Start >= c.budget
}
