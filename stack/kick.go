package stack

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmaxdp/vmaxdp/backend"
)

// Coalesced transmit kicks (Options.TxKickDelay). In AF_XDP copy mode a
// frame leaves only inside a kick, a sendto(2) that runs the device's
// transmit inline: one per send caps a sender at one system call per
// datagram. A send that follows another with no receive or wait of the
// stack between them (waitPoint) leaves its frames on the TX ring; the
// kick that sends them comes with the next full batch (the backend's),
// the next receive or wait, a send that finds them older than the delay,
// or kickTimer. The first send after a wait kicks at once: a ping-pong
// is not delayed, and a lone datagram needs no timer, whose arming wakes
// Go's netpoller thread (3.5 us a send on each side of a sockperf
// ping-pong when every send armed it).
//
// The kick runs without the queue's txMu (kick), and a poll's without the
// receive lock (Stack.Poll): the system call runs the device's transmit,
// for a veth the peer's receive on this CPU, and the threads that sent or
// received meanwhile waited for it on the lock. An application
// thread that waits on a Go mutex in a cgo call hands its P to another
// thread and is woken by a third: memcached's four workers over TCP
// spent 2.8 s of every 3 s blocked on txMu (Go's block profile), and a
// futex wait or wake per request.

// transmit sends bufs on q, at once or (Options.TxKickDelay, when the
// send follows another and atOnce is not set) at the next flush. now is
// monoNow's, or 0 for read when needed. Caller holds q.txMu.
func (st *Stack) transmit(q *queue, bufs []backend.Buf, now int64, atOnce bool) (int, error) {
	if !st.sent.Load() {
		st.sent.Store(true)
	}
	gen := st.waitGen.Load()
	follows := gen == q.sendGen
	q.sendGen = gen
	if atOnce || !follows && !q.unkicked.Load() {
		return st.transmitNow(q, bufs)
	}
	return st.transmitLater(q, bufs, now)
}

// transmitLater sends bufs on q at the next flush (Options.TxKickDelay);
// now as for transmit. Caller holds q.txMu.
func (st *Stack) transmitLater(q *queue, bufs []backend.Buf, now int64) (int, error) {
	if st.opts.TxKickDelay == 0 {
		return st.transmitNow(q, bufs)
	}
	n, err := q.be.TransmitLater(bufs)
	if q.unkicked.Load() && q.be.Unsent() {
		if now == 0 {
			now = monoNow()
		}
		if now-q.unkickedAt >= int64(st.opts.TxKickDelay) {
			q.kickDue = true
			return n, err
		}
	}
	st.noteUnsent(q, now, false)
	return n, err
}

// transmitNow sends bufs and whatever earlier sends left on q, with the
// kick its caller makes once it has let go of q.txMu (unlockTx). Caller
// holds q.txMu.
func (st *Stack) transmitNow(q *queue, bufs []backend.Buf) (int, error) {
	q.kickDue = true
	return q.be.Enqueue(bufs)
}

// unlockTx lets go of q.txMu and makes the kick that the sends under it
// asked for (kickDue); the kick's error, but for a busy device's.
func (st *Stack) unlockTx(q *queue) error {
	due := q.kickDue
	q.kickDue = false
	q.txMu.Unlock()
	if !due {
		return nil
	}
	if _, err := st.kick(q, 0, false); err != nil && !errors.Is(err, backend.ErrBusy) {
		return err
	}
	return nil
}

// kickLatch makes a queue's kicks one at a time: a kick that finds
// another under way leaves its frames to that one, which kicks again once
// done, so that what was queued meanwhile goes too.
type kickLatch struct {
	mu     sync.Mutex
	wanted atomic.Bool // a kick was asked for since the holder's began
}

// take says whether the caller is to kick, holding the latch; false: the
// holder kicks again for it. With wait it waits for the latch.
func (l *kickLatch) take(wait bool) bool {
	l.wanted.Store(true)
	if wait {
		l.mu.Lock()
	} else if !l.mu.TryLock() {
		return false
	}
	l.wanted.Store(false)
	return true
}

