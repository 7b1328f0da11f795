package stack

import (
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Coalesced writes: the kernel's tcp_autocorking for netstack. A small
// write that follows another of the same connection with no receive or
// wait of the stack between them (waitPoint) is copied into the
// connection's coalesced bytes instead of going to netstack, and they go
// as one netstack Write: when they reach coalesceFlush, at the stack's
// next wait point, with kickTimer (Options.TxKickDelay), or before
// anything else the connection does. The first write after a wait goes
// at once, so a request-response exchange is not delayed. A connection in
// an epoll set is not coalesced: an event loop's reads are no wait
// points (the engine's TCPRecv), and nginx's keep-alive rate under ab,
// both under vmaxdp, fell from 56-60k to 41-50k requests a second when
// its connections were (2 interleaved rounds of each build). netstack makes
// a segment of every Write under TCP_NODELAY and its Write is the cost of
// a stream of small messages: sockperf --tcp tp from vmaxdp spent half
// of the sender's CPU in it, where the kernel's client puts about 13 of
// its 64-byte messages in each segment. (netstack's own TCP_CORK was
// tried for this and is dearer than the segments it saves: README.)
//
// What netstack has no room for when they go (its send buffer is full)
// stays coalesced: the connection's next write returns EAGAIN until it
// has gone, as the kernel's would with a full buffer, and netstack's
// writable event flushes it. A close or a write shutdown that finds some
// left takes effect once it has gone.

const (
	// coalesceSmall is the largest write that is coalesced.
	coalesceSmall = 1024
	// coalesceFlush is where coalesced bytes go to netstack: a few
	// segments' worth, one Write.
	coalesceFlush = 4096
)

// coalesceState is what a connection keeps of its coalesced writes.
// Under the connection's wmu.
type coalesceState struct {
	buf []byte // the bytes, in order; cap coalesceFlush+coalesceSmall
	// gen is the stack's coalesceGen at the connection's last write, and
	// wrote says there was one.
	gen   uint32
	wrote bool
	// listed: on the stack's coalescing list. waiting: registered for
	// netstack's writable event (left bytes).
	listed  bool
	waiting bool
	entry   waiter.Entry
	// shut: the write side is shut (Shutdown, Close): a write goes to
	// netstack, which fails it.
	shut bool
	// then is the close or shutdown (SHUT_WR) that waits for the bytes
	// to go (pendingClose, pendingShut).
	then coalesceThen
}

type coalesceThen uint8

const (
	thenNothing coalesceThen = iota
	thenShut
	thenClose
)

// coalescing lists a stack's connections with coalesced bytes.
type coalescing struct {
	mu    sync.Mutex
	conns []*TCPConn
	spare []*TCPConn   // the other list, swapped in at each flush: no allocation
	n     atomic.Int32 // len(conns), read without mu (waitPoint)
}

// coalesce copies bufs (n bytes) into c's coalesced bytes and says
// whether it did: a small write that follows the connection's last one
// with no wait point between, on an established connection, with room.
// Caller holds c.wmu.
func (c *TCPConn) coalesce(bufs [][]byte, n int, more bool, gen uint32) bool {
	cs := &c.coal
	if more || n > coalesceSmall || !cs.wrote || cs.gen != gen || cs.shut || c.sets.Load() > 0 ||
		c.st.opts.TxKickDelay == 0 || len(cs.buf)+n > coalesceFlush+coalesceSmall {
		return false
	}
	if st := c.State(); st != tcp.StateEstablished && st != tcp.StateCloseWait {
		return false
	}
	if cs.buf == nil {
		cs.buf = make([]byte, 0, coalesceFlush+coalesceSmall)
	}
	for _, b := range bufs {
		cs.buf = append(cs.buf, b...)
	}
	if len(cs.buf) >= coalesceFlush {
		c.flushCoalescedLocked()
	}
	if len(cs.buf) > 0 && !cs.listed {
		cs.listed = true
		c.st.coalescing.add(c)
		c.st.armKick()
	}
	return true
}

// flushCoalescedLocked writes c's coalesced bytes to netstack, as many as
// it has room for, and says whether none are left. What is left waits
// for netstack's writable event. Caller holds c.wmu.
func (c *TCPConn) flushCoalescedLocked() bool {
	cs := &c.coal
	if len(cs.buf) == 0 {
		return true
	}
	c.wr.reset([][]byte{cs.buf})
	c.st.tcpAppSends.Add(1)
	n, terr := c.ep.Write(&c.wr, tcpip.WriteOptions{})
	c.st.tcpAppSends.Add(-1)
	c.wr.reset(nil)
	switch terr.(type) {
	case nil, *tcpip.ErrWouldBlock:
	default:
		// The connection can send no more (reset, closed): what is
		// left goes with it, as the kernel's send queue does, and the
		// application's next call on it gets the error.
		n = int64(len(cs.buf))
	}
	left := copy(cs.buf, cs.buf[n:])
	cs.buf = cs.buf[:left]
	if left == 0 {
		if cs.waiting {
			cs.waiting = false
			c.wq.EventUnregister(&cs.entry)
		}
		return true
	}
	if !cs.waiting {
		cs.waiting = true
		cs.entry.Init(c, waiter.WritableEvents)
		c.wq.EventRegister(&cs.entry)
	}
	return false
}

// NotifyEvent is netstack's writable event for left coalesced bytes
// (waiter.EventListener): kickTimer flushes them.
func (c *TCPConn) NotifyEvent(waiter.EventMask) { c.st.armKick() }

// flushCoalesced writes c's coalesced bytes, then makes the close or
// shutdown that waited for them; wait says whether it may wait for the
// connection's write lock (kickTimer may not). flushPassed: the lock
// was taken; flushBusy: netstack had no room for some.
func (c *TCPConn) flushCoalesced(wait bool) flushResult {
	if wait {
		c.wmu.Lock()
	} else if !c.wmu.TryLock() {
		return flushPassed
	}
	if !c.flushCoalescedLocked() {
		c.wmu.Unlock()
		return flushBusy
	}
	then := c.coal.then
	c.coal.then, c.coal.listed = thenNothing, false
	c.wmu.Unlock()
	switch then {
	case thenShut:
		c.shutWrite()
	case thenClose:
		c.shutWrite()
		c.closeNow()
	}
	return flushDone
}

// add lists c (its first coalesced bytes).
func (l *coalescing) add(c *TCPConn) {
	l.mu.Lock()
	l.conns = append(l.conns, c)
	l.n.Store(int32(len(l.conns)))
	l.mu.Unlock()
}

// flushCoalesced writes the coalesced bytes of every listed connection of
// the stack; those netstack had no room for stay listed, for its
// writable event. A wait point of the application's waits for each
// connection's lock; kickTimer does not, and says whether one was taken
// (passed: it looks again one delay later).
func (st *Stack) flushCoalesced(wait bool) (passed bool) {
	l := &st.coalescing
	if l.n.Load() == 0 {
		return false
	}
	l.mu.Lock()
	conns := l.conns
	l.conns, l.spare = l.spare[:0], nil
	l.n.Store(0)
	l.mu.Unlock()
	keep := conns[:0]
	for _, c := range conns {
		switch c.flushCoalesced(wait) {
		case flushPassed:
			passed = true
			keep = append(keep, c)
		case flushBusy:
			keep = append(keep, c)
		}
	}
	clear(conns[len(keep):])
	l.mu.Lock()
	if len(keep) > 0 {
		l.conns = append(l.conns, keep...)
		l.n.Store(int32(len(l.conns)))
	}
	if l.spare == nil {
		clear(keep)
		l.spare = conns[:0]
	}
	l.mu.Unlock()
	return passed
}

// wroteDirect notes a write of c's that went to netstack itself: the
// next one coalesces until a wait point, which counts it (waitPoint:
// coalesceGen). Not the kicks' waitGen: a write netstack holds (Nagle,
// TCP_CORK) sends nothing. Caller holds c.wmu.
func (c *TCPConn) wroteDirect(gen uint32) {
	c.coal.gen, c.coal.wrote = gen, true
	if !c.st.tcpWrote.Load() {
		c.st.tcpWrote.Store(true)
	}
}

// coalescedErr is what a write gets while coalesced bytes are left:
// netstack's buffer is full (EAGAIN), or the write side waits to shut.
func (c *TCPConn) coalescedErr() error {
	if c.coal.shut {
		return unix.EPIPE
	}
	return unix.EAGAIN
}
