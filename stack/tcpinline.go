package stack

import (
	"reflect"
	"slices"
	"sync"
	"unsafe" // go:linkname, the endpoint's segment queue

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/vmaxdp/vmaxdp/stack/header"
)

// Inline segment processing. netstack hands every segment it receives to
// a processor goroutine of its own (tcp's dispatcher), which another
// thread must wake up to run when the frame came in on the application's
// own thread (a cgo callback, locked to it): a thread wake-up per segment,
// which the kernel does not make. A receive that polls for its
// connection's answer drains the rings itself (TCPConn.Poll), and the
// segments that only carry data or acknowledge (no SYN, FIN, RST or URG)
// for that connection, established, are processed on its thread, as the
// processor would:
//
//  1. at the first such segment of the drain, LockUser marks the
//     endpoint owned by a user goroutine, so the dispatcher queues the
//     segments without waking its processor;
//  2. the drain's frames are delivered as any other;
//  3. at the end of the drain, handleConnected's work runs here, under
//     the endpoint's lock, when the segments were a few: one ACK for
//     them all;
//  4. UnlockUser, which hands what is left to the processor: all of the
//     segments when they were more than maxInlineSegs (a bulk transfer's,
//     whose processing then runs beside the next drain on another CPU).
//
// An epoll_wait drains the same way for the connections of its set
// (TCPPoller): an event loop's thread (redis) then finds its requests
// processed and its mirrors marked without a wake-up of another thread.
//
// The queues' drain goroutines process so the segments of connections in
// epoll sets (TCPConn.sets) that no thread polls: memcached's workers,
// each with its set, which their sets' bells wake (internal/engine's
// owed.go). That saves netstack's processor its wake-up, and the ACK is
// owed, not built. memcached -t 4 under vmaxdp with a kernel memcaslap, 3
// interleaved pairs: 53.0/52.5/40.2k -> 61.4/58.6/63.6k operations a
// second. Each drain batch (drainLocked) processes what it
// held before the next: the first build held the endpoints across all of
// a wake-up's batches, for every connection, and took knot over TCP
// (dnsperf's 32 connections, two workers) from 21-27k to 14-18k queries
// a second as server, 30-50k to 18-22k as client, the workers' reads
// asleep on endpoints the drain held; this one left knot where it was
// (62-67k as server, 64-70k as client, 35-47k both, two interleaved
// runs of three rounds each).
//
// The functions of netstack's this needs are unexported; they are reached
// with go:linkname. Their signatures are those of the gVisor pseudo-version
// go.mod pins, which TestTCPInlineSignatures checks are what this file
// declares: read it again when moving gVisor.

//go:linkname tcpHandleSegmentsLocked gvisor.dev/gvisor/pkg/tcpip/transport/tcp.(*Endpoint).handleSegmentsLocked
func tcpHandleSegmentsLocked(ep *tcp.Endpoint) tcpip.Error

//go:linkname tcpResetConnectionLocked gvisor.dev/gvisor/pkg/tcpip/transport/tcp.(*Endpoint).resetConnectionLocked
func tcpResetConnectionLocked(ep *tcp.Endpoint, err tcpip.Error)

//go:linkname tcpDrainClosingSegmentQueue gvisor.dev/gvisor/pkg/tcpip/transport/tcp.(*Endpoint).drainClosingSegmentQueue
func tcpDrainClosingSegmentQueue(ep *tcp.Endpoint)

//go:linkname tcpStartTimeWait gvisor.dev/gvisor/pkg/tcpip/transport/tcp.startTimeWait
func tcpStartTimeWait(ep *tcp.Endpoint)

// tcpCompleteStateLocked copies the endpoint's state (TCPConn.Unacked,
// not inline processing: the go:linkname declarations live here, where
// TestTCPInlineSignatures checks them). Caller holds the endpoint
// (LockUser), connected.
//
//go:linkname tcpCompleteStateLocked gvisor.dev/gvisor/pkg/tcpip/transport/tcp.(*Endpoint).completeStateLocked
func tcpCompleteStateLocked(ep *tcp.Endpoint, s *tcp.TCPEndpointState)

