package stack

import (
	"sync"
	"time"
)

// lockSpinFor bounds how long an application thread spins for a lock of
// the stack's that another thread holds before it waits on the mutex.
// Longer spins cost a CPU when the holder's thread is preempted (unbound
// with two threads lost 5-10% at 50 us); the receive lock's holds are
// shorter since a poll's kicks come before it (Stack.Poll).
const lockSpinFor = 10 * time.Microsecond

// spinLock takes mu for an application thread, spinning for it first. A
// C thread that waits on a Go mutex inside a cgo call parks its
// goroutine, which is locked to that thread: the unlock readies it on
// the unlocker's P and wakes one of Go's threads, which finds it locked
// to another thread, hands that thread the P and wakes it. Two workers of
// a SO_REUSEPORT group on one queue (knot, 32 flows of dnsperf) made
// 1,700 such hand-offs a second on the receive lock and left the two
// CPUs 12% idle (0.84x the kernel's queries); spinning, with the poll's
// kicks out of the lock, 100 (0.94x). The kernel's socket locks spin.
func spinLock(mu *sync.Mutex) {
	if mu.TryLock() {
		return
	}
	deadline := monoNow() + int64(lockSpinFor)
	for i := 1; ; i++ {
		if mu.TryLock() {
			return
		}
		if i%64 == 0 && monoNow() > deadline {
			break
		}
	}
	mu.Lock()
}
