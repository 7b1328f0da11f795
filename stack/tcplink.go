package stack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	gbuffer "gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	gheader "gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	nstack "gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/stack/gro"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/stack/header"
)

// TCP is gVisor's netstack (gvisor.dev/gvisor/pkg/tcpip), not one of our
// own: its TCP is conformance-tested and maintained. It sits on the stack
// as an IP link (tcpLink): the stack keeps Ethernet, the next hops (from
// the kernel's tables), the queues and the steering, hands netstack the
// TCP packets the steering rules bring, and puts netstack's packets on a
// transmit queue. UDP keeps its own path; ARP, ICMP and the rest stay
// with the kernel.

// tcpNIC is netstack's only NIC: the stack's interface.
const tcpNIC tcpip.NICID = 1

// TCPCounters are the stack's TCP frame counters; netstack keeps its own
// per-protocol counters (tcpip.Stats).
type TCPCounters struct {
	RxSegments atomic.Uint64 // segments handed to netstack
	TxSegments atomic.Uint64 // segments put on a transmit queue
	// TxDropped counts netstack's packets that found no transmit frame,
	// no next hop behind the interface, or were IP fragments whose
	// checksum the backend could not finish (transmit); TCP sends them
	// again.
	TxDropped atomic.Uint64
	// DrainErrors counts queues no goroutine drains for netstack: their
	// descriptor could not join Go's netpoller (logged too).
	DrainErrors atomic.Uint64
	// AcksCarried counts netstack's bare ACKs not sent: a segment with
	// data or a FIN of the same connection carried the acknowledgement
	// (held acknowledgements, tcplink.go).
	AcksCarried atomic.Uint64
	// AcksDelayed counts netstack's bare ACKs that left when their hold
	// was over: no segment carried them.
	AcksDelayed atomic.Uint64
	// RxInline counts the segments netstack processed on the thread of
	// a receive that polled for them, not on its processor goroutine
	// (tcpinline.go).
	RxInline atomic.Uint64
	// RxDrained counts the frames the drain goroutines took from the
	// rings (startDrains): no application thread polled them.
	RxDrained atomic.Uint64
	// DrainWakeups counts the times Go's netpoller woke a drain goroutine
	// for its queue's frames: a Go thread woken, often on the other CPU.
	// While an application thread polls the queues the drains stay out of
	// the netpoller (notePoll), and this stays still.
	DrainWakeups atomic.Uint64
	// RxMerged counts the segments GRO merged into the one before them
	// (tcpState.gro): of RxSegments, netstack processed RxSegments less
	// RxMerged packets.
	RxMerged atomic.Uint64
	// RxDirect counts the packets handed straight to their connection's
	// endpoint, past netstack's IP layer and demuxer (deliverDirect).
	RxDirect atomic.Uint64
}

// tcpState is netstack and what drives it, made by the first TCP socket.
type tcpState struct {
	ns   *nstack.Stack
	link *tcpLink
	// defaults tell the options an application set on a kernel socket
	// (copyOptions).
	defaults optionDefaults
	stop     chan struct{}
	done     chan struct{}

	// closing are closed connections whose steering rule and kernel
	// socket wait for netstack to finish with them (FIN exchange,
	// TIME-WAIT; the rule for timeWaitRule of it): removed at once, the
	// peer's last segments would meet the kernel, which answers with a
	// reset.
	mu      sync.Mutex
	closing []*TCPConn

	// gro coalesces a drain's consecutive segments of a flow into one
	// packet for netstack, as the kernel's GRO does: netstack's cost is
	// per packet, and a bulk sender's segments come in runs. A drain
	// flushes it before it ends (flushTCP), so nothing waits on it; a
	// segment with PSH, FIN or no payload (a request, its answer, an
	// ACK) goes up at once. It hands netstack its packets through up,
	// which counts them. Guarded by the stack's rxMu, as segs is: the
	// segments the drain gave it.
	gro  gro.GRO
	up   groOut
	segs uint64
}

// groOut is GRO's way to netstack's dispatcher (d, the link's when the
// drain began), counting the packets it hands on.
type groOut struct {
	d         nstack.NetworkDispatcher
	delivered uint64
	st        *Stack
	tcp       queuedTCP
}

func (o *groOut) DeliverNetworkPacket(p tcpip.NetworkProtocolNumber, pkt *nstack.PacketBuffer) {
	o.delivered++
	if o.tcp != nil && o.deliverDirect(pkt) {
		return
	}
	o.d.DeliverNetworkPacket(p, pkt)
}

// queuedTCP is netstack's TCP protocol as its transport demuxer sees it:
// QueuePacket hands a segment to an endpoint's queue and processor (or
// to the goroutine that holds the endpoint: tcpinline.go).
type queuedTCP interface {
	QueuePacket(ep nstack.TransportEndpoint, id nstack.TransportEndpointID, pkt *nstack.PacketBuffer)
}

// deliverDirect hands the segment in pkt, an IPv4 packet, straight to its
// connection's endpoint when it only carries data or acknowledges, the
// connection established: what netstack's IPv4 layer and transport
// demuxer would do with it (ipv4's HandlePacket, the NIC's
// deliverTransportPacket), less what cannot apply here. The stack parsed
// and checked the packet (deliverTCP: no fragment, checksums, its length
// the IP header's), netstack has no packet filter, raw or packet
// endpoint, and the connection's address is netstack's since it has the
// connection. Those two layers took 13% of redis-server's thread under
// vmaxdp, 7% without the endpoint's own queueing (perf); what they count
// (netstack's IP counters) vmaxdp never showed. Anything else, or an
// IPv4 header with options, takes their way.
func (o *groOut) deliverDirect(pkt *nstack.PacketBuffer) bool {
	b, ok := pkt.Data().PullUp(header.IPv4MinLen + header.TCPMinLen)
	if !ok {
		return false
	}
	ip, seg := header.IPv4(b), header.TCP(b[header.IPv4MinLen:])
	if ip.HeaderLen() != header.IPv4MinLen || ip.Protocol() != header.ProtocolTCP || !plainSegment(seg) {
		return false
	}
	off := int(gheader.TCP(seg).DataOffset())
	if off < header.TCPMinLen || pkt.Data().Size() < header.IPv4MinLen+off {
		return false
	}
	k := segKey(ip, seg)
	c, ok := o.st.tcpConns.Load(k)
	if !ok {
		return false
	}
	ep, ok := c.(*TCPConn).ep.(*tcp.Endpoint)
	if !ok || ep.EndpointState() != tcp.StateEstablished {
		return false
	}
	id := nstack.TransportEndpointID{
		LocalPort: k.local.Port(), LocalAddress: tcpip.AddrFrom4(k.local.Addr().As4()),
		RemotePort: k.remote.Port(), RemoteAddress: tcpip.AddrFrom4(k.remote.Addr().As4()),
	}
	pkt.NetworkHeader().Consume(header.IPv4MinLen)
	pkt.TransportHeader().Consume(off)
	pkt.NICID = tcpNIC
	pkt.TransportProtocolNumber = tcp.ProtocolNumber
	o.tcp.QueuePacket(ep, id, pkt)
	o.st.TCPCounters.RxDirect.Add(1)
	return true
}

func (o *groOut) DeliverLinkPacket(p tcpip.NetworkProtocolNumber, pkt *nstack.PacketBuffer) {
	o.d.DeliverLinkPacket(p, pkt)
}

