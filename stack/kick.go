package stack

import (
	"slices"
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

// transmit sends bufs on q, at once or (Options.TxKickDelay, when the
// send follows another) at the next flush. now is monoNow's, or 0 for
// read when needed. Caller holds q.txMu.
func (st *Stack) transmit(q *queue, bufs []backend.Buf, now int64) (int, error) {
	if !st.sent.Load() {
		st.sent.Store(true)
	}
	gen := st.waitGen.Load()
	follows := gen == q.sendGen
	q.sendGen = gen
	if !follows && !q.unkicked.Load() {
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
			if ferr := st.kickLocked(q, now); err == nil {
				err = ferr
			}
			return n, err
		}
	}
	st.noteUnsent(q, now, false)
	return n, err
}

// transmitNow sends bufs and whatever earlier sends left on q. Caller
// holds q.txMu.
func (st *Stack) transmitNow(q *queue, bufs []backend.Buf) (int, error) {
	n, err := q.be.Transmit(bufs)
	if q.unkicked.Load() || q.be.Unsent() {
		st.noteUnsent(q, 0, true)
	}
	return n, err
}

// kickLocked kicks what q holds back, unless a kick found its device busy
// or failing less than txBusyRetry ago: a busy device's kick spins up to
// 1 ms (xsk's drainTx), and every wait point and drain would pay it.
// Caller holds q.txMu.
func (st *Stack) kickLocked(q *queue, now int64) error {
	if q.busyAt != 0 && now-q.busyAt < int64(txBusyRetry) {
		return nil
	}
	err := q.be.Flush()
	st.noteUnsent(q, now, true)
	return err
}

// noteUnsent records what q's backend holds back after a send or a kick
// and arms kickTimer for it: frames a send deferred, or, when the call
// kicked, frames a busy or failing device kept (busyAt). now as for
// transmit. Caller holds q.txMu.
func (st *Stack) noteUnsent(q *queue, now int64, kicked bool) {
	if !q.be.Unsent() {
		q.unkicked.Store(false)
		q.busyAt = 0
		return
	}
	if now == 0 {
		now = monoNow()
	}
	if kicked {
		q.busyAt = now
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
	if st.sent.Load() {
		st.sent.Store(false)
		st.waitGen.Add(1)
	}
	st.flushTx(false)
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
// age. Without wait it passes over q when its lock is taken.
func (st *Stack) flushQueue(q *queue, wait bool, age time.Duration) flushResult {
	if !q.unkicked.Load() {
		return flushDone
	}
	if wait {
		q.txMu.Lock()
	} else if !q.txMu.TryLock() {
		return flushPassed
	}
	defer q.txMu.Unlock()
	// unkickedAt is written under txMu.
	if !q.unkicked.Load() || q.closed {
		return flushDone
	}
	now := monoNow()
	if age > 0 && now-q.unkickedAt < int64(age) {
		return flushPassed
	}
	// A failed kick leaves the frames for the next one; the backend
	// counts it (xsk: TxKickErrs, TxBacklog).
	st.kickLocked(q, now)
	if q.unkicked.Load() {
		return flushBusy
	}
	return flushDone
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
	if again := st.flushTx(false); again > 0 {
		st.kickTimer.Reset(again)
	}
}
