package stack

import (
	"io"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/steer"
)

// TCP connections on netstack: net.Conn for Go programs, and the calls
// with the kernel's semantics (never blocking, errors as errnos, socket
// options by their Linux numbers) for the engine, which serves an
// application's socket calls and does its own waiting.

// TCPConn is a TCP connection netstack serves. Its 5-tuple has a steering
// rule of its own, so that it outlives its listener; a connection this
// stack opened also holds its local port in a kernel socket.
type TCPConn struct {
	*gonet.TCPConn
	st   *Stack
	ep   tcpip.Endpoint
	wq   *waiter.Queue
	rule steer.RuleID
	kfd  int // the kernel socket that holds the local port, or -1
	once sync.Once
	// twSince is when reapTCP first saw the closed connection in
	// TIME-WAIT, and ruleGone says its rule is released (releaseRule);
	// both under the tcpState's mu while it is listed in closing.
	twSince  time.Time
	ruleGone bool
	// mapped: the application's socket is AF_INET6 (SetMapped), so the
	// kernel socket ToKernel makes is one too, with IPv4-mapped names.
	mapped atomic.Bool

	// The readers and writers of ReadNonblock and WriteNonblock, kept so
	// that a call allocates nothing.
	rmu sync.Mutex
	rw  tcpip.SliceWriter
	// fin: a FIN from the peer reached netstack (finArriving).
	fin atomic.Bool
	key tcpKey
	// inlineSegs: a drain of Poll's holds the endpoint, with this many
	// segments queued for processInline (tcpinline.go). Under the
	// stack's rxMu.
	inlineSegs int
	// ackOwed: on the link's owed list (tcpLink.oweAck). Under the
	// link's owedMu. settleDue: the settle under way settles it (under
	// the link's settleMu).
	ackOwed   bool
	settleDue bool
	// sets counts the TCPPollers (epoll sets) the connection is in: a
	// thread that waits on one of them answers it (tcpLink.hold).
	sets atomic.Int32
	wmu  sync.Mutex
	wr   gatherReader
	coal coalesceState // coalesced writes (coalesce.go), under wmu
	// wrShut: the write side is shut (Shutdown, Close: push), and
	// appCork and appNoDelay are TCP_CORK and TCP_NODELAY as the
	// application set them, which the endpoint no longer follows
	// (shutOption). Under optMu.
	optMu      sync.Mutex
	wrShut     bool
	appCork    bool
	appNoDelay bool
	// acksCarried: the connection's bare ACKs the link dropped, a later
	// segment carrying them (tcpLink.dropHeld). netstack counted them
	// sent; Info's Segs_out does not, as they never left.
	acksCarried atomic.Uint64
}

// gatherReader is the payload of one netstack Write: a send's buffers
// (writev, sendmsg) in order, read without copying them first. netstack
// sends each Write as segments of its own with TCP_NODELAY, so a send is
// one Write, as it is one send for the kernel: memcached's replies (a
// sendmsg of a header, the value and "END") left as three segments, and
// the peer acknowledged between them. It keeps its own array of the
// buffers: holding the caller's would move that to the heap, an
// allocation per send; a send of more than maxGather buffers takes a
// Write for each maxGather.
type gatherReader struct {
	vec  [maxGather][]byte
	bufs [][]byte // what is left: bufs[0][off:], then the rest
	off  int
	left int
}

const maxGather = 16

// reset takes up to maxGather of bufs and says how many.
func (r *gatherReader) reset(bufs [][]byte) int {
	n := copy(r.vec[:], bufs)
	clear(r.vec[n:])
	r.bufs, r.off, r.left = r.vec[:n], 0, 0
	for _, b := range r.bufs {
		r.left += len(b)
	}
	return n
}

// Len is the bytes left to read (tcpip.Payloader).
func (r *gatherReader) Len() int { return r.left }

func (r *gatherReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && len(r.bufs) > 0 {
		k := copy(p[n:], r.bufs[0][r.off:])
		n += k
		r.off += k
		if r.off == len(r.bufs[0]) {
			r.bufs, r.off = r.bufs[1:], 0
		}
	}
	r.left -= n
	return n, nil
}

