package stack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/steer"
)

// SocketCounters are one socket's counters (vma_stats' per-socket block).
type SocketCounters struct {
	RxOffloadPackets  atomic.Uint64
	RxOffloadBytes    atomic.Uint64
	RxOSPackets       atomic.Uint64
	RxOSBytes         atomic.Uint64
	RxQueueDrops      atomic.Uint64 // over RxBytesLimit or queue full
	RxQueueDropBytes  atomic.Uint64 // their payload bytes
	RxFiltered        atomic.Uint64 // refused by the receive filter
	RxSourceFiltered  atomic.Uint64 // multicast from a source the socket's filter refuses
	RxEagain          atomic.Uint64 // reads that timed out or found nothing
	RxErrors          atomic.Uint64 // reads of the kernel socket that failed
	RxPollHit         atomic.Uint64 // reads served without sleeping
	RxPollMiss        atomic.Uint64 // reads that had to sleep
	RxQueueBytesMax   atomic.Uint64
	RxQueuePacketsMax atomic.Uint64
	TxOffloadPackets  atomic.Uint64
	TxOffloadBytes    atomic.Uint64
	TxOSPackets       atomic.Uint64
	TxOSBytes         atomic.Uint64
	TxNoBufs          atomic.Uint64 // sends that found no transmit frame
	TxErrors          atomic.Uint64
	TxStampDrops      atomic.Uint64 // transmit stamps its full error queue had no room for (SO_TIMESTAMPING; the engine's)
}

// RecvFilter decides whether a datagram is queued (true) or dropped and
// counted in RxFiltered (false). It runs on the receive path under the
// stack's receive lock: it must be quick, must not block and must not use
// any socket; payload is valid only during the call.
type RecvFilter func(payload []byte, from netip.AddrPort) bool

type rxItem struct {
	buf   backend.Buf
	q     *queue
	off   uint16 // the payload's offset in the frame
	n     uint16
	ipOff uint8 // the IPv4 header's offset in the frame, for RecvMeta
	from  netip.AddrPort
	stamp int64 // arrival, unix ns, when the socket asked (SetRecvStamp)
}

// RecvMeta is what a receive reports besides the payload and its sender:
// what recvmsg's ancillary data carries (IP_PKTINFO, IP_RECVTOS,
// IP_RECVTTL, IP_RECVORIGDSTADDR, SO_TIMESTAMP).
type RecvMeta struct {
	Dst     netip.AddrPort // the datagram's destination address and port
	SpecDst netip.Addr     // the local address a reply leaves from (IP_PKTINFO's ipi_spec_dst)
	Ifindex int            // the interface it arrived on
	TOS     uint8
	TTL     uint8
	// Stamp is the arrival time in unix nanoseconds, when the socket asked
	// for it (SetRecvStamp; from the kernel socket, when it did).
	Stamp int64
	// GROSize is the segment size of datagrams the kernel socket coalesced
	// into this one (UDP_GRO, which it turned on); 0 for one datagram.
	GROSize int
}

// fill sets m from a queued datagram.
func (m *RecvMeta) fill(st *Stack, it *rxItem) {
	ip := header.IPv4(it.buf.Data[it.ipOff:])
	udp := header.UDP(ip[ip.HeaderLen():])
	dst := ip.Dst()
	*m = RecvMeta{Dst: netip.AddrPortFrom(dst, udp.DstPort()), SpecDst: dst, Ifindex: st.ifindex, TOS: ip[1], TTL: ip.TTL(), Stamp: it.stamp}
	if dst.IsMulticast() || dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		m.SpecDst = st.Addr()
	}
}

// UDPConn is a UDP socket served by the stack. It implements
// net.PacketConn and net.Conn.
type UDPConn struct {
	st     *Stack
	kfd    atomic.Int32 // the companion kernel socket
	ownFD  bool         // Close closes fd (false when adopted)
	evfd   int          // wakes a sleeping reader; -1 until a reader first sleeps
	local  netip.AddrPort
	remote netip.AddrPort // valid when connected
	ttl    atomic.Uint32  // unicast TTL
	mttl   atomic.Uint32  // multicast TTL
	tos    atomic.Uint32  // IP_TOS
	noDF   atomic.Bool    // DF clear (SetPMTUDisc)
	// segment is UDP_SEGMENT's size on the kernel socket, 0: off (SetSegment).
	segment atomic.Int32
	// mcLoop: multicast to a group with a member on this host goes
	// through the kernel socket, for the kernel's loopback copy
	// (IP_MULTICAST_LOOP; mcmember.go). mcOtherIf: all multicast does,
	// for another interface (IP_MULTICAST_IF).
	mcLoop, mcOtherIf atomic.Bool
	mcLoopTold        atomic.Bool  // Options.McLoopViaKernel was called
	rxLim             atomic.Int64 // payload bytes the receive queue may hold
	rxSlots           atomic.Int64 // datagrams the receive queue may hold (SetRxBytesLimit)
	stamp             atomic.Bool  // stamp datagrams with their arrival time (SetRecvStamp)

	rules []steer.RuleID
	keys  []sockKey
	// reusePort: its kernel socket has SO_REUSEPORT, so it may share its
	// address and port with others that have it (a group). shareable: it
	// has SO_REUSEPORT or SO_REUSEADDR, so kernel sockets the stack does
	// not serve may share them (see ErrShared). inode names its kernel
	// socket in sock_diag's answers. All three are set by attach.
	reusePort bool
	shareable bool
	inode     uint64
	steered   atomic.Bool // its rules are installed (attach to Unsteer)
	groups    map[netip.Addr]steer.RuleID

	// Receive queue, guarded by st.rxMu.
	rxq    []rxItem
	rxHead int
	rxLen  int
	// queued mirrors rxLen for readers without the lock (Queued).
	queued  atomic.Int32
	rxBytes int
	filter  RecvFilter
	// sources: the source filters of the groups that have one (the
	// kernel socket's, see SteerGroup); nil when none does.
	sources map[[4]byte]sourceFilter

	errAgain error // EAGAIN as a *net.OpError, made once: nonblocking polls return it per call
	spin     Spin  // how long blocking receives poll (Options.RxPoll 0)
	waiters  atomic.Int32
	// muxFDs are the eventfds of the multiplexers asleep for the socket
	// (BeginWait; guarded by Stack.muxMu), muxSleepers how many.
	muxFDs      []int32
	muxSleepers atomic.Int32
	// queuedNow: the poll under way queued a datagram for the socket
	// (guarded by Stack.rxMu).
	queuedNow bool
	osPolls   atomic.Uint32 // nonblocking reads' polls, for RxPollOSRatio
	// osPeeked: the last receive peeked (MSG_PEEK) at the kernel socket's
	// datagram, which the next receive must return first, as the kernel's
	// would (dnsmasq peeks for a datagram's size, then reads it).
	osPeeked atomic.Bool
	// osFirst: the kernel socket may hold datagrams older than any the
	// stack queued (those that came before the socket was steered):
	// receives read it first until it is empty. recvs counts receives, so
	// that every RxPollOSRatio-th looks at the kernel socket first, hit or
	// miss, as VMA's RX_UDP_POLL_OS_RATIO does: a flood on the fast path
	// must not leave what reached the kernel socket unread.
	osFirst atomic.Bool
	// older: the first older datagrams of the queue came before any the
	// kernel socket holds (Reopen moved them from the socket it replaced,
	// and the kernel socket took what came while the steering changed
	// hands): receives take them before they look at the kernel socket.
	// Written under the stack's rxMu.
	older atomic.Int32
	recvs atomic.Uint32
	// use counts the calls in progress that use the socket's descriptors
	// (kfd, evfd), with useClosing set once Close began; Close waits on
	// left for them to leave before it closes the descriptors.
	use          atomic.Int64
	left         chan struct{}
	readDeadline atomic.Int64 // unix nanoseconds, 0: none
	txq          *queue
	hop          atomic.Pointer[nextHop] // connected sockets: cached next hop

	// Counters are the socket's; Reopen hands them on with the socket.
	Counters *SocketCounters
}

// ListenUDP opens a socket bound to laddr (port 0: the kernel picks one).
// An unspecified address receives on every address of the interface; a
// multicast address receives that group once joined.
func (st *Stack) ListenUDP(laddr netip.AddrPort) (*UDPConn, error) {
	return st.open(laddr, netip.AddrPort{})
}

// DialUDP opens a socket connected to raddr, bound to laddr (which may be
// the zero value).
func (st *Stack) DialUDP(laddr, raddr netip.AddrPort) (*UDPConn, error) {
	if !raddr.IsValid() || !raddr.Addr().Is4() || raddr.Port() == 0 {
		return nil, fmt.Errorf("dial udp %s: %w", raddr, unix.EDESTADDRREQ)
	}
	return st.open(laddr, raddr)
}

