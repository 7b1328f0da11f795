package stack

import (
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
// send follows another) at the next flush. Caller holds q.txMu.
func (st *Stack) transmit(q *queue, bufs []backend.Buf) (int, error) {
	if !st.sent.Load() {
		st.sent.Store(true)
	}
	gen := st.waitGen.Load()
	follows := gen == q.sendGen
	q.sendGen = gen
	if !follows && !q.unkicked.Load() {
		return q.be.Transmit(bufs)
	}
	return st.transmitLater(q, bufs)
}

// transmitLater sends bufs on q at the next flush (Options.TxKickDelay).
// Caller holds q.txMu.
func (st *Stack) transmitLater(q *queue, bufs []backend.Buf) (int, error) {
	if st.opts.TxKickDelay == 0 {
		return q.be.Transmit(bufs)
	}
	n, unsent, err := q.be.TransmitLater(bufs)
	switch {
	case err != nil || !unsent:
		q.unkicked.Store(false)
	case !q.unkicked.Load():
		q.unkickedAt = time.Now().UnixNano()
		q.unkicked.Store(true)
		st.armKick()
	case time.Now().UnixNano()-q.unkickedAt >= int64(st.opts.TxKickDelay):
		err = q.be.Flush()
		q.unkicked.Store(false)
	}
	return n, err
}

// transmitNow sends bufs and whatever earlier sends left on q. Caller
// holds q.txMu.
func (st *Stack) transmitNow(q *queue, bufs []backend.Buf) (int, error) {
	n, err := q.be.Transmit(bufs)
	q.unkicked.Store(false)
	return n, err
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

// flushTx kicks what sends left on the TX rings. Without wait it passes
// over a queue whose lock another thread holds: that thread is sending,
// and kicks or arms the timer itself.
func (st *Stack) flushTx(wait bool) {
	if !st.kickArmed.Load() {
		return
	}
	pending := false
	for _, q := range st.queueList() {
		pending = !st.flushQueue(q, wait, 0) || pending
	}
	if pending {
		return
	}
	// Nothing left: stop the timer, which would wake a goroutine for
	// nothing, and look again for a send that deferred meanwhile and
	// found the timer still armed.
	if st.kickArmed.Swap(false) {
		st.kickTimer.Stop()
	}
	for _, q := range st.queueList() {
		if q.unkicked.Load() {
			st.armKick()
			return
		}
	}
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

// flushQueue kicks what sends left on q, if they have waited at least
// age; false when it left them there: q's lock was taken (and not wait),
// or they are younger.
func (st *Stack) flushQueue(q *queue, wait bool, age time.Duration) bool {
	if !q.unkicked.Load() {
		return true
	}
	if wait {
		q.txMu.Lock()
	} else if !q.txMu.TryLock() {
		return false
	}
	defer q.txMu.Unlock()
	// unkickedAt is written under txMu.
	if !q.unkicked.Load() || q.closed {
		return true
	}
	if age > 0 && time.Now().UnixNano()-q.unkickedAt < int64(age) {
		return false
	}
	// A failed kick leaves the frames on the ring for the next one; the
	// backend counts it (xsk: TxKickErrs).
	q.be.Flush()
	q.unkicked.Store(false)
	return true
}

// armKick starts kickTimer unless it runs already.
func (st *Stack) armKick() {
	if !st.kickArmed.Swap(true) {
		st.kickTimer.Reset(st.opts.TxKickDelay)
	}
}

// kickFired is kickTimer's function.
func (st *Stack) kickFired() { st.flushTx(true) }
