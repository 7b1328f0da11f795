package engine

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/stack"
)

// Receive flags the engine serves; any other flag (MSG_ERRQUEUE, MSG_OOB)
// goes to the kernel.
const recvFlagsServed = unix.MSG_DONTWAIT | unix.MSG_PEEK | unix.MSG_TRUNC | unix.MSG_WAITALL | unix.MSG_NOSIGNAL | unix.MSG_CMSG_CLOEXEC

// Send flags the engine serves; any other (MSG_MORE, MSG_OOB) goes to the
// kernel, and after MSG_MORE the send that ends the datagram too.
const sendFlagsServed = unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL | unix.MSG_CONFIRM | unix.MSG_EOR

// Recv serves a receive on fd into b: bytes copied, the datagram's full
// length (more than n when cut) and its sender. ErrPassOS means the kernel
// must serve it. A blocking receive ends by deadline, or when that is zero
// by the socket's SO_RCVTIMEO. sig counts the handlers of the calling
// thread's signals (nil: none return EINTR). meta, when not nil, receives
// what recvmsg's ancillary data reports (see Cmsg).
func (e *Engine) Recv(fd int, b []byte, flags int, deadline time.Time, sig *stack.Signals, meta *stack.RecvMeta) (n, full int, from netip.AddrPort, errno unix.Errno) {
	s := e.get(fd)
	if s == nil {
		return 0, 0, from, ErrPassOS
	}
	if flags&^recvFlagsServed != 0 {
		return 0, 0, from, ErrPassOS
	}
	c := s.conn.Load()
	if c == nil {
		return e.recvCandidate(fd, s, b, flags, deadline, sig, meta)
	}
	var rf stack.RecvFlags
	if s.nonblock.Load() || flags&unix.MSG_DONTWAIT != 0 {
		rf |= stack.RecvNonblock
	} else if t := s.rcvtimeo.Load(); t > 0 && deadline.IsZero() {
		deadline = time.Now().Add(time.Duration(t))
	}
	if flags&unix.MSG_PEEK != 0 {
		rf |= stack.RecvPeek
	}
	if s.osReady.Load() && s.osReady.CompareAndSwap(true, false) {
		rf |= stack.RecvCheckOS
	}
	stamped := s.ioctlStamp.Load()
	var own stack.RecvMeta
	if stamped && meta == nil {
		meta = &own // SIOCGSTAMP reads the arrival the receive reports
	}
	n, full, from, err := c.RecvFrom(b, rf, deadline, sig, meta)
	if err == nil {
		switch {
		case stamped && meta.Stamp > 0:
			s.lastStamp.Store(meta.Stamp)
		case s.lastStamp.Load() == 0:
			s.lastStamp.Store(-1)
		}
	}
	if s.draining.Load() {
		e.endDrain(s)
	}
	if err != nil && errors.Is(err, net.ErrClosed) && e.get(fd) == s {
		// Reopened (connect, or its fd closed under a dup) while this
		// receive waited: go on with the socket's new stack socket, or
		// with the kernel if it could not be re-attached. Reopen runs
		// under s.mu and closes c before it stores the new one.
		s.mu.Lock()
		now := s.conn.Load()
		s.mu.Unlock()
		if now != c {
			return e.Recv(fd, b, flags, deadline, sig, meta)
		}
	}
	return n, full, from, errnoOf(err)
}

// GetTimestamp serves SIOCGSTAMP and SIOCGSTAMPNS on fd, an offloaded
// socket, as the kernel's sock_gettstamp: the arrival of the last
// datagram read, in unix nanoseconds; ENOENT before any; for one read
// before stamps were on, the time of the call, which later calls keep
// until a stamped one is read. The first call turns stamps on.
func (e *Engine) GetTimestamp(fd int) (int64, unix.Errno) {
	s := e.get(fd)
	if s == nil {
		return 0, ErrPassOS
	}
	c := s.conn.Load()
	if c == nil {
		return 0, ErrPassOS
	}
	if !s.ioctlStamp.Swap(true) {
		c.SetRecvStamp(true)
	}
	switch ts := s.lastStamp.Load(); ts {
	case 0:
		return 0, unix.ENOENT
	case -1:
		s.lastStamp.CompareAndSwap(-1, time.Now().UnixNano())
		return s.lastStamp.Load(), 0
	default:
		return ts, 0
	}
}

// candidateSlice bounds each sleep of a wait that involves a candidate
// socket: offload may attach to it meanwhile (another thread's first send)
// and steer its datagrams away from the kernel socket the wait watches.
const candidateSlice = 10 * time.Millisecond