func (st *Stack) open(laddr, raddr netip.AddrPort) (_ *UDPConn, err error) {
	if !laddr.Addr().IsValid() {
		laddr = netip.AddrPortFrom(netip.IPv4Unspecified(), laddr.Port())
	}
	if !laddr.Addr().Is4() {
		return nil, fmt.Errorf("udp %s: %w: IPv4 only", laddr, unix.EAFNOSUPPORT)
	}
	c := st.newConn(-1, true)
	defer func() {
		if err != nil {
			c.Close()
			err = fmt.Errorf("udp %s: %w", laddr, err)
		}
	}()
	if err := netnsutil.Do(st.ns, func() error { return c.openKernel(laddr, raddr) }); err != nil {
		return c, err
	}
	return c, c.attach()
}

// Adopt serves an existing kernel UDP socket, already bound and perhaps
// connected, with the stack: the socket's address and peer are read from
// the kernel. The socket stays the caller's: Close leaves it open. This is
// how an application's own socket is offloaded without changing its fd.
func (st *Stack) Adopt(fd int) (_ *UDPConn, err error) {
	c := st.newConn(fd, false)
	defer func() {
		if err != nil {
			c.Close()
			err = fmt.Errorf("udp fd %d: %w", fd, err)
		}
	}()
	if c.local, c.remote, err = SockAddrs(fd); err != nil {
		return c, err
	}
	if c.local.Port() == 0 {
		return c, fmt.Errorf("not bound: %w", unix.EINVAL)
	}
	return c, c.attach()
}

// ErrIPv6 is returned by SockAddrs for an AF_INET6 socket with IPv6
// traffic only: an IPv6 address of its own or peer, or IPV6_V6ONLY on.
var ErrIPv6 = errors.New("IPv6 only")

// SockAddrs reads a kernel socket's bound address and its peer (zero
// when not connected), as IPv4 addresses: an AF_INET6 socket that carries
// IPv4 as well (IPV6_V6ONLY off; bound to :: or an IPv4-mapped address,
// with an IPv4-mapped peer if any) has its IPv4 traffic served as an
// AF_INET socket's would be; any other gives ErrIPv6.
func SockAddrs(fd int) (local, remote netip.AddrPort, err error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return local, remote, fmt.Errorf("getsockname: %w", err)
	}
	if local, err = sockAddr4(fd, sa, true); err != nil {
		return local, remote, err
	}
	if pa, perr := unix.Getpeername(fd); perr == nil {
		if remote, err = sockAddr4(fd, pa, false); err != nil {
			return netip.AddrPort{}, netip.AddrPort{}, err
		}
	}
	return local, remote, nil
}

// sockAddr4 is sa, fd's own address (local) or its peer's, as IPv4.
func sockAddr4(fd int, sa unix.Sockaddr, local bool) (netip.AddrPort, error) {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), nil
	case *unix.SockaddrInet6:
		addr := netip.AddrFrom16(a.Addr)
		if v6only, err := unix.GetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY); err != nil || v6only != 0 {
			return netip.AddrPort{}, fmt.Errorf("%w: IPV6_V6ONLY is on", ErrIPv6)
		}
		switch {
		case addr.Is4In6():
			return netip.AddrPortFrom(addr.Unmap(), uint16(a.Port)), nil
		case addr.IsUnspecified() && local:
			return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(a.Port)), nil
		}
		return netip.AddrPort{}, fmt.Errorf("%w: %s", ErrIPv6, netip.AddrPortFrom(addr, uint16(a.Port)))
	}
	return netip.AddrPort{}, fmt.Errorf("%w: not an IP socket", unix.EAFNOSUPPORT)
}

// Reopen serves the kernel socket fd (c's own after a connect or
// disconnect, or a dup of it when c's fd is closing) with a new UDPConn
// that takes over c's groups, options and queued datagrams, and closes c.
// Datagrams that arrive meanwhile reach the kernel socket, which the new
// UDPConn reads too, after those c had queued: in arrival order. On error
// c is closed and nothing is served.
func (c *UDPConn) Reopen(fd int) (*UDPConn, error) {
	st := c.st
	groups := slices.Collect(maps.Keys(c.groups))
	c.Unsteer()
	n, err := st.Adopt(fd)
	if err != nil {
		c.Close()
		return nil, err
	}
	for _, g := range groups {
		if err := n.SteerGroup(g); err != nil {
			n.Close()
			c.Close()
			return nil, err
		}
	}
	n.Counters = c.Counters
	n.txq = c.txq // what c queued to transmit leaves before what n sends
	n.ttl.Store(c.ttl.Load())
	n.mttl.Store(c.mttl.Load())
	n.mcLoop.Store(c.mcLoop.Load())
	n.mcOtherIf.Store(c.mcOtherIf.Load())
	n.rxLim.Store(c.rxLim.Load())
	st.rxMu.Lock()
	n.sources = maps.Clone(c.sources) // a socket bound to its group has no rule to steer again
	// What c queued came before what reached the kernel socket since c's
	// rules went, unless c had yet to read the kernel socket's older ones
	// (osFirst), and before what n queued since its rules came (another
	// socket's receive may have polled the rings).
	var it rxItem
	var queue []rxItem
	for c.popLocked(&it) {
		queue = append(queue, it)
	}
	moved := len(queue)
	for n.popLocked(&it) {
		queue = append(queue, it)
	}
	for _, it := range queue {
		if !n.roomLocked() {
			n.Counters.RxQueueDrops.Add(1)
			n.Counters.RxQueueDropBytes.Add(uint64(it.n))
			st.releaseLocked(it.q, it.buf)
			continue
		}
		n.pushLocked(it)
	}
	moved = min(moved, n.rxLen)
	if !c.osFirst.Load() {
		n.older.Store(int32(moved))
	}
	st.rxMu.Unlock()
	c.Close()
	return n, nil
}

// Unsteer stops steering the socket's flows to the stack: its kernel
// socket receives them from now on, and the datagrams already queued stay
// readable. It must not race the socket's own group changes.
func (c *UDPConn) Unsteer() {
	c.steered.Store(false)
	defer c.st.kickShare() // the others on its port may share with it now
	for _, id := range c.rules {
		c.st.removeRule(id)
	}
	for _, id := range c.groups {
		c.st.removeRule(id)
	}
	// What was steered here before the rules went is in the rings: into
	// the socket's queue with it while the socket is still in the table,
	// not counted as no_socket by the next poll.
	c.st.Poll()
	c.st.removeSocket(c, c.keys...)
	c.rules, c.keys, c.groups = nil, nil, map[netip.Addr]steer.RuleID{}
}

func (st *Stack) newConn(fd int, own bool) *UDPConn {
	txq := st.pickTxQueue()
	c := &UDPConn{st: st, ownFD: own, Counters: &SocketCounters{}, evfd: -1, txq: txq,
		groups: map[netip.Addr]steer.RuleID{}, rxq: make([]rxItem, rxInitial), left: make(chan struct{}, 1)}
	c.kfd.Store(int32(fd))
	c.ttl.Store(header.DefaultTTL)
	c.mttl.Store(1) // the kernel's IP_MULTICAST_TTL default
	c.SetRxBytesLimit(st.opts.RxBytesLimit)
	return c
}

// attach enters the bound (and perhaps connected) socket in the table and
// steers its flow to the stack.
func (c *UDPConn) attach() error {
	st := c.st
	rule := steer.Rule{Proto: unix.IPPROTO_UDP, Local: c.local}
	key := sockKey{laddr: c.local.Addr().As4(), lport: c.local.Port()}
	switch {
	case c.remote.IsValid():
		rule.Kind, rule.Remote = steer.Rule5Tuple, c.remote
		key.raddr, key.rport = c.remote.Addr().As4(), c.remote.Port()
	case c.local.Addr().IsMulticast():
		rule.Kind = steer.RuleMcast
	case c.local.Addr().IsUnspecified():
		rule.Kind = steer.RulePort
	default:
		rule.Kind = steer.Rule3Tuple
	}
	c.errAgain = c.readErr(unix.EAGAIN)
	c.osFirst.Store(true)
	if v, err := unix.GetsockoptInt(c.FD(), unix.SOL_SOCKET, unix.SO_REUSEPORT); err == nil {
		c.reusePort = v != 0
	}
	c.shareable, c.inode = shareable(c.FD())
	// The queue holds at least what the kernel socket would: its
	// SO_RCVBUF (what the kernel counts there includes each skb's
	// overhead, so as payload it holds more). A queue of only
	// VMAXDP_RX_BYTES_MIN (64 KiB) dropped iperf3's 1400-byte datagrams
	// where the kernel socket dropped none.
	if rcvbuf, err := unix.GetsockoptInt(c.FD(), unix.SOL_SOCKET, unix.SO_RCVBUF); err == nil {
		c.SetRxBytesLimit(rcvbuf)
	}
	// The socket is in the table before its rule exists, so that no
	// steered datagram finds no socket.
	c.keys = append(c.keys, key)
	if err := st.addSocket(c, key); err != nil {
		return err
	}
	if c.shareable && st.diag != nil {
		served := func() map[uint64]bool {
			_, s := st.shareableConns()
			s[c.inode] = true
			return s
		}
		hit, who, err := st.sharedWith(unix.IPPROTO_UDP, c.local.Port(), []netip.Addr{c.local.Addr()}, served)
		if err != nil {
			return err
		}
		if len(hit) > 0 {
			st.kickShare() // those of the stack on the port follow
			return fmt.Errorf("%w: %s", ErrShared, sharedCause(c.local, who, "datagrams"))
		}
	}
	id, err := st.addRule(rule)
	if err != nil {
		return err
	}
	c.rules = append(c.rules, id)
	c.steered.Store(true)
	if c.shareable {
		st.kickShare() // the watcher looks at its port from now on
	}
	return nil
}

