package stack

import (
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Signals counts the signal handlers that ran on one application thread,
// so that a blocking call made on that thread returns EINTR when a handler
// runs during it, as the kernel's call would, even while it spins in user
// space where no system call can be interrupted. The preload library's
// handler wrapper keeps one per thread (its layout is the C struct
// vmx_signals). Go programs have no use for it: their calls take nil and
// never return EINTR.
type Signals struct {
	// Any counts every handler.
	Any atomic.Uint64
	// Intr counts the handlers installed without SA_RESTART; after the
	// others a receive without a timeout goes on waiting, as the kernel
	// restarts recvfrom (signal(7)).
	Intr atomic.Uint64
	// Cancel is set while a pthread_cancel of the thread waits for its
	// call to end (the interposer's wrapper): the wait ends as if a
	// handler had run, and the interposer acts on the cancellation.
	Cancel atomic.Uint64
	// resched is when (unix ns) the thread's waits last let Go's
	// scheduler run, and waited when its last wait began
	// (SignalWait.Resched); only the thread writes them.
	resched, waited int64
}

// SignalWait is one blocking call's view of its thread's Signals.
type SignalWait struct {
	s             *Signals
	watch         *atomic.Uint64
	seen, seenAny uint64
}

// Begin starts a wait. restartable is true for a receive without a
// timeout, which SA_RESTART handlers do not end; multiplexers and receives
// with a timeout are never restarted. s may be nil.
func (s *Signals) Begin(restartable bool) SignalWait {
	if s == nil {
		return SignalWait{}
	}
	w := SignalWait{s: s, watch: &s.Any, seenAny: s.Any.Load()}
	if restartable {
		w.watch = &s.Intr
	}
	w.seen = w.watch.Load()
	return w
}

// Interrupted reports whether a handler that ends the wait has run, or
// a pthread_cancel waits for it.
func (w *SignalWait) Interrupted() bool {
	return w.s != nil && (w.watch.Load() != w.seen || w.s.Cancel.Load() != 0)
}

// reschedEvery is how often a busy thread's waits let Go's scheduler run;
// Go's sysmon acts on a P that ran one goroutine 10 ms (forcePreemptNS).
// A thread is busy while its waits begin less than reschedBusy apart.
const (
	reschedEvery = 5 * time.Millisecond
	reschedBusy  = time.Millisecond
)

// Resched lets Go's scheduler run the calling goroutine anew
// (runtime.Gosched) when the thread is busy and reschedEvery has passed
// since its last (now in unix ns, the wait's start). An application thread that calls into Go never goes
// through the scheduler otherwise, so its P's schedule count stands
// still; every 10 ms Go's sysmon then takes the P back from it or
// preempts it, and after taking one wakes every 20 us again. Under
// memcaslap (one thread, 16 UDP sockets) sysmon woke 1,800 times a second
// on the two CPUs that memcaslap and its kernel memcached need, each time
// preempting one of them; with this, about 400. The Gosched costs a
// hand-off between two of Go's threads, which wakes one: a thread whose
// waits are far apart (a server asked every 10 ms) is left alone, since
// its P sits idle in between, and its every wait would pay it (the drain
// goroutines then took 8 to 17 of 100 requests' segments from such a TCP
// server, against 3 to 6).
func (w *SignalWait) Resched(now int64) {
	if w == nil || w.s == nil {
		return
	}
	s := w.s
	busy := uint64(now-s.waited) < uint64(reschedBusy)
	s.waited = now
	if d := now - s.resched; busy && (d >= int64(reschedEvery) || d < 0) {
		s.resched = now
		runtime.Gosched()
	}
}

// Ppoll sleeps in ppoll(2) with the thread's signal mask (a multiplexer
// with a mask of its own sets it on the thread for the whole call), plus
// SIGURG (see ppoll), unless the wait is already interrupted. Every signal
// is blocked from the last look at the counters to the ppoll, which
// unblocks them atomically: a signal that comes after the look still ends
// the sleep. It returns unix.EINTR when the wait is interrupted, and nil
// when only restarting handlers ended the sleep. With no Signals it is a
// plain sleep, and a signal's EINTR is the caller's to take or ignore.
func (w *SignalWait) Ppoll(pfds []unix.PollFd, ts *unix.Timespec) (int, error) {
	if w.s == nil {
		return ppoll(pfds, ts, nil)
	}
	runtime.LockOSThread() // the mask is the thread's
	defer runtime.UnlockOSThread()
	var all, old unix.Sigset_t
	for i := range all.Val {
		all.Val[i] = ^all.Val[i] // every bit, whatever the word size
	}
	if err := unix.PthreadSigmask(unix.SIG_BLOCK, &all, &old); err != nil {
		return 0, err
	}
	defer unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
	if w.Interrupted() {
		return 0, unix.EINTR
	}
	n, err := ppoll(pfds, ts, &old)
	// A handler vmaxdp does not wrap (installed by a raw system call) is
	// not counted: its EINTR stands.
	if err == unix.EINTR && !w.Interrupted() && w.s.Any.Load() != w.seenAny {
		return 0, nil
	}
	return n, err
}
