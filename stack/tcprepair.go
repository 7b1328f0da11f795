package stack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/stack/header"
)

// Handing an established connection to the kernel. netstack's connection
// lives in the process that runs the engine; a child that fork made
// cannot use it (accept-then-fork servers: sshd, socat's fork, Python's
// ForkingTCPServer, inetd's kind). The kernel's TCP_REPAIR mode (CRIU's
// way of moving a connection) makes a kernel socket that goes on from
// netstack's sequence numbers, options and windows, with the bytes
// netstack received and the application has not read in its receive
// queue: the process and its child then share a kernel socket, as
// without vmaxdp. netstack's endpoint ends without a word to the peer.

// ErrUnsent: a connection with bytes sent and not yet acknowledged, or
// not sent, stays netstack's: they live in netstack's send queue, which
// ToKernel does not move.
var ErrUnsent = errors.New("bytes written and not yet acknowledged")

// TCP_REPAIR_QUEUE's queues and TCP_REPAIR_OPTIONS' codes (linux/tcp.h).
const (
	tcpRecvQueue    = 1
	tcpSendQueue    = 2
	tcpoptMSS       = 2
	tcpoptWindow    = 3
	tcpoptSACKPerm  = 4
	tcpoptTimestamp = 8
)

// tcpRepairWindow is struct tcp_repair_window.
type tcpRepairWindow struct {
	sndWl1, sndWnd, maxWindow, rcvWnd, rcvWup uint32
}

// SetMapped says that the application's socket of c is AF_INET6, which
// carries c's IPv4 mapped: the socket ToKernel makes is AF_INET6 too.
func (c *TCPConn) SetMapped() { c.mapped.Store(true) }