// ReusePort says whether the socket's kernel socket has SO_REUSEPORT: it
// may be one of a group (see Stack.Group).
func (c *UDPConn) ReusePort() bool { return c.reusePort }

// rxInitial is a new socket's receive queue slots; the queue grows as
// its backlog does (roomLocked), so that a program of many sockets does
// not pay for the few that fall behind.
const rxInitial = 64

// rxFrames is the receive frames of each queue: half its UMEM's.
func (st *Stack) rxFrames() int {
	n := 4096
	if st.opts.XSK != nil && st.opts.XSK.NumFrames != 0 {
		n = int(st.opts.XSK.NumFrames)
	}
	return n / 2
}

// rxCapacity is the least a socket's receive queue may grow to, whatever
// its SO_RCVBUF: every receive frame of the stack's queues.
func (st *Stack) rxCapacity() int { return st.rxFrames() * max(1, len(st.queueList())) }

func (c *UDPConn) openKernel(laddr, raddr netip.AddrPort) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("kernel socket: %w", err)
	}
	fd = highfd.Move(fd)
	c.kfd.Store(int32(fd))
	if laddr.Addr().IsMulticast() {
		// Several receivers of one group share its port, as with the kernel.
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: laddr.Addr().As4(), Port: int(laddr.Port())}); err != nil {
		return fmt.Errorf("bind kernel socket: %w", err)
	}
	if raddr.IsValid() {
		if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: raddr.Addr().As4(), Port: int(raddr.Port())}); err != nil {
			return fmt.Errorf("connect kernel socket to %s: %w", raddr, err)
		}
	}
	c.local, c.remote, err = SockAddrs(fd)
	return err
}

// JoinGroup joins a multicast group on the stack's interface. The kernel
// socket joins, so IGMP is the kernel's; the steering rule brings the
// group's datagrams to this socket.
func (c *UDPConn) JoinGroup(group netip.Addr) error {
	if !group.Is4() || !group.IsMulticast() {
		return fmt.Errorf("udp %s: join %s: not an IPv4 multicast group", c.local, group)
	}
	if !c.enter() {
		return net.ErrClosed
	}
	defer c.leave()
	mreq := &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(c.st.ifindex)}
	if err := unix.SetsockoptIPMreqn(c.FD(), unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, mreq); err != nil {
		return fmt.Errorf("udp %s: join %s: %w", c.local, group, err)
	}
	if err := c.SteerGroup(group); err != nil {
		unix.SetsockoptIPMreqn(c.FD(), unix.IPPROTO_IP, unix.IP_DROP_MEMBERSHIP, mreq)
		return err
	}
	return nil
}

// SteerGroup brings to the socket the datagrams of a group as its kernel
// socket's membership stands (an adopted socket that joined before it was
// bound, or changed its membership with source options): while the kernel
// socket is a member, the group is steered here with the kernel's source
// filter (IP_ADD_SOURCE_MEMBERSHIP, IP_BLOCK_SOURCE, MCAST_*, IP_MSFILTER:
// the kernel validates them and keeps the state, read back with
// IP_MSFILTER); once it is not, the group is no longer steered. A socket
// bound to the group itself is steered already.
func (c *UDPConn) SteerGroup(group netip.Addr) error {
	if !group.Is4() || !group.IsMulticast() {
		return fmt.Errorf("udp %s: join %s: not an IPv4 multicast group", c.local, group)
	}
	f, member, err := c.kernelSourceFilter(group)
	if err != nil {
		return fmt.Errorf("udp %s: source filter of %s: %w", c.local, group, err)
	}
	c.setSources(group, f)
	if !member {
		c.unsteerGroup(group)
		return nil
	}
	if _, ok := c.groups[group]; ok || c.local.Addr() == group {
		return nil
	}
	key := sockKey{laddr: group.As4(), lport: c.local.Port()}
	if err := c.st.addSocket(c, key); err != nil {
		return fmt.Errorf("udp %s: join %s: %w", c.local, group, err)
	}
	id, err := c.st.addRule(steer.Rule{Kind: steer.RuleMcast, Proto: unix.IPPROTO_UDP, Local: netip.AddrPortFrom(group, c.local.Port())})
	if err != nil {
		c.st.removeSocket(c, key)
		return fmt.Errorf("udp %s: join %s: %w", c.local, group, err)
	}
	c.keys = append(c.keys, key)
	c.groups[group] = id
	return nil
}

// LeaveGroup leaves a group joined with JoinGroup.
func (c *UDPConn) LeaveGroup(group netip.Addr) error {
	if !c.enter() {
		return net.ErrClosed
	}
	defer c.leave()
	if !c.unsteerGroup(group) && c.local.Addr() != group {
		return fmt.Errorf("udp %s: leave %s: %w", c.local, group, unix.EADDRNOTAVAIL)
	}
	mreq := &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(c.st.ifindex)}
	if err := unix.SetsockoptIPMreqn(c.FD(), unix.IPPROTO_IP, unix.IP_DROP_MEMBERSHIP, mreq); err != nil {
		return fmt.Errorf("udp %s: leave %s: %w", c.local, group, err)
	}
	return nil
}

// unsteerGroup stops steering group here and forgets its source filter;
// it says whether the group was steered.
func (c *UDPConn) unsteerGroup(group netip.Addr) bool {
	c.setSources(group, sourceFilter{})
	id, ok := c.groups[group]
	if ok {
		delete(c.groups, group)
		c.st.removeRule(id)
		c.st.removeSocket(c, sockKey{laddr: group.As4(), lport: c.local.Port()})
	}
	return ok
}

// setSources sets group's source filter, and forgets it when f refuses
// nothing (exclude mode without sources), so that c.sources stays nil for
// a socket without filters: enqueueLocked looks at nothing more then.
func (c *UDPConn) setSources(group netip.Addr, f sourceFilter) {
	c.st.rxMu.Lock()
	defer c.st.rxMu.Unlock()
	if f.include || len(f.srcs) > 0 {
		if c.sources == nil {
			c.sources = map[[4]byte]sourceFilter{}
		}
		c.sources[group.As4()] = f
		return
	}
	delete(c.sources, group.As4())
	if len(c.sources) == 0 {
		c.sources = nil
	}
}

// sourceFilter is one group's source filter: the sources accepted
// (include) or refused (exclude), as the kernel's ip_mc_sf_allow reads it.
type sourceFilter struct {
	include bool
	srcs    [][4]byte
}

func (f *sourceFilter) allows(src [4]byte) bool {
	return slices.Contains(f.srcs, src) == f.include
}

// maxSources bounds the sources read back per group (the kernel's
// net.ipv4.igmp_max_msf is 10 by default); a group with more stays on the
// kernel.
const maxSources = 256

// kernelSourceFilter reads the kernel socket's membership of group on the
// stack's interface (getsockopt IP_MSFILTER): whether it is a member, and
// its filter mode and sources.
func (c *UDPConn) kernelSourceFilter(group netip.Addr) (f sourceFilter, member bool, err error) {
	var buf [16 + 4*maxSources]byte
	copy(buf[0:4], group.AsSlice())
	copy(buf[4:8], c.st.Addr().AsSlice())
	binary.NativeEndian.PutUint32(buf[12:16], maxSources)
	n := uint32(len(buf))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(c.FD()), unix.IPPROTO_IP, unix.IP_MSFILTER,
		uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	switch {
	case e == unix.EADDRNOTAVAIL:
		return f, false, nil
	case e != 0:
		return f, false, e
	}
	f.include = binary.NativeEndian.Uint32(buf[8:12]) == unix.MCAST_INCLUDE
	count := binary.NativeEndian.Uint32(buf[12:16])
	if count > maxSources {
		return f, false, fmt.Errorf("%d sources, more than the %d the stack filters", count, maxSources)
	}
	for i := range count {
		f.srcs = append(f.srcs, [4]byte(buf[16+4*i:20+4*i]))
	}
	return f, true, nil
}

// SetTTL sets the TTL of unicast (IP_TTL) or multicast (IP_MULTICAST_TTL)
// datagrams the stack sends.
func (c *UDPConn) SetTTL(ttl uint8, multicast bool) {
	if multicast {
		c.mttl.Store(uint32(ttl))
	} else {
		c.ttl.Store(uint32(ttl))
	}
}

// FlushSends sends what the socket's earlier sends left on its TX ring
// (coalesced kicks): a send through the kernel socket comes after them.
func (c *UDPConn) FlushSends() {
	if q := c.txq; q != nil && q.unkicked.Load() {
		c.st.flushQueue(q, true, 0)
	}
}