// tcpLink is netstack's link endpoint over the stack's queues. Netstack
// sees a link without a header: frames arrive as IPv4 packets, and
// WritePackets adds the Ethernet header of the next hop.
type tcpLink struct {
	st   *Stack
	q    *queue
	disp atomic.Pointer[dispatcher]
	// parked are packets waiting for their next hop's ARP answer, by
	// destination (park).
	parkMu sync.Mutex
	parked map[netip.Addr][]*nstack.PacketBuffer

	mu      sync.Mutex
	onClose func()
	// down: netstack is closing, and what it sends is dropped.
	down atomic.Bool

	// Bare acknowledgements held back for a reply to carry (holdAcks).
	heldMu    sync.Mutex
	held      []*nstack.PacketBuffer
	heldKeys  [maxHeld]ackKey        // held[i]'s connection and number, read once at its hold
	spare     []*nstack.PacketBuffer // held's next array, while a release sends the last
	heldN     atomic.Int32           // len(held), read without heldMu
	heldTimer *time.Timer            // releases held after holdDelay
	heldArmed bool
	heldLong  bool // heldTimer waits for sets' threads (answeredInSets), longer than holdDelay
	// heldDue is when held must go (monoNow's clock), while an
	// application thread polls and expires them itself (pollHeld) in
	// place of heldTimer; 0 otherwise. A timer armed at each hold made
	// Go wake its netpoller with a system call, and one of its threads on
	// another CPU, at every round trip (4% of a spinning sockperf client).
	heldDue atomic.Int64
	// heldCheck releases what heldDue says is due in case the polling
	// thread went away without saying so (PollStop): it is armed at the
	// first such hold and runs every appPollCheck while they go on.
	heldCheck      *time.Timer
	heldCheckArmed bool

	// Owed acknowledgements (tcpinline.go): event loops' connections
	// whose processing built no ACK, for their answers to carry, until
	// settleOwed. Each is on owed once (TCPConn.ackOwed).
	owedMu    sync.Mutex
	owed      []*TCPConn
	owedSpare []*TCPConn   // owed's next array
	owedN     atomic.Int32 // len(owed), read without owedMu
	owedTimer *time.Timer  // settles owed maxHoldDelay after the first is owed
	owedArmed bool         // owedTimer is armed, or running
	// settleMu orders the settles, which take the connections' endpoints
	// without owedMu: a thread that processes segments inline holds
	// endpoints as it owes (processInline).
	settleMu sync.Mutex
	due      []*TCPConn              // what the settle under way took off owed
	cands    []*TCPConn              // the owed list as the settle under way found it
	settling atomic.Pointer[TCPConn] // the connection settle acknowledges: its bare ACK is not held
	settled  atomic.Uint64           // bare ACKs that left for settle

	// silenced are connections (ackKey.conn) handed to the kernel
	// (ToKernel), whose netstack endpoint ends without a segment.
	silenceMu sync.Mutex
	silenced  map[[12]byte]struct{}
	silencedN atomic.Int32
}

// dispatcher boxes the interface so that the receive path loads it
// atomically.
type dispatcher struct{ nstack.NetworkDispatcher }

func (l *tcpLink) MTU() uint32                              { return uint32(l.st.tcpMTU()) }
func (l *tcpLink) SetMTU(uint32)                            {}
func (l *tcpLink) MaxHeaderLength() uint16                  { return 0 }
func (l *tcpLink) LinkAddress() tcpip.LinkAddress           { return "" }
func (l *tcpLink) SetLinkAddress(tcpip.LinkAddress)         {}
func (l *tcpLink) Wait()                                    {}
func (l *tcpLink) ARPHardwareType() gheader.ARPHardwareType { return gheader.ARPHardwareNone }
func (l *tcpLink) AddHeader(*nstack.PacketBuffer)           {}
func (l *tcpLink) ParseHeader(*nstack.PacketBuffer) bool    { return true }
func (l *tcpLink) IsAttached() bool                         { return l.disp.Load() != nil }

// Capabilities: the stack checks TCP checksums itself (deliverTCP), since
// a kernel sender on this host leaves them partial.
//
// With a backend that completes checksums (backend.TxChecksum), netstack
// leaves the TCP checksum to the link too: transmit writes the
// pseudo-header sum and the kernel finishes it, as for the stack's UDP.
func (l *tcpLink) Capabilities() nstack.LinkEndpointCapabilities {
	if l.q.be.TxChecksum() {
		return nstack.CapabilityRXChecksumOffload | nstack.CapabilityTXChecksumOffload
	}
	return nstack.CapabilityRXChecksumOffload
}

func (l *tcpLink) Attach(d nstack.NetworkDispatcher) {
	if d == nil {
		l.disp.Store(nil)
		return
	}
	l.disp.Store(&dispatcher{d})
}

func (l *tcpLink) SetOnCloseAction(f func()) {
	l.mu.Lock()
	l.onClose = f
	l.mu.Unlock()
}

func (l *tcpLink) Close() {
	l.mu.Lock()
	f := l.onClose
	l.mu.Unlock()
	if f != nil {
		f()
	}
}

// WritePackets puts netstack's packets on the link's transmit queue, or
// holds its bare acknowledgements (hold).
func (l *tcpLink) WritePackets(pkts nstack.PacketBufferList) (int, tcpip.Error) {
	return l.writePackets(pkts.AsSlice())
}

// tcpQDisc is the NIC's queueing discipline: it hands netstack's packets
// to the link one by one, as netstack sends them. netstack's default
// wraps each packet in a PacketBufferList of its own, two allocations a
// packet (BenchmarkTCPPingPong).
type tcpQDisc struct{ l *tcpLink }

func (q tcpQDisc) WritePacket(pkt *nstack.PacketBuffer) tcpip.Error {
	_, err := q.l.writePackets([]*nstack.PacketBuffer{pkt})
	return err
}

func (tcpQDisc) Close() {}

func (l *tcpLink) writePackets(list []*nstack.PacketBuffer) (int, tcpip.Error) {
	if l.down.Load() {
		// netstack is closing: the resets it sends as it aborts what is
		// left (TIME-WAIT included) are not what the kernel sends for a
		// process that ends, and would reach peers whose own steering
		// may be gone. Counted as netstack's dropped packets.
		l.st.TCPCounters.TxDropped.Add(uint64(len(list)))
		return len(list), nil
	}
	if l.silencedN.Load() > 0 {
		all := len(list)
		if list = l.unsilenced(list); len(list) == 0 {
			return all, nil
		}
	}
	if l.hold(list) {
		return len(list), nil
	}
	return l.write(list, false)
}

// silence drops conn's packets from now on, unsilence no more.
func (l *tcpLink) silence(conn [12]byte) {
	l.silenceMu.Lock()
	defer l.silenceMu.Unlock()
	if l.silenced == nil {
		l.silenced = map[[12]byte]struct{}{}
	}
	l.silenced[conn] = struct{}{}
	l.silencedN.Store(int32(len(l.silenced)))
}

func (l *tcpLink) unsilence(conn [12]byte) {
	l.silenceMu.Lock()
	defer l.silenceMu.Unlock()
	delete(l.silenced, conn)
	l.silencedN.Store(int32(len(l.silenced)))
}

// unsilenced is list without the packets of silenced connections; a new
// slice when it drops any (the caller's holds what it releases).
func (l *tcpLink) unsilenced(list []*nstack.PacketBuffer) []*nstack.PacketBuffer {
	l.silenceMu.Lock()
	defer l.silenceMu.Unlock()
	var out []*nstack.PacketBuffer
	for i, p := range list {
		if _, ok := l.silenced[keyOf(p).conn]; !ok {
			if out != nil {
				out = append(out, p)
			}
			continue
		}
		if out == nil {
			out = append(make([]*nstack.PacketBuffer, 0, len(list)), list[:i]...)
		}
	}
	if out == nil {
		return list
	}
	return out
}

// write puts pkts on the link's transmit queue, a batch at a time; now
// (released acknowledgements) kicks at once. The next hops are looked up
// before the queue's lock is taken: the first packet to a destination
// may wait for ARP.
func (l *tcpLink) write(list []*nstack.PacketBuffer, now bool) (int, tcpip.Error) {
	st, q := l.st, l.q
	var hops [rxBatch]nextHop
	var out [rxBatch]*nstack.PacketBuffer
	mono := monoNow() // one clock read: the next hops' expiry, the kick's age
	sent := 0
	for sent < len(list) {
		chunk := list[sent:min(len(list), sent+len(q.txBufs))]
		n := 0
		var last netip.Addr
		var lastHop nextHop
		for _, pkt := range chunk {
			dst := netip.AddrFrom4([4]byte(pkt.NetworkHeader().Slice()[16:20]))
			h, ok := lastHop, dst == last && n > 0
			if !ok {
				h, ok = st.hopCached(dst, mono)
			}
			if !ok {
				if l.parkBehind(dst, pkt) {
					continue // an ARP answer is awaited for dst already
				}
				var err error
				h, err = st.hopNow(dst)
				switch {
				case errors.Is(err, errNeighPending):
					l.park(dst, pkt)
					continue
				case err != nil:
					h.viaKernel = true
				}
			}
			last, lastHop = dst, h
			out[n], hops[n] = pkt, h
			n++
		}
		if n > 0 {
			if err := l.transmit(q, out[:n], hops[:n], mono, now); err != nil {
				return sent, err
			}
		}
		sent += len(chunk)
	}
	return sent, nil
}

// parkedPerHop is how many packets wait for one next hop's ARP answer,
// as the kernel queues a few of a neighbour's first packets (unres_qlen);
// more are dropped and counted, for TCP to send again.
const parkedPerHop = 4