// recvCandidate receives on fd, a socket not yet decided: from the kernel
// socket, until offload attaches.
func (e *Engine) recvCandidate(fd int, s *Socket, b []byte, flags int, deadline time.Time, sig *stack.Signals, meta *stack.RecvMeta) (n, full int, from netip.AddrPort, errno unix.Errno) {
	nonblock := s.nonblock.Load() || flags&unix.MSG_DONTWAIT != 0
	if t := s.rcvtimeo.Load(); t > 0 && !nonblock && deadline.IsZero() {
		deadline = time.Now().Add(time.Duration(t))
	}
	sw := sig.Begin(deadline.IsZero())
	for {
		if s.conn.Load() != nil {
			return e.Recv(fd, b, flags, deadline, sig, meta)
		}
		s.mu.Lock()
		st := s.state
		s.mu.Unlock()
		switch st {
		case StateOffloaded:
			continue // attached since the look at conn
		case StateKernel:
			return 0, 0, from, ErrPassOS
		}
		wait := candidateSlice
		if !deadline.IsZero() {
			wait = min(wait, time.Until(deadline))
		}
		var ready bool
		if ready, full, from, errno = e.candidateTurn(fd, s, b, flags, nonblock, wait, &sw, meta); ready {
			return min(full, len(b)), full, from, errno
		}
		if nonblock || !deadline.IsZero() && time.Until(deadline) <= 0 {
			return 0, 0, from, unix.EAGAIN
		}
	}
}

// candidateTurn reads fd's kernel socket once and, when it has nothing and
// the call blocks, waits for it up to wait. It runs only while fd names s,
// and Close waits for it to end before the application closes fd: it never
// reads a descriptor number that was closed and reused meanwhile.
func (e *Engine) candidateTurn(fd int, s *Socket, b []byte, flags int, nonblock bool, wait time.Duration, sw *stack.SignalWait, meta *stack.RecvMeta) (ready bool, full int, from netip.AddrPort, errno unix.Errno) {
	s.mu.Lock()
	if e.get(fd) != s {
		s.mu.Unlock()
		return true, 0, from, unix.EBADF
	}
	s.kernelReads = append(s.kernelReads, fd)
	decided := s.decidedFD()
	s.mu.Unlock()
	defer s.endKernelRead(fd)
	if meta != nil {
		full, from, errno = stack.KernelRecvMsg(fd, b, flags&^unix.MSG_TRUNC, meta)
	} else {
		full, from, errno = stack.KernelRecvFrom(fd, b, flags&^unix.MSG_TRUNC)
	}
	if errno == 0 && flags&unix.MSG_PEEK == 0 {
		s.osRxPackets.Add(1)
		s.osRxBytes.Add(uint64(full))
	}
	if errno != unix.EAGAIN || nonblock || wait <= 0 {
		return errno != unix.EAGAIN, full, from, errno
	}
	ts := unix.NsecToTimespec(wait.Nanoseconds())
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(decided), Events: unix.POLLIN}}
	if decided < 0 {
		pfd = pfd[:1]
	}
	if _, err := sw.Ppoll(pfd, &ts); err == unix.EINTR {
		return true, 0, from, unix.EINTR
	}
	return false, 0, from, 0
}

func (s *Socket) endKernelRead(fd int) {
	s.mu.Lock()
	i := slices.Index(s.kernelReads, fd)
	s.kernelReads = slices.Delete(s.kernelReads, i, i+1)
	s.mu.Unlock()
}

// Pending is FIONREAD: the length of fd's next datagram, or 0.
func (e *Engine) Pending(fd int) (int, unix.Errno) {
	c := e.Conn(fd)
	if c == nil {
		return 0, ErrPassOS
	}
	if n, ok := c.Pending(); ok {
		return n, 0
	}
	return 0, ErrPassOS // the kernel socket may hold one
}

// Send serves a send of b on fd to to (zero: the connected peer), with
// what its ancillary data asks (m: the source address, a transmit
// stamp). The first send of a candidate socket decides its offload.
func (e *Engine) Send(fd int, b []byte, to netip.AddrPort, m SendCmsg, flags int) (int, unix.Errno) {
	vec := [1][]byte{b}
	return e.SendVec(fd, vec[:], to, m, flags)
}