// SetPMTUDisc follows IP_MTU_DISCOVER (mode, one of unix.IP_PMTUDISC_*):
// the socket's datagrams carry DF, as the kernel's do, in modes WANT (the
// default), DO and PROBE, and not in DONT, INTERFACE and OMIT (which DNS
// servers choose, to have large answers fragmented rather than lost).
func (c *UDPConn) SetPMTUDisc(mode int) {
	c.noDF.Store(mode != unix.IP_PMTUDISC_WANT && mode != unix.IP_PMTUDISC_DO && mode != unix.IP_PMTUDISC_PROBE)
}

// SetTOS sets the IP TOS byte (DSCP and ECN) of the datagrams the socket
// sends, as IP_TOS does.
func (c *UDPConn) SetTOS(tos uint8) { c.tos.Store(uint32(tos)) }

// SetRxBytesLimit caps the payload bytes queued on the socket (the
// offloaded counterpart of SO_RCVBUF); it never goes below the stack's
// RxBytesLimit.
func (c *UDPConn) SetRxBytesLimit(n int) {
	n = max(n, c.st.opts.RxBytesLimit)
	c.rxLim.Store(int64(n))
	c.rxSlots.Store(int64(max(n/minTruesize+1, c.st.rxCapacity())))
}

// minTruesize is the least a kernel socket charges its buffer for one
// datagram: the sk_buff and skb_shared_info (256 and 320 bytes, cache
// aligned) and the smallest head, 256 bytes. A SO_RCVBUF of n holds at
// most n/minTruesize+1 datagrams, so a queue with that many slots holds
// all a kernel socket would.
const minTruesize = 832

// SetRecvStamp makes the stack note each datagram's arrival time for
// RecvMeta.Stamp (SO_TIMESTAMP); it costs a clock read per datagram.
func (c *UDPConn) SetRecvStamp(on bool) {
	if on {
		c.st.stampArrivals()
	}
	c.stamp.Store(on)
}

// SetRecvFilter installs (or, with nil, removes) the receive filter.
func (c *UDPConn) SetRecvFilter(f RecvFilter) {
	c.st.rxMu.Lock()
	c.filter = f
	c.st.rxMu.Unlock()
}

// enqueueLocked queues a received datagram. Caller holds st.rxMu.
func (c *UDPConn) enqueueLocked(q *queue, b backend.Buf, p *header.Packet) {
	c.queueLocked(q, b, p, q, b)
}

// queueLocked queues b, a frame of q, which is the frame ab of queue aq
// that the datagram arrived in or a copy of it (for its arrival stamp).
// Caller holds st.rxMu.
func (c *UDPConn) queueLocked(q *queue, b backend.Buf, p *header.Packet, aq *queue, ab backend.Buf) {
	if c.sources != nil && p.IP[16]>>4 == 0xe {
		if f, ok := c.sources[[4]byte(p.IP[16:20])]; ok && !f.allows([4]byte(p.IP[12:16])) {
			c.Counters.RxSourceFiltered.Add(1)
			c.st.releaseLocked(q, b)
			return
		}
	}
	from := netip.AddrPortFrom(p.IP.Src(), p.UDP.SrcPort())
	if c.filter != nil && !c.filter(p.Payload, from) {
		c.Counters.RxFiltered.Add(1)
		c.st.releaseLocked(q, b)
		return
	}
	n := len(p.Payload)
	if int64(c.rxBytes+n) > c.rxLim.Load() || !c.roomLocked() {
		c.Counters.RxQueueDrops.Add(1)
		c.Counters.RxQueueDropBytes.Add(uint64(n))
		c.st.releaseLocked(q, b)
		return
	}
	off := cap(b.Data) - cap(p.Payload) // Payload and IP are subslices of the frame
	it := rxItem{buf: b, q: q, off: uint16(off), n: uint16(n), ipOff: uint8(cap(b.Data) - cap(p.IP)), from: from}
	if c.stamp.Load() {
		it.stamp = c.st.arrival(aq, ab)
	}
	c.pushLocked(it)
	if uint64(c.rxBytes) > c.Counters.RxQueueBytesMax.Load() {
		c.Counters.RxQueueBytesMax.Store(uint64(c.rxBytes))
	}
	if uint64(c.rxLen) > c.Counters.RxQueuePacketsMax.Load() {
		c.Counters.RxQueuePacketsMax.Store(uint64(c.rxLen))
	}
	c.Counters.RxOffloadPackets.Add(1)
	c.Counters.RxOffloadBytes.Add(uint64(n))
	if !c.queuedNow {
		// Woken once at the end of the poll, however many of its batch
		// it got (see Stack.wakeQueued).
		c.queuedNow = true
		c.st.queuedNow = append(c.st.queuedNow, c)
	}
}

// stampArrivals has the steering program stamp each frame's arrival,
// for the receive stamps a socket asked for, once. Where it cannot, a
// datagram is stamped as it comes off the ring.
func (st *Stack) stampArrivals() {
	if st.arrivalClock.Load() != nil || st.prog == nil {
		return
	}
	k, err := calibrateMono()
	if err == nil {
		err = st.prog.StampArrivals(true)
	}
	if err != nil {
		slog.Debug(fmt.Sprintf("stack %s: receive stamps taken as datagrams come off the ring, not as they arrive: %v", st.ifname, err))
		return
	}
	st.arrivalClock.CompareAndSwap(nil, &k)
}

// arrival is the receive stamp, in unix nanoseconds, of frame b of q:
// when the steering program redirected it, where the frame says so, as
// the kernel stamps a datagram as it comes off the device; else now, as
// the stack takes it off the ring. A frame without the stamp a second
// after the program began writing them (frames in flight then have none)
// means the driver gives XDP no metadata room: said once, as the stamps
// are later by the wake-up of the thread that reads them.
func (st *Stack) arrival(q *queue, b backend.Buf) int64 {
	now := time.Now()
	k := st.arrivalClock.Load()
	if k == nil {
		return now.UnixNano()
	}
	if q.arrivals != nil {
		if mono, ok := q.arrivals.Arrival(b); ok {
			if age := k.at(now) - mono; age > 0 {
				return now.UnixNano() - age
			}
			return now.UnixNano()
		}
	}
	if now.Sub(k.base) > time.Second && !st.arrivalMissTold.Swap(true) {
		slog.Warn(fmt.Sprintf("stack %s: receive timestamps are taken as datagrams come off the ring, not as they arrive: frames on queue %d carry no arrival stamp (the driver gives XDP no metadata room)", st.ifname, q.idx))
	}
	return now.UnixNano()
}

func (c *UDPConn) wake() {
	if c.evfd >= 0 {
		writeEventfd(int32(c.evfd))
	}
}

// roomLocked says whether the receive queue has a free slot, growing it
// up to its SO_RCVBUF's worth (rxSlots) when it has none. Caller holds
// st.rxMu.
func (c *UDPConn) roomLocked() bool {
	if c.rxLen < len(c.rxq) {
		return true
	}
	n := min(2*len(c.rxq), int(c.rxSlots.Load()))
	if n <= len(c.rxq) {
		return false
	}
	q := make([]rxItem, n)
	k := copy(q, c.rxq[c.rxHead:])
	copy(q[k:], c.rxq[:c.rxHead])
	c.rxq, c.rxHead = q, 0
	return true
}

// pushLocked queues it as the newest datagram; roomLocked said there is
// room. Caller holds st.rxMu.
func (c *UDPConn) pushLocked(it rxItem) {
	c.rxq[(c.rxHead+c.rxLen)%len(c.rxq)] = it
	c.rxLen++
	c.queued.Store(int32(c.rxLen))
	c.rxBytes += int(it.n)
}

// popLocked takes the oldest queued datagram. Caller holds st.rxMu.
func (c *UDPConn) popLocked(it *rxItem) bool {
	if c.rxLen == 0 {
		return false
	}
	*it = c.rxq[c.rxHead]
	c.rxq[c.rxHead] = rxItem{}
	if c.older.Load() > 0 {
		c.older.Add(-1)
	}
	c.rxHead = (c.rxHead + 1) % len(c.rxq)
	c.rxLen--
	c.queued.Store(int32(c.rxLen))
	c.rxBytes -= int(it.n)
	return true
}

// tryOffload takes a datagram from the socket's queue, polling the queues
// when it is empty, all under one hold of the receive lock. With b, the
// payload is copied into b and the frame released at once; with zc, the
// frame is lent to zc until zc.Release; with peek, the datagram stays
// queued. It returns the bytes copied and the datagram's full length.
func (c *UDPConn) tryOffload(b []byte, zc *Datagram, peek bool, meta *RecvMeta) (int, int, netip.AddrPort, bool) {
	st := c.st
	var it rxItem
	spinLock(&st.rxMu)
	defer st.rxMu.Unlock()
	st.notePoll()
	if c.rxLen == 0 && (st.pollLocked() == 0 || c.rxLen == 0) {
		return 0, 0, netip.AddrPort{}, false
	}
	if st.appPolls%lowCheckEvery == 0 && st.anyFramesLowLocked() {
		st.drainRings()
	}
	if meta != nil {
		meta.fill(st, &c.rxq[c.rxHead])
	}
	if peek {
		it = c.rxq[c.rxHead]
		n := copy(b, it.buf.Data[it.off:int(it.off)+int(it.n)])
		return n, int(it.n), it.from, true
	}
	c.popLocked(&it)
	payload := it.buf.Data[it.off : int(it.off)+int(it.n)]
	if zc != nil {
		zc.c, zc.it, zc.From, zc.Payload = c, it, it.from, payload
		return len(payload), len(payload), it.from, true
	}
	n := copy(b, payload)
	st.releaseLocked(it.q, it.buf)
	return n, len(payload), it.from, true
}