// A polled connection is acknowledged by its answer. netstack
// acknowledges what it processed at the end of handleSegmentsLocked, and
// the link held that bare ACK until the answer carried it (tcplink.go):
// built to be thrown away, through TCP, IP and the link, 12% of
// redis-server's thread under vmaxdp (perf). So what a poll processes
// (an event loop's TCPPoller, a receive's TCPConn.Poll) runs
// handleSegmentsLocked's loop without its last step (handleSegmentsNoAck)
// and leaves the ACK owed (tcpLink.oweAck); the next poll, the loop's
// next wait, a sleep, or maxHoldDelay settle it (tcpLink.settleOwed),
// with handleSegmentsLocked on an empty queue: it acknowledges only what
// no answer did. redis-benchmark's 10 connections against redis-server
// under vmaxdp, 5 interleaved pairs of runs: 61-77k -> 64-83k requests a
// second (medians 64.7k -> 77.0k); sockperf --tcp, 3 interleaved pairs:
// pp 64 B a little faster in 6 cells of 9, tp with the server under
// vmaxdp 483k -> 497k messages a second (medians).
//
// The loop needs the endpoint's segment queue, a field netstack does not
// export: its offset is read once (segQueueOffset) and checked against
// its type's name, and without it processing acknowledges as before.
// The queue and its segments are netstack's; these name them without
// their layout, for the go:linkname declarations.
type (
	netstackSegmentQueue struct{}
	netstackSegment      struct{}
)

//go:linkname tcpSegmentQueueDequeue gvisor.dev/gvisor/pkg/tcpip/transport/tcp.(*segmentQueue).dequeue
func tcpSegmentQueueDequeue(q *netstackSegmentQueue) *netstackSegment

//go:linkname tcpHandleSegmentLocked gvisor.dev/gvisor/pkg/tcpip/transport/tcp.(*Endpoint).handleSegmentLocked
func tcpHandleSegmentLocked(ep *tcp.Endpoint, s *netstackSegment) (cont bool, err tcpip.Error)

//go:linkname tcpSegmentDecRef gvisor.dev/gvisor/pkg/tcpip/transport/tcp.(*segment).DecRef
func tcpSegmentDecRef(s *netstackSegment)

// segQueueOffset is the offset of tcp.Endpoint's segmentQueue, 0 when the
// field is not there as expected (owed ACKs are then not used).
var segQueueOffset = func() uintptr {
	f, ok := reflect.TypeFor[tcp.Endpoint]().FieldByName("segmentQueue")
	if !ok || len(f.Index) != 1 || f.Type.Kind() != reflect.Struct || f.Type.Name() != "segmentQueue" ||
		f.Type.PkgPath() != reflect.TypeFor[tcp.Endpoint]().PkgPath() {
		return 0
	}
	return f.Offset
}()

// handleSegmentsNoAck is netstack's handleSegmentsLocked (tcp.connect.go)
// but its last two steps: the ACK, and resetting the keepalive timer,
// which settleOwed's handleSegmentsLocked does. Its route confirmation
// is not needed: the link resolves no neighbours for netstack (Route's
// ConfirmReachable finds no entry). Caller holds the endpoint (LockUser).
func handleSegmentsNoAck(ep *tcp.Endpoint) tcpip.Error {
	q := (*netstackSegmentQueue)(unsafe.Add(unsafe.Pointer(ep), segQueueOffset))
	for range maxSegmentsPerWake {
		if ackless(ep.EndpointState()) {
			return nil
		}
		s := tcpSegmentQueueDequeue(q)
		if s == nil {
			break
		}
		cont, err := tcpHandleSegmentLocked(ep, s)
		tcpSegmentDecRef(s)
		if err != nil || !cont {
			return err
		}
	}
	return nil
}

// maxSegmentsPerWake is netstack's bound on the segments one
// handleSegmentsLocked processes.
const maxSegmentsPerWake = 100

// maxInlineSegs is the most segments a drain processes inline: a
// request, an answer, their acknowledgements.
const maxInlineSegs = 2

// plainSegment says whether seg only carries data or acknowledges: the
// segments processed inline.
func plainSegment(seg header.TCP) bool {
	const other = header.TCPFlagSyn | header.TCPFlagFin | header.TCPFlagRst | header.TCPFlagUrg
	return seg.Flags()&other == 0 && seg.Flags()&header.TCPFlagAck != 0
}