// WaitPoint tells the stack that the application receives or is about
// to wait: what its sends left on the TX rings goes now, and its next
// send kicks at once (see kick.go). The engine calls it before its
// receives and waits.
func (c *TCPConn) WaitPoint() { c.st.waitPoint() }

// Close closes the connection as netstack does (FIN, or RST with unread
// data); its rule and port stay until netstack has finished with it.
func (c *TCPConn) Close() error {
	c.wmu.Lock()
	c.coal.shut = true
	if !c.flushCoalescedLocked() {
		c.coal.then = thenClose // once they went (flushCoalesced)
		c.wmu.Unlock()
		return nil
	}
	c.wmu.Unlock()
	return c.closeNow()
}

// closeNow is Close once no coalesced bytes are left.
func (c *TCPConn) closeNow() error {
	c.push()
	err := c.TCPConn.Close()
	c.once.Do(func() {
		t := c.st.tcp.Load()
		if t == nil {
			c.release()
			return
		}
		t.mu.Lock()
		t.closing = append(t.closing, c)
		t.mu.Unlock()
	})
	return err
}

// releaseRule removes the connection's steering rule: netstack gets its
// late segments through its listener's rule, if one still steers them,
// and the kernel answers them with a reset otherwise.
func (c *TCPConn) releaseRule() {
	if c.ruleGone {
		return
	}
	c.ruleGone = true
	c.st.tcpConns.CompareAndDelete(c.key, c)
	c.st.removeRule(c.rule)
}

// release removes the connection's rule and kernel socket.
func (c *TCPConn) release() {
	c.releaseRule()
	if c.kfd >= 0 {
		highfd.Close(c.kfd)
		c.kfd = -1
	}
}

// State is netstack's TCP state of the connection.
func (c *TCPConn) State() tcp.EndpointState { return tcp.EndpointState(c.ep.State()) }

// Rule is the connection's steering rule.
func (c *TCPConn) Rule() steer.RuleID { return c.rule }

// StateName is the TCP state as the kernel names it (ESTABLISHED...).
func (c *TCPConn) StateName() string { return c.State().String() }

// TCPStateName names a kernel socket's TCP state (TCP_INFO's tcpi_state)
// as StateName names netstack's, which numbers its states as Linux does.
func TCPStateName(state uint8) string { return tcp.EndpointState(state).String() }

// Connecting says whether the connection waits for the peer's SYN-ACK.
func (c *TCPConn) Connecting() bool {
	switch c.State() {
	case tcp.StateConnecting, tcp.StateSynSent, tcp.StateSynRecv:
		return true
	}
	return false
}

// Established says whether the handshake completed and the connection
// has not been reset since: it may carry data (one direction may be
// shut).
func (c *TCPConn) Established() bool {
	switch c.State() {
	case tcp.StateEstablished, tcp.StateFinWait1, tcp.StateFinWait2, tcp.StateTimeWait, tcp.StateCloseWait, tcp.StateLastAck, tcp.StateClosing:
		return true
	}
	return false
}

// Closing says whether the connection still exchanges its closing
// segments (FIN-WAIT, CLOSING, LAST-ACK); TIME-WAIT and CLOSED are done.
func (c *TCPConn) Closing() bool {
	switch c.State() {
	case tcp.StateFinWait1, tcp.StateFinWait2, tcp.StateClosing, tcp.StateLastAck:
		return true
	}
	return false
}

// Stack is the connection's stack.
func (c *TCPConn) Stack() *Stack { return c.st }

// Addrs are the connection's local and remote addresses.
func (c *TCPConn) Addrs() (local, remote netip.AddrPort) {
	if la, err := c.ep.GetLocalAddress(); err == nil {
		local = netip.AddrPortFrom(netip.AddrFrom4(la.Addr.As4()), la.Port)
	}
	if ra, err := c.ep.GetRemoteAddress(); err == nil {
		remote = netip.AddrPortFrom(netip.AddrFrom4(ra.Addr.As4()), ra.Port)
	}
	return local, remote
}

