package stack

import (
	"errors"
	"fmt"
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

// ToKernel hands the established connection to a new kernel socket, made
// in the calling thread's network namespace, and returns it; the
// connection is then closed here, its steering rule removed. It needs
// CAP_NET_ADMIN (TCP_REPAIR). A connection not established, whose peer
// sent its FIN, or with bytes not yet acknowledged (ErrUnsent) stays as
// it is.
func (c *TCPConn) ToKernel() (int, error) {
	t := c.st.tcp.Load()
	ep, ok := c.ep.(*tcp.Endpoint)
	if t == nil || !ok {
		return -1, fmt.Errorf("tcp %s>%s: to the kernel: %w", c.key.local, c.key.remote, unix.ENOTCONN)
	}
	fail := func(err error) (int, error) {
		return -1, fmt.Errorf("tcp %s>%s: to the kernel: %w", c.key.local, c.key.remote, err)
	}
	// What netstack received and the application did not read goes to
	// the kernel socket's receive queue: read it out, then hold the
	// endpoint, and read again if more came meanwhile.
	var unread []byte
	buf := make([]byte, 64<<10)
	var s tcp.TCPEndpointState
	for try := 0; ; try++ {
		for {
			n, err := c.ReadNonblock(buf, false)
			unread = append(unread, buf[:n]...)
			if err != nil || n == 0 {
				break
			}
		}
		ep.LockUser()
		if ep.EndpointState() != tcp.StateEstablished {
			ep.UnlockUser()
			return fail(fmt.Errorf("state %s", ep.EndpointState()))
		}
		tcpCompleteStateLocked(ep, &s)
		if s.RcvBufState.RcvBufUsed == 0 {
			break
		}
		ep.UnlockUser()
		if try == 3 {
			return fail(errors.New("data keeps coming"))
		}
	}
	defer ep.UnlockUser()
	if s.Sender.SndUna != s.Sender.SndNxt || s.SndBufState.SndBufUsed > 0 {
		return fail(ErrUnsent)
	}
	if c.fin.Load() {
		return fail(errors.New("the peer's FIN came"))
	}
	fd, err := c.repairSocket(&s, unread, t.ns.Clock().NowMonotonic())
	if err != nil {
		return fail(err)
	}
	// From here the peer's segments go to the kernel socket, ahead of a
	// listener's rule on the port. The rule stays until the stack closes:
	// the kernel socket's end is not the engine's to see.
	if err := c.st.prog.ToKernel(c.rule); err != nil {
		unix.Close(fd)
		return fail(err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_REPAIR, 0); err != nil {
		// The peer's segments reach a socket that cannot answer them,
		// nor netstack: the connection is lost either way.
		unix.Close(fd)
		return fail(fmt.Errorf("TCP_REPAIR off: %w", err))
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

// repairSocket makes the kernel socket that goes on from s, in repair
// mode still: bound to the connection's local address (repair mode may
// share the port with the listener, or the socket that held it), its
// sequence numbers, connected without a handshake, its options, windows
// and timestamp clock, and unread in its receive queue.
func (c *TCPConn) repairSocket(s *tcp.TCPEndpointState, unread []byte, now tcpip.MonotonicTime) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
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
		checkRepair("bind "+local.String(), unix.Bind(fd, &unix.SockaddrInet4{Port: int(local.Port()), Addr: local.Addr().As4()})),
	)
	if err == nil {
		err = errors.Join(
			checkRepair("send sequence", queue(tcpSendQueue, uint32(s.Sender.SndNxt))),
			checkRepair("receive sequence", queue(tcpRecvQueue, rcvNxt-uint32(len(unread)))),
		)
	}
	if err == nil {
		err = checkRepair("connect "+remote.String(), unix.Connect(fd, &unix.SockaddrInet4{Port: int(remote.Port()), Addr: remote.Addr().As4()}))
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
		err = checkRepair("TCP_TIMESTAMP", opt(unix.TCP_TIMESTAMP, int(int32(s.TSOffset.TSVal(now)))))
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
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