// parkBehind parks pkt if packets to dst wait for its ARP answer
// already; false if none do.
func (l *tcpLink) parkBehind(dst netip.Addr, pkt *nstack.PacketBuffer) bool {
	l.parkMu.Lock()
	defer l.parkMu.Unlock()
	list, waiting := l.parked[dst]
	if !waiting {
		return false
	}
	if len(list) >= parkedPerHop {
		l.st.TCPCounters.TxDropped.Add(1)
		return true
	}
	pkt.IncRef()
	l.parked[dst] = append(list, pkt)
	return true
}

// park keeps pkt until dst's next hop is resolved, then sends it
// (unpark): netstack's goroutine that sends it does not wait for ARP.
// Dropped and counted when too many next hops are awaited already.
func (l *tcpLink) park(dst netip.Addr, pkt *nstack.PacketBuffer) {
	l.parkMu.Lock()
	defer l.parkMu.Unlock()
	list, waiting := l.parked[dst]
	switch {
	case len(list) >= parkedPerHop:
		l.st.TCPCounters.TxDropped.Add(1)
		return
	case !waiting && !l.st.afterHop(dst, func(h nextHop, err error) { l.unpark(dst, h, err) }):
		// Too many ARP answers awaited (a SYN flood from addresses
		// nobody holds): dst's packets are dropped for a while without
		// a lookup each.
		l.st.unresolved(dst)
		l.st.TCPCounters.TxDropped.Add(1)
		return
	}
	if l.parked == nil {
		l.parked = map[netip.Addr][]*nstack.PacketBuffer{}
	}
	pkt.IncRef()
	l.parked[dst] = append(list, pkt)
}

// unpark sends the packets parked for dst, whose next hop is h, or drops
// and counts them when it could not be resolved.
func (l *tcpLink) unpark(dst netip.Addr, h nextHop, err error) {
	l.parkMu.Lock()
	pkts := l.parked[dst]
	delete(l.parked, dst)
	l.parkMu.Unlock()
	if err != nil || h.viaKernel || l.down.Load() {
		l.st.TCPCounters.TxDropped.Add(uint64(len(pkts)))
		if h.unresolved {
			l.hostUnreachable(pkts)
		}
	} else {
		hops := make([]nextHop, len(pkts))
		for i := range hops {
			hops[i] = h
		}
		l.transmit(l.q, pkts, hops, 0, false)
	}
	for _, p := range pkts {
		p.DecRef()
	}
}

// hostUnreachable tells netstack that pkts were not sent, their next hop
// unresolved, as the kernel tells its own sockets when a neighbour's ARP
// requests go unanswered (arp_error_report): an ICMP host unreachable for
// each SYN (a connect's, or a SYN-ACK), from its destination. A connect
// fails with EHOSTUNREACH, as the kernel's does, where it waited for its
// SYN's retransmissions; a half-open connection is dropped. Other
// segments get none: the kernel keeps such an error of an established
// connection out of SO_ERROR, where netstack would put it.
func (l *tcpLink) hostUnreachable(pkts []*nstack.PacketBuffer) {
	d := l.disp.Load()
	if d == nil {
		return
	}
	for _, p := range pkts {
		// The quote: the packet's IP header and its first 8 bytes beyond.
		var orig [gheader.IPv4MaximumHeaderSize + header.TCPMinLen]byte
		n := copyPacket(orig[:], p)
		ip := header.IPv4(orig[:n])
		if n < header.IPv4MinLen || n < ip.HeaderLen()+header.TCPMinLen ||
			header.TCP(orig[ip.HeaderLen():n]).Flags()&header.TCPFlagSyn == 0 {
			continue
		}
		quote := orig[:ip.HeaderLen()+8]
		b := make([]byte, gheader.IPv4MinimumSize+gheader.ICMPv4MinimumSize+len(quote))
		ih := gheader.IPv4(b)
		ih.Encode(&gheader.IPv4Fields{
			TotalLength: uint16(len(b)),
			TTL:         64,
			Protocol:    uint8(gheader.ICMPv4ProtocolNumber),
			SrcAddr:     tcpip.AddrFrom4(ip.Dst().As4()),
			DstAddr:     tcpip.AddrFrom4(ip.Src().As4()),
		})
		ih.SetChecksum(^ih.CalculateChecksum())
		ic := gheader.ICMPv4(b[gheader.IPv4MinimumSize:])
		ic.SetType(gheader.ICMPv4DstUnreachable)
		ic.SetCode(gheader.ICMPv4HostUnreachable)
		copy(ic[gheader.ICMPv4MinimumSize:], quote)
		ic.SetChecksum(gheader.ICMPv4Checksum(ic, 0))
		pkt := nstack.NewPacketBuffer(nstack.PacketBufferOptions{Payload: gbuffer.MakeWithData(b)})
		d.DeliverNetworkPacket(ipv4.ProtocolNumber, pkt)
		pkt.DecRef()
	}
}

// transmit puts pkts, whose next hops are hops, on q as frames; now is
// monoNow's, or 0 (Stack.transmit); kick: at once, whatever they are.
func (l *tcpLink) transmit(q *queue, pkts []*nstack.PacketBuffer, hops []nextHop, now int64, kick bool) tcpip.Error {
	st := l.st
	// Packets with no next hop behind the interface, or too long for a
	// frame, are dropped before frames are taken for them: a transmit
	// frame cannot be given back unsent. So are IP fragments while the
	// backend finishes checksums: netstack left the segment's checksum to
	// the link and then fragmented it (the MTU came down, and shrinkMSS
	// has not run yet), and a checksum asked of each fragment was written
	// into the data of those after the first (a kernel reader on the veth
	// took 1 MB altered). TCP sends them again, shrunk.
	partial := q.be.TxChecksum()
	var send [rxBatch]int
	n := 0
	for i, pkt := range pkts {
		if !hops[i].viaKernel && header.EthernetLen+pkt.Size() <= st.txFrameLen &&
			!(partial && header.IPv4(pkt.NetworkHeader().Slice()).IsFragment()) {
			send[n] = i
			n++
		}
	}
	st.TCPCounters.TxDropped.Add(uint64(len(pkts) - n))
	if n == 0 {
		return nil
	}
	spinLock(&q.txMu)
	got := q.be.Alloc(q.txBufs[:n])
	for k, i := range send[:got] {
		b := &q.txBufs[k]
		eth := header.Ethernet(b.Data)
		eth.SetDst(hops[i].mac)
		eth.SetSrc(st.mac)
		eth.SetType(header.EtherTypeIPv4)
		b.Data = b.Data[:header.EthernetLen+copyPacket(b.Data[header.EthernetLen:], pkts[i])]
		if q.be.TxChecksum() {
			partialTCPChecksum(b)
		}
	}
	st.TCPCounters.TxDropped.Add(uint64(n - got))
	if got == 0 {
		q.txMu.Unlock()
		return &tcpip.ErrNoBufferSpace{}
	}
	// netstack acks every segment at once, before the application can
	// answer: a batch of bare acks waits for the next kick (the answer's,
	// most often), as the kernel's delayed ack rides on a reply. The
	// segments of an application's send kick as UDP's datagrams do
	// (transmit): at once after a receive or wait (TCPConn.WaitPoint),
	// with the next one's kick when sends follow each other (sockperf
	// --tcp tp from vmaxdp: 1.5x the messages a second). What netstack
	// sends on its own (the processor's goroutine: data queued while it
	// held the connection, retransmissions) kicks at once: no receive of
	// the application's would follow it (redis-benchmark lost 10%).
	var m int
	var err error
	switch {
	case kick:
		m, err = st.transmitNow(q, q.txBufs[:got])
	case allBareAcks(pkts):
		m, err = st.transmitLater(q, q.txBufs[:got], now)
	case st.tcpAppSends.Load() > 0:
		m, err = st.transmit(q, q.txBufs[:got], now, false)
	default:
		m, err = st.transmitNow(q, q.txBufs[:got])
	}
	if kerr := st.unlockTx(q); err == nil {
		err = kerr
	}
	st.TCPCounters.TxSegments.Add(uint64(m))
	if err != nil {
		return &tcpip.ErrClosedForSend{}
	}
	return nil
}

// Held acknowledgements. netstack acknowledges each segment as it
// processes it, before the application can answer, where the kernel
// delays its ACK for the answer to carry (RFC 1122 4.2.3.2). A bare ACK
// without SACK blocks is held back, for at most the kick delay
// (holdDelay), or until the event loop whose thread processed the
// segment waits again (TCPPoller.Wait; at most maxHoldDelay); a later
// segment of the same connection that carries data or a FIN and
// acknowledges as much makes it redundant, and it is not sent
// (TCPCounters.AcksCarried). The rest leave when the hold is over,
// together (TCPCounters.AcksDelayed). As the kernel
// acknowledges at once when a second full segment is unacknowledged, a
// bare ACK that acknowledges a full segment more than the ACKs held for
// its connection leaves at once, in their place, so that a bulk
// receiver's ACKs still clock its sender. ACKs with SACK blocks (data
// arrived out of order) are never held, and held duplicate ACKs (one
// connection, one acknowledged byte) are never carried: both tell the
// sender of a loss.

