package stack

import (
	"net/netip"
	_ "unsafe" // go:linkname

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
// Only the polling connection's, and only on its thread: the drain
// goroutines that processed every connection's segments this way took
// knot over TCP (dnsperf's 32 connections, two workers) from 21-27k to
// 14-18k queries a second as server, 30-50k to 18-22k as client: one
// goroutine processed them all in turn, holding their endpoints, which
// the workers' reads then slept on; and bulk receives lost a fifth of
// their rate.
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

// maxInlineSegs is the most segments a drain processes inline: a
// request, an answer, their acknowledgements.
const maxInlineSegs = 2

// plainSegment says whether seg only carries data or acknowledges: the
// segments processed inline.
func plainSegment(seg header.TCP) bool {
	const other = header.TCPFlagSyn | header.TCPFlagFin | header.TCPFlagRst | header.TCPFlagUrg
	return seg.Flags()&other == 0 && seg.Flags()&header.TCPFlagAck != 0
}

// Poll drains the stack's receive rings on this goroutine unless another
// does already (false), processing c's segments here (see above).
func (c *TCPConn) Poll() bool {
	st := c.st
	if !st.rxMu.TryLock() {
		return false
	}
	defer st.rxMu.Unlock()
	st.inlineFor = c
	st.pollLocked()
	st.inlineFor = nil
	if c.inlineSegs > 0 {
		c.processInline()
	}
	if t := st.tcp.Load(); t != nil {
		t.link.pollHeld()
	}
	return true
}

// Polling says that a thread polls for c, and will say PollStop when it
// stops: meanwhile the queues' drain goroutines leave it the frames.
func (c *TCPConn) Polling() { c.st.appPolled.Store(monoNow()) }

// PollStop says that the thread that polled for c stops, to sleep: the
// queues' drain goroutines take over.
func (c *TCPConn) PollStop() { c.st.handOver() }

// holdInline holds the endpoint of the connection whose receive drains
// (inlineFor), for processInline, when the plain segment about to be
// delivered is for it and it is established. Caller holds rxMu.
func (st *Stack) holdInline(ip header.IPv4, seg header.TCP) {
	c := st.inlineFor
	if c == nil || c.key != (tcpKey{local: netip.AddrPortFrom(ip.Dst(), seg.DstPort()), remote: netip.AddrPortFrom(ip.Src(), seg.SrcPort())}) {
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
	}
	c.inlineSegs++
}

// processInline is what netstack's processor does for a connected
// endpoint (tcp.handleConnected), on the endpoint holdInline holds;
// more than maxInlineSegs segments go to the processor. Caller holds
// rxMu.
func (c *TCPConn) processInline() {
	ep := c.ep.(*tcp.Endpoint)
	n := c.inlineSegs
	c.inlineSegs = 0
	if n > maxInlineSegs {
		ep.UnlockUser()
		return
	}
	c.st.TCPCounters.RxInline.Add(uint64(n))
	err := tcpHandleSegmentsLocked(ep)
	if err != nil {
		tcpResetConnectionLocked(ep, err)
	}
	switch {
	case err != nil || ep.EndpointState() == tcp.StateClose:
		ep.UnlockUser()
		tcpDrainClosingSegmentQueue(ep)
		c.wq.Notify(waiter.EventHUp | waiter.EventErr | waiter.ReadableEvents | waiter.WritableEvents)
		return
	case ep.EndpointState() == tcp.StateTimeWait:
		tcpStartTimeWait(ep)
	}
	ep.UnlockUser()
}