// Pending polls the queues and returns the length of the next queued
// datagram (what FIONREAD reports for UDP) and whether there is one.
func (c *UDPConn) Pending() (int, bool) {
	st := c.st
	spinLock(&st.rxMu)
	defer st.rxMu.Unlock()
	if c.rxLen == 0 {
		st.pollLocked()
	}
	if c.rxLen == 0 {
		return 0, false
	}
	return int(c.rxq[c.rxHead].n), true
}

// Queued reports whether datagrams wait in the socket's queue, without
// the receive lock and without polling the rings: a multiplexer over many
// sockets polls each stack once per scan (Stack.Poll), then asks each.
func (c *UDPConn) Queued() bool { return c.queued.Load() > 0 }

// QueueLen is what the receive queue holds now.
func (c *UDPConn) QueueLen() (packets, bytes int) {
	c.st.rxMu.Lock()
	defer c.st.rxMu.Unlock()
	return c.rxLen, c.rxBytes
}

// RxBytesLimit is the payload bytes the receive queue may hold.
func (c *UDPConn) RxBytesLimit() int { return int(c.rxLim.Load()) }

// Rules are the ids of the socket's steering rules, its groups' included.
// Like JoinGroup, it must not race the socket's own group changes.
func (c *UDPConn) Rules() []steer.RuleID {
	ids := slices.Clone(c.rules)
	for _, id := range c.groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Groups are the multicast groups the stack receives for the socket, the
// one it is bound to included. Like JoinGroup, it must not race the
// socket's own group changes.
func (c *UDPConn) Groups() []netip.Addr {
	gs := make([]netip.Addr, 0, len(c.groups)+1)
	if c.local.Addr().IsMulticast() {
		gs = append(gs, c.local.Addr())
	}
	for g := range c.groups {
		gs = append(gs, g)
	}
	slices.SortFunc(gs, netip.Addr.Compare)
	return gs
}

// Stack is the stack serving the socket.
func (c *UDPConn) Stack() *Stack { return c.st }

// FD is the socket's kernel fd.
func (c *UDPConn) FD() int { return int(c.kfd.Load()) }

// Datagram is a received datagram lent by RecvZeroCopy: Payload points into
// the receive frame until Release, which must be called exactly once.
type Datagram struct {
	Payload []byte
	From    netip.AddrPort
	c       *UDPConn
	it      rxItem
	osBuf   []byte // lands datagrams from the kernel socket; kept across Release
}

// Release returns the datagram's frame to the stack.
func (d *Datagram) Release() {
	if d.it.q == nil {
		return
	}
	spinLock(&d.c.st.rxMu)
	d.c.st.releaseLocked(d.it.q, d.it.buf)
	d.c.st.rxMu.Unlock()
	d.it = rxItem{}
	d.Payload = nil
}

// ReadFromUDPAddrPort reads a datagram into b; a longer datagram is cut to
// len(b), as with the kernel. It does not allocate.
func (c *UDPConn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	return c.recv(b, nil)
}

// RecvZeroCopy receives a datagram without copying it (VMA's
// recvfrom_zcopy). A datagram that came through the kernel socket is read
// into d's own buffer, so d must not be shared between goroutines.
func (c *UDPConn) RecvZeroCopy(d *Datagram) error {
	_, _, err := c.recv(nil, d)
	return err
}

// RecvFlags modify RecvFrom, as recvfrom's flags do.
type RecvFlags uint8

const (
	// RecvNonblock returns unix.EAGAIN at once when nothing is queued
	// (MSG_DONTWAIT, O_NONBLOCK).
	RecvNonblock RecvFlags = 1 << iota
	// RecvPeek leaves the datagram queued (MSG_PEEK).
	RecvPeek
	// RecvCheckOS looks at the kernel socket before anything else, because
	// the caller saw it readable (a multiplexer reported it).
	RecvCheckOS
)

// RecvFrom reads a datagram like ReadFromUDPAddrPort, with flags; it also
// returns the datagram's full length, which exceeds n when it was cut.
// Errors are unix.EAGAIN (nonblocking and nothing queued),
// os.ErrDeadlineExceeded, unix.EINTR (a signal arrived while it slept)
// and net.ErrClosed, each in a *net.OpError. deadline bounds a blocking
// receive instead of the socket's read deadline (zero: that one). A
// blocking receive returns unix.EINTR when a handler counted in sig ends it
// (sig may be nil: Go's own reads are never interrupted).
//
// meta, when not nil, receives the datagram's RecvMeta.
func (c *UDPConn) RecvFrom(b []byte, flags RecvFlags, deadline time.Time, sig *Signals, meta *RecvMeta) (n, full int, from netip.AddrPort, err error) {
	var d int64
	if !deadline.IsZero() {
		d = deadline.UnixNano()
	}
	return c.recvZC(b, nil, flags, d, sig, meta)
}

// osBuf is where zero-copy receives land when the datagram comes from the
// kernel socket.
const osBufLen = 65536

func (c *UDPConn) recv(b []byte, zc *Datagram) (int, netip.AddrPort, error) {
	n, _, from, err := c.recvZC(b, zc, 0, 0, nil, nil)
	return n, from, err
}

func (c *UDPConn) readErr(err error) error {
	return &net.OpError{Op: "read", Net: "udp", Addr: net.UDPAddrFromAddrPort(c.local), Err: err}
}

// recvOS reads the kernel socket; ok is false when it has nothing.
func (c *UDPConn) recvOS(b []byte, zc *Datagram, slept bool, flags RecvFlags, meta *RecvMeta) (n, full int, from netip.AddrPort, ok bool, err error) {
	if zc != nil {
		if zc.osBuf == nil {
			zc.osBuf = make([]byte, osBufLen)
		}
		b = zc.osBuf
	}
	rf := 0
	if flags&RecvPeek != 0 {
		rf = unix.MSG_PEEK
	}
	if !c.enter() {
		return 0, 0, from, false, net.ErrClosed
	}
	var e unix.Errno
	if meta != nil {
		full, from, e = KernelRecvMsg(c.FD(), b, rf, meta)
	} else {
		full, from, e = KernelRecvFrom(c.FD(), b, rf)
	}
	c.leave()
	if e == unix.EAGAIN {
		return 0, 0, from, false, nil
	}
	if e != 0 {
		if e != unix.EINTR {
			c.Counters.RxErrors.Add(1)
		}
		return 0, 0, from, false, c.readErr(os.NewSyscallError("recvfrom", e))
	}
	n = min(full, len(b))
	if flags&RecvPeek != 0 {
		c.osPeeked.Store(true)
		return n, full, from, true, nil
	}
	c.countPoll(slept)
	c.Counters.RxOSPackets.Add(1)
	c.Counters.RxOSBytes.Add(uint64(n))
	if zc != nil {
		zc.c, zc.it, zc.From, zc.Payload = c, rxItem{}, from, b[:n]
	}
	return n, full, from, true, nil
}

// deadlineOf is a receive's deadline in unix nanoseconds (0: none): fixed,
// or when that is 0 the socket's read deadline, read each time because
// SetReadDeadline moves it under a waiting reader.
func (c *UDPConn) deadlineOf(fixed int64) int64 {
	if fixed != 0 {
		return fixed
	}
	return c.readDeadline.Load()
}

// recvZC receives into b or lends the frame to zc, by deadline (see
// deadlineOf).
func (c *UDPConn) recvZC(b []byte, zc *Datagram, flags RecvFlags, deadline int64, sig *Signals, meta *RecvMeta) (int, int, netip.AddrPort, error) {
	// What this thread sent last goes before it waits for an answer.
	c.st.waitPoint()
	ratio := c.st.opts.RxPollOSRatio
	slept := false
	var sw SignalWait
	nonblock := flags&RecvNonblock != 0
	if !nonblock {
		sw = sig.Begin(c.deadlineOf(deadline) == 0)
	}
	everyRatio := ratio > 0 && c.recvs.Add(1)%uint32(ratio) == 0
	// What the kernel socket holds comes after the queue's older ones, and
	// a peeked datagram of the kernel socket before anything.
	if c.osPeeked.Swap(false) || c.older.Load() == 0 && (flags&RecvCheckOS != 0 || everyRatio || c.osFirst.Load()) {
		n, full, from, ok, err := c.recvOS(b, zc, false, flags, meta)
		if ok || err != nil {
			return n, full, from, err
		}
		c.osFirst.Store(false)
	}
	// clock watches the wait once the first look found nothing, in
	// adaptive mode; found reports the wait to the socket's Spin.
	var clock SpinClock
	adaptive := c.st.adaptive && !nonblock
	found := func() {
		if adaptive && clock.Start != 0 {
			c.spin.Done(clock.Start, time.Now().UnixNano())
		}
	}
	for i := 1; ; i++ {
		if c.closing() {
			return 0, 0, netip.AddrPort{}, net.ErrClosed
		}
		if n, full, from, ok := c.tryOffload(b, zc, flags&RecvPeek != 0, meta); ok {
			c.countPoll(slept)
			found()
			return n, full, from, nil
		}
		// The kernel socket is looked at after every ratio polls, not
		// before the first: a read whose datagram is a poll away must not
		// pay a recvfrom syscall. Nonblocking reads count polls across
		// calls, as VMA does, so that a spinning reader pays it as rarely.
		var sleepNext bool
		switch {
		case adaptive && clock.Start == 0:
			now := time.Now().UnixNano()
			sw.Resched(now)
			clock.Begin(now, c.spin.Budget())
			sleepNext = clock.Tick()
		case adaptive:
			sleepNext = clock.Tick()
		case nonblock:
			// It never sleeps: the kernel socket's turn is osTurn's.
			// Before, auto's RxPoll of 0 read it here at every EAGAIN,
			// a recvfrom syscall for every empty look of an event loop
			// (BIND's named: 5,400 a second, each EAGAIN).
		default:
			sleepNext = c.st.opts.RxPoll >= 0 && i > c.st.opts.RxPoll
		}
		osTurn := ratio > 0 && i%ratio == 0
		if nonblock {
			osTurn = ratio > 0 && c.osPolls.Add(1)%uint32(ratio) == 0 || ratio == 0
		}
		if osTurn || sleepNext {
			if n, full, from, ok, err := c.recvOS(b, zc, slept, flags, meta); ok || err != nil {
				if ok {
					found()
				}
				return n, full, from, err
			}
		}
		if nonblock {
			c.Counters.RxEagain.Add(1)
			return 0, 0, netip.AddrPort{}, c.errAgain
		}
		if i&63 == 0 || sleepNext {
			if d := c.deadlineOf(deadline); d != 0 && time.Now().UnixNano() >= d {
				c.Counters.RxEagain.Add(1)
				return 0, 0, netip.AddrPort{}, c.readErr(os.ErrDeadlineExceeded)
			}
			if sw.Interrupted() {
				return 0, 0, netip.AddrPort{}, c.readErr(unix.EINTR)
			}
		}
		if sleepNext {
			if err := c.sleep(deadline, &sw); err != nil {
				return 0, 0, netip.AddrPort{}, err
			}
			slept = true
			i = 0
			clock.Stop() // after a wake-up, look once and sleep again
		}
	}
}

func (c *UDPConn) countPoll(slept bool) {
	if slept {
		c.Counters.RxPollMiss.Add(1)
	} else {
		c.Counters.RxPollHit.Add(1)
	}
}

// sleep blocks until a queue (if it watches them, ringWatch), the kernel
// socket or a wakeup has work, the read deadline passes or a signal ends
// sw. The waiter is announced before the last look at the queue, and the
// demultiplexer looks at waiters after queueing, so no datagram can
// arrive unseen between the two.
func (c *UDPConn) sleep(deadline int64, sw *SignalWait) error {
	st := c.st
	if !c.enter() {
		return net.ErrClosed
	}
	defer c.leave()
	if c.evfd < 0 {
		fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			return fmt.Errorf("udp %s: eventfd: %w", c.local, err)
		}
		fd = highfd.Move(fd)
		st.rxMu.Lock()
		if c.evfd < 0 {
			c.evfd = fd
		} else {
			highfd.Close(fd)
		}
		st.rxMu.Unlock()
	}
	c.waiters.Add(1)
	defer c.waiters.Add(-1)
	spinLock(&st.rxMu)
	// Close marks the socket closing before it wakes evfd under rxMu: a
	// reader that made evfd after that wake sees the mark here.
	ready := c.closing() || c.rxLen > 0 || st.pollLocked() > 0 && c.rxLen > 0
	st.rxMu.Unlock()
	if ready {
		return nil
	}
	var pfds [maxQueues + 2]unix.PollFd
	n := 0
	st.muxMu.Lock()
	watcher := st.takeRingsLocked(int32(c.evfd), false)
	st.muxMu.Unlock()
	for _, q := range st.pollQueues() {
		if !watcher {
			break
		}
		pfds[n] = unix.PollFd{Fd: int32(q.be.FD()), Events: unix.POLLIN}
		n++
	}
	pfds[n] = unix.PollFd{Fd: int32(c.FD()), Events: unix.POLLIN}
	pfds[n+1] = unix.PollFd{Fd: int32(c.evfd), Events: unix.POLLIN}
	n += 2
	var ts *unix.Timespec
	var tsv unix.Timespec
	if d := c.deadlineOf(deadline); d != 0 {
		left := max(d-time.Now().UnixNano(), 0)
		tsv = unix.NsecToTimespec(left)
		ts = &tsv
	}
	_, err := sw.Ppoll(pfds[:n], ts)
	st.muxMu.Lock()
	others := st.leaveRingsLocked(int32(c.evfd), watcher, false)
	st.muxMu.Unlock()
	if err == nil && others && st.queuesReady(pfds[:n-2]) && c.Queued() {
		// The receive that follows polls only an empty queue; the
		// sleepers off the queues wait for this poll.
		st.Poll()
	}
	if err == unix.EINTR && sw.s != nil {
		return c.readErr(unix.EINTR)
	}
	if err != nil && err != unix.EINTR {
		return fmt.Errorf("udp %s: ppoll: %w", c.local, err)
	}
	if pfds[n-1].Revents&unix.POLLIN != 0 {
		var v [8]byte
		unix.Read(c.evfd, v[:])
	}
	return nil
}