// TCPEvents are what a connection is ready for, as poll(2) reports it.
type TCPEvents uint8

const (
	TCPReadable   TCPEvents = 1 << iota // data, the peer's FIN, or an error to read
	TCPWritable                         // room in the send buffer
	TCPReadHangup                       // the peer sent its FIN (EPOLLRDHUP)
	TCPHangup                           // both directions are closed (POLLHUP)
	TCPError                            // an error is pending (POLLERR)
)

const tcpEventMask = waiter.ReadableEvents | waiter.WritableEvents | waiter.EventRdHUp | waiter.EventHUp | waiter.EventErr

func tcpEvents(m waiter.EventMask) TCPEvents {
	var ev TCPEvents
	if m&waiter.ReadableEvents != 0 {
		ev |= TCPReadable
	}
	if m&waiter.WritableEvents != 0 {
		ev |= TCPWritable
	}
	if m&waiter.EventRdHUp != 0 {
		ev |= TCPReadHangup
	}
	if m&waiter.EventHUp != 0 {
		ev |= TCPHangup
	}
	if m&waiter.EventErr != 0 {
		ev |= TCPError
	}
	return ev
}

// Events is what the connection is ready for now.
func (c *TCPConn) Events() TCPEvents { return tcpEvents(c.ep.Readiness(tcpEventMask)) }

// Notify calls fn with the events netstack signals (on netstack's
// goroutines, which may hold its locks: fn must not call into netstack);
// cancel stops it.
func (c *TCPConn) Notify(fn func(TCPEvents)) (cancel func()) {
	e := waiter.NewFunctionEntry(tcpEventMask, func(m waiter.EventMask) {
		ev := tcpEvents(m)
		if ev&TCPReadable != 0 && c.fin.Load() {
			ev |= TCPReadHangup
		}
		fn(ev)
	})
	c.wq.EventRegister(&e)
	return func() { c.wq.EventUnregister(&e) }
}

// ReadNonblock reads what the connection has into b (with peek, leaving
// it there): 0 and no error at the end of the stream, unix.EAGAIN when
// there is nothing yet.
func (c *TCPConn) ReadNonblock(b []byte, peek bool) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	c.rw = b
	res, terr := c.ep.Read(&c.rw, tcpip.ReadOptions{Peek: peek})
	c.rw = nil
	switch terr.(type) {
	case nil:
		return res.Count, nil
	case *tcpip.ErrClosedForReceive:
		return 0, nil
	}
	return 0, tcpipErrno(terr)
}

// WriteNonblock queues what of bufs (the first maxGather), in order, the
// send buffer has room for, in one netstack Write (more: MSG_MORE, which netstack does not
// implement), and returns unix.EAGAIN when it has none; unix.EPIPE once
// the connection cannot send any more.
func (c *TCPConn) WriteNonblock(bufs [][]byte, more bool) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.wr.reset(bufs); c.wr.left == 0 {
		return 0, nil
	}
	gen := c.st.coalesceGen.Load()
	if n := c.wr.left; len(bufs) <= maxGather && c.coalesce(bufs, n, more, gen) {
		c.wr.reset(nil)
		return n, nil
	}
	if len(c.coal.buf) > 0 {
		if !c.flushCoalescedLocked() {
			return 0, c.coalescedErr()
		}
		c.wr.reset(bufs) // the flush's Write read another payload
	}
	c.wroteDirect(gen)
	c.st.tcpAppSends.Add(1)
	n, terr := c.ep.Write(&c.wr, tcpip.WriteOptions{More: more})
	c.st.tcpAppSends.Add(-1)
	c.wr.reset(nil)
	if terr != nil {
		if _, closed := terr.(*tcpip.ErrClosedForSend); closed {
			return 0, unix.EPIPE
		}
		return 0, tcpipErrno(terr)
	}
	return int(n), nil
}

