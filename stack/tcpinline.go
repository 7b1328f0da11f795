package stack

import (
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
// segment, which the kernel does not make. For a segment that only
// carries data or acknowledges (no SYN, FIN, RST or URG) on an
// established connection, the goroutine that received the frame runs
// netstack's processing itself, as the processor would:
//
//  1. LockUser marks the endpoint owned by a user goroutine, so the
//     dispatcher queues the segment without waking its processor;
//  2. the frame is delivered as any other;
//  3. handleConnected's work runs here, under the endpoint's lock;
//  4. UnlockUser, which hands what is left (more than netstack handles
//     at once) to the processor.
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

// plainSegment says whether seg only carries data or acknowledges: the
// segments processed inline.
func plainSegment(seg header.TCP) bool {
	const other = header.TCPFlagSyn | header.TCPFlagFin | header.TCPFlagRst | header.TCPFlagUrg
	return seg.Flags()&other == 0 && seg.Flags()&header.TCPFlagAck != 0
}

// deliverInline delivers pkt to c's endpoint and processes it on this
// goroutine; false (nothing done) when c's endpoint is not established.
func (c *TCPConn) deliverInline(deliver func()) bool {
	ep, ok := c.ep.(*tcp.Endpoint)
	if !ok || ep.EndpointState() != tcp.StateEstablished {
		return false
	}
	ep.LockUser()
	if ep.EndpointState() != tcp.StateEstablished {
		ep.UnlockUser()
		return false
	}
	deliver()
	// What handleConnected does after its TryLock.
	err := tcpHandleSegmentsLocked(ep)
	if err != nil {
		tcpResetConnectionLocked(ep, err)
	}
	switch {
	case err != nil || ep.EndpointState() == tcp.StateClose:
		ep.UnlockUser()
		tcpDrainClosingSegmentQueue(ep)
		c.wq.Notify(waiter.EventHUp | waiter.EventErr | waiter.ReadableEvents | waiter.WritableEvents)
		return true
	case ep.EndpointState() == tcp.StateTimeWait:
		tcpStartTimeWait(ep)
	}
	ep.UnlockUser()
	return true
}