// maxHeld bounds the acknowledgements held at once; more release them.
const maxHeld = 32

// maxHoldDelay bounds holdDelay whatever the kick delay: an answer that
// is coming comes sooner, and an ACK held near the peer's retransmission
// timeout (200 ms at least) would bring the segment again.
const maxHoldDelay = time.Millisecond

// holdDelay is the longest an acknowledgement is held: the kick delay,
// which bounded how long it waited on the transmit ring before, up to
// maxHoldDelay. Longer is not better: with 250 us or 1 ms, dnsperf under
// vmaxdp over 32 TCP connections to a kernel knot made 17-31k and
// 21-23k queries a second, against 40-47k with 20 or 100 us, though
// redis-server under vmaxdp gained a tenth (its answers come 100-300 us
// after the request, and the ACKs held longer ride on them).
func (l *tcpLink) holdDelay() time.Duration { return min(l.st.opts.TxKickDelay, maxHoldDelay) }

// hold holds list if it is all bare ACKs without SACK blocks, and drops
// the held ACKs list's segments make redundant; true when it held list.
func (l *tcpLink) hold(list []*nstack.PacketBuffer) bool {
	if c := l.settling.Load(); c != nil && len(list) == 1 && allBareAcks(list) && keyOf(list[0]).conn == c.key.heldConn() {
		// An owed ACK no answer carried: its hold is over.
		l.settled.Add(1)
		l.st.TCPCounters.AcksDelayed.Add(1)
		return false
	}
	if l.holdDelay() == 0 {
		return false
	}
	if len(list) > maxHeld || !allBareAcks(list) || slices.ContainsFunc(list, hasSACK) {
		if l.heldN.Load() > 0 {
			l.carry(list)
		}
		return false
	}
	long := l.answeredInSets(list)
	var release []*nstack.PacketBuffer
	l.heldMu.Lock()
	if l.ackNow(list) {
		l.heldMu.Unlock()
		return false
	}
	if len(l.held)+len(list) > maxHeld {
		release = l.takeHeld()
	}
	for _, p := range list {
		p.IncRef()
		l.heldKeys[len(l.held)] = keyOf(p)
		l.held = append(l.held, p)
	}
	l.heldN.Store(int32(len(l.held)))
	switch {
	case l.heldArmed && l.heldLong && !long:
		// Held for their sets' threads, which wait again soon or not at
		// all: these are no reason to wait, and bring the time in.
		l.armHeld(l.holdDelay())
	case l.heldArmed || l.heldDue.Load() != 0:
		// What is held already goes when its time comes: these with it.
	case l.st.eventLoop.Load():
		// An event loop answers what a poll gave it before it polls
		// again (redis-server writes its replies before its next
		// epoll_wait), however long its batch takes: held until then
		// (TCPPoller.Wait and PollStop release them), or maxHoldDelay.
		// With the kick delay alone, a third of redis-server's requests
		// had a bare ACK of their own, sent by a timer's goroutine.
		l.heldDue.Store(monoNow() + int64(maxHoldDelay))
		l.armCheck()
	case long:
		// A thread that waits on an epoll set answers its connections
		// (a worker of memcached's, each with its set): held until it
		// waits again having read what they acknowledge
		// (TCPPoller.Wait), or maxHoldDelay. With the kick delay alone,
		// four of five of memcached's answers came too late to carry
		// theirs, a bare ACK each.
		l.armHeld(maxHoldDelay)
	case l.st.appPolling():
		l.heldDue.Store(monoNow() + int64(l.holdDelay()))
		l.armCheck()
	default:
		l.armHeld(l.holdDelay())
	}
	l.heldMu.Unlock()
	l.send(release)
	return true
}

// answeredInSets says whether each of list's ACKs is for a connection in
// an epoll set (TCPConn.sets), whose thread is to answer it.
func (l *tcpLink) answeredInSets(list []*nstack.PacketBuffer) bool {
	for _, p := range list {
		c, ok := l.st.tcpConns.Load(heldKey(keyOf(p).conn))
		if !ok || c.(*TCPConn).sets.Load() == 0 {
			return false
		}
	}
	return true
}

// ackNow says whether a bare ACK of list acknowledges a full segment or
// more beyond the ACKs held for its connection: then list leaves at once,
// and the held ACKs it acknowledges more than are dropped (carried).
// Caller holds heldMu.
func (l *tcpLink) ackNow(list []*nstack.PacketBuffer) bool {
	if len(l.held) == 0 {
		return false
	}
	mss := int32(l.st.tcpMTU() - header.IPv4MinLen - header.TCPMinLen)
	now := false
	for _, p := range list {
		k := keyOf(p)
		if !slices.ContainsFunc(l.heldKeys[:len(l.held)], func(h ackKey) bool { return h.conn == k.conn && int32(k.ack-h.ack) >= mss }) {
			continue
		}
		now = true
		l.dropHeld(func(i int) bool { h := l.heldKeys[i]; return h.conn == k.conn && int32(h.ack-k.ack) < 0 })
	}
	return now
}

// ackKey is what the hold compares of a segment: its connection (ports
// and addresses, both from this host) and acknowledgement number. Read
// once per segment: read from the packet at each comparison, it took 9%
// of redis-server's CPU under vmaxdp (perf), the held list being up to
// one ACK per connection and compared pairwise.
type ackKey struct {
	conn [12]byte
	ack  uint32
}

func keyOf(p *nstack.PacketBuffer) ackKey {
	tcp, ip := p.TransportHeader().Slice(), p.NetworkHeader().Slice()
	var k ackKey
	copy(k.conn[:4], tcp[0:4])
	copy(k.conn[4:], ip[12:20])
	k.ack = binary.BigEndian.Uint32(tcp[8:12])
	return k
}

// dropHeld drops, as carried, the held ACKs drop says are redundant (i:
// their index in held). Caller holds heldMu.
func (l *tcpLink) dropHeld(drop func(i int) bool) {
	keep := l.held[:0]
	for i, h := range l.held {
		if !drop(i) {
			l.heldKeys[len(keep)] = l.heldKeys[i]
			keep = append(keep, h)
			continue
		}
		h.DecRef()
		l.st.TCPCounters.AcksCarried.Add(1)
		if c, ok := l.st.tcpConns.Load(heldKey(l.heldKeys[i].conn)); ok {
			c.(*TCPConn).acksCarried.Add(1)
		}
	}
	clear(l.held[len(keep):])
	l.held = keep
	l.heldN.Store(int32(len(l.held)))
	if len(l.held) == 0 {
		l.disarmHeld()
	}
}

// armHeld starts heldTimer. Caller holds heldMu.
func (l *tcpLink) armHeld(d time.Duration) {
	l.heldArmed = true
	l.heldLong = d > l.holdDelay()
	l.heldTimer.Reset(d)
}

// disarmHeld: nothing is held any more. Caller holds heldMu.
func (l *tcpLink) disarmHeld() {
	l.heldDue.Store(0)
	if l.heldArmed {
		l.heldArmed = false
		l.heldTimer.Stop()
	}
}

// pollHeld releases the held ACKs whose time came, for a thread that
// polls (heldDue).
func (l *tcpLink) pollHeld() {
	if d := l.heldDue.Load(); d != 0 && monoNow() >= d {
		l.expireHeld()
	}
}

// armCheck starts heldCheck unless it runs. Caller holds heldMu.
func (l *tcpLink) armCheck() {
	if l.heldCheckArmed {
		return
	}
	l.heldCheckArmed = true
	l.heldCheck.Reset(appPollCheck)
}

// checkHeld is heldCheck's: it releases what is due, and looks again
// while the polling thread holds ACKs.
func (l *tcpLink) checkHeld() {
	l.pollHeld()
	l.heldMu.Lock()
	l.heldCheckArmed = false
	if l.heldDue.Load() != 0 {
		l.armCheck()
	}
	l.heldMu.Unlock()
}

// timeHeld hands the held ACKs a polling thread was to release to
// heldTimer: the thread stops polling.
func (l *tcpLink) timeHeld() {
	if l.heldDue.Load() == 0 {
		return
	}
	l.heldMu.Lock()
	if d := l.heldDue.Load(); d != 0 && len(l.held) > 0 && !l.heldArmed {
		l.heldDue.Store(0)
		l.armHeld(time.Duration(max(d-monoNow(), 0)))
	}
	l.heldMu.Unlock()
}