// again lets go of the latch and says whether the caller is to kick
// again, holding it: a kick was asked for meanwhile.
func (l *kickLatch) again() bool {
	l.mu.Unlock()
	if !l.wanted.Load() || !l.mu.TryLock() {
		return false // nobody asked, or the one who holds it now kicks
	}
	l.wanted.Store(false)
	return true
}

// release lets go of the latch without kicking again: what was asked
// for meanwhile waits for kickTimer (a busy device, see kick).
func (l *kickLatch) release() { l.mu.Unlock() }

// kick sends what q's TX ring holds, without q.txMu (see above), one kick
// at a time (q.kicks). A kick that found the device busy or failing less
// than txBusyRetry ago is passed over: a busy device's kick spins up to 1
// ms (xsk's drainTx), and every send and wait point would pay it. What a
// busy or failing device keeps is noted under txMu (noteUnsent), for
// kickTimer; now is monoNow's, or 0 for read when needed.
func (st *Stack) kick(q *queue, now int64, wait bool) (flushResult, error) {
	if !q.kicks.take(wait) {
		return flushPassed, nil
	}
	var err error
	for ok := true; ok; ok = q.kicks.again() {
		err = nil
		if b := q.busyAt.Load(); b != 0 {
			if now == 0 {
				now = monoNow()
			}
			if now-b < int64(txBusyRetry) {
				q.kicks.release()
				return flushBusy, nil
			}
		}
		if !q.closed {
			err = q.be.Flush()
		}
	}
	switch {
	case err != nil:
		// A busy device, or a failed kick (the backend counts both: xsk's
		// TxBacklog, TxKickErrs): the frames stay for kickTimer.
		q.txMu.Lock()
		st.noteUnsent(q, now, true)
		q.txMu.Unlock()
		return flushBusy, err
	case q.unkicked.Load() || q.busyAt.Load() != 0:
		// Sent what earlier sends left, or what a busy device kept: say
		// so, unless a sender holds txMu, which notes it itself (or
		// kickTimer finds nothing left).
		if q.txMu.TryLock() {
			st.noteUnsent(q, now, false)
			q.txMu.Unlock()
		}
		if q.unkicked.Load() {
			return flushPassed, nil
		}
	}
	return flushDone, nil
}

// noteUnsent records what q's backend holds back after a send or a kick
// and arms kickTimer for it: frames a send deferred, or, when the call
// kicked, frames a busy or failing device kept (busyAt). now as for
// transmit. Caller holds q.txMu.
func (st *Stack) noteUnsent(q *queue, now int64, kicked bool) {
	if !q.be.Unsent() {
		q.unkicked.Store(false)
		q.busyAt.Store(0)
		return
	}
	if now == 0 {
		now = monoNow()
	}
	if kicked {
		q.busyAt.Store(now)
	}
	if !q.unkicked.Load() {
		q.unkickedAt = now
		q.unkicked.Store(true)
		st.armKick()
	}
}

// waitPoint marks a receive or wait of the stack: the next send kicks at
// once, and what sends left goes now. It runs for every receive and poll,
// so it writes the shared counter only after a send: a receive-only
// path reads two flags.
func (st *Stack) waitPoint() {
	st.flushCoalesced(true)
	if st.tcpWrote.Load() {
		st.tcpWrote.Store(false)
		st.coalesceGen.Add(1)
	}
	if st.sent.Load() {
		st.sent.Store(false)
		st.waitGen.Add(1)
	}
	st.flushTx(false)
}

// FlushSends kicks what sends left on the stack's TX rings, and waits for
// the kicks: at a process's exit, frames left for kickTimer would go with
// it, where a datagram the kernel took outlives its sender.
func (st *Stack) FlushSends() {
	st.flushCoalesced(true)
	st.flushTx(true)
}

// txBusyRetry is how long the kick timer waits before it kicks again a
// queue whose device stayed busy, or failed, through a kick (the
// backend's Unsent): a link that is down answers every kick at once,
// and retrying at the coalescing delay would cost a core.
const txBusyRetry = time.Millisecond