// inliner names the connections a drain processes inline: on an
// application thread, the one a receive polls for (a TCPConn) or an epoll
// set's (a TCPPoller); on a queue's drain goroutine, those in epoll sets
// (setsInliner).
type inliner interface {
	inlineConn(k tcpKey) *TCPConn
}

func (c *TCPConn) inlineConn(k tcpKey) *TCPConn {
	if c.key == k {
		return c
	}
	return nil
}

// Poll drains the stack's receive rings on this goroutine unless another
// does already (false), processing c's segments here (see above). Unless
// c is in an epoll set, it settles the ACKs owed first: a receive that
// polls again is back from what the last poll gave it, and its answer
// carried those ACKs or none is coming.
func (c *TCPConn) Poll() bool {
	if c.sets.Load() == 0 {
		// An epoll set's connection is its thread's, whose waits
		// settle what it owes (TCPPoller.Wait): a read until EAGAIN
		// between a request and its answer would acknowledge it alone.
		c.st.settleOwed()
	}
	return c.st.pollInline(c) >= 0
}

// pollInline drains the rings for in, unless another goroutine does
// (-1), and returns how many frames it saw.
func (st *Stack) pollInline(in inliner) int {
	if !st.rxMu.TryLock() {
		return -1
	}
	defer st.rxMu.Unlock()
	st.inline = in
	n := st.pollLocked()
	st.inline = nil
	st.processHeldInline()
	if t := st.tcp.Load(); t != nil {
		t.link.pollHeld()
	}
	return n
}

// processHeldInline processes the segments of the connections a drain
// held (holdInline). Caller holds rxMu.
func (st *Stack) processHeldInline() {
	for i, c := range st.inlineHeld {
		c.processInline()
		st.inlineHeld[i] = nil
	}
	st.inlineHeld = st.inlineHeld[:0]
}

// setsInliner names, for a drain goroutine, the connections in epoll sets
// (TCPConn.sets).
type setsInliner struct{ st *Stack }

func (s setsInliner) inlineConn(k tcpKey) *TCPConn {
	if c, ok := s.st.tcpConns.Load(k); ok && c.(*TCPConn).sets.Load() > 0 {
		return c.(*TCPConn)
	}
	return nil
}

// TCPPoller processes, on the thread that polls it, the segments of a set
// of connections: those of an epoll set, whose epoll_wait drains the
// rings in place of the queues' drain goroutines and netstack's
// processor, as VMA's epoll_wait polls its rings. A connection may be
// added more than once (an fd and its dup): it stays until removed as
// often.
type TCPPoller struct {
	st    *Stack
	mu    sync.Mutex
	conns map[tcpKey]pollee
	polls uint32 // Poll's calls: one in pollerMarkEvery says Polling
}

// pollerMarkEvery: a poller says that a thread polls once every so many
// polls (a clock read each), well within appPollRecent while it spins.
const pollerMarkEvery = 16

type pollee struct {
	c    *TCPConn
	refs int
}

// NewTCPPoller makes an empty poller of the stack's; Close ends it.
func (st *Stack) NewTCPPoller() *TCPPoller {
	st.tcpPollers.Add(1)
	return &TCPPoller{st: st, conns: map[tcpKey]pollee{}}
}

// Close ends the poller, once.
func (p *TCPPoller) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns != nil {
		for _, e := range p.conns {
			e.c.sets.Add(-1)
		}
		p.conns = nil
		p.st.tcpPollers.Add(-1)
	}
}

// Alone says whether the poller is its stack's only one. Several threads
// that each poll the stack for their own connections (knot's TCP
// workers, each with its epoll set) take its rings in turn and leave one
// another's segments to netstack's processor: an epoll set of TCP
// connections polls only when it is alone.
func (p *TCPPoller) Alone() bool { return p.st.tcpPollers.Load() == 1 }