// carry drops the held ACKs that list's segments with data or a FIN make
// redundant: of the same connection, acknowledging as much or more.
func (l *tcpLink) carry(list []*nstack.PacketBuffer) {
	l.heldMu.Lock()
	defer l.heldMu.Unlock()
	for _, p := range list {
		tcp := p.TransportHeader().Slice()
		if len(tcp) < header.TCPMinLen || tcp[13]&0x10 == 0 || (p.Data().Size() == 0 && tcp[13]&0x01 == 0) {
			continue // no ACK, or neither data nor a FIN
		}
		k := keyOf(p)
		keys := l.heldKeys[:len(l.held)]
		var carried [maxHeld]bool
		for i, h := range keys {
			if h.conn != k.conn || int32(h.ack-k.ack) > 0 {
				continue
			}
			// Held ACKs of one connection that acknowledge the same
			// byte are duplicate ACKs, which tell a sender without
			// SACK of a loss: they leave as they are.
			dup := false
			for j, o := range keys {
				dup = dup || j != i && o == h
			}
			carried[i] = !dup
		}
		l.dropHeld(func(i int) bool { return carried[i] })
	}
}

// oweAck puts c, whose processing built no ACK, on the owed list
// (tcpinline.go), and arms owedTimer for the list's first.
func (l *tcpLink) oweAck(c *TCPConn) {
	l.owedMu.Lock()
	defer l.owedMu.Unlock()
	if c.ackOwed {
		return
	}
	c.ackOwed = true
	l.owed = append(l.owed, c)
	l.owedN.Store(int32(len(l.owed)))
	if !l.owedArmed {
		l.owedArmed = true
		l.owedTimer.Reset(maxHoldDelay)
	}
}

// owedTimeout is owedTimer's: what is owed is settled.
func (l *tcpLink) owedTimeout() {
	l.owedMu.Lock()
	l.owedArmed = false
	l.owedMu.Unlock()
	l.settleOwed(nil)
}

// settleOwed settles the owed ACKs but those of but's connections, whose
// thread is about to write on them (TCPPoller.Wait's writers).
func (l *tcpLink) settleOwed(but []*TCPConn) {
	if l.owedN.Load() == 0 {
		return
	}
	l.settleOwedWhere(func(c *TCPConn) bool { return !slices.Contains(but, c) })
}

// settleOwedWhere settles the owed ACKs of the connections due says. due
// runs with no lock of the link's held (a poller's asks it, and netstack),
// on a copy of the owed list.
func (l *tcpLink) settleOwedWhere(due func(c *TCPConn) bool) {
	l.settleMu.Lock()
	defer l.settleMu.Unlock()
	l.owedMu.Lock()
	cands := append(l.cands[:0], l.owed...)
	l.owedMu.Unlock()
	for _, c := range cands {
		c.settleDue = due(c)
	}
	l.owedMu.Lock()
	list, kept := l.due[:0], l.owedSpare[:0]
	for _, c := range l.owed {
		if !c.settleDue {
			kept = append(kept, c)
			continue
		}
		c.ackOwed = false
		list = append(list, c)
	}
	for _, c := range cands {
		c.settleDue = false
	}
	clear(cands)
	l.cands = cands[:0]
	clear(l.owed)
	l.owed, l.owedSpare = kept, l.owed[:0]
	l.owedN.Store(int32(len(kept)))
	if len(kept) == 0 && l.owedArmed && l.owedTimer.Stop() {
		l.owedArmed = false
	}
	l.owedMu.Unlock()
	for _, c := range list {
		l.settle(c)
	}
	clear(list)
	l.due = list[:0]
}

// settle acknowledges what c's peer sent, unless c's answers did
// (AcksCarried): netstack's handleSegmentsLocked on the endpoint, whose
// last step sends the ACK if one is still due, and processes whatever
// came meanwhile. Caller holds settleMu.
func (l *tcpLink) settle(c *TCPConn) {
	ep, ok := c.ep.(*tcp.Endpoint)
	if !ok {
		return
	}
	ep.LockUser()
	if ackless(ep.EndpointState()) {
		ep.UnlockUser()
		return
	}
	before := l.settled.Load()
	l.settling.Store(c)
	c.settleLocked(ep, tcpHandleSegmentsLocked(ep))
	l.settling.Store(nil)
	if l.settled.Load() == before {
		l.st.TCPCounters.AcksCarried.Add(1)
	}
}

// releaseHeld sends the held ACKs: their delay is over.
func (l *tcpLink) releaseHeld() int {
	l.heldMu.Lock()
	release := l.takeHeld()
	l.heldN.Store(0)
	l.heldArmed = false
	l.heldDue.Store(0)
	l.heldMu.Unlock()
	l.send(release)
	return len(release)
}

// expireHeld is the hold timer's: the held ACKs no segment carried
// leave, and are counted.
func (l *tcpLink) expireHeld() {
	l.st.TCPCounters.AcksDelayed.Add(uint64(l.releaseHeld()))
}

// takeHeld empties held and returns what it held, for send. Caller holds
// heldMu.
func (l *tcpLink) takeHeld() []*nstack.PacketBuffer {
	out := l.held
	l.held, l.spare = l.spare[:0], nil
	if l.held == nil {
		l.held = make([]*nstack.PacketBuffer, 0, maxHeld)
	}
	return out
}

// send writes released ACKs, kicked at once, and lets them go; dropped
// and counted once netstack is closing. Their array becomes the spare.
func (l *tcpLink) send(pkts []*nstack.PacketBuffer) {
	if len(pkts) == 0 {
		return
	}
	if l.down.Load() {
		l.st.TCPCounters.TxDropped.Add(uint64(len(pkts)))
	} else {
		l.write(pkts, true)
	}
	for _, p := range pkts {
		p.DecRef()
	}
	clear(pkts)
	l.heldMu.Lock()
	if l.spare == nil {
		l.spare = pkts[:0]
	}
	l.heldMu.Unlock()
}

// hasSACK says whether p's TCP header carries SACK blocks (option 5).
func hasSACK(p *nstack.PacketBuffer) bool {
	tcp := p.TransportHeader().Slice()
	if len(tcp) < header.TCPMinLen {
		return false
	}
	opts := tcp[header.TCPMinLen:min(len(tcp), int(tcp[12]>>4)*4)]
	for i := 0; i < len(opts); {
		switch opts[i] {
		case 0:
			return false
		case 1:
			i++
			continue
		case 5:
			return true
		}
		if i+1 >= len(opts) || opts[i+1] < 2 {
			return false
		}
		i += int(opts[i+1])
	}
	return false
}

// allBareAcks says whether every packet is a TCP segment with the ACK
// flag alone and no payload.
func allBareAcks(pkts []*nstack.PacketBuffer) bool {
	for _, p := range pkts {
		tcp := p.TransportHeader().Slice()
		if len(tcp) < header.TCPMinLen || tcp[13] != 0x10 || p.Data().Size() != 0 {
			return false
		}
	}
	return true
}

// partialTCPChecksum sets the TCP checksum of b's IPv4 packet to the
// pseudo-header sum and asks the backend to finish it: netstack left it
// to the link (CapabilityTXChecksumOffload).
func partialTCPChecksum(b *backend.Buf) {
	ip := header.IPv4(b.Data[header.EthernetLen:])
	hl := ip.HeaderLen()
	seg := ip[hl:]
	if ip.Protocol() != header.ProtocolTCP || len(seg) < header.TCPMinLen {
		return
	}
	header.SetPartialChecksum(seg, header.TCPChecksumOffset, ip.Src(), ip.Dst(), header.ProtocolTCP)
	b.CsumStart, b.CsumOffset = uint16(header.EthernetLen+hl), header.TCPChecksumOffset
}

// deliverTCP hands a TCP packet to netstack (a copy: the frame goes back
// to its queue at once). Caller holds rxMu.
func (st *Stack) deliverTCP(ip header.IPv4) {
	t := st.tcp.Load()
	if t == nil {
		st.Counters.RxNoSocket.Add(1)
		return
	}
	d := t.link.disp.Load()
	if d == nil {
		st.Counters.RxNoSocket.Add(1)
		return
	}
	if !st.checked(header.CheckTCPOn(ip, st.partialCsum)) {
		return
	}
	seg := header.TCP(ip[ip.HeaderLen():])
	if seg.Flags()&header.TCPFlagFin != 0 {
		st.finArriving(ip, seg)
	}
	pkt := nstack.NewPacketBuffer(nstack.PacketBufferOptions{Payload: gbuffer.MakeWithData(ip)})
	pkt.NetworkProtocolNumber = ipv4.ProtocolNumber
	pkt.RXChecksumValidated = true // checked above, the IP header by Parse
	st.TCPCounters.RxSegments.Add(1)
	if plainSegment(seg) {
		st.holdInline(ip, seg)
	}
	t.up.d = d
	t.segs++
	t.gro.Enqueue(pkt)
	pkt.DecRef()
}