// flushTx kicks what sends left on the TX rings. Without wait it passes
// over a queue whose lock another thread holds: that thread is sending,
// and kicks or arms the timer itself. It returns when the timer should
// look again (0: nothing is left): one coalescing delay for a queue it
// passed over, txBusyRetry when only busy devices hold frames.
func (st *Stack) flushTx(wait bool) (again time.Duration) {
	if !st.kickArmed.Load() {
		return 0
	}
	for _, q := range st.queueList() {
		switch st.flushQueue(q, wait, 0) {
		case flushPassed:
			again = st.kickDelay()
		case flushBusy:
			if again == 0 {
				again = txBusyRetry
			}
		}
	}
	if again > 0 {
		return again
	}
	// Nothing left: stop the timer, which would wake a goroutine for
	// nothing. A send may arm it between the swap and the stop (which
	// then undoes that), or defer while it still looked armed: look
	// again for both.
	if st.kickArmed.Swap(false) {
		st.kickTimer.Stop()
	}
	switch {
	case st.kickArmed.Load():
		st.kickTimer.Reset(st.kickDelay())
	case slices.ContainsFunc(st.queueList(), func(q *queue) bool { return q.unkicked.Load() }):
		st.armKick()
	}
	return 0
}

// flushAged kicks the queues whose unkicked frames have waited at least
// age, passing over those another thread is sending on; the timer stays
// armed for the rest.
func (st *Stack) flushAged(age time.Duration) {
	if !st.kickArmed.Load() {
		return
	}
	for _, q := range st.queueList() {
		st.flushQueue(q, false, age)
	}
}

// flushResult is what flushQueue did with a queue's unkicked frames.
type flushResult uint8

const (
	flushDone   flushResult = iota // none are left
	flushPassed                    // left: the queue's lock was taken, or they are younger than asked
	flushBusy                      // left: the device stayed busy, or failed, through the kick
)

// flushQueue kicks what sends left on q, if they have waited at least
// age. Without wait it passes over q when its lock, or the kick, is
// taken.
func (st *Stack) flushQueue(q *queue, wait bool, age time.Duration) flushResult {
	if !q.unkicked.Load() {
		return flushDone
	}
	if wait {
		q.txMu.Lock()
	} else if !q.txMu.TryLock() {
		return flushPassed
	}
	// unkickedAt is written under txMu.
	if !q.unkicked.Load() || q.closed {
		q.txMu.Unlock()
		return flushDone
	}
	now := monoNow()
	young := age > 0 && now-q.unkickedAt < int64(age)
	q.txMu.Unlock()
	if young {
		return flushPassed
	}
	// A failed kick leaves the frames for the next one; the backend
	// counts it (xsk: TxKickErrs, TxBacklog).
	res, _ := st.kick(q, now, wait)
	return res
}

// armKick starts kickTimer unless it runs already. With coalescing off
// only a busy device's frames (noteUnsent) arm it.
func (st *Stack) armKick() {
	if !st.kickArmed.Swap(true) {
		st.kickTimer.Reset(st.kickDelay())
	}
}

// kickDelay is kickTimer's delay: Options.TxKickDelay, or with
// coalescing off (where only a busy device's frames arm the timer)
// txBusyRetry.
func (st *Stack) kickDelay() time.Duration {
	if st.opts.TxKickDelay == 0 {
		return txBusyRetry
	}
	return st.opts.TxKickDelay
}

// kickFired is kickTimer's function. It never waits for a queue's lock:
// the thread holding it is sending, and the timer looks again one delay
// later. Waiting made every send of a stream that found the timer's
// goroutine parked on the lock wake it (sockperf tp under vmaxdp: 4% of
// the sender's CPU in futex wake-ups from the send's unlock).
func (st *Stack) kickFired() {
	passed := st.flushCoalesced(false)
	again := st.flushTx(false)
	if passed && (again == 0 || again > st.kickDelay()) {
		again = st.kickDelay()
		st.kickArmed.Store(true)
	}
	if again > 0 {
		st.kickTimer.Reset(again)
	}
}