// Shutdown closes one or both directions (unix.SHUT_RD, SHUT_WR, SHUT_RDWR).
func (c *TCPConn) Shutdown(how int) error {
	var f tcpip.ShutdownFlags
	switch how {
	case unix.SHUT_RD:
		f = tcpip.ShutdownRead
	case unix.SHUT_WR:
		f = tcpip.ShutdownWrite
	case unix.SHUT_RDWR:
		f = tcpip.ShutdownRead | tcpip.ShutdownWrite
	default:
		return unix.EINVAL
	}
	if f&tcpip.ShutdownWrite != 0 {
		c.wmu.Lock()
		c.coal.shut = true
		if !c.flushCoalescedLocked() {
			// The FIN goes after them (flushCoalesced); the read side
			// shuts now.
			c.coal.then = thenShut
			c.wmu.Unlock()
			if f &^= tcpip.ShutdownWrite; f == 0 {
				return nil
			}
		} else {
			c.wmu.Unlock()
			c.push()
		}
	}
	if terr := c.ep.Shutdown(f); terr != nil {
		return tcpipErrno(terr)
	}
	return nil
}

// shutWrite shuts the write side once coalesced bytes left before a
// shutdown or a close have gone (flushCoalesced).
func (c *TCPConn) shutWrite() {
	c.push()
	c.ep.Shutdown(tcpip.ShutdownWrite)
}

// push sends what TCP_CORK or Nagle's algorithm holds back, as the kernel
// sends its pending data with the FIN of a close or a shutdown, Nagle
// off: netstack held it behind the FIN until its cork timer (200 ms) or
// the peer's acknowledgement, and nginx's every HTTP/1.0 answer (sendfile
// with tcp_nopush, then close) took 200 ms.
//
// The endpoint keeps both off from then on: the application writes no
// more, and the kernel holds neither the data before a FIN nor the FIN
// for them. Given back to the endpoint, TCP_CORK held for good what the
// peer's window had not let go yet: netstack's uncorking disarms its cork
// timer and leaves it marked armed, so the tail under the restored cork
// waited for a timer that never came (nginx answering pipelined
// keep-alive requests, then its lingering close's shutdown: 376 bytes and
// the FIN never left; TestRunTCPNginx failed 6 runs in 30 under load, 0
// in 30 since). getsockopt still reads what the application set.
func (c *TCPConn) push() {
	so := c.ep.SocketOptions()
	c.optMu.Lock()
	defer c.optMu.Unlock()
	if c.wrShut {
		return
	}
	c.appCork, c.appNoDelay = so.GetCorkOption(), !so.GetDelayOption()
	c.wrShut = true
	if c.appCork {
		so.SetCorkOption(false) // sends what it held
	}
	if !c.appNoDelay {
		so.SetDelayOption(false)
	}
}

// shutOption is where the application's view of an option the endpoint
// no longer follows is kept (push), or nil. Caller holds optMu.
func (c *TCPConn) shutOption(level, name int) *bool {
	if !c.wrShut || level != unix.IPPROTO_TCP {
		return nil
	}
	switch name {
	case unix.TCP_CORK:
		return &c.appCork
	case unix.TCP_NODELAY:
		return &c.appNoDelay
	}
	return nil
}

// Abort resets the connection (close with SO_LINGER 0); coalesced bytes
// go with it, as the kernel's send queue does.
func (c *TCPConn) Abort() {
	c.wmu.Lock()
	c.coal.buf = c.coal.buf[:0]
	c.wmu.Unlock()
	c.ep.Abort()
}

// flushWrites writes the coalesced bytes before a call that reads or
// changes the send side (SIOCOUTQ, TCP_INFO, an option, a move to the
// kernel).
func (c *TCPConn) flushWrites() {
	c.wmu.Lock()
	c.flushCoalescedLocked()
	c.wmu.Unlock()
}

// Write is net.Conn's, after the coalesced bytes of the engine's writes.
func (c *TCPConn) Write(b []byte) (int, error) {
	c.flushWrites()
	return c.TCPConn.Write(b)
}