// flushTCP hands netstack what the drain's GRO holds, and counts what it
// merged. Caller holds rxMu.
func (st *Stack) flushTCP() {
	t := st.tcp.Load()
	if t == nil || t.segs == 0 {
		return
	}
	t.gro.Flush()
	if merged := t.segs - t.up.delivered; merged > 0 {
		st.TCPCounters.RxMerged.Add(merged)
	}
	t.segs, t.up.delivered = 0, 0
}

// finArriving marks the connection a FIN is for, before netstack takes
// it: netstack tells its waiters of a FIN as of data (readable) and only
// then moves to CLOSE-WAIT, so that readiness alone would report the
// peer's hangup (EPOLLRDHUP) after the waiter looked.
func (st *Stack) finArriving(ip header.IPv4, seg header.TCP) {
	if c, ok := st.tcpConns.Load(segKey(ip, seg)); ok {
		c.(*TCPConn).fin.Store(true)
	}
}

// tcpKey names a connection by its 5-tuple (TCP implied).
type tcpKey struct{ local, remote netip.AddrPort }

// segKey is the key of the connection segment seg, in ip, came for.
func segKey(ip header.IPv4, seg header.TCP) tcpKey {
	return tcpKey{local: netip.AddrPortFrom(ip.Dst(), seg.DstPort()), remote: netip.AddrPortFrom(ip.Src(), seg.SrcPort())}
}

// heldKey is the tcpKey of an ackKey.conn.
func heldKey(c [12]byte) tcpKey {
	return tcpKey{
		local:  netip.AddrPortFrom(netip.AddrFrom4([4]byte(c[4:8])), binary.BigEndian.Uint16(c[0:2])),
		remote: netip.AddrPortFrom(netip.AddrFrom4([4]byte(c[8:12])), binary.BigEndian.Uint16(c[2:4])),
	}
}

// heldConn is ackKey.conn of the connection's segments (zero, which no
// segment's is, for an address that is not IPv4's: netstack's link here
// carries IPv4 only).
func (k tcpKey) heldConn() [12]byte {
	var c [12]byte
	la, ra := k.local.Addr().Unmap(), k.remote.Addr().Unmap()
	if !la.Is4() || !ra.Is4() {
		return c
	}
	binary.BigEndian.PutUint16(c[0:2], k.local.Port())
	binary.BigEndian.PutUint16(c[2:4], k.remote.Port())
	l, r := la.As4(), ra.As4()
	copy(c[4:8], l[:])
	copy(c[8:12], r[:])
	return c
}

// TCPClosing counts the closed connections still exchanging their closing
// segments (see TCPConn.Closing): a process that exits waits for them,
// so that the peers' last segments find netstack, not the kernel.
func (st *Stack) TCPClosing() int {
	t := st.tcp.Load()
	if t == nil {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, c := range t.closing {
		if c.Closing() {
			n++
		}
	}
	return n
}

// HasTCP says whether netstack runs on the stack (a TCP socket made it).
func (st *Stack) HasTCP() bool { return st.tcp.Load() != nil }

// NetstackCounters are netstack's own TCP counters (tcpip.Stats.TCP),
// those a user needs to see where segments and connections went.
type NetstackCounters struct {
	ActiveOpens             uint64 // connects that sent a SYN
	PassiveOpens            uint64 // connections a listener accepted
	CurrentEstablished      uint64 // in ESTABLISHED or CLOSE-WAIT now
	EstablishedResets       uint64 // established connections reset
	EstablishedTimedout     uint64 // established connections timed out
	FailedConnects          uint64 // connects that failed
	ListenOverflowSynDrop   uint64 // SYNs dropped: a listener's backlog was full
	ListenOverflowAckDrop   uint64 // handshakes dropped: a listener's accept queue was full
	SynCookiesSent          uint64 // SYNs answered with a cookie: too many half-open connections
	ValidSegmentsReceived   uint64
	InvalidSegmentsReceived uint64 // malformed
	ChecksumErrors          uint64
	SegmentsSent            uint64
	SegmentSendErrors       uint64
	ResetsSent              uint64
	ResetsReceived          uint64
	Retransmits             uint64
	Timeouts                uint64 // retransmission timeouts
}

// Netstack reads netstack's counters; false when no TCP socket made it.
func (st *Stack) Netstack() (NetstackCounters, bool) {
	t := st.tcp.Load()
	if t == nil {
		return NetstackCounters{}, false
	}
	s := t.ns.Stats().TCP
	return NetstackCounters{
		ActiveOpens: s.ActiveConnectionOpenings.Value(), PassiveOpens: s.PassiveConnectionOpenings.Value(),
		CurrentEstablished: s.CurrentEstablished.Value(), EstablishedResets: s.EstablishedResets.Value(),
		EstablishedTimedout: s.EstablishedTimedout.Value(), FailedConnects: s.FailedConnectionAttempts.Value(),
		ListenOverflowSynDrop: s.ListenOverflowSynDrop.Value(), ListenOverflowAckDrop: s.ListenOverflowAckDrop.Value(),
		SynCookiesSent:        s.ListenOverflowSynCookieSent.Value(),
		ValidSegmentsReceived: s.ValidSegmentsReceived.Value(), InvalidSegmentsReceived: s.InvalidSegmentsReceived.Value(),
		ChecksumErrors: s.ChecksumErrors.Value(), SegmentsSent: s.SegmentsSent.Value(), SegmentSendErrors: s.SegmentSendErrors.Value(),
		ResetsSent: s.ResetsSent.Value(), ResetsReceived: s.ResetsReceived.Value(), Retransmits: s.Retransmits.Value(),
		Timeouts: s.Timeouts.Value(),
	}, true
}

// shrinkMSS lowers the segment size of every netstack connection to the
// interface's MTU, which came down. netstack sizes a connection's
// segments at its handshake and lowers them only on an ICMP
// "fragmentation needed", which nobody sends for a local MTU change: its
// segments went out IP-fragmented (iperf3 at 0.3 Gbit/s after the change
// against 1.2 with MTU 1280 from the start), where the kernel's TCP reads
// the MTU at each send. What netstack takes from such an ICMP message is
// given to each connection as if one had come.
func (st *Stack) shrinkMSS() {
	if shrinkOff.Load() {
		return
	}
	mtu := tooBig(st.tcpMTU() - header.IPv4MinLen)
	st.tcpConns.Range(func(_, v any) bool {
		if ep, ok := v.(*TCPConn).ep.(nstack.TransportEndpoint); ok {
			ep.HandleError(mtu, nil)
		}
		return true
	})
}

// shrinkOff is set only by a test that looks at what netstack sends
// before its segments shrink.
var shrinkOff atomic.Bool

// tooBig is an ICMP "fragmentation needed" for netstack's TCP: the
// largest IP payload that passes (shrinkMSS). netstack reads its Kind
// and Info only.
type tooBig uint32

func (tooBig) Origin() tcpip.SockErrOrigin     { return tcpip.SockExtErrorOriginLocal }
func (tooBig) Type() uint8                     { return 0 }
func (tooBig) Code() uint8                     { return 0 }
func (m tooBig) Info() uint32                  { return uint32(m) }
func (tooBig) Kind() nstack.TransportErrorKind { return nstack.PacketTooBigTransportError }

// tcpMTU is the largest IP packet netstack may send, and (through the
// MSS it advertises) receive: the interface's MTU now, within a frame.
func (st *Stack) tcpMTU() int {
	return min(int(st.mtu.Load()), st.txFrameLen-header.EthernetLen, st.rxFrameLen-header.EthernetLen)
}

// tcpStack returns netstack, made on first use with the interface's
// addresses, a route to everything through it, and goroutines that drain
// the queues while no receive does.
func (st *Stack) tcpStack() (*tcpState, error) {
	st.tcpMu.Lock()
	defer st.tcpMu.Unlock()
	if t := st.tcp.Load(); t != nil {
		return t, nil
	}
	q := st.pickTxQueue()
	if q == nil {
		return nil, fmt.Errorf("tcp: no queue can transmit")
	}
	defaults, err := kernelOptionDefaults()
	if err != nil {
		return nil, err
	}
	link := &tcpLink{st: st, q: q}
	// The hold's timers, made once and stopped: armHeld and armCheck only
	// Reset them (a method value made at each arming would allocate).
	link.heldTimer = time.AfterFunc(time.Hour, link.expireHeld)
	link.heldTimer.Stop()
	link.heldCheck = time.AfterFunc(time.Hour, link.checkHeld)
	link.heldCheck.Stop()
	link.owedTimer = time.AfterFunc(time.Hour, link.owedTimeout)
	link.owedTimer.Stop()
	ns := nstack.New(nstack.Options{
		NetworkProtocols:   []nstack.NetworkProtocolFactory{ipv4.NewProtocol},
		TransportProtocols: []nstack.TransportProtocolFactory{tcp.NewProtocol},
	})
	sack := tcpip.TCPSACKEnabled(true)
	ns.SetTransportProtocolOption(tcp.ProtocolNumber, &sack)
	// No RACK: its tail loss probe pushes the retransmission timer back at
	// every new send (schedulePTO disables it, the probe enables it again
	// from then), so a connection that keeps sending to a peer that
	// vanished never timed out, TCP_USER_TIMEOUT or not
	// (TestRunTCPPeerVanishes). Loss is recovered by SACK and the
	// retransmission timer, as RFC 6298 has it.
	recovery := tcpip.TCPRecovery(0)
	ns.SetTransportProtocolOption(tcp.ProtocolNumber, &recovery)
	// Nagle on, as on a fresh kernel socket (TCP_NODELAY 0): netstack's
	// own default is off, and copyOptions copies only the options that
	// differ from the kernel's defaults, so that an application that never
	// set TCP_NODELAY sent every write as a segment of its own (sockperf
	// --tcp tp from vmaxdp: one 64-byte message a segment).
	delay := tcpip.TCPDelayEnabled(true)
	ns.SetTransportProtocolOption(tcp.ProtocolNumber, &delay)
	if err := ns.CreateNICWithOptions(tcpNIC, link, nstack.NICOptions{QDisc: tcpQDisc{link}}); err != nil {
		ns.Close()
		return nil, fmt.Errorf("tcp: netstack NIC: %s", err)
	}
	if p := st.addrs.Load(); p != nil {
		for _, a := range *p {
			if err := st.tcpAddAddr(ns, a); err != nil {
				ns.Close()
				return nil, err
			}
		}
	}
	ns.SetRouteTable([]tcpip.Route{{Destination: gheader.IPv4EmptySubnet, NIC: tcpNIC}})
	t := &tcpState{ns: ns, link: link, defaults: defaults, stop: make(chan struct{}), done: make(chan struct{})}
	t.gro.Init(true)
	t.gro.Dispatcher = &t.up
	t.up.st = st
	t.up.tcp, _ = ns.TransportProtocolInstance(tcp.ProtocolNumber).(queuedTCP)
	go st.tcpDrain(t)
	st.tcp.Store(t)
	return t, nil
}

func (st *Stack) tcpAddAddr(ns *nstack.Stack, a netip.Addr) error {
	pa := tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber,
		AddressWithPrefix: tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(a.As4()), PrefixLen: 32}}
	if err := ns.AddProtocolAddress(tcpNIC, pa, nstack.AddressProperties{}); err != nil {
		if _, dup := err.(*tcpip.ErrDuplicateAddress); dup {
			return nil
		}
		return fmt.Errorf("tcp: netstack address %s: %s", a, err)
	}
	return nil
}