// SendVec is Send of one datagram made of vec's pieces (sendmsg's and
// writev's iovecs), each copied once, into the frame.
func (e *Engine) SendVec(fd int, vec [][]byte, to netip.AddrPort, m SendCmsg, flags int) (int, unix.Errno) {
	s := e.get(fd)
	if s == nil {
		return 0, ErrPassOS
	}
	c := s.conn.Load()
	if m.Stamp && s.v6 {
		// Its stamp would be read as IPV6_RECVERR, which the engine
		// does not make (SetTimestamping).
		return 0, passSend(c)
	}
	if flags&unix.MSG_MORE != 0 {
		// The kernel socket keeps the start of the datagram (its cork)
		// until a send without MSG_MORE, which must be its too.
		s.corked.Store(true)
		return 0, passSend(c)
	}
	if flags&^sendFlagsServed != 0 || s.cork.Load() || s.shutWr.Load() || s.corked.Load() && s.corked.CompareAndSwap(true, false) {
		return 0, passSend(c)
	}
	if c == nil {
		if e.PrepareSend(fd, to) != StateOffloaded {
			return 0, ErrPassOS
		}
		c = s.conn.Load()
	}
	if !to.IsValid() {
		if to = c.RemoteAddrPort(); !to.IsValid() {
			return 0, unix.EDESTADDRREQ
		}
	}
	if m.Src.IsValid() && !m.Src.IsUnspecified() && !c.Stack().HasAddr(m.Src) {
		// A source (IP_PKTINFO) of another interface, or of lo: the
		// kernel sends from any address of the host, and refuses the
		// others itself. A server bound to 0.0.0.0 answers so what came
		// to an address of lo through this interface (a host's service
		// address, an anycast one).
		return 0, passSend(c)
	}
	tx := s.tx.Load()
	stamp := tx != nil && tx.all.Load()
	if m.StampSet {
		stamp = m.Stamp // the message's flags stand for the socket's, as in the kernel
	}
	if !stamp {
		n, err := c.WriteMsg(vec, m.meta(), to, nil)
		if err != nil {
			return 0, errnoOf(err)
		}
		return n, 0
	}
	if tx == nil {
		tx = s.txQueue()
	}
	return e.sendStamped(fd, c, tx, vec, m.meta(), to)
}

// sendStamped is Send for a socket with transmit stamps on: the stack's
// send is stamped as its frame goes on the ring (with the frame, when the
// packet is looped back); one the stack handed its kernel socket (too
// long for a frame) the kernel stamps itself, in its own error queue.
func (e *Engine) sendStamped(fd int, c *stack.UDPConn, tx *txStamps, vec [][]byte, m stack.SendMeta, to netip.AddrPort) (int, unix.Errno) {
	var ts stack.TxStamp
	if tx.looped() {
		frame := e.Scratch()
		defer e.PutScratch(frame)
		ts.Frame = *frame
	}
	n, err := c.WriteMsg(vec, m, to, &ts)
	if err != nil {
		return 0, errnoOf(err)
	}
	if ts.At != 0 {
		e.stampSend(fd, c, tx, ts.At, ts.Frame[:ts.Looped])
	}
	return n, 0
}

// SentOS counts what fd's kernel socket sent when Send passed it
// (ErrPassOS): packets datagrams, bytes in all, in its stack socket's
// counters (tx_os), as the stack counts those it sends through the kernel
// socket itself. The interposer calls it once the kernel has sent them.
func (e *Engine) SentOS(fd, packets, bytes int) {
	s := e.get(fd)
	if s == nil {
		return
	}
	p, b := uint64(packets), uint64(bytes)
	c := s.conn.Load()
	if c == nil {
		// A candidate whose stack is opening: adopt moves these over.
		s.osTxPackets.Add(p)
		s.osTxBytes.Add(b)
		if c = s.conn.Load(); c == nil {
			return
		}
		p, b = s.osTxPackets.Swap(0), s.osTxBytes.Swap(0)
	}
	c.Counters.TxOSPackets.Add(p)
	c.Counters.TxOSBytes.Add(b)
}

// passSend hands a send to the kernel socket (ErrPassOS) once what the
// stack socket c (nil: none) left on its TX ring has gone: the datagrams
// leave in the order sent.
func passSend(c *stack.UDPConn) unix.Errno {
	if c != nil {
		c.FlushSends()
	}
	return ErrPassOS
}

// Scratch lends a 64 KiB buffer for gathering and scattering iovecs;
// return it with PutScratch.
func (e *Engine) Scratch() *[]byte { return e.scratch.Get().(*[]byte) }

// PutScratch returns a buffer from Scratch.
func (e *Engine) PutScratch(b *[]byte) { e.scratch.Put(b) }