// ReadFrom implements net.PacketConn (it allocates the address; use
// ReadFromUDPAddrPort on hot paths).
func (c *UDPConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, from, err := c.recv(b, nil)
	if err != nil {
		return 0, nil, err
	}
	return n, net.UDPAddrFromAddrPort(from), nil
}

// Read implements net.Conn.
func (c *UDPConn) Read(b []byte) (int, error) {
	n, _, err := c.recv(b, nil)
	return n, err
}

// WriteToUDPAddrPort sends b to addr. It does not allocate.
func (c *UDPConn) WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	return c.send(b, addr)
}

// WriteTo implements net.PacketConn.
func (c *UDPConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	ua, ok := addr.(*net.UDPAddr)
	if !ok {
		return 0, &net.OpError{Op: "write", Net: "udp", Addr: addr, Err: unix.EINVAL}
	}
	return c.send(b, ua.AddrPort())
}

// Write implements net.Conn on a connected socket.
func (c *UDPConn) Write(b []byte) (int, error) {
	if !c.remote.IsValid() {
		return 0, &net.OpError{Op: "write", Net: "udp", Err: unix.EDESTADDRREQ}
	}
	return c.send(b, c.remote)
}

func (c *UDPConn) sendErr(addr netip.AddrPort, err error) error {
	c.Counters.TxErrors.Add(1)
	return &net.OpError{Op: "write", Net: "udp", Source: net.UDPAddrFromAddrPort(c.local), Addr: net.UDPAddrFromAddrPort(addr), Err: err}
}

func (c *UDPConn) send(b []byte, to netip.AddrPort) (int, error) {
	return c.WriteFromTo(b, netip.Addr{}, to)
}

// WriteFromTo sends b to addr from the source address src, one of the
// interface's addresses (IP_PKTINFO's ipi_spec_dst on sendmsg); the zero
// Addr means the socket's own, as WriteToUDPAddrPort sends. A source the
// interface does not have is refused with EINVAL, as the kernel refuses
// it. It does not allocate.
func (c *UDPConn) WriteFromTo(b []byte, src netip.Addr, addr netip.AddrPort) (int, error) {
	msgs := [1][]byte{b}
	return c.WriteVecFromTo(msgs[:], src, addr)
}

// WriteVecFromTo sends vec's pieces, one after the other, as one datagram
// (the gather of writev and of sendmsg's iovecs), as WriteFromTo sends
// one buffer: each piece is copied once, into the frame. It returns the
// datagram's length. It does not allocate, but to hand the kernel socket
// a datagram of more than 16 pieces.
func (c *UDPConn) WriteVecFromTo(vec [][]byte, src netip.Addr, addr netip.AddrPort) (int, error) {
	return c.WriteMsg(vec, SendMeta{Src: src}, addr, nil)
}

// SendMeta is what a send asks beyond its bytes and destination (a
// sendmsg's ancillary data).
type SendMeta struct {
	// Src is the source address, one of the interface's (IP_PKTINFO's
	// ipi_spec_dst); the zero Addr means the socket's own.
	Src netip.Addr
	// Segment, when SegmentSet, is the send's UDP_SEGMENT size (0: none)
	// in place of the socket's (SetSegment), as a UDP_SEGMENT message
	// gives it.
	Segment    int
	SegmentSet bool
}

// TxStamp is what WriteStamped reports of the datagram it sent: At, the
// unix nanoseconds read just before its frame went on the ring, and, when
// Frame was given, a copy of that frame (Ethernet, IPv4 and UDP headers
// and the payload, cut to len(Frame)) and its whole length, Looped.
// Looped and At are 0 when the datagram went through the kernel socket,
// which stamps (and loops) its own.
type TxStamp struct {
	Frame  []byte
	Looped int
	At     int64
}