// tcpDrain drains the queues while no receive of a UDP socket does:
// netstack's sockets have no receive of ours to poll. It starts a drain
// per queue again when the queues change (a new channel count), and
// retires closed connections once netstack is done with them.
func (st *Stack) tcpDrain(t *tcpState) {
	defer close(t.done)
	qs := st.queues.Load()
	stop := st.startDrains(*qs)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-t.stop:
			stop()
			return
		case <-tick.C:
		}
		st.reapTCP(t, false)
		if now := st.queues.Load(); now != qs && now != nil {
			stop()
			qs, stop = now, st.startDrains(*now)
		}
	}
}

// startDrains starts a goroutine per queue that drains it whenever it
// has frames, and returns what stops them. Each waits in Go's netpoller
// on a duplicate of its queue's descriptor, not in poll(2): a goroutine
// parked there lets the goroutines it readies (netstack's processor, the
// reader) run at once, where one blocked in a system call holds its P
// from them (64-byte TCP ping-pong: 27 us, against 43 us with poll(2);
// BenchmarkTCPPingPong). While an application thread polls the queues
// (appPolling), the drain leaves the netpoller: its descriptor there would
// wake one of Go's threads at every frame, which the polling thread takes
// first anyway.
func (st *Stack) startDrains(qs []*queue) (stop func()) {
	var wg sync.WaitGroup
	var ds []*drain
	for _, q := range qs {
		d := &drain{st: st, be: q.be, wake: make(chan struct{}, 1), stop: make(chan struct{})}
		ds = append(ds, d)
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.run()
		}()
	}
	st.drainsMu.Lock()
	st.drains = append(st.drains, ds...)
	st.drainsMu.Unlock()
	return func() {
		st.drainsMu.Lock()
		st.drains = slices.DeleteFunc(st.drains, func(d *drain) bool { return slices.Contains(ds, d) })
		st.drainsMu.Unlock()
		for _, d := range ds {
			d.close()
		}
		wg.Wait()
	}
}

// drain is a queue's drain goroutine.
type drain struct {
	st   *Stack
	be   backend.Backend
	wake chan struct{} // an application thread stopped polling (pollStopped)
	stop chan struct{}
	mu   sync.Mutex
	f    *os.File // in the netpoller, or nil
	done bool
}

// appPollRecent: an application thread that polled the queues this
// recently polls them still (appPolling); appPollCheck is how often the
// drain looks meanwhile whether it still does (and releases the held
// acknowledgements that are due).
//
// ringSleepCheck is how often it looks while a thread sleeps on the
// queues (sleepOnRings), which it wakes from by itself: the look
// then only finds out late that the thread, woken, went to other work
// and left the frames of other threads' connections waiting. At
// appPollCheck the drains of an idle redis-server woke 2,000 times a
// second for nothing (4.5% of a CPU where the server took 2.9% before).
const (
	appPollRecent  = 200 * time.Microsecond
	appPollCheck   = 500 * time.Microsecond
	ringSleepCheck = 4 * time.Millisecond
)

func (d *drain) run() {
	st := d.st
	woken := false // the netpoller woke the drain: not Read's first look
	ready := func(uintptr) bool {
		if woken {
			st.TCPCounters.DrainWakeups.Add(1)
		}
		woken = true
		if st.appPolling() {
			return true // Read returns: leave the netpoller
		}
		st.rxMu.Lock()
		defer st.rxMu.Unlock()
		n := st.drainBatchesLocked()
		st.TCPCounters.RxDrained.Add(uint64(n))
		return n > 0
	}
	t := time.NewTimer(appPollCheck)
	t.Stop()
	for {
		d.mu.Lock()
		if d.done {
			d.mu.Unlock()
			return
		}
		f, rc, err := pollerFile(d.be)
		if err != nil {
			d.mu.Unlock()
			d.failed(err)
			return
		}
		d.f = f
		d.mu.Unlock()
		for err == nil && !st.appPolling() {
			woken = false
			err = rc.Read(ready)
		}
		d.mu.Lock()
		d.closeFile()
		done := d.done
		d.mu.Unlock()
		if err != nil {
			if !done {
				d.failed(err)
			}
			return
		}
		for st.appPolling() {
			if st.ringSleeper.Load() {
				t.Reset(ringSleepCheck)
			} else {
				t.Reset(appPollCheck)
			}
			select {
			case <-d.stop:
				t.Stop()
				return
			case <-d.wake:
			case <-t.C:
			}
			t.Stop()
			if tcp := st.tcp.Load(); tcp != nil {
				tcp.link.pollHeld() // the polling thread went away
			}
			// The rings stay the polling thread's: a look that drained
			// them took the frames of an event loop busy between its
			// waits (a quarter of them), for netstack's processor, whose
			// acknowledgements then left on their own. Once the thread
			// has not polled for appPollRecent, the loop ends and the
			// netpoller's first look drains what waits.
		}
	}
}

// failed counts and logs a drain that stops before its stack closes: its
// queue's TCP segments then wait for an application thread's poll, and
// those of connections nobody polls for, for ever.
func (d *drain) failed(err error) {
	d.st.TCPCounters.DrainErrors.Add(1)
	slog.Error(fmt.Sprintf("stack %s: %s: TCP segments are drained only by the application's polls from now on: %v", d.st.ifname, d.be, err))
}