// Add adds c, a connection of the poller's stack.
func (p *TCPPoller) Add(c *TCPConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return // closed
	}
	if e := p.conns[c.key]; e.c == c {
		e.refs++
		p.conns[c.key] = e
		return
	}
	// By value: an event loop that deletes and adds its connections'
	// events after each request (redis-benchmark) adds one each time.
	if e := p.conns[c.key]; e.c != nil {
		e.c.sets.Add(-1) // a connection gone whose 5-tuple c has now
	}
	p.conns[c.key] = pollee{c: c, refs: 1}
	c.sets.Add(1)
}

// Remove takes back one Add of c; false once the poller has no
// connection left.
func (p *TCPPoller) Remove(c *TCPConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.conns[c.key]; e.c == c {
		if e.refs--; e.refs == 0 {
			delete(p.conns, c.key)
			c.sets.Add(-1)
		} else {
			p.conns[c.key] = e
		}
	}
	return len(p.conns) > 0
}

// Poll drains the stack's rings on this goroutine, processing the plain
// segments of the poller's connections here, and says that a thread
// polls (Polling) until PollStop. It returns how many frames it saw: -1
// when another goroutine drains them, or polls this poller.
func (p *TCPPoller) Poll() int {
	if !p.mu.TryLock() {
		return -1
	}
	defer p.mu.Unlock()
	if p.polls%pollerMarkEvery == 0 {
		p.st.appPolled.Store(monoNow())
	}
	p.polls++
	p.st.eventLoop.Store(true)
	defer p.st.eventLoop.Store(false)
	return p.st.pollInline(p)
}

// Wait says that the poller's thread begins a wait (an epoll_wait), in
// which it polls. It is back from what its last wait gave it: the
// answers it wrote carried the acknowledgements held for it (tcpLink.hold),
// and the rest go now. Polling is said at once, where Poll says it once
// in pollerMarkEvery polls: an event loop that does not spin polls once
// a wait, and the queues' drain goroutines, which take the frames when
// nobody polls, would hand them to netstack's processor while the loop
// works (a quarter of redis-server's requests, each acknowledged on its
// own by a timer's goroutine).
//
// The acknowledgements held for writers, connections the loop waits to
// write on (EPOLLOUT), stay held until their time: the write this wait
// lets through carries them. redis-benchmark asks for EPOLLOUT after each
// reply and writes its next request once the wait gives it: each reply's
// ACK left on its own before, a second frame and kick per request.
//
// A poller that is not alone (a worker thread of several, each with its
// set) does not poll: its wait releases the held ACKs of its connections
// whose data the thread read since, as it had its chance to answer them
// (tcpLink.hold holds them for it), but writers'.
func (p *TCPPoller) Wait(writers []*TCPConn) {
	// Set members do not coalesce (coalesce.go), but a connection may
	// join a set with bytes coalesced before: they go first, and carry
	// the ACKs held for it rather than leaving after them.
	p.st.flushCoalesced(true)
	if !p.Alone() {
		p.releaseRead(writers)
		return
	}
	p.st.appPolled.Store(monoNow())
	p.st.releaseHeldBut(writers)
}

// releaseRead settles the owed ACKs and sends the held ones of the
// poller's connections whose thread is done with them (readDone). It
// asks netstack with no lock of the link's held.
func (p *TCPPoller) releaseRead(writers []*TCPConn) {
	t := p.st.tcp.Load()
	if t == nil {
		return
	}
	l := t.link
	done := func(c *TCPConn) bool { return p.readDone(c, writers) }
	if l.owedN.Load() > 0 {
		l.settleOwedWhere(done)
	}
	if l.heldN.Load() == 0 {
		return
	}
	var held, read [maxHeld][12]byte
	l.heldMu.Lock()
	n := len(l.held)
	for i := range n {
		held[i] = l.heldKeys[i].conn
	}
	l.heldMu.Unlock()
	m := 0
	for _, k := range held[:n] {
		if c, ok := p.st.tcpConns.Load(heldKey(k)); ok && done(c.(*TCPConn)) {
			read[m] = k
			m++
		}
	}
	if m > 0 {
		l.expireHeldWhere(func(conn [12]byte) bool { return slices.Contains(read[:m], conn) })
	}
}