// WriteStamped sends vec's pieces as one datagram, as WriteVecFromTo
// does, and fills ts for a transmit timestamp (SO_TIMESTAMPING), with the
// frame as the kernel loops a sent packet back to its socket's error
// queue when ts.Frame is set. It returns the datagram's length. It does
// not allocate.
func (c *UDPConn) WriteStamped(vec [][]byte, src netip.Addr, addr netip.AddrPort, ts *TxStamp) (int, error) {
	return c.WriteMsg(vec, SendMeta{Src: src}, addr, ts)
}

// WriteMsg sends vec's pieces as one datagram to addr, with what m asks
// (a source address, a segment size), as sendmsg sends with its
// ancillary data; a non-nil ts is filled as WriteStamped fills it (for
// the last frame of a segmented send). A source the interface does not
// have is refused with EINVAL, as the kernel refuses it. A datagram
// longer than its segment size leaves as segments of that size, each its
// own datagram, as the kernel's UDP GSO cuts it. It returns the
// datagram's length. It does not allocate.
func (c *UDPConn) WriteMsg(vec [][]byte, m SendMeta, addr netip.AddrPort, ts *TxStamp) (int, error) {
	if m.Src.IsValid() && !m.Src.IsUnspecified() && !c.st.HasAddr(m.Src) {
		return 0, c.sendErr(addr, unix.EINVAL)
	}
	if ts != nil {
		ts.Looped, ts.At = 0, 0
	}
	d := gathered(vec)
	d.seg = int(c.segment.Load())
	if m.SegmentSet {
		d.seg, d.segSet = m.Segment, true
	}
	if _, err := c.sendBatch(d, addr, m.Src, ts); err != nil {
		return 0, err
	}
	return d.size(0), nil
}

// WriteBatchToUDPAddrPort sends each of msgs to addr as one datagram, with
// one wakeup of the kernel for the whole batch (sendmmsg's counterpart). It
// returns how many were sent; it does not allocate.
func (c *UDPConn) WriteBatchToUDPAddrPort(msgs [][]byte, addr netip.AddrPort) (int, error) {
	return c.sendBatch(datagrams{msgs: msgs, seg: int(c.segment.Load())}, addr, netip.Addr{}, nil)
}

// datagrams is what one send puts out: each of msgs a datagram, or, when
// gather is set, msgs' pieces together one datagram of gatherLen bytes;
// a datagram longer than seg (UDP_SEGMENT's size, 0: none) is cut into
// datagrams of seg bytes. segSet: seg is the send's own (a UDP_SEGMENT
// message), not the socket's.
type datagrams struct {
	msgs      [][]byte
	gather    bool
	gatherLen int
	seg       int
	segSet    bool
}

func gathered(vec [][]byte) datagrams {
	n := 0
	for _, p := range vec {
		n += len(p)
	}
	return datagrams{msgs: vec, gather: true, gatherLen: n}
}

func (d *datagrams) count() int {
	if d.gather {
		return 1
	}
	return len(d.msgs)
}

func (d *datagrams) size(i int) int {
	if d.gather {
		return d.gatherLen
	}
	return len(d.msgs[i])
}

// copyTo copies len(b) bytes of datagram i from off on to b.
func (d *datagrams) copyTo(i, off int, b []byte) {
	if !d.gather {
		copy(b, d.msgs[i][off:])
		return
	}
	for _, p := range d.msgs {
		if off >= len(p) {
			off -= len(p)
			continue
		}
		b = b[copy(b, p[off:]):]
		off = 0
		if len(b) == 0 {
			return
		}
	}
}

// hopTo returns the next hop to to at now (monoNow); stamped: for a send
// that asks for a transmit stamp, which waits for ARP on a new neighbour
// (nextHop).
func (c *UDPConn) hopTo(to netip.AddrPort, now int64, stamped bool) (nextHop, error) {
	if to != c.remote {
		return c.st.nextHop(to.Addr(), now, stamped)
	}
	if h := c.hop.Load(); h != nil && now < h.expires {
		return *h, nil
	}
	h, err := c.st.nextHop(to.Addr(), now, stamped)
	if err == nil && !h.pending {
		c.hop.Store(&h)
	}
	return h, err
}

// sendKernel sends datagram i of d through the kernel socket.
func (c *UDPConn) sendKernel(d *datagrams, i int, to netip.AddrPort) error {
	call, e := "sendto", unix.Errno(0)
	if d.gather {
		seg := -1 // the kernel socket's own UDP_SEGMENT
		if d.segSet {
			seg = d.seg
		}
		call, e = "sendmsg", kernelSendVec(c.FD(), d.msgs, to, seg)
	} else {
		e = kernelSendTo(c.FD(), d.msgs[i], to)
	}
	if e != 0 {
		return c.sendErr(to, os.NewSyscallError(call, e))
	}
	size, n := d.size(i), 1
	if g := d.seg; g > 0 && size > g {
		n = (size + g - 1) / g // the kernel socket's UDP_SEGMENT cut it
	}
	c.Counters.TxOSPackets.Add(uint64(n))
	c.Counters.TxOSBytes.Add(uint64(size))
	return nil
}

// SetSegment follows UDP_SEGMENT (UDP GSO), set on the socket's kernel
// socket: a send longer than size bytes (0: off) leaves as datagrams of
// size bytes, the last one shorter, as the kernel cuts it.
func (c *UDPConn) SetSegment(size int) { c.segment.Store(int32(size)) }

// maxSegments is the most datagrams the stack cuts one send into
// (UDP_SEGMENT): the kernel's UDP_MAX_SEGMENTS was 64 before Linux 6.9
// and is 128 since, and a send of more goes to the kernel socket, which
// cuts it or refuses it (EINVAL) as its version does.
const maxSegments = 64

// txSoftSumMax is the largest payload whose UDP checksum the stack sums
// itself though the backend would have the kernel finish it (AF_XDP TX
// metadata): in copy mode the metadata costs the kernel more per frame
// than summing a small payload here and again at its receiver (a sum
// costs 6 ns and 0.09 ns a byte here, BuildUDP timed at 64 to 1400
// bytes). 64-byte ping-pong between two
// stacks: 7.8-7.9 us a round trip summed here, 8.0-8.2 us with the
// metadata (BenchmarkEcho, 4 interleaved runs each).
const txSoftSumMax = 256

// sendBatch sends d to to from from (zero: the socket's address); a
// non-nil ts is filled for the last frame put on the ring.
func (c *UDPConn) sendBatch(d datagrams, to netip.AddrPort, from netip.Addr, ts *TxStamp) (sent int, err error) {
	if !c.enter() {
		return 0, net.ErrClosed
	}
	defer c.leave()
	if !to.Addr().Is4() {
		return 0, c.sendErr(to, unix.EAFNOSUPPORT)
	}
	st := c.st
	var hop nextHop
	// The send's one clock read: the next hop's expiry and the deferred
	// kick's age (kick.go).
	now := monoNow()
	kernel := st.kernelOnly.Load() != nil // the interface is down or gone
	if !kernel {
		var err error
		if hop, err = c.hopTo(to, now, ts != nil); err != nil {
			return 0, c.sendErr(to, err)
		}
		// Not behind our interface, or multicast the kernel must send.
		kernel = hop.viaKernel || to.Addr().IsMulticast() && c.mcViaKernel(to.Addr())
	}
	if kernel {
		c.FlushSends() // what this socket's earlier sends left on the ring leaves first
		for i := range d.count() {
			if err := c.sendKernel(&d, i, to); err != nil {
				return i, err
			}
		}
		return d.count(), nil
	}
	src := c.local.Addr()
	switch {
	case from.IsValid() && !from.IsUnspecified():
		src = from
	case src.IsUnspecified() || src.IsMulticast():
		src = hop.src
	}
	f := header.UDPFields{DstMAC: hop.mac, SrcMAC: st.mac, Src: netip.AddrPortFrom(src, c.local.Port()), Dst: to, NoDF: c.noDF.Load(), TOS: uint8(c.tos.Load()), TTL: uint8(c.ttl.Load())}
	if to.Addr().IsMulticast() {
		f.TTL = uint8(c.mttl.Load())
	}
	maxPayload := min(int(st.mtu.Load()), st.txFrameLen-header.EthernetLen) - header.IPv4MinLen - header.UDPLen
	q := c.txq
	spinLock(&q.txMu)
	sent, err = c.sendLocked(q, &d, to, &f, maxPayload, now, ts)
	if kerr := c.st.unlockTx(q); err == nil && kerr != nil {
		err = c.sendErr(to, kerr)
	}
	return sent, err
}