// ToKernel hands the connection, established or in CLOSE-WAIT, to a new
// kernel socket, made in the calling thread's network namespace, and
// returns it; the connection then ends here without a segment, and its
// steering rule gives its segments to the kernel. It needs
// CAP_NET_ADMIN (TCP_REPAIR; and a raw socket for a peer's FIN). A
// connection in another state, or with bytes not yet acknowledged
// (ErrUnsent), stays as it is.
func (c *TCPConn) ToKernel() (int, error) {
	fail := func(err error) (int, error) {
		return -1, fmt.Errorf("tcp %s>%s: to the kernel: %w", c.key.local, c.key.remote, err)
	}
	t := c.st.tcp.Load()
	ep, ok := c.ep.(*tcp.Endpoint)
	if t == nil || !ok {
		return fail(unix.ENOTCONN)
	}
	c.flushWrites() // what is left is unsent: ErrUnsent below
	// What netstack received and the application did not read goes to
	// the kernel socket's receive queue: peeked, as nothing may be taken
	// from netstack before the move is sure, then the endpoint held, and
	// peeked again if more came meanwhile.
	opts := c.movedValues()
	var unread []byte
	var s tcp.TCPEndpointState
	for try := 0; ; try++ {
		unread = make([]byte, c.Unread())
		if len(unread) > 0 {
			n, err := c.ReadNonblock(unread, true)
			if err != nil {
				return fail(err)
			}
			unread = unread[:n]
		}
		ep.LockUser()
		if st := ep.EndpointState(); st != tcp.StateEstablished && st != tcp.StateCloseWait {
			ep.UnlockUser()
			return fail(fmt.Errorf("state %s", st))
		}
		tcpCompleteStateLocked(ep, &s)
		if s.RcvBufState.RcvBufUsed == len(unread) && s.Receiver.PendingBufUsed == 0 {
			break
		}
		ep.UnlockUser()
		if try == 3 {
			return fail(errors.New("data keeps coming, or came out of order"))
		}
	}
	defer ep.UnlockUser()
	if s.Sender.SndUna != s.Sender.SndNxt || s.SndBufState.SndBufUsed > 0 {
		return fail(ErrUnsent)
	}
	// A peer's FIN netstack took (CLOSE-WAIT) is given to the kernel
	// socket as the peer sent it, once the socket is live: repair mode
	// makes an established socket, one sequence number short.
	fin := ep.EndpointState() == tcp.StateCloseWait
	if fin {
		s.Receiver.RcvNxt--
	}
	fd, err := c.repairSocket(&s, unread, opts, t.ns.Clock().NowMonotonic())
	if err != nil {
		return fail(err)
	}
	// Until repair mode ends the socket sends nothing, and closing it
	// says nothing to the peer: what can fail is done first (the raw
	// socket for the FIN needs CAP_NET_RAW).
	raw := -1
	if fin {
		if raw, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW); err != nil {
			unix.Close(fd)
			return fail(fmt.Errorf("raw socket for the peer's FIN: %w", err))
		}
		defer unix.Close(raw)
	}
	// From here the peer's segments go to the kernel socket, ahead of a
	// listener's rule on the port. The rule stays until the stack closes:
	// the kernel socket's end is not the engine's to see.
	if err := c.st.prog.ToKernel(c.rule); err != nil {
		unix.Close(fd)
		return fail(err)
	}
	// undo leaves the connection netstack's after a step that should not
	// fail did: the kernel socket goes back to repair mode and closes
	// without a word, and the rule steers to the stack again. Segments
	// the kernel socket took meanwhile are lost to netstack.
	undo := func(err error) (int, error) {
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 1)
		unix.Close(fd)
		c.st.prog.FromKernel(c.rule)
		return fail(err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 0); err != nil {
		return undo(fmt.Errorf("TCP_REPAIR off: %w", err))
	}
	if fin {
		if err := c.sendFIN(raw, &s); err != nil {
			return undo(fmt.Errorf("the peer's FIN to the kernel socket: %w", err))
		}
	}
	c.once.Do(func() {
		c.st.tcpConns.CompareAndDelete(c.key, c)
		if c.kfd >= 0 {
			highfd.Close(c.kfd)
			c.kfd = -1
		}
	})
	// netstack's endpoint goes without a segment: its reset would end the
	// connection the kernel now carries.
	conn := c.key.heldConn()
	t.link.silence(conn)
	go func() {
		c.ep.Abort()
		time.AfterFunc(time.Second, func() { t.link.unsilence(conn) })
	}()
	return fd, nil
}

// movedOptions are the options a moved connection takes to its kernel
// socket when they differ from the fresh kernel socket's: those a server
// sets on a connection it accepted before it forks (sshd: TCP_NODELAY,
// IP_TOS, keepalive). The buffers stay the kernel's own (netstack's
// sizes are not the application's choice), as does its congestion
// control (netstack's cubic is not either).
var movedOptions = [...]struct{ level, name int }{
	{unix.IPPROTO_TCP, unix.TCP_NODELAY},
	{unix.IPPROTO_TCP, unix.TCP_CORK},
	{unix.SOL_SOCKET, unix.SO_KEEPALIVE},
	{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE},
	{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL},
	{unix.IPPROTO_TCP, unix.TCP_KEEPCNT},
	{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT},
	{unix.IPPROTO_IP, unix.IP_TOS},
}

// movedValues are the connection's values of movedOptions (-1: none)
// and its SO_LINGER, read before the endpoint is held: netstack's
// getsockopt holds it too.
type movedValues struct {
	v             [len(movedOptions)]int
	linger        bool
	lingerSeconds int
}

func (c *TCPConn) movedValues() *movedValues {
	var m movedValues
	for i, o := range movedOptions {
		v, err := c.Option(o.level, o.name)
		if err != nil {
			v = -1
		}
		m.v[i] = v
	}
	m.linger, m.lingerSeconds = c.Linger()
	return &m
}