// Unread is the bytes received and not yet read (FIONREAD).
func (c *TCPConn) Unread() int {
	n, terr := c.ep.GetSockOptInt(tcpip.ReceiveQueueSizeOption)
	if terr != nil || n < 0 {
		return 0
	}
	return n
}

// Unacked is the bytes written and not yet acknowledged by the peer, sent
// or not (SIOCOUTQ, as the kernel's write_seq - snd_una); 0 while the
// connection is not established yet, or no more. netstack's
// GetSockOptInt does not serve SendQueueSizeOption for TCP: its send
// buffer's use is read from the endpoint's state (connState).
func (c *TCPConn) Unacked() int {
	c.flushWrites()
	var s tcp.TCPEndpointState
	if !c.connState(&s) {
		return 0
	}
	return max(s.SndBufState.SndBufUsed, 0)
}

// connState copies the endpoint's state into s while it is connected,
// and says whether it was; netstack copies it whole for its probes (no
// per-packet call uses it).
func (c *TCPConn) connState(s *tcp.TCPEndpointState) bool {
	ep, ok := c.ep.(*tcp.Endpoint)
	if !ok {
		return false
	}
	ep.LockUser()
	defer ep.UnlockUser()
	switch ep.EndpointState() {
	case tcp.StateEstablished, tcp.StateFinWait1, tcp.StateFinWait2, tcp.StateTimeWait, tcp.StateCloseWait, tcp.StateLastAck, tcp.StateClosing:
		// Connected: the endpoint has its sender, which the copy reads.
	default:
		return false
	}
	tcpCompleteStateLocked(ep, s)
	return true
}

// MSS is TCP_MAXSEG as the kernel reads it: connected, the most payload
// a segment carries (the peer's MSS less the room netstack keeps for its
// options); before, what TCP_MAXSEG set, or netstack's default.
func (c *TCPConn) MSS() int {
	var s tcp.TCPEndpointState
	if c.connState(&s) && s.Sender.MaxPayloadSize > 0 {
		return s.Sender.MaxPayloadSize
	}
	v, terr := c.ep.GetSockOptInt(tcpip.MaxSegOption)
	if terr != nil {
		return 0
	}
	return v
}

// SetCongestion is TCP_CONGESTION: one of the algorithms netstack has
// (Congestions), unix.ENOENT for another, as the kernel for one it lacks.
func (c *TCPConn) SetCongestion(name string) error { return setCongestion(c.ep, name) }

func setCongestion(ep tcpip.Endpoint, name string) error {
	o := tcpip.CongestionControlOption(name)
	if terr := ep.SetSockOpt(&o); terr != nil {
		return tcpipErrno(terr)
	}
	return nil
}

// Congestion is the connection's congestion control algorithm.
func (c *TCPConn) Congestion() string {
	var o tcpip.CongestionControlOption
	if terr := c.ep.GetSockOpt(&o); terr != nil {
		return ""
	}
	return string(o)
}

// Congestions are the congestion control algorithms netstack has.
func (st *Stack) Congestions() []string {
	t := st.tcp.Load()
	if t == nil {
		return nil
	}
	var o tcpip.TCPAvailableCongestionControlOption
	if terr := t.ns.TransportProtocolOption(tcp.ProtocolNumber, &o); terr != nil {
		return nil
	}
	return strings.Fields(string(o))
}

// SoError takes the pending error (SO_ERROR): 0 when none.
func (c *TCPConn) SoError() unix.Errno {
	terr := c.ep.LastError()
	if terr == nil {
		return 0
	}
	if errno, ok := tcpipErrno(terr).(unix.Errno); ok {
		return errno
	}
	return unix.EIO
}

// SetOption sets an integer socket option by its Linux level and name;
// unix.ENOPROTOOPT for one netstack has no equivalent of.
func (c *TCPConn) SetOption(level, name, v int) error {
	c.flushWrites()
	c.optMu.Lock()
	defer c.optMu.Unlock()
	if o := c.shutOption(level, name); o != nil {
		*o = v != 0
		return nil
	}
	return setOption(c.ep, level, name, v)
}