// readDone says whether c is one of the poller's connections, not one of
// writers, with nothing left to read: its thread read what c's ACKs
// acknowledge and had its chance to answer.
func (p *TCPPoller) readDone(c *TCPConn, writers []*TCPConn) bool {
	p.mu.Lock()
	mine := p.conns[c.key].c == c
	p.mu.Unlock()
	return mine && !slices.Contains(writers, c) && c.Events()&TCPReadable == 0
}

// PollStop says that the thread that polled stops, to sleep: the queues'
// drain goroutines take over. The next Poll says Polling again. A poller
// that did not poll since says nothing: the mark may be another thread's
// (a receive that polls), which still polls.
func (p *TCPPoller) PollStop() {
	p.mu.Lock()
	polled := p.polls != 0
	p.polls = 0
	p.mu.Unlock()
	if polled {
		p.st.releaseHeld()
		p.st.pollStopped()
	}
}

// Sleep says that the poller's thread, back from polling, sleeps on the
// stack's queues (AppendQueues) beside the kernel's report of its
// connections, and false when another thread does already: then it
// sleeps on the mirrors alone (SleepOnMirrors). See sleepOnRings. Woke
// ends it.
func (p *TCPPoller) Sleep() bool { return p.st.sleepOnRings() }

// Woke ends a Sleep: the thread polls again at once, unless the poller
// is no longer alone (Alone): then the drains take over.
func (p *TCPPoller) Woke() { p.st.wokeFromRings(p.Alone()) }

// Sleep says that a receive on c, back from polling, sleeps on the
// stack's queues (AppendQueues) beside c's mirror, and false when another
// thread does already, or the stack has epoll sets' pollers, whose
// threads may wait in the kernel's epoll_wait on their mirrors, unseen:
// then it sleeps on the mirror (SleepOnMirror). See sleepOnRings. After
// Woke, it polls (Poll).
func (c *TCPConn) Sleep() bool { return c.st.tcpPollers.Load() == 0 && c.st.sleepOnRings() }

// SleepOnMirror says that a thread that polled for c stops, to sleep on
// c's mirror (PollStop), until WokeFromMirror: the drains take over.
func (c *TCPConn) SleepOnMirror() {
	c.st.mirrorSleepers.Add(1)
	c.PollStop()
}

// WokeFromMirror ends a SleepOnMirror.
func (c *TCPConn) WokeFromMirror() { c.st.mirrorSleepers.Add(-1) }

// SleepOnMirrors says that the poller's thread stops polling, to sleep on
// its connections' mirrors (PollStop), until WokeFromMirrors.
func (p *TCPPoller) SleepOnMirrors() {
	p.st.mirrorSleepers.Add(1)
	p.PollStop()
}

// WokeFromMirrors ends a SleepOnMirrors.
func (p *TCPPoller) WokeFromMirrors() { p.st.mirrorSleepers.Add(-1) }

// Woke ends a Sleep.
func (c *TCPConn) Woke() { c.st.wokeFromRings(true) }

// sleepOnRings makes the calling thread the stack's ring sleeper, unless
// another is: the drains leave the frames to it, and it processes its
// connections' segments itself when a frame wakes it, one thread wake-up
// a request as in the kernel, where a sleep after PollStop costs two (the
// drain's thread, then the mirror's reader). One thread at a time, so
// that a frame wakes one, and none while others sleep on their mirrors
// (a thread a connection): those need the drains in the netpoller, and
// a ring sleeper would add its own wake-up to theirs.
func (st *Stack) sleepOnRings() bool {
	return st.mirrorSleepers.Load() == 0 && st.ringSleeper.CompareAndSwap(false, true)
}

// wokeFromRings ends sleepOnRings: the thread polls at once (polls), or
// the drains take over, as they do at once while other threads sleep on
// their mirrors: the woken thread may go to other work for long, and
// their frames would wait for the drains' next look (ringSleepCheck).
func (st *Stack) wokeFromRings(polls bool) {
	st.ringSleeper.Store(false)
	if polls && st.mirrorSleepers.Load() == 0 {
		st.appPolled.Store(monoNow())
		return
	}
	st.appPolled.Store(0)
	st.wakeDrains()
}