// close stops the drain: its Read in the netpoller returns as its file
// closes.
func (d *drain) close() {
	d.mu.Lock()
	d.done = true
	d.closeFile()
	d.mu.Unlock()
	close(d.stop)
}

// closeFile takes the drain's descriptor out of the netpoller, once.
// Caller holds mu.
func (d *drain) closeFile() {
	if d.f == nil {
		return
	}
	highfd.Forget(int(d.f.Fd()))
	d.f.Close()
	d.f = nil
}

// notePoll says that an application thread polls the queues for a UDP
// socket or a multiplexer (appPolled), once in pollerMarkEvery polls, as
// a TCPPoller says it: the drains then leave it the frames, and it
// releases the held ACKs that are due, as they would. Without it, a
// program that receives UDP with TCP offload on (iperf3 -u, whose
// control connection is TCP) had the drains in Go's netpoller woken by
// every datagram it was about to take itself: 71k epoll_pwait and 36k
// context switches a second in iperf3's server, 0.66x-0.84x the kernel's
// rate against 1.03x-1.05x with TCP offload off. Caller holds rxMu.
func (st *Stack) notePoll() {
	if st.appPolls++; st.appPolls%pollerMarkEvery != 0 {
		return
	}
	if t := st.tcp.Load(); t != nil {
		st.appPolled.Store(monoNow())
		t.link.pollHeld()
	}
	st.markPoller()
}

// appPolling says whether an application thread polls the queues.
func (st *Stack) appPolling() bool {
	if st.ringSleeper.Load() {
		return true
	}
	t := st.appPolled.Load()
	return t != 0 && monoNow()-t < int64(appPollRecent)
}

// releaseHeld sends the acknowledgements held (tcpLink.hold), for an
// event loop's thread that waits again.
func (st *Stack) releaseHeld() { st.releaseHeldBut(nil) }

// releaseHeldBut settles the owed ACKs and sends the held ones but those
// of writers' connections.
func (st *Stack) releaseHeldBut(writers []*TCPConn) {
	t := st.tcp.Load()
	if t != nil {
		t.link.settleOwed(writers)
	}
	switch {
	case t == nil || t.link.heldN.Load() == 0:
	case len(writers) == 0:
		t.link.expireHeld()
	default:
		t.link.expireHeldBut(writers)
	}
}

// expireHeldBut sends the held ACKs, counted as expireHeld does, but
// those of writers' connections, which stay held until their time.
func (l *tcpLink) expireHeldBut(writers []*TCPConn) {
	l.expireHeldWhere(func(conn [12]byte) bool {
		return !slices.ContainsFunc(writers, func(c *TCPConn) bool { return c.key.heldConn() == conn })
	})
}

// expireHeldWhere sends the held ACKs whose connection (ackKey.conn) due
// says, counted as expireHeld does; the rest stay held until their time.
func (l *tcpLink) expireHeldWhere(due func(conn [12]byte) bool) {
	l.heldMu.Lock()
	out := l.spare
	l.spare = nil
	if out == nil {
		out = make([]*nstack.PacketBuffer, 0, maxHeld)
	}
	kept := l.held[:0]
	for i, h := range l.held {
		if !due(l.heldKeys[i].conn) {
			l.heldKeys[len(kept)] = l.heldKeys[i]
			kept = append(kept, h)
			continue
		}
		out = append(out, h)
	}
	clear(l.held[len(kept):])
	l.held = kept
	l.heldN.Store(int32(len(kept)))
	if len(kept) == 0 {
		l.heldArmed = false
		l.heldDue.Store(0)
	}
	if len(out) == 0 {
		l.spare = out
		l.heldMu.Unlock()
		return
	}
	l.heldMu.Unlock()
	l.st.TCPCounters.AcksDelayed.Add(uint64(len(out)))
	l.send(out)
}

// pollStopped tells the drains that the application thread that polled the
// queues stopped: it is about to sleep.
func (st *Stack) pollStopped() {
	if st.appPolled.Load() == 0 {
		return
	}
	st.appPolled.Store(0)
	if t := st.tcp.Load(); t != nil {
		t.link.timeHeld()
	}
	st.wakeDrains()
}

// wakeDrains makes the drains look at once whether a thread polls.
func (st *Stack) wakeDrains() {
	st.drainsMu.Lock()
	for _, d := range st.drains {
		select {
		case d.wake <- struct{}{}:
		default:
		}
	}
	st.drainsMu.Unlock()
}

// pollerFile is an *os.File in Go's netpoller that polls readable when
// be's receive ring has frames: an epoll instance of its own that watches
// be's descriptor for EPOLLIN only. Go's netpoller watches a descriptor
// for reading and writing both, and an AF_XDP socket in copy mode wakes
// its waiters at every transmit completion: with be's descriptor itself
// there, a UDP sender with TCP offload on (iperf3 -u's client, whose
// control connection is TCP) woke the netpoller 8k times a second and
// sent a quarter fewer datagrams.
func pollerFile(be backend.Backend) (*os.File, syscall.RawConn, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, nil, err
	}
	ep = highfd.Move(ep)
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, be.FD(), &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
		highfd.Close(ep)
		return nil, nil, err
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		highfd.Close(ep)
		return nil, nil, err
	}
	f := os.NewFile(uintptr(ep), be.String())
	rc, err := f.SyscallConn()
	if err != nil {
		highfd.Forget(ep)
		f.Close()
		return nil, nil, err
	}
	return f, rc, nil
}

// drainBatchesLocked drains the queues until they are empty, or a bound
// of batches, and returns how many frames it saw; each batch's segments
// of connections in epoll sets are processed here (setsInliner,
// tcpinline.go). Caller holds rxMu.
func (st *Stack) drainBatchesLocked() int {
	got := 0
	for range 64 {
		st.inline = setsInliner{st}
		k := st.drainLocked()
		st.inline = nil
		st.processHeldInline()
		if k == 0 {
			break
		}
		got += k
	}
	return got
}

// closeTCP stops netstack; its sockets are closed already.
func (st *Stack) closeTCP() {
	t := st.tcp.Swap(nil)
	if t == nil {
		return
	}
	close(t.stop)
	<-t.done
	// The acknowledgements still held go before the link is down: the
	// last may be a closed connection's of its peer's FIN (TIME-WAIT),
	// which the peer would send again to the kernel once the steering
	// is gone (TestRunTCPCalls, both under vmaxdp: the client's kernel
	// took that FIN, now and then).
	t.link.releaseHeld()
	st.reapTCP(t, true)
	t.link.down.Store(true)
	t.ns.Close()
	t.ns.Wait()
}

// timeWaitRule is how long a connection in TIME-WAIT keeps its steering
// rule: long enough for the peer to send its FIN again should the last
// ACK be lost (its retransmission timeout is 200 ms at least), far
// shorter than netstack's TIME-WAIT (60 s). A server that closes first
// (HTTP/1.0: lighttpd under ab -c 20) held a rule for each connection of
// the last minute, and once the program's 4,096 were taken every new
// connection was reset.
const timeWaitRule = time.Second

// reapTCP removes the rules and kernel sockets of closed connections
// netstack has let go of (all of them with all), and the rules of those
// in TIME-WAIT for timeWaitRule; the kernel socket that holds such a
// connection's port stays until netstack lets it go.
func (st *Stack) reapTCP(t *tcpState, all bool) {
	now := time.Now()
	t.mu.Lock()
	keep := t.closing[:0]
	var done []*TCPConn
	for _, c := range t.closing {
		state := tcp.EndpointState(c.ep.State())
		switch {
		case all || state == tcp.StateClose || state == tcp.StateError:
			done = append(done, c)
			continue
		case state != tcp.StateTimeWait: // still closing: kept
		case c.twSince.IsZero():
			c.twSince = now
		case now.Sub(c.twSince) >= timeWaitRule:
			c.releaseRule()
		}
		keep = append(keep, c)
	}
	clear(t.closing[len(keep):])
	t.closing = keep
	t.mu.Unlock()
	for _, c := range done {
		c.release()
	}
}

var _ nstack.LinkEndpoint = (*tcpLink)(nil)

// copyPacket copies pkt's bytes, headers first, into b, which has room
// for them, and returns their length; PacketBuffer.AsSlices would
// allocate the list of its views.
func copyPacket(b []byte, pkt *nstack.PacketBuffer) int {
	views, skip := pkt.AsViewList()
	n := 0
	for v := views.Front(); v != nil; v = v.Next() {
		s := v.AsSlice()
		if skip >= len(s) {
			skip -= len(s)
			continue
		}
		n += copy(b[n:], s[skip:])
		skip = 0
	}
	return n
}