func setOption(ep tcpip.Endpoint, level, name, v int) error {
	so := ep.SocketOptions()
	var terr tcpip.Error
	switch {
	case level == unix.IPPROTO_TCP && name == unix.TCP_NODELAY:
		so.SetDelayOption(v == 0)
	case level == unix.IPPROTO_TCP && name == unix.TCP_CORK:
		so.SetCorkOption(v != 0)
	case level == unix.IPPROTO_TCP && name == unix.TCP_QUICKACK:
		so.SetQuickAck(v != 0)
	case level == unix.IPPROTO_TCP && name == unix.TCP_KEEPIDLE:
		o := tcpip.KeepaliveIdleOption(time.Duration(v) * time.Second)
		terr = ep.SetSockOpt(&o)
	case level == unix.IPPROTO_TCP && name == unix.TCP_KEEPINTVL:
		o := tcpip.KeepaliveIntervalOption(time.Duration(v) * time.Second)
		terr = ep.SetSockOpt(&o)
	case level == unix.IPPROTO_TCP && name == unix.TCP_KEEPCNT:
		terr = ep.SetSockOptInt(tcpip.KeepaliveCountOption, v)
	case level == unix.IPPROTO_TCP && name == unix.TCP_USER_TIMEOUT:
		o := tcpip.TCPUserTimeoutOption(time.Duration(v) * time.Millisecond)
		terr = ep.SetSockOpt(&o)
	case level == unix.IPPROTO_TCP && name == unix.TCP_MAXSEG:
		terr = ep.SetSockOptInt(tcpip.MaxSegOption, v)
	case level == unix.SOL_SOCKET && name == unix.SO_KEEPALIVE:
		so.SetKeepAlive(v != 0)
	case level == unix.SOL_SOCKET && name == unix.SO_REUSEADDR:
		so.SetReuseAddress(v != 0)
	case level == unix.SOL_SOCKET && name == unix.SO_REUSEPORT:
		so.SetReusePort(v != 0)
	case level == unix.SOL_SOCKET && name == unix.SO_RCVBUF:
		so.SetReceiveBufferSize(2*int64(v), true) // the kernel doubles it too
	case level == unix.SOL_SOCKET && name == unix.SO_SNDBUF:
		so.SetSendBufferSize(2*int64(v), true)
	case level == unix.IPPROTO_IP && name == unix.IP_TOS:
		terr = ep.SetSockOptInt(tcpip.IPv4TOSOption, v)
	case level == unix.IPPROTO_IP && name == unix.IP_TTL:
		if v == -1 {
			v = 0 // the kernel's "back to the default"; netstack's is 0
		}
		terr = ep.SetSockOptInt(tcpip.IPv4TTLOption, v)
	case level == unix.IPPROTO_TCP && name == unix.TCP_SYNCNT:
		terr = ep.SetSockOptInt(tcpip.TCPSynCountOption, v)
	case level == unix.IPPROTO_TCP && name == unix.TCP_WINDOW_CLAMP:
		// 0 only before connect, as on the kernel (EINVAL after).
		terr = ep.SetSockOptInt(tcpip.TCPWindowClampOption, v)
	case level == unix.IPPROTO_TCP && name == unix.TCP_LINGER2:
		// Seconds in FIN-WAIT-2; < 0 skips it, 0 is the default, as on
		// the kernel.
		o := tcpip.TCPLingerTimeoutOption(time.Duration(v) * time.Second)
		terr = ep.SetSockOpt(&o)
	default:
		return unix.ENOPROTOOPT
	}
	if terr != nil {
		return tcpipErrno(terr)
	}
	return nil
}