// sendLocked is sendBatch's part under q.txMu: d on q's TX ring, each
// datagram longer than d.seg cut into frames of d.seg bytes, or to the
// kernel when a datagram is too long for the stack to send.
func (c *UDPConn) sendLocked(q *queue, d *datagrams, to netip.AddrPort, f *header.UDPFields, maxPayload int, now int64, ts *TxStamp) (sent int, err error) {
	st := c.st
	off := 0 // of datagram sent, the bytes already on the ring: a cut one may take more than a batch
	for sent < d.count() {
		if !d.fits(sent, maxPayload) {
			// Larger than the MTU or a transmit frame: the kernel sends it
			// (and fragments it when it must); cut into more segments
			// than the stack makes, or into segments too long: the kernel
			// cuts it or refuses it. What earlier sends left on the ring
			// leaves first, as the kernel keeps a socket's datagrams in
			// order: a kick under txMu, for a send that makes a system
			// call anyway.
			if q.unkicked.Load() || q.kickDue {
				q.be.Flush()
				st.noteUnsent(q, now, false)
			}
			if err := c.sendKernel(d, sent, to); err != nil {
				return sent, err
			}
			sent++
			if ts != nil {
				ts.Looped, ts.At = 0, 0
			}
			continue
		}
		// The batch: frames from datagram sent's byte off on, through
		// the datagrams after it that fit, as many as txBufs holds.
		run, i, o := 0, sent, off
		for run < len(q.txBufs) && i < d.count() && d.fits(i, maxPayload) {
			i, o, _ = d.advance(i, o, 1)
			run++
		}
		got := 0
		for try := 0; try < 1000 && got == 0; try++ {
			got = q.be.Alloc(q.txBufs[:run])
		}
		if got == 0 {
			c.Counters.TxNoBufs.Add(1)
			return sent, c.sendErr(to, unix.ENOBUFS)
		}
		devSum := q.be.TxChecksum()
		i, o = sent, off
		for k := range got {
			tb := &q.txBufs[k]
			n := d.piece(i, o)
			d.copyTo(i, o, tb.Data[header.UDPHeadersLen:header.UDPHeadersLen+n])
			// Neither this stack nor a kernel receiver on this host sums
			// the payload when the backend has the checksum finished; a
			// small one is summed here all the same (txSoftSumMax).
			f.PartialChecksum = devSum && n > txSoftSumMax
			f.ID = uint16(st.ipID.Add(1))
			tb.Data = tb.Data[:header.BuildUDP(tb.Data, f, n)]
			if f.PartialChecksum {
				tb.CsumStart, tb.CsumOffset = header.UDPChecksumStart, header.UDPChecksumOffset
			}
			if ts != nil && ts.Frame != nil {
				ts.Looped = len(tb.Data)
				copy(ts.Frame, tb.Data)
			}
			i, o, _ = d.advance(i, o, 1)
		}
		if ts != nil {
			// As close to the device as the stack sees: the kick may
			// bring the peer's answer back before it returns. A stamped
			// frame leaves in this send's kick, not in a coalesced one
			// up to TxKickDelay after its stamp.
			ts.At = time.Now().UnixNano()
		}
		k, err := st.transmit(q, q.txBufs[:got], now, ts != nil)
		var bytes int
		sent, off, bytes = d.advance(sent, off, k)
		c.Counters.TxOffloadPackets.Add(uint64(k))
		c.Counters.TxOffloadBytes.Add(uint64(bytes))
		if err != nil {
			// A datagram cut short here counts as not sent; its segments
			// that left are the peer's to drop, as a wire's loss.
			return sent, c.sendErr(to, err)
		}
	}
	return sent, nil
}

// fits says whether the stack sends datagram i of d itself: in one frame
// of at most maxPayload bytes, or, longer than d.seg, cut into at most
// maxSegments frames of d.seg bytes that each fit.
func (d *datagrams) fits(i, maxPayload int) bool {
	size := d.size(i)
	if d.seg > 0 && size > d.seg {
		return d.seg <= maxPayload && size <= d.seg*maxSegments
	}
	return size <= maxPayload
}

// piece is the payload of the frame that carries datagram i of d from
// its byte off on.
func (d *datagrams) piece(i, off int) int {
	n := d.size(i) - off
	if d.seg > 0 {
		n = min(n, d.seg)
	}
	return n
}

// advance moves the cursor at datagram i's byte off over frames frames
// (piece), and returns where it ends and the payload bytes it passed.
func (d *datagrams) advance(i, off, frames int) (int, int, int) {
	bytes := 0
	for ; frames > 0; frames-- {
		n := d.piece(i, off)
		bytes += n
		if off += n; off == d.size(i) {
			i, off = i+1, 0
		}
	}
	return i, off, bytes
}

// mcViaKernel says whether multicast to group goes through the kernel
// socket: for another interface, or for the kernel's loopback copy to a
// member on this host.
func (c *UDPConn) mcViaKernel(group netip.Addr) bool {
	if c.mcOtherIf.Load() {
		return true
	}
	if !c.mcLoop.Load() || !c.st.localMember(group) {
		return false
	}
	// A load before the swap: this runs at every such send, and the
	// flag is set once.
	if f := c.st.opts.McLoopViaKernel; f != nil && !c.mcLoopTold.Load() && !c.mcLoopTold.Swap(true) {
		f(c, group)
	}
	return true
}

// SetMulticastLoop follows IP_MULTICAST_LOOP (off by default): while it
// is on, multicast to a group that has a member on this host goes through
// the kernel socket, which gives the member its copy. The stack's own
// multicast reaches the wire only.
func (c *UDPConn) SetMulticastLoop(on bool) { c.mcLoop.Store(on) }

// SetMulticastViaKernel makes all the socket's multicast go through its
// kernel socket (on) or the stack (off, the default): on for an interface
// other than the stack's (IP_MULTICAST_IF), as the stack's multicast
// leaves by its own interface.
func (c *UDPConn) SetMulticastViaKernel(on bool) { c.mcOtherIf.Store(on) }

// LocalAddr implements net.PacketConn.
func (c *UDPConn) LocalAddr() net.Addr { return net.UDPAddrFromAddrPort(c.local) }

// RemoteAddr implements net.Conn; nil when not connected.
func (c *UDPConn) RemoteAddr() net.Addr {
	if !c.remote.IsValid() {
		return nil
	}
	return net.UDPAddrFromAddrPort(c.remote)
}

// LocalAddrPort is the bound address.
func (c *UDPConn) LocalAddrPort() netip.AddrPort { return c.local }

// RemoteAddrPort is the peer of a connected socket (invalid when not connected).
func (c *UDPConn) RemoteAddrPort() netip.AddrPort { return c.remote }

func deadline(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// SetDeadline implements net.PacketConn.
func (c *UDPConn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	return c.SetWriteDeadline(t)
}

// SetReadDeadline implements net.PacketConn; a sleeping reader wakes up to
// see the new deadline.
func (c *UDPConn) SetReadDeadline(t time.Time) error {
	c.readDeadline.Store(deadline(t))
	if c.waiters.Load() > 0 {
		c.wake()
	}
	return nil
}

// SetWriteDeadline implements net.PacketConn. Sends never block (a full
// transmit ring gives ENOBUFS), so there is nothing for it to bound.
func (c *UDPConn) SetWriteDeadline(time.Time) error { return nil }

// useClosing is the bit of UDPConn.use that Close sets.
const useClosing = 1 << 62

// enter begins a call that uses the socket's descriptors; it returns false
// once Close began. Close leaves the descriptors open until every such call
// has left, so that no call ever uses a descriptor number that was closed
// and given to another file meanwhile.
func (c *UDPConn) enter() bool {
	if c.use.Add(1)&useClosing != 0 {
		c.leave()
		return false
	}
	return true
}

func (c *UDPConn) leave() {
	if c.use.Add(-1) == useClosing {
		select {
		case c.left <- struct{}{}:
		default: // Close has a wakeup pending already
		}
	}
}

func (c *UDPConn) closing() bool { return c.use.Load()&useClosing != 0 }

// Close removes the socket's rules, returns its queued frames and closes
// its kernel socket. Readers in the socket return net.ErrClosed, and Close
// returns once they have left: the descriptors they used are closed after
// that, and never under them.
func (c *UDPConn) Close() error {
	if c.use.Or(useClosing)&useClosing != 0 {
		return net.ErrClosed
	}
	st := c.st
	c.steered.Store(false)
	var errs []error
	for _, id := range c.rules {
		errs = append(errs, st.removeRule(id))
	}
	for _, id := range c.groups {
		errs = append(errs, st.removeRule(id))
	}
	st.removeSocket(c, c.keys...)
	st.mu.Lock()
	delete(st.conns, c)
	st.mu.Unlock()
	st.rxMu.Lock()
	var it rxItem
	for c.popLocked(&it) {
		st.releaseLocked(it.q, it.buf)
	}
	for _, q := range st.queueList() {
		st.flushLocked(q)
	}
	c.wake()
	st.rxMu.Unlock()
	// Readers leave quickly: a sleeping one was just woken, a polling one
	// looks at the mark on every turn.
	for c.use.Load() != useClosing {
		<-c.left
	}
	if c.evfd >= 0 {
		highfd.Close(c.evfd)
		c.evfd = -1
	}
	if fd := c.FD(); fd >= 0 && c.ownFD {
		errs = append(errs, highfd.Close(fd))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("udp %s: close: %w", c.local, err)
	}
	return nil
}

var (
	_ net.PacketConn = (*UDPConn)(nil)
	_ net.Conn       = (*UDPConn)(nil)
)