// set sets on fd those of m that differ from fd's own.
func (m *movedValues) set(fd int) error {
	var errs []error
	for i, o := range movedOptions {
		v := m.v[i]
		if v < 0 {
			continue
		}
		if k, err := unix.GetsockoptInt(fd, o.level, o.name); err == nil && k == v {
			continue
		}
		if err := unix.SetsockoptInt(fd, o.level, o.name, v); err != nil {
			errs = append(errs, fmt.Errorf("option %d/%d %d: %w", o.level, o.name, v, err))
		}
	}
	if m.linger {
		if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: int32(m.lingerSeconds)}); err != nil {
			errs = append(errs, fmt.Errorf("SO_LINGER %d: %w", m.lingerSeconds, err))
		}
	}
	return errors.Join(errs...)
}

// repairSocket makes the kernel socket that goes on from s, in repair
// mode still: bound to the connection's local address (repair mode may
// share the port with the listener, or the socket that held it), its
// sequence numbers, connected without a handshake, its options, windows
// and timestamp clock, unread in its receive queue, and the options of
// moved.
func (c *TCPConn) repairSocket(s *tcp.TCPEndpointState, unread []byte, moved *movedValues, now tcpip.MonotonicTime) (int, error) {
	family := unix.AF_INET
	sockaddr := func(a netip.AddrPort) unix.Sockaddr {
		return &unix.SockaddrInet4{Port: int(a.Port()), Addr: a.Addr().As4()}
	}
	if c.mapped.Load() {
		family = unix.AF_INET6
		sockaddr = func(a netip.AddrPort) unix.Sockaddr {
			return &unix.SockaddrInet6{Port: int(a.Port()), Addr: a.Addr().As16()}
		}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	opt := func(name, v int) error { return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, name, v) }
	queue := func(q int, seq uint32) error {
		if err := opt(unix.TCP_REPAIR_QUEUE, q); err != nil {
			return err
		}
		return opt(unix.TCP_QUEUE_SEQ, int(int32(seq)))
	}
	var opts []unix.TCPRepairOpt
	mss := min(s.Sender.MaxPayloadSize+maxOptionRoom, c.st.tcpMTU()-header.IPv4MinLen-header.TCPMinLen)
	opts = append(opts, unix.TCPRepairOpt{Code: tcpoptMSS, Val: uint32(mss)})
	if s.Sender.SndWndScale > 0 || s.Receiver.RcvWndScale > 0 {
		opts = append(opts, unix.TCPRepairOpt{Code: tcpoptWindow, Val: uint32(s.Sender.SndWndScale) | uint32(s.Receiver.RcvWndScale)<<16})
	}
	if s.SACKPermitted {
		opts = append(opts, unix.TCPRepairOpt{Code: tcpoptSACKPerm})
	}
	if s.SendTSOk {
		opts = append(opts, unix.TCPRepairOpt{Code: tcpoptTimestamp})
	}
	rcvNxt := uint32(s.Receiver.RcvNxt)
	win := tcpRepairWindow{
		sndWl1: rcvNxt, sndWnd: uint32(s.Sender.SndWnd), maxWindow: uint32(s.Sender.SndWnd),
		rcvWnd: uint32(s.Receiver.RcvAcc) - rcvNxt, rcvWup: rcvNxt,
	}
	local, remote := c.key.local, c.key.remote
	err = errors.Join(
		checkRepair("TCP_REPAIR", opt(unix.TCP_REPAIR, 1)),
		checkRepair("bind "+local.String(), unix.Bind(fd, sockaddr(local))),
	)
	if err == nil {
		err = errors.Join(
			checkRepair("send sequence", queue(tcpSendQueue, uint32(s.Sender.SndNxt))),
			checkRepair("receive sequence", queue(tcpRecvQueue, rcvNxt-uint32(len(unread)))),
		)
	}
	if err == nil {
		err = checkRepair("connect "+remote.String(), unix.Connect(fd, sockaddr(remote)))
	}
	if err == nil {
		err = checkRepair("TCP_REPAIR_OPTIONS", setsockoptBytes(fd, unix.TCP_REPAIR_OPTIONS, unsafe.Pointer(unsafe.SliceData(opts)), len(opts)*int(unsafe.Sizeof(opts[0]))))
	}
	if err == nil && len(unread) > 0 {
		// Queued as received: the kernel's receive sequence moves on to
		// netstack's.
		err = checkRepair("receive queue", opt(unix.TCP_REPAIR_QUEUE, tcpRecvQueue))
		for off := 0; err == nil && off < len(unread); {
			var n int
			n, err = unix.Write(fd, unread[off:])
			off += n
			err = checkRepair("receive queue", err)
		}
	}
	if err == nil {
		err = checkRepair("TCP_REPAIR_WINDOW", setsockoptBytes(fd, unix.TCP_REPAIR_WINDOW, unsafe.Pointer(&win), int(unsafe.Sizeof(win))))
	}
	if err == nil && s.SendTSOk {
		// The value's low bit asks for microsecond timestamps (Linux
		// 6.7): netstack's are milliseconds, and the peer's PAWS wants
		// them to go on from netstack's last, so the next even value.
		ts := (s.TSOffset.TSVal(now) + 1) &^ 1
		err = checkRepair("TCP_TIMESTAMP", opt(unix.TCP_TIMESTAMP, int(int32(ts))))
	}
	if err == nil {
		err = checkRepair("options", moved.set(fd))
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// sendFIN hands the kernel socket the peer's FIN that netstack took: a
// segment as the peer sent it (its addresses, the FIN's sequence number,
// acknowledging what netstack had sent, with the timestamps option when
// agreed), through the raw socket raw to the local address, which the
// kernel loops back to TCP.
func (c *TCPConn) sendFIN(raw int, s *tcp.TCPEndpointState) error {
	hl := header.TCPMinLen
	if s.SendTSOk {
		hl += 12 // NOP, NOP, timestamps
	}
	pkt := make([]byte, header.IPv4MinLen+hl)
	ip, seg := pkt[:header.IPv4MinLen], pkt[header.IPv4MinLen:]
	src, dst := c.key.remote, c.key.local
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(pkt)))
	ip[8], ip[9] = 64, header.ProtocolTCP
	s4, d4 := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(seg[0:], src.Port())
	binary.BigEndian.PutUint16(seg[2:], dst.Port())
	binary.BigEndian.PutUint32(seg[4:], uint32(s.Receiver.RcvNxt))
	binary.BigEndian.PutUint32(seg[8:], uint32(s.Sender.SndNxt))
	seg[12] = byte(hl/4) << 4
	seg[13] = header.TCPFlagFin | header.TCPFlagAck
	binary.BigEndian.PutUint16(seg[14:], uint16(min(uint32(s.Sender.SndWnd)>>s.Sender.SndWndScale, 0xffff)))
	if s.SendTSOk {
		copy(seg[20:], []byte{1, 1, 8, 10})
		binary.BigEndian.PutUint32(seg[24:], s.RecentTS)
	}
	binary.BigEndian.PutUint16(seg[16:], ^header.Fold(header.Sum(seg, header.PseudoSum(src.Addr(), dst.Addr(), header.ProtocolTCP, len(seg)))))
	return unix.Sendto(raw, pkt, 0, &unix.SockaddrInet4{Addr: d4})
}

// maxOptionRoom is what netstack keeps of its peer's MSS for its options
// (timestamps and SACK blocks): the peer's MSS is MaxPayloadSize and
// this, as the kernel's repair wants it.
const maxOptionRoom = 40

func setsockoptBytes(fd, name int, p unsafe.Pointer, n int) error {
	_, _, errno := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.IPPROTO_TCP, uintptr(name), uintptr(p), uintptr(n), 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// checkRepair names the step of repairSocket that failed.
func checkRepair(what string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}