// Option reads an integer socket option by its Linux level and name;
// unix.ENOPROTOOPT for one netstack has no equivalent of.
func (c *TCPConn) Option(level, name int) (int, error) {
	so := c.ep.SocketOptions()
	b := func(v bool) (int, error) {
		if v {
			return 1, nil
		}
		return 0, nil
	}
	c.optMu.Lock()
	o := c.shutOption(level, name)
	set := o != nil && *o
	c.optMu.Unlock()
	if o != nil {
		return b(set)
	}
	switch {
	case level == unix.IPPROTO_TCP && name == unix.TCP_NODELAY:
		return b(!so.GetDelayOption())
	case level == unix.IPPROTO_TCP && name == unix.TCP_CORK:
		return b(so.GetCorkOption())
	case level == unix.IPPROTO_TCP && name == unix.TCP_KEEPIDLE:
		var o tcpip.KeepaliveIdleOption
		if terr := c.ep.GetSockOpt(&o); terr != nil {
			return 0, tcpipErrno(terr)
		}
		return int(time.Duration(o) / time.Second), nil
	case level == unix.IPPROTO_TCP && name == unix.TCP_KEEPINTVL:
		var o tcpip.KeepaliveIntervalOption
		if terr := c.ep.GetSockOpt(&o); terr != nil {
			return 0, tcpipErrno(terr)
		}
		return int(time.Duration(o) / time.Second), nil
	case level == unix.IPPROTO_TCP && name == unix.TCP_KEEPCNT:
		v, terr := c.ep.GetSockOptInt(tcpip.KeepaliveCountOption)
		if terr != nil {
			return 0, tcpipErrno(terr)
		}
		return v, nil
	case level == unix.IPPROTO_TCP && name == unix.TCP_USER_TIMEOUT:
		var o tcpip.TCPUserTimeoutOption
		if terr := c.ep.GetSockOpt(&o); terr != nil {
			return 0, tcpipErrno(terr)
		}
		return int(time.Duration(o) / time.Millisecond), nil
	case level == unix.IPPROTO_TCP && name == unix.TCP_MAXSEG:
		return c.MSS(), nil
	case level == unix.IPPROTO_TCP && name == unix.TCP_WINDOW_CLAMP:
		v, terr := c.ep.GetSockOptInt(tcpip.TCPWindowClampOption)
		if terr != nil {
			return 0, tcpipErrno(terr)
		}
		return v, nil
	case level == unix.IPPROTO_TCP && name == unix.TCP_QUICKACK:
		return b(so.GetQuickAck())
	case level == unix.IPPROTO_TCP && name == unix.TCP_SYNCNT:
		v, terr := c.ep.GetSockOptInt(tcpip.TCPSynCountOption)
		if terr != nil {
			return 0, tcpipErrno(terr)
		}
		return v, nil
	case level == unix.IPPROTO_TCP && name == unix.TCP_LINGER2:
		var o tcpip.TCPLingerTimeoutOption
		if terr := c.ep.GetSockOpt(&o); terr != nil {
			return 0, tcpipErrno(terr)
		}
		if o < 0 {
			return -1, nil
		}
		return int(time.Duration(o) / time.Second), nil
	case level == unix.IPPROTO_IP && name == unix.IP_TOS:
		v, terr := c.ep.GetSockOptInt(tcpip.IPv4TOSOption)
		if terr != nil {
			return 0, tcpipErrno(terr)
		}
		return v, nil
	case level == unix.IPPROTO_IP && name == unix.IP_TTL:
		v, terr := c.ep.GetSockOptInt(tcpip.IPv4TTLOption)
		if terr != nil {
			return 0, tcpipErrno(terr)
		}
		if v == 0 { // netstack's default: the route's, which is the kernel's
			return c.st.defaultOption(unix.IPPROTO_IP, unix.IP_TTL), nil
		}
		return v, nil
	case level == unix.SOL_SOCKET && name == unix.SO_KEEPALIVE:
		return b(so.GetKeepAlive())
	case level == unix.SOL_SOCKET && name == unix.SO_RCVBUF:
		return int(so.GetReceiveBufferSize()), nil
	case level == unix.SOL_SOCKET && name == unix.SO_SNDBUF:
		return int(so.GetSendBufferSize()), nil
	case level == unix.SOL_SOCKET && name == unix.SO_ERROR:
		return int(c.SoError()), nil
	case level == unix.SOL_SOCKET && name == unix.SO_TYPE:
		return unix.SOCK_STREAM, nil
	case level == unix.SOL_SOCKET && name == unix.SO_DOMAIN:
		return unix.AF_INET, nil
	case level == unix.SOL_SOCKET && name == unix.SO_PROTOCOL:
		return unix.IPPROTO_TCP, nil
	case level == unix.SOL_SOCKET && name == unix.SO_ACCEPTCONN:
		return 0, nil
	}
	return 0, unix.ENOPROTOOPT
}

