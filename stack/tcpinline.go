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
// own thread (a cgo callback, locked to it): one thread wake-up per
// segment, which the kernel does not make. For the segments that only
// carry data or acknowledge (no SYN, FIN, RST or URG) on an established
// connection, the goroutine that drains the rings runs netstack's
// processing itself, a batch at a time, as the processor would:
//
//  1. at the connection's first such segment of the drain, LockUser
//     marks its endpoint owned by a user goroutine, so the dispatcher
//     queues the segments without waking its processor;
//  2. the drain's frames are delivered as any other;
//  3. at the end of the drain, handleConnected's work runs here for each
//     such connection that got a few segments, under its endpoint's lock:
//     every segment queued, one ACK for them all;
//  4. UnlockUser, which hands what is left to the processor: all of a
//     connection's segments when they were more than maxInlineSegs, a
//     bulk transfer's, whose processing then runs beside the next drain
//     on another CPU, as before (processed here, a segment at a time,
//     bulk receives lost half their rate: iperf3 -P 4 with the server
//     under vmaxdp 2.5 -> 1.2 Gbit/s; a drain at a time, 2.5 -> 1.7-2.1).
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

// maxInlined bounds the connections a drain holds locked; one more
// processes those first.
const maxInlined = 16

// maxInlineSegs is the most segments of a connection a drain processes
// inline: a request, an answer, their acknowledgements.
const maxInlineSegs = 2

// plainSegment says whether seg only carries data or acknowledges: the
// segments processed inline.
func plainSegment(seg header.TCP) bool {
	const other = header.TCPFlagSyn | header.TCPFlagFin | header.TCPFlagRst | header.TCPFlagUrg
	return seg.Flags()&other == 0 && seg.Flags()&header.TCPFlagAck != 0
}

// deliverInline runs deliver, netstack's delivery of a plain segment,
// with its connection's endpoint held for processInlined; false (nothing
// done) when the segment is for no established connection of the stack.
// Caller holds rxMu.
func (st *Stack) deliverInline(ip header.IPv4, seg header.TCP, deliver func()) bool {
	k := tcpKey{local: netip.AddrPortFrom(ip.Dst(), seg.DstPort()), remote: netip.AddrPortFrom(ip.Src(), seg.SrcPort())}
	v, ok := st.tcpConns.Load(k)
	if !ok {
		return false
	}
	c := v.(*TCPConn)
	if !c.inlined {
		ep, ok := c.ep.(*tcp.Endpoint)
		if !ok || ep.EndpointState() != tcp.StateEstablished {
			return false
		}
		if len(st.inlined) == maxInlined {
			st.processInlined()
		}
		ep.LockUser()
		if ep.EndpointState() != tcp.StateEstablished {
			ep.UnlockUser()
			return false
		}
		c.inlined = true
		st.inlined = append(st.inlined, c)
	}
	c.inlineSegs++
	deliver()
	return true
}

// processInlined processes the segments deliverInline queued, and lets
// their endpoints go. Caller holds rxMu.
func (st *Stack) processInlined() {
	for i, c := range st.inlined {
		if c.inlineSegs <= maxInlineSegs {
			c.processInline()
		} else {
			c.ep.(*tcp.Endpoint).UnlockUser()
		}
		c.inlined, c.inlineSegs = false, 0
		st.inlined[i] = nil
	}
	st.inlined = st.inlined[:0]
}

// processInline is what netstack's processor does for a connected
// endpoint (tcp.handleConnected), on an endpoint deliverInline holds.
func (c *TCPConn) processInline() {
	c.st.TCPCounters.RxInline.Add(uint64(c.inlineSegs))
	ep := c.ep.(*tcp.Endpoint)
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