// AppendQueues appends the stack's queue descriptors to pfds, to be
// polled readable: a ring sleeper's (Sleep).
func (st *Stack) AppendQueues(pfds []unix.PollFd) []unix.PollFd {
	for _, q := range st.pollQueues() {
		pfds = append(pfds, unix.PollFd{Fd: int32(q.be.FD()), Events: unix.POLLIN})
	}
	return pfds
}

// Stack is the poller's stack.
func (p *TCPPoller) Stack() *Stack { return p.st }

func (p *TCPPoller) inlineConn(k tcpKey) *TCPConn {
	return p.conns[k].c
}

// Polling says that a thread polls for c, and will say PollStop when it
// stops: meanwhile the queues' drain goroutines leave it the frames.
func (c *TCPConn) Polling() { c.st.appPolled.Store(monoNow()) }

// PollStop says that the thread that polled for c stops, to sleep: the
// queues' drain goroutines take over. What it owes is settled.
func (c *TCPConn) PollStop() {
	c.st.settleOwed()
	c.st.pollStopped()
}

// settleOwed settles the ACKs owed (tcpLink.settleOwed).
func (st *Stack) settleOwed() {
	if t := st.tcp.Load(); t != nil {
		t.link.settleOwed(nil)
	}
}

// holdInline holds the endpoint of the connection the drain is for
// (st.inline), for processInline, when the plain segment about to be
// delivered is its and it is established. Caller holds rxMu.
func (st *Stack) holdInline(ip header.IPv4, seg header.TCP) {
	if st.inline == nil {
		return
	}
	c := st.inline.inlineConn(segKey(ip, seg))
	if c == nil {
		return
	}
	if c.inlineSegs == 0 {
		ep, ok := c.ep.(*tcp.Endpoint)
		if !ok || ep.EndpointState() != tcp.StateEstablished {
			return
		}
		ep.LockUser()
		if ep.EndpointState() != tcp.StateEstablished {
			ep.UnlockUser()
			return
		}
		st.inlineHeld = append(st.inlineHeld, c)
	}
	c.inlineSegs++
}

// processInline is what netstack's processor does for a connected
// endpoint (tcp.handleConnected), on the endpoint holdInline holds;
// more than maxInlineSegs segments go to the processor. It leaves the
// ACK owed. Caller holds rxMu.
func (c *TCPConn) processInline() {
	ep := c.ep.(*tcp.Endpoint)
	n := c.inlineSegs
	c.inlineSegs = 0
	if n > maxInlineSegs {
		ep.UnlockUser()
		return
	}
	c.st.TCPCounters.RxInline.Add(uint64(n))
	owe := segQueueOffset != 0
	var err tcpip.Error
	if owe {
		err = handleSegmentsNoAck(ep)
	} else {
		err = tcpHandleSegmentsLocked(ep)
	}
	if c.settleLocked(ep, err) && owe {
		if t := c.st.tcp.Load(); t != nil {
			t.link.oweAck(c)
		}
	}
}

// settleLocked ends the processing of ep's segments (err: its error) as
// netstack's processor does, lets ep go (UnlockUser), and says whether the
// connection may still owe an ACK: not closed, in error or in TIME-WAIT,
// the states in which handleSegmentsLocked does not acknowledge. Caller
// holds ep.
func (c *TCPConn) settleLocked(ep *tcp.Endpoint, err tcpip.Error) bool {
	if err != nil {
		tcpResetConnectionLocked(ep, err)
	}
	switch {
	case err != nil || ep.EndpointState() == tcp.StateClose:
		ep.UnlockUser()
		tcpDrainClosingSegmentQueue(ep)
		c.wq.Notify(waiter.EventHUp | waiter.EventErr | waiter.ReadableEvents | waiter.WritableEvents)
		return false
	case ep.EndpointState() == tcp.StateTimeWait:
		tcpStartTimeWait(ep)
	}
	acks := !ackless(ep.EndpointState())
	ep.UnlockUser()
	return acks
}

// ackless says whether netstack's processing acknowledges nothing in
// state st (handleSegmentsLocked returns first).
func ackless(st tcp.EndpointState) bool {
	return st == tcp.StateClose || st == tcp.StateError || st == tcp.StateTimeWait
}