// SetLinger is SO_LINGER: with on and 0 seconds, close resets the
// connection; with on and more, close waits that long for the FIN's ack.
func (c *TCPConn) SetLinger(on bool, secs int) {
	c.ep.SocketOptions().SetLinger(tcpip.LingerOption{Enabled: on, Timeout: time.Duration(secs) * time.Second})
}

// Linger is SO_LINGER's setting.
func (c *TCPConn) Linger() (on bool, secs int) {
	l := c.ep.SocketOptions().GetLinger()
	return l.Enabled, int(l.Timeout / time.Second)
}

// Info fills TCP_INFO's fields netstack keeps: state, congestion state,
// retransmissions, RTO, RTT and its variation, congestion window and
// threshold, the MSS sent and advertised, the options agreed (timestamps,
// SACK, window scaling), segments unacknowledged and SACKed, and
// segments in and out.
func (c *TCPConn) Info() unix.TCPInfo {
	c.flushWrites()
	var o tcpip.TCPInfoOption
	var ti unix.TCPInfo
	if terr := c.ep.GetSockOpt(&o); terr != nil {
		return ti
	}
	// netstack numbers its states as Linux does (TCP_ESTABLISHED = 1...).
	ti.State = uint8(o.State)
	ti.Ca_state = uint8(o.CcState)
	ti.Rto = uint32(o.RTO / time.Microsecond)
	ti.Rtt = uint32(o.RTT / time.Microsecond)
	ti.Rttvar = uint32(o.RTTVar / time.Microsecond)
	ti.Snd_cwnd = o.SndCwnd
	ti.Snd_ssthresh = o.SndSsthresh
	ti.Advmss = uint32(c.st.tcpMTU() - header.IPv4MinLen - header.TCPMinLen)
	var s tcp.TCPEndpointState
	if c.connState(&s) {
		if s.SendTSOk {
			ti.Advmss -= tcpTimestampsLen // as the kernel's, once timestamps are agreed
		}
		ti.Snd_mss = uint32(s.Sender.MaxPayloadSize)
		ti.Unacked = uint32(max(s.Sender.Outstanding, 0))
		ti.Sacked = uint32(max(s.Sender.SackedOut, 0))
		if s.SendTSOk {
			ti.Options |= tcpiOptTimestamps
		}
		if s.SACKPermitted {
			ti.Options |= tcpiOptSACK
		}
		// Window scaling is agreed when both SYNs carry the option;
		// netstack keeps scales of 0 when they do not. (The scales
		// themselves are bit fields x/sys's TCPInfo leaves out.)
		if s.Sender.SndWndScale > 0 || s.Receiver.RcvWndScale > 0 {
			ti.Options |= tcpiOptWscale
		}
	} else {
		ti.Snd_mss = uint32(c.MSS())
	}
	if st, ok := c.ep.Stats().(*tcp.Stats); ok {
		ti.Total_retrans = uint32(st.SendErrors.Retransmits.Value())
		ti.Segs_out = uint32(st.SegmentsSent.Value() - c.acksCarried.Load())
		ti.Segs_in = uint32(st.SegmentsReceived.Value())
	}
	return ti
}

// TCP_INFO's tcpi_options bits (linux/tcp.h), and the room the timestamps
// option takes in a segment (TCPOLEN_TSTAMP_ALIGNED).
const (
	tcpTimestampsLen  = 12
	tcpiOptTimestamps = 1
	tcpiOptSACK       = 2
	tcpiOptWscale     = 4
)
