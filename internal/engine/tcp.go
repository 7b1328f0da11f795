package engine

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/internal/rules"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stats"
)

// TCP sockets (VMAXDP_TCP=1). A listener stays the application's kernel
// socket, which holds the port and takes the connections that come
// another way (loopback, other interfaces); netstack listens beside it on
// the interface (stack.NetstackListener), and accept returns both kinds.
// A connection netstack accepted gets a real fd of its own: one end of a
// Unix socket pair, whose other end the engine keeps and uses to mirror
// netstack's readiness into the kernel's (a byte queued while netstack
// has data or the peer's FIN, the end made unwritable while netstack's
// send buffer is full, shutdowns for the peer's FIN and reset). So poll,
// select and epoll, with every flag, keep working on the kernel alone,
// with any mix of fds; fstat, dup and close behave; and the data calls
// (read, write, recv, send and the rest) come to the engine, which serves
// them from netstack.

// tcpListener is an offloaded listening socket.
type tcpListener struct {
	nl *stack.NetstackListener
	v6 bool // an AF_INET6 listener: its connections are AF_INET6 sockets, with IPv4-mapped addresses
	// forking: in handover since a fork began, to go to the kernel once
	// it returns (handoverAtFork).
	forking atomic.Bool
	cancel  func()
	refs    atomic.Int32 // fds naming it (dup)
	ifname  string
	backlog int
	// accepted counts the connections accept handed out, netstack's
	// and the kernel's.
	accepted, acceptedOS atomic.Uint64
	// multiplexed: the process waited for it in poll, select or epoll
	// (keepAtFork).
	multiplexed atomic.Bool
	// handoff is the queue of the connections netstack completed as the
	// process forked, set then (handoff.go).
	handoff *handoff
	// wake is an eventfd readable while netstack may have a connection
	// waiting (marked), for the multiplexers' sleeps; arrivals counts
	// netstack's notices, for EPOLLET.
	wake     int
	mu       sync.Mutex
	marked   bool
	arrivals atomic.Uint64
	// opts are the kernel socket's options accept reads, kept until the
	// application sets an option on the listener (OptionSet bumps
	// optsGen): 18 getsockopt calls at every accept otherwise.
	opts    atomic.Pointer[listenerOptions]
	optsGen atomic.Uint64
}

// listenerOptions are a listener's options as of generation gen.
type listenerOptions struct {
	gen      uint64
	rcvtimeo time.Duration        // accept's timeout (SO_RCVTIMEO), 0: none
	conn     *stack.KernelOptions // the accepted connections'
	err      error                // why conn could not be read
}

// ListenerOptionSet is called after the application set an option on fd:
// an offloaded listener's options are read again at its next accept.
func (e *Engine) ListenerOptionSet(fd int) {
	if l := e.listener(fd); l != nil {
		l.optsGen.Add(1)
	}
}

// options returns the listener's options, read off its kernel socket fd
// when the application set one since they were last read.
func (l *tcpListener) options(fd int) *listenerOptions {
	gen := l.optsGen.Load()
	if o := l.opts.Load(); o != nil && o.gen == gen {
		return o
	}
	o := &listenerOptions{gen: gen}
	if tv, err := unix.GetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO); err == nil && tv.Nano() > 0 {
		o.rcvtimeo = time.Duration(tv.Nano())
	}
	o.conn, o.err = l.nl.KernelOptions(fd)
	l.opts.Store(o)
	return o
}

func (l *tcpListener) mark() {
	l.arrivals.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.marked {
		unix.Write(l.wake, one[:])
		l.marked = true
	}
}

// settle unmarks the wake eventfd when no connection waits. It asks
// netstack with no lock of its own held: netstack may notify (mark) with
// its locks held.
func (l *tcpListener) settle() {
	l.mu.Lock()
	marked := l.marked
	l.mu.Unlock()
	if !marked || l.nl.Pending() {
		return
	}
	l.mu.Lock()
	if l.marked {
		var b [8]byte
		unix.Read(l.wake, b[:])
		l.marked = false
	}
	l.mu.Unlock()
	if l.nl.Pending() { // a notice came between the look and the read
		l.mark()
	}
}

// tcpConn is an offloaded connection, named by the application's end of
// a Unix socket pair (app) whose other end (eng) the engine keeps.
type tcpConn struct {
	c        *stack.TCPConn
	v6       bool // accepted on an AF_INET6 listener
	app, eng int
	cancel   func()
	refs     atomic.Int32 // fds naming it (dup)
	ifname   string
	// The application's bytes and calls, for vmaxdp stats (the segments
	// are netstack's).
	rxBytes, txBytes, rxEagain, rxErrors, txErrors atomic.Uint64
	rxPollHit, rxPollMiss                          atomic.Uint64 // receives served without sleeping, and after
	nonblock                                       atomic.Bool
	rcvtimeo                                       atomic.Int64 // nanoseconds, 0: none
	sndtimeo                                       atomic.Int64
	// notices counts netstack's notices that may make a receive succeed,
	// for a receive that polls before it sleeps (pollRead); spin says how
	// long it polls (VMAXDP_RX_POLL auto); sentBefore is txBytes as the
	// last receive began.
	notices    atomic.Uint32
	spin       stack.Spin
	sentBefore atomic.Uint64
	// emptyAt is notices+1 as of a read that found nothing (0: none
	// did): until netstack's next notice, a receive need not ask
	// netstack again (TCPRecv).
	emptyAt atomic.Int64
	// eagainRun counts non-blocking receives in a row that found nothing:
	// spinningAfter of them, and the application spins on them.
	eagainRun atomic.Uint32
	// used: the application made a data call on the connection (a
	// receive or a send, splice and sendfile included), under way or
	// done; one not used yet moves to the kernel at fork (Forking).
	used atomic.Bool

	mu    sync.Mutex // the mirror's state below
	marks int        // bytes queued on app, readable: netstack has data
	// readers counts the receives under way on the connection; while
	// there are any, a notice that data came leaves app unmarked
	// (deferred) and the last of them marks it as it leaves if netstack
	// still has data. A receive that reads what came at once (every
	// request-response exchange) so costs no mirror byte either way,
	// where the byte's send and its settling read are two system calls
	// in each round trip's path (about 1.5 us a side, sockperf --tcp pp).
	readers  int
	deferred bool
	// sleepers counts the receives asleep on app (wait): a notice marks
	// it for them, whatever a set owes.
	sleepers int
	// sets counts the epoll sets the connection is a member of, and lazy
	// is the member that may owe its marks (owed.go), if any.
	sets int
	lazy *tcpMember
	// owedListed: on its set's owed list (owedSet.addLocked); not under mu.
	owedListed atomic.Bool
	full       bool // app made unwritable: netstack's send buffer is full
	rdhup      bool // eng shut for writing: the peer's FIN
	hangup     bool // eng shut both ways: the connection is over
	closed     bool // eng is closed: its number may name another file
	// junk is what block queued on eng to make app unwritable, and
	// bypassed the bytes beyond it unblockLocked took off eng: written
	// past the interposer (lost).
	junk, bypassed int
}

// maxMarks bounds the bytes queued on app: a byte per notice gives
// edge-triggered waiters an edge per segment, as the kernel does.
const maxMarks = 64

// junk is what app sends to make itself unwritable: its send buffer is
// set to the least, which one such write exceeds.
var junk [2048]byte

// notify mirrors netstack's events. It runs on netstack's goroutines and
// never calls into netstack.
func (t *tcpConn) notify(ev stack.TCPEvents) {
	if ev&^stack.TCPWritable != 0 {
		t.notices.Add(1)
	}
	t.mu.Lock()
	bell := t.notifyLocked(ev)
	t.mu.Unlock()
	if bell != nil {
		bell.ring()
	}
}

// notifyLocked is notify's, under t.mu; it returns the owed set whose
// bell the caller rings, if any.
func (t *tcpConn) notifyLocked(ev stack.TCPEvents) *owedSet {
	if t.closed {
		return nil
	}
	// The hangup first: the waiter the byte wakes must see it too. Once
	// eng is shut for writing, app reads as at its end for good, and no
	// byte is needed (nor can be sent).
	if ev&stack.TCPReadHangup != 0 {
		t.hangupLocked(stack.TCPReadHangup)
	}
	if ev&stack.TCPWritable != 0 {
		t.unblockLocked()
	}
	if ev&(stack.TCPHangup|stack.TCPError) != 0 {
		// netstack sends these with every other event on any change of
		// state: whether the connection ended is for its readiness to
		// say, which only a goroutine of ours may ask. That goroutine
		// marks app readable too, after the hangup: a waiter the byte
		// woke first saw POLLIN without POLLHUP and POLLERR (a keepalive
		// timeout), where the kernel reports them together.
		go t.refresh()
		return nil
	}
	if ev&stack.TCPReadable == 0 {
		return nil
	}
	if t.readers > 0 {
		t.deferred = true
		return nil
	}
	if t.sleepers == 0 && t.lazy != nil {
		o := &t.lazy.set.owed
		if owed, ring := o.owe(t, t.lazy.set.polls.Load()); owed {
			t.deferred = true
			if ring {
				return o
			}
			return nil
		}
	}
	t.markLocked()
	return nil
}

// markUsed notes a data call (tcpConn.used); a load first, so that the
// calls after the first write nothing.
func (t *tcpConn) markUsed() {
	if !t.used.Load() {
		t.used.Store(true)
	}
}

// end closes the engine's side of t: netstack's notices, the connection,
// the mirror's other end.
func (t *tcpConn) end() {
	t.cancel()
	t.c.Close()
	t.mu.Lock()
	t.closed = true
	highfd.Close(t.eng)
	t.mu.Unlock()
}

// lost counts what the application wrote on app past the interposer, for
// a connection no fd of the application's names any more (before end): a
// raw write(2) system call, a library's own (stdio's are moved to the
// kernel first: stdio.go). Those bytes reach eng, never the peer; eng
// receives nothing else but block's junk, so what lies beyond it is
// theirs.
func (t *tcpConn) lost() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, err := unix.IoctlGetInt(t.eng, unix.SIOCINQ)
	if err != nil {
		return t.bypassed
	}
	if t.full {
		n -= t.junk
	}
	return t.bypassed + max(n, 0)
}

// logLost logs, at WARNING, the bytes written past the interposer on t,
// which fd named last (lost).
func (e *Engine) logLost(fd int, t *tcpConn) {
	if n := t.lost(); n > 0 {
		local, remote := t.c.Addrs()
		e.Log.Printf(params.LevelWarning, "fd %d: tcp connection %s>%s: %d bytes written on it past vmaxdp (a raw write system call, or a library's own) reached its mirror, never the peer: lost (write them with the C library's write or send)", fd, local, remote, n)
	}
}

// beginRead: a receive is under way (tcpConn.readers). It says whether t
// is an event loop's connection: the lazy member of a set whose last wait
// polled (epollSet.polls).
func (t *tcpConn) beginRead() (loop bool) {
	t.mu.Lock()
	t.readers++
	loop = t.lazy != nil && t.lazy.set.polls.Load()
	t.mu.Unlock()
	return loop
}

// endRead: a receive ends or sleeps on app; the last one marks app if it
// left data a notice deferred the mark of. It asks netstack with no lock
// of its own held, as settleRead does.
func (t *tcpConn) endRead() {
	t.mu.Lock()
	t.readers--
	deferred := t.deferred && t.readers == 0
	if deferred {
		t.deferred = false
	}
	t.mu.Unlock()
	if deferred && t.c.Events()&stack.TCPReadable != 0 {
		t.notify(stack.TCPReadable)
	}
}

// markLocked queues a byte on app, which makes it readable.
func (t *tcpConn) markLocked() {
	if t.marks >= maxMarks || t.rdhup {
		return
	}
	// MSG_NOSIGNAL: the mirror's writes must never raise SIGPIPE in the
	// application.
	if n, _ := unix.SendmsgN(t.eng, junk[:1], nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL); n == 1 {
		t.marks++
	}
}

// refresh mirrors the hangups netstack's readiness shows.
func (t *tcpConn) refresh() {
	ev := t.c.Events()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.hangupLocked(ev)
	if ev&(stack.TCPReadable|stack.TCPHangup|stack.TCPError) != 0 {
		t.markLocked()
	}
}

// hangupLocked shuts eng down for the peer's FIN (app: EPOLLRDHUP) and
// for the end of the connection (app: POLLHUP). Caller holds t.mu.
func (t *tcpConn) hangupLocked(ev stack.TCPEvents) {
	switch {
	case ev&stack.TCPHangup != 0 && !t.hangup:
		// One shutdown for both: a waiter the first of two woke saw
		// POLLRDHUP without POLLHUP (a keepalive timeout), where the
		// kernel reports them together.
		t.unblockLocked()
		unix.Shutdown(t.eng, unix.SHUT_RDWR)
		t.rdhup, t.hangup = true, true
	case ev&stack.TCPReadHangup != 0 && !t.rdhup:
		unix.Shutdown(t.eng, unix.SHUT_WR)
		t.rdhup = true
	}
}

func (t *tcpConn) unblockLocked() {
	if !t.full {
		return
	}
	var b [4096]byte
	took := 0
	for {
		n, err := unix.Read(t.eng, b[:])
		if n <= 0 || err != nil {
			break
		}
		took += n
	}
	t.bypassed += max(took-t.junk, 0)
	t.full, t.junk = false, 0
}

// channels takes off eng the sockets forked children sent on app to
// claim the connection (claimedConn): each child claims its slot first,
// then sends, so a claim's channel may come a moment after the claim.
// What eng held besides was written past the interposer (lost). A claim
// cannot be sent while app is unwritable (full), so eng holds no junk
// before it.
func (t *tcpConn) channels() []int {
	var chans []int
	for try := 0; len(chans) == 0 && try < 10; try++ {
		if try > 0 {
			time.Sleep(time.Millisecond)
		}
		if chans = t.takeChannels(); chans == nil && t.isClosed() {
			break
		}
	}
	return chans
}

func (t *tcpConn) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// takeChannels is one look of channels'.
func (t *tcpConn) takeChannels() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	var chans []int
	var b [256]byte
	oob := make([]byte, unix.CmsgSpace(4))
	// Bounded: each read ends where the sender changes (a stream's reads
	// keep apart what different processes sent), a claim is one read,
	// and an application's own raw writes are few.
	for range 64 {
		n, oobn, _, _, err := unix.Recvmsg(t.eng, b[:], oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		if err != nil || n <= 0 {
			break
		}
		msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
		got := 0
		for i := range msgs {
			fds, _ := unix.ParseUnixRights(&msgs[i])
			chans = append(chans, fds...)
			got += len(fds)
		}
		t.bypassed += n - min(got, 1) // a claim's own byte is no loss
	}
	return chans
}

// settleRead takes app's bytes back once netstack has nothing to read.
func (t *tcpConn) settleRead() {
	t.mu.Lock()
	marks := t.marks
	t.mu.Unlock()
	if marks == 0 {
		return
	}
	ev := t.c.Events()
	if ev&stack.TCPReadable != 0 {
		return
	}
	t.mu.Lock()
	if t.marks > 0 {
		var b [maxMarks]byte
		// recvfrom(2) itself: unix.Recvfrom allocates the sender's
		// address at each call, one allocation a request.
		unix.Syscall6(unix.SYS_RECVFROM, uintptr(t.app), uintptr(unsafe.Pointer(&b[0])), uintptr(t.marks), unix.MSG_DONTWAIT, 0, 0)
		t.marks = 0
	}
	t.mu.Unlock()
	if ev = t.c.Events(); ev&stack.TCPReadable != 0 {
		t.notify(stack.TCPReadable)
	}
}

// block makes app unwritable after netstack's send buffer filled.
func (t *tcpConn) block() {
	t.mu.Lock()
	if !t.full && !t.hangup && !t.closed {
		if n, _ := unix.SendmsgN(t.app, junk[:], nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL); n > 0 {
			t.full, t.junk = true, n
		}
	}
	t.mu.Unlock()
	if t.c.Events()&stack.TCPWritable != 0 { // room came back meanwhile
		t.notify(stack.TCPWritable)
	}
}

// wait sleeps on app until events (POLLIN or POLLOUT) or the deadline
// (zero: none): EAGAIN when it passed, EINTR for a signal.
//
// A receive sleeps on its stack's queues as well when no other thread
// does (TCPConn.Sleep), and polls them once it wakes.
func (t *tcpConn) wait(events int16, deadline time.Time, sw *stack.SignalWait) unix.Errno {
	pfds := []unix.PollFd{{Fd: int32(t.app), Events: events}}
	if events == unix.POLLIN && t.c.Sleep() {
		defer func() {
			t.c.Woke()
			t.c.Poll()
		}()
		pfds = t.c.Stack().AppendQueues(pfds)
	} else {
		t.c.SleepOnMirror()
		defer t.c.WokeFromMirror()
	}
	var ts *unix.Timespec
	if !deadline.IsZero() {
		left := time.Until(deadline)
		if left <= 0 {
			return unix.EAGAIN
		}
		v := unix.NsecToTimespec(left.Nanoseconds())
		ts = &v
	}
	if _, err := sw.Ppoll(pfds, ts); err != nil {
		return errnoOf(err)
	}
	return 0
}

func (e *Engine) listener(fd int) *tcpListener {
	if fd < 0 || fd >= MaxFD {
		return nil
	}
	return e.listeners.Load(fd)
}

func (e *Engine) tcpConn(fd int) *tcpConn {
	if fd < 0 || fd >= MaxFD {
		return nil
	}
	return e.conns.Load(fd)
}

// epollListener follows an epoll_ctl the kernel accepted on the
// offloaded listener fd: its wake eventfd joins (or leaves, or changes
// in) the same epoll set with the same events and data, so that the set
// reports the listener readable when netstack has a connection waiting,
// and epoll_wait stays the kernel's own call. The kernel reports the
// listener's own readiness (a connection in the kernel's queue) beside
// it; an application that accepts until EAGAIN takes both.
func (e *Engine) epollListener(epfd, op, fd int, l *tcpListener, ev *unix.EpollEvent) {
	var err error
	switch op {
	case unix.EPOLL_CTL_ADD, unix.EPOLL_CTL_MOD:
		setOnce(&l.multiplexed)
		err = unix.EpollCtl(epfd, op, l.wake, ev)
	case unix.EPOLL_CTL_DEL:
		err = unix.EpollCtl(epfd, op, l.wake, nil)
	}
	if err != nil {
		e.Log.Printf(params.LevelWarning, "fd %d: epoll fd %d: netstack's connections are not reported there (its wake eventfd: %v): accept finds them when the kernel's do", fd, epfd, err)
	}
}

// stackWait bounds how long listen waits for its interface's stack.
const stackWait = 2 * time.Second

// stackNow returns ifname's stack, opening it and waiting for it.
func (e *Engine) stackNow(ifname string) (*stack.Stack, error) {
	deadline := time.Now().Add(stackWait)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tcpWanting[ifname]++
	defer func() { e.tcpWanting[ifname]-- }()
	for {
		if st := e.stacks[ifname]; st != nil {
			return st, nil
		}
		if err := e.stackErr[ifname]; err != nil {
			return nil, err
		}
		if _, started := e.opening[ifname]; !started {
			if err := e.startOpen(ifname); err != nil {
				return nil, err
			}
			if e.opening == nil {
				e.opening = map[string][]pendingAdopt{}
			}
			e.opening[ifname] = []pendingAdopt{}
		}
		done := e.opened[ifname]
		e.mu.Unlock()
		select {
		case <-done:
		case <-time.After(time.Until(deadline)):
		}
		e.mu.Lock()
		if time.Now().After(deadline) && e.stacks[ifname] == nil {
			return nil, fmt.Errorf("stack %s: not open after %v", ifname, stackWait)
		}
	}
}

// Listen is called before the kernel's listen on fd: with VMAXDP_TCP=1,
// an AF_INET stream socket the rules offload listens in netstack first
// (an unbound one is bound to a port as listen would), so that no SYN
// reaches the kernel's listener once it listens. Should the kernel's
// listen fail, the caller closes fd's offload (Close).
func (e *Engine) Listen(fd, backlog int) State {
	if fd < 0 || fd >= MaxFD {
		return StateOS
	}
	if l := e.listener(fd); l != nil {
		return StateOffloaded // listen again: the kernel took the new backlog
	}
	dom := streamDomain(fd)
	if dom != unix.AF_INET && (dom != unix.AF_INET6 || !e.p.TCP) {
		return StateOS
	}
	// An AF_INET6 listener that carries IPv4 (IPV6_V6ONLY off, on :: or
	// an IPv4-mapped address) has its IPv4 connections served as an
	// AF_INET one's; its IPv6 ones stay the kernel's.
	local, _, err := stack.SockAddrs(fd)
	if err == nil && local.Port() == 0 {
		// listen binds an unbound socket to a port of the kernel's choice;
		// netstack needs the port before.
		var sa unix.Sockaddr = &unix.SockaddrInet4{Addr: local.Addr().As4()}
		if dom == unix.AF_INET6 {
			sa = &unix.SockaddrInet6{}
		}
		if err := unix.Bind(fd, sa); err != nil {
			return StateOS // the kernel's listen says why
		}
		local, _, err = stack.SockAddrs(fd)
	}
	if err != nil {
		local6, _ := sockAddrs6(fd)
		return e.tcpNotOffloaded(fd, socketWhat(rules.TCPServer, local6, netip.AddrPort{}), ipv6Only("TCP", err))
	}
	what := socketWhat(rules.TCPServer, local, netip.AddrPort{})
	if !e.p.TCP {
		e.Log.Printf(params.LevelDebug, "fd %d: not offloaded: %s: %sTCP=0", fd, what, params.Prefix)
		return StateOS
	}
	_, cause := e.ruleDecision(rules.TCPServer, local, netip.AddrPort{})
	if cause != "" {
		return e.tcpNotOffloaded(fd, what, cause)
	}
	if n, _ := e.stream(fd); n.selects != "" && reusePort(fd) {
		return e.tcpNotOffloaded(fd, what, selectsCause(n.selects, "connection"))
	}
	ifname, err := e.pickInterface(local.Addr(), netip.Addr{})
	if err != nil {
		return e.tcpNotOffloaded(fd, what, err.Error())
	}
	if dev := boundDevice(fd); dev != "" && dev != ifname {
		return e.tcpNotOffloaded(fd, what, deviceCause(dev, ifname))
	}
	st, err := e.stackNow(ifname)
	if err != nil {
		return e.tcpNotOffloaded(fd, what, err.Error())
	}
	// A SO_REUSEPORT listener joins netstack's group on its port, unless
	// a kernel listener the engine does not serve shares the port (then
	// the kernel spreads the connections, over every listener).
	nl, err := st.ListenNetstack(local, fd)
	if err != nil {
		return e.tcpNotOffloaded(fd, what, err.Error())
	}
	wake, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		nl.Close()
		return e.tcpNotOffloaded(fd, what, fmt.Sprintf("eventfd: %v", err))
	}
	l := &tcpListener{nl: nl, wake: highfd.Move(wake), ifname: ifname, backlog: backlog, v6: dom == unix.AF_INET6}
	l.refs.Store(1)
	l.cancel = nl.Notify(l.mark)
	l.mark() // what came before Notify
	l.settle()
	e.use(fd)
	e.listeners.Store(fd, l)
	e.watchRings()
	e.Log.Printf(params.LevelDebug, "fd %d: offloaded on %s (%s)", fd, ifname, what)
	return StateOffloaded
}

// tcpNotOffloaded logs why a TCP socket stays on the kernel, which it
// never left (StateOS: the engine serves nothing of it), and keeps the
// reason for vmaxdp stats.
func (e *Engine) tcpNotOffloaded(fd int, what, cause string) State {
	e.logNotOffloaded(fd, what, cause)
	e.noteStream(fd, func(n *kernelStream) { n.reason = cause })
	return StateOS
}

// streamDomain is the address family of fd when it is a stream socket,
// 0 otherwise.
func streamDomain(fd int) int {
	if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_STREAM {
		return 0
	}
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return 0
	}
	return dom
}

// Accept serves accept and accept4 (flags: SOCK_NONBLOCK, SOCK_CLOEXEC)
// on an offloaded listener: a connection netstack established, or one the
// kernel socket has. Blocking unless the listener is non-blocking, with
// SO_RCVTIMEO and signals as the kernel's accept.
func (e *Engine) Accept(fd, flags int, sig *stack.Signals) (int, netip.AddrPort, unix.Errno) {
	l := e.listener(fd)
	if l == nil {
		return -1, netip.AddrPort{}, ErrPassOS
	}
	if flags&^(unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC) != 0 {
		return -1, netip.AddrPort{}, unix.EINVAL
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return -1, netip.AddrPort{}, errnoOf(err)
	}
	opts := l.options(fd)
	var deadline time.Time
	if opts.rcvtimeo > 0 {
		deadline = time.Now().Add(opts.rcvtimeo)
	}
	sw := sig.Begin(deadline.IsZero())
	zero := unix.Timespec{}
	for {
		c, err := l.nl.Accept()
		if err == nil {
			l.accepted.Add(1)
			l.settle() // the wake eventfd reads as no more waiting, if none
			err := opts.err
			if err == nil {
				err = c.InheritOptions(opts.conn)
			}
			if err != nil {
				e.Log.Printf(params.LevelInfo, "fd %d: %v; accepted without those", fd, err)
			}
			return e.adoptConn(c, l.ifname, flags, l.v6)
		}
		if !errors.Is(err, unix.EAGAIN) {
			e.Log.Printf(params.LevelDebug, "fd %d: accept from netstack: %v", fd, err)
		}
		l.settle()
		pfds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(l.wake), Events: unix.POLLIN}}
		if n, _ := unix.Ppoll(pfds[:1], &zero, nil); n > 0 {
			nfd, sa, err := unix.Accept4(fd, flags)
			if err == nil {
				l.acceptedOS.Add(1)
				var peer netip.AddrPort
				switch a := sa.(type) {
				case *unix.SockaddrInet4:
					peer = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
				case *unix.SockaddrInet6:
					addr := netip.AddrFrom16(a.Addr).Unmap()
					if a.ZoneId != 0 && addr.Is6() {
						addr = addr.WithZone(strconv.FormatUint(uint64(a.ZoneId), 10))
					}
					peer = netip.AddrPortFrom(addr, uint16(a.Port))
				}
				return nfd, peer, 0
			}
			if err != unix.EAGAIN && err != unix.ECONNABORTED {
				return -1, netip.AddrPort{}, errnoOf(err)
			}
		}
		if fl&unix.O_NONBLOCK != 0 {
			return -1, netip.AddrPort{}, unix.EAGAIN
		}
		var ts *unix.Timespec
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return -1, netip.AddrPort{}, unix.EAGAIN
			}
			v := unix.NsecToTimespec(left.Nanoseconds())
			ts = &v
		}
		if _, err := sw.Ppoll(pfds, ts); err != nil {
			return -1, netip.AddrPort{}, errnoOf(err)
		}
		if e.listener(fd) != l {
			// Back to the kernel meanwhile (a fork, a shared port), or
			// closed: the kernel's accept says which.
			return -1, netip.AddrPort{}, ErrPassOS
		}
	}
}

// adoptConn gives c an fd of the application's: the lowest free number,
// as the kernel's accept would.
func (e *Engine) adoptConn(c *stack.TCPConn, ifname string, flags int, v6 bool) (int, netip.AddrPort, unix.Errno) {
	local, peer := c.Addrs()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		c.Abort()
		c.Close()
		return -1, netip.AddrPort{}, errnoOf(err)
	}
	app := pair[0]
	if flags&unix.SOCK_CLOEXEC == 0 {
		unix.FcntlInt(uintptr(app), unix.F_SETFD, 0)
	}
	t := e.mirror(c, app, highfd.Move(pair[1]), flags&unix.SOCK_NONBLOCK != 0)
	t.ifname, t.v6 = ifname, v6
	if v6 {
		c.SetMapped()
	}
	e.use(app)
	e.conns.Store(app, t)
	e.onState(app, StateTCP)
	e.Log.Printf(params.LevelDebug, "fd %d: tcp connection %s>%s offloaded", app, local, peer)
	return app, peer, 0
}

// TCPConnect serves connect on an AF_INET stream socket: with
// VMAXDP_TCP=1, a destination the rules offload and the kernel routes
// through an offloaded interface is connected through netstack. fd's
// kernel socket keeps the local port (the engine holds a duplicate), and
// fd becomes the application's end of the connection's mirror, with its
// flags. Blocking, or EINPROGRESS when fd is non-blocking, as the
// kernel's connect; ErrPassOS leaves the connect to the kernel.
func (e *Engine) TCPConnect(fd int, raddr netip.AddrPort, sig *stack.Signals) unix.Errno {
	return e.tcpConnect(fd, raddr, unix.AF_INET, sig)
}

// TCPConnect6 serves connect to an IPv4-mapped sockaddr_in6 (raddr, as
// IPv4): only an AF_INET6 socket takes one, and it is offloaded as an
// AF_INET socket connecting to raddr would be, its names mapped.
func (e *Engine) TCPConnect6(fd int, raddr netip.AddrPort, sig *stack.Signals) unix.Errno {
	return e.tcpConnect(fd, raddr, unix.AF_INET6, sig)
}

// tcpConnect is TCPConnect to a destination of family dst (AF_INET, or
// AF_INET6 when it came mapped).
func (e *Engine) tcpConnect(fd int, raddr netip.AddrPort, dst int, sig *stack.Signals) unix.Errno {
	if fd < 0 || fd >= MaxFD {
		return ErrPassOS
	}
	if t := e.tcpConn(fd); t != nil {
		switch {
		case t.c.Connecting():
			return unix.EALREADY
		case t.c.Established():
			return unix.EISCONN
		}
		return unix.ECONNABORTED
	}
	if !e.p.TCP || !raddr.Addr().Is4() || raddr.Addr().IsLoopback() || raddr.Addr().IsUnspecified() || raddr.Addr().IsMulticast() {
		return ErrPassOS
	}
	// An AF_INET6 socket takes an AF_INET destination as well, and
	// carries its IPv4 mapped; an AF_INET socket refuses a sockaddr_in6.
	dom := streamDomain(fd)
	if dom != unix.AF_INET6 && (dom != unix.AF_INET || dst != unix.AF_INET) {
		return ErrPassOS
	}
	local, _, err := stack.SockAddrs(fd)
	if err != nil {
		return ErrPassOS // IPV6_V6ONLY, or an IPv6 address: the kernel's connect answers
	}
	what := socketWhat(rules.TCPClient, local, raddr)
	if _, cause := e.ruleDecision(rules.TCPClient, local, raddr); cause != "" {
		e.tcpNotOffloaded(fd, what, cause)
		return ErrPassOS
	}
	if cause := e.cgroupCause(true); cause != "" {
		e.tcpNotOffloaded(fd, what, cause)
		return ErrPassOS
	}
	ifname, err := e.pickInterface(local.Addr(), raddr.Addr())
	if err != nil {
		e.tcpNotOffloaded(fd, what, err.Error())
		return ErrPassOS
	}
	if dev := boundDevice(fd); dev != "" && dev != ifname {
		e.tcpNotOffloaded(fd, what, deviceCause(dev, ifname))
		return ErrPassOS
	}
	st, err := e.stackNow(ifname)
	if err != nil {
		e.tcpNotOffloaded(fd, what, err.Error())
		return ErrPassOS
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return errnoOf(err)
	}
	fdfl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	if err != nil {
		return errnoOf(err)
	}
	kfd, err := highfd.Dup(fd)
	if err != nil {
		e.tcpNotOffloaded(fd, what, fmt.Sprintf("dup: %v", err))
		return ErrPassOS
	}
	c, err := st.ConnectTCP(kfd, raddr)
	if err != nil {
		highfd.Close(kfd)
		e.tcpNotOffloaded(fd, what, err.Error())
		return ErrPassOS
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		c.Abort()
		c.Close()
		return errnoOf(err)
	}
	// fd now names the mirror: the connect has begun and cannot go back
	// to the kernel.
	flags := 0
	if fdfl&unix.FD_CLOEXEC != 0 {
		flags = unix.O_CLOEXEC
	}
	if err := unix.Dup3(pair[0], fd, flags); err != nil {
		unix.Close(pair[0])
		unix.Close(pair[1])
		c.Abort()
		c.Close()
		return errnoOf(err)
	}
	unix.Close(pair[0])
	nonblock := fl&unix.O_NONBLOCK != 0
	t := e.mirror(c, fd, highfd.Move(pair[1]), nonblock)
	t.ifname, t.v6 = ifname, dom == unix.AF_INET6
	if t.v6 {
		c.SetMapped()
	}
	// The timeouts set before connect were the kernel socket's (kfd's
	// now): fd's mirror and the engine take them over.
	for _, o := range []struct {
		name int
		to   *atomic.Int64
	}{{unix.SO_RCVTIMEO, &t.rcvtimeo}, {unix.SO_SNDTIMEO, &t.sndtimeo}} {
		if tv, err := unix.GetsockoptTimeval(kfd, unix.SOL_SOCKET, o.name); err == nil && tv.Nano() > 0 {
			o.to.Store(tv.Nano())
			unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, o.name, tv)
		}
	}
	t.block() // unwritable until established, as the kernel's socket is
	e.use(fd)
	e.conns.Store(fd, t)
	e.watchRings()
	e.onState(fd, StateTCP)
	e.Log.Printf(params.LevelDebug, "fd %d: offloaded on %s (%s)", fd, ifname, what)
	if nonblock {
		return unix.EINPROGRESS
	}
	return t.awaitConnect(sig)
}

// TCPConnectWait waits again for the connect of fd that a cancel ended
// while the thread had cancellation disabled (pthread_cancel wakes it
// with SIGCANCEL): the kernel's blocking connect goes on waiting then.
// ErrPassOS when fd is not an offloaded connection.
func (e *Engine) TCPConnectWait(fd int, sig *stack.Signals) unix.Errno {
	t := e.tcpConn(fd)
	if t == nil {
		return ErrPassOS
	}
	return t.awaitConnect(sig)
}

// awaitConnect waits until t's connect ends, as a blocking connect: 0
// once established, the error that ended it, EINTR (the connect goes on)
// or EINPROGRESS once SO_SNDTIMEO passed.
func (t *tcpConn) awaitConnect(sig *stack.Signals) unix.Errno {
	var deadline time.Time
	if d := t.sndtimeo.Load(); d > 0 {
		deadline = time.Now().Add(time.Duration(d))
	}
	sw := sig.Begin(false) // an interrupted connect goes on, and says EINTR
	for t.c.Connecting() {
		if errno := t.wait(unix.POLLOUT, deadline, &sw); errno != 0 {
			if errno == unix.EAGAIN {
				return unix.EINPROGRESS // SO_SNDTIMEO passed, as the kernel says it
			}
			return errno
		}
	}
	if t.c.Established() {
		return 0
	}
	if errno := t.c.SoError(); errno != 0 {
		return errno
	}
	return unix.ECONNREFUSED
}

// mirror makes the tcpConn of c, named by the application's end app of
// a socket pair whose other end is eng.
func (e *Engine) mirror(c *stack.TCPConn, app, eng int, nonblock bool) *tcpConn {
	unix.SetNonblock(eng, true)
	if nonblock {
		unix.SetNonblock(app, true)
	}
	// The least send buffer: one write of junk makes app unwritable.
	unix.SetsockoptInt(app, unix.SOL_SOCKET, unix.SO_SNDBUF, 1)
	t := &tcpConn{c: c, app: app, eng: eng}
	t.refs.Store(1)
	t.nonblock.Store(nonblock)
	t.cancel = c.Notify(t.notify)
	t.notify(c.Events()) // what came before Notify
	return t
}

// tcpRecvFlags are the receive flags served on a connection; MSG_OOB is
// refused as the kernel refuses it with no urgent data (EINVAL).
const tcpRecvFlags = unix.MSG_DONTWAIT | unix.MSG_PEEK | unix.MSG_WAITALL | unix.MSG_NOSIGNAL | unix.MSG_CMSG_CLOEXEC | unix.MSG_TRUNC

// TCPRecv serves read, recv, recvfrom, recvmsg and readv on an offloaded
// connection, into bufs in turn.
func (e *Engine) TCPRecv(fd int, bufs [][]byte, flags int, sig *stack.Signals) (int, unix.Errno) {
	t := e.tcpConn(fd)
	if t == nil {
		return 0, ErrPassOS
	}
	if flags&^tcpRecvFlags != 0 {
		return 0, unix.EINVAL
	}
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	if total == 0 {
		return 0, 0
	}
	t.markUsed()
	// An event loop's receive is not a wait: its loop's next epoll_wait
	// is, which polls for all the loop's connections, so a read that
	// finds nothing leaves the rings to it (below) and the answers the
	// loop writes meanwhile share a kick. Polled by each read until
	// EAGAIN, another connection's segments went to netstack's processor
	// (a thread woken) and its mirror (a byte each way), and each answer
	// kicked alone: lighttpd under ab -k, 3 interleaved pairs,
	// 50.2/50.3/51.1k -> 89.1/89.9/92.6k requests a second.
	loop := t.beginRead()
	defer t.endRead()
	if !loop {
		t.c.WaitPoint() // a receive: what sends left goes, the next send kicks
	}
	// A receive polls only for an answer: when the application sent on
	// the connection since its last receive began. A stream's receiver
	// waits for a sender that needs the CPU the poll would take (sockperf
	// --tcp tp with the server under vmaxdp: 1.31x the kernel's rate
	// without polling, 1.16x with it, 4 interleaved rounds).
	sent := t.txBytes.Load()
	answer := t.sentBefore.Swap(sent) != sent
	peek := flags&unix.MSG_PEEK != 0
	if peek {
		bufs = bufs[:1] // a peek reads from the start each time
	}
	nonblock := t.nonblock.Load() || flags&unix.MSG_DONTWAIT != 0
	waitall := flags&unix.MSG_WAITALL != 0 && !peek && !nonblock
	var deadline time.Time
	if d := t.rcvtimeo.Load(); d > 0 && !nonblock {
		deadline = time.Now().Add(time.Duration(d))
	}
	sw := sig.Begin(deadline.IsZero())
	got, i, off, counted := 0, 0, 0, 0
	var waited int64 // unix ns: when the receive first found nothing
	slept, polled := false, false
	for {
		seq := t.notices.Load()
		eof := false
		var rerr error
		if got == 0 && t.emptyAt.Load() == int64(seq)+1 {
			// Nothing came since a read found nothing: an application
			// that spins on its receives (sockperf --nonblocked) would
			// otherwise take the endpoint's lock at each, and netstack's
			// processor, which needs it for what the queue's drain
			// goroutine delivered, would spin on it (a fifth of the
			// process's CPU in perf).
			rerr = unix.EAGAIN
		}
		for rerr == nil && i < len(bufs) {
			n, err := t.c.ReadNonblock(bufs[i][off:], peek)
			got += n
			off += n
			if err != nil {
				rerr = err
				break
			}
			if n == 0 {
				eof = true
				break
			}
			if off < len(bufs[i]) {
				break
			}
			i, off = i+1, 0
		}
		if got == 0 && errors.Is(rerr, unix.EAGAIN) {
			t.emptyAt.Store(int64(seq) + 1)
		}
		t.settleRead()
		if !peek {
			t.rxBytes.Add(uint64(got - counted))
			counted = got
		}
		switch {
		case rerr != nil && !errors.Is(rerr, unix.EAGAIN):
			if got > 0 {
				return got, 0
			}
			t.rxErrors.Add(1)
			return 0, errnoOf(rerr)
		case eof:
			t.mu.Lock()
			if !t.closed {
				t.hangupLocked(stack.TCPReadHangup)
			}
			t.mu.Unlock()
			return got, 0
		case got == total, got > 0 && !waitall:
			t.eagainRun.Store(0)
			if answer && waited != 0 && e.p.RxPoll == params.PollAuto {
				t.spin.Done(waited, time.Now().UnixNano())
			}
			if slept {
				t.rxPollMiss.Add(1)
			} else {
				t.rxPollHit.Add(1)
			}
			return got, 0
		case nonblock && !polled:
			// Once, as VMA polls its completion queue at each
			// non-blocking receive: an application that spins on its own
			// (sockperf --nonblocked) would otherwise wait for the queue's
			// drain goroutine to be woken, run, and hand the segment to
			// netstack's processor. One that spins is told to the drain
			// goroutines, which leave it the frames while it does. An
			// event loop's read polls only once it spins so.
			polled = true
			if t.eagainRun.Add(1) >= spinningAfter {
				t.c.Polling()
			} else if loop {
				t.rxEagain.Add(1)
				return 0, unix.EAGAIN
			}
			t.c.Poll()
			continue
		case nonblock:
			t.rxEagain.Add(1)
			return 0, unix.EAGAIN
		}
		if waited == 0 {
			waited = time.Now().UnixNano()
		}
		if answer && e.pollRead(t, seq, waited, deadline, &sw) {
			continue
		}
		slept = true
		t.mu.Lock()
		t.sleepers++
		t.mu.Unlock()
		t.endRead() // the sleep needs app marked
		errno := t.wait(unix.POLLIN, deadline, &sw)
		t.mu.Lock()
		t.sleepers--
		t.mu.Unlock()
		t.beginRead()
		if errno != 0 {
			if got > 0 {
				return got, 0
			}
			return 0, errno
		}
	}
}

// pollRead polls for a notice of netstack's after seq, before a receive
// that began waiting at waited sleeps, for as long as VMAXDP_RX_POLL says
// (auto: while polling pays, stack.Spin); true when one came. A poll is
// an atomic load, where a sleep costs the mirror's byte both ways (two
// system calls) and waking this thread. A signal or the deadline ends it.
func (e *Engine) pollRead(t *tcpConn, seq uint32, waited int64, deadline time.Time, sw *stack.SignalWait) bool {
	limit := e.p.RxPoll
	if limit == 0 {
		return false
	}
	var clock stack.SpinClock
	if limit == params.PollAuto {
		sw.Resched(waited)
		clock.Begin(waited, t.spin.Budget())
	}
	t.c.Polling()
	for i := 1; ; i++ {
		if t.c.Poll() && t.notices.Load() != seq {
			return true // this thread processed the segment: the lock is free
		}
		if t.notices.Load() != seq {
			// The notice comes from netstack's processor goroutine while
			// it holds the endpoint's lock (it goes on to send the ACK).
			// A read at once finds the lock taken, and netstack's
			// LockUser then yields with runtime.Gosched, which on this
			// thread (a cgo callback, locked to it) hands the P away and
			// costs two thread wake-ups. Waiting readGrace first: sockperf
			// --tcp pp 64 B, server under vmaxdp, 0.84x -> 0.95x the
			// kernel's round trips; client 0.81x -> 0.93x (5 interleaved
			// rounds).
			for end := time.Now().Add(readGrace); time.Now().Before(end); {
			}
			return true
		}
		switch {
		case limit == params.PollAuto:
			if clock.Tick() {
				return false
			}
		case limit > 0 && i >= limit:
			return false
		}
		if i&63 == 0 {
			// Polling's mark lasts appPollRecent: a poll longer than that
			// (VMAXDP_RX_POLL set high) renews it.
			t.c.Polling()
			if sw.Interrupted() || !deadline.IsZero() && time.Now().After(deadline) {
				return false
			}
		}
	}
}

// spinningAfter: see tcpConn.eagainRun. An event loop reads until
// EAGAIN once per wake-up; a spinning application reads on and on.
const spinningAfter = 16

// readGrace: see pollRead.
const readGrace = 2 * time.Microsecond

// tcpSendFlags are the send flags served on a connection.
const tcpSendFlags = unix.MSG_DONTWAIT | unix.MSG_NOSIGNAL | unix.MSG_MORE | unix.MSG_EOR | unix.MSG_CONFIRM

// TCPSend serves write, send, sendto, sendmsg and writev on an offloaded
// connection, from bufs in turn. EPIPE is the caller's to turn into
// SIGPIPE, unless MSG_NOSIGNAL.
func (e *Engine) TCPSend(fd int, bufs [][]byte, flags int, sig *stack.Signals) (int, unix.Errno) {
	t := e.tcpConn(fd)
	if t == nil {
		return 0, ErrPassOS
	}
	if flags&^tcpSendFlags != 0 {
		return t.c.Unacked(), 0
	}
	t.markUsed()
	nonblock := t.nonblock.Load() || flags&unix.MSG_DONTWAIT != 0
	var deadline time.Time
	if d := t.sndtimeo.Load(); d > 0 && !nonblock {
		deadline = time.Now().Add(time.Duration(d))
	}
	sw := sig.Begin(deadline.IsZero())
	sent := 0
	defer func() { t.txBytes.Add(uint64(sent)) }()
	total := 0
	for _, b := range bufs {
		total += len(b)
	}
	for sent < total {
		// All of what is left in one write: one send, one segment when
		// it fits, as the kernel sends it.
		n, err := t.c.WriteNonblock(bufs, flags&unix.MSG_MORE != 0)
		sent += n
		bufs = consumed(bufs, n)
		switch {
		case err == nil:
			continue
		case !errors.Is(err, unix.EAGAIN):
			if sent > 0 {
				return sent, 0
			}
			t.txErrors.Add(1)
			return 0, errnoOf(err)
		}
		t.block()
		t.c.WaitPoint() // the segments queued so far must leave to be acked
		if nonblock {
			if sent > 0 {
				return sent, 0
			}
			return 0, unix.EAGAIN
		}
		if errno := t.wait(unix.POLLOUT, deadline, &sw); errno != 0 {
			if sent > 0 {
				return sent, 0
			}
			return 0, errno
		}
	}
	return sent, 0
}

// consumed drops the first n bytes of bufs, in place, and returns what is
// left.
func consumed(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if n > 0 {
		bufs[0] = bufs[0][n:]
	}
	return bufs
}

// spliceChunk bounds one splice onto or from a connection: a pipe's
// default capacity.
const spliceChunk = 64 << 10

var spliceBufs = sync.Pool{New: func() any { return new([spliceChunk]byte) }}

// TCPSplice serves splice(2) between a pipe and an offloaded connection
// (in or out; the other must be a pipe): the kernel's splice would move
// the bytes to or from the connection's mirror. Nothing is lost either
// way: onto the connection, the pipe's bytes are copied out with tee(2)
// and only as many leave the pipe as the connection took; from it, no
// more are read than the pipe has room for. SPLICE_F_NONBLOCK makes both
// sides non-blocking, as on the kernel; SPLICE_F_MORE is MSG_MORE.
func (e *Engine) TCPSplice(in, out, n int, flags int, sig *stack.Signals) (int, unix.Errno) {
	tin, tout := e.tcpConn(in), e.tcpConn(out)
	switch {
	case tin == nil && tout == nil:
		return 0, ErrPassOS
	case tin != nil && tout != nil:
		return 0, unix.EINVAL // no pipe
	case n == 0:
		return 0, 0
	}
	buf := spliceBufs.Get().(*[spliceChunk]byte)
	defer spliceBufs.Put(buf)
	n = min(n, spliceChunk)
	if tout != nil {
		return e.spliceOnto(in, out, buf[:n], flags, sig)
	}
	return e.spliceFrom(in, out, buf[:n], flags, sig)
}

// isPipe says whether fd is a pipe (a FIFO).
func isPipe(fd int) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFIFO
}

// spliceOnto moves up to len(buf) bytes from the pipe in onto the
// connection out.
func (e *Engine) spliceOnto(in, out int, buf []byte, flags int, sig *stack.Signals) (int, unix.Errno) {
	if !isPipe(in) {
		return 0, unix.EINVAL
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return 0, errnoOf(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	teed, err := unix.Tee(in, p[1], len(buf), flags&unix.SPLICE_F_NONBLOCK)
	if err != nil || teed == 0 {
		return 0, errnoOf(err) // 0: the pipe is empty and has no writer
	}
	got, err := unix.Read(p[0], buf[:teed])
	if err != nil {
		return 0, errnoOf(err)
	}
	sendFlags := 0
	if flags&unix.SPLICE_F_NONBLOCK != 0 {
		sendFlags |= unix.MSG_DONTWAIT
	}
	if flags&unix.SPLICE_F_MORE != 0 {
		sendFlags |= unix.MSG_MORE
	}
	sent, errno := e.TCPSend(out, [][]byte{buf[:got]}, sendFlags, sig)
	if sent > 0 {
		// The bytes the connection took leave the pipe: they are at its
		// head, where tee found them.
		if _, err := unix.Read(in, buf[:sent]); err != nil {
			e.Log.Printf(params.LevelError, "splice fd %d onto fd %d: %d bytes sent stay in the pipe: %v", in, out, sent, err)
		}
	}
	return sent, errno
}

// spliceFrom moves up to len(buf) bytes from the connection in into the
// pipe out, no more than the pipe has room for.
func (e *Engine) spliceFrom(in, out int, buf []byte, flags int, sig *stack.Signals) (int, unix.Errno) {
	if !isPipe(out) {
		return 0, unix.EINVAL
	}
	nonblock := flags&unix.SPLICE_F_NONBLOCK != 0
	if fl, err := unix.FcntlInt(uintptr(out), unix.F_GETFL, 0); err == nil && fl&unix.O_NONBLOCK != 0 {
		nonblock = true
	}
	size, err := unix.FcntlInt(uintptr(out), unix.F_GETPIPE_SZ, 0)
	if err != nil {
		return 0, errnoOf(err)
	}
	for {
		queued, err := unix.IoctlGetInt(out, unix.TIOCINQ) // FIONREAD
		if err != nil {
			return 0, errnoOf(err)
		}
		if room := size - queued; room > 0 {
			buf = buf[:min(len(buf), room)]
			break
		}
		if nonblock {
			return 0, unix.EAGAIN
		}
		pfd := []unix.PollFd{{Fd: int32(out), Events: unix.POLLOUT}}
		if _, err := unix.Poll(pfd, -1); err != nil {
			return 0, errnoOf(err)
		}
	}
	recvFlags := 0
	if flags&unix.SPLICE_F_NONBLOCK != 0 {
		recvFlags = unix.MSG_DONTWAIT
	}
	got, errno := e.TCPRecv(in, [][]byte{buf}, recvFlags, sig)
	for b := buf[:got]; len(b) > 0; {
		w, err := unix.Write(out, b)
		if err == unix.EAGAIN { // another writer took the room: wait for it
			pfd := []unix.PollFd{{Fd: int32(out), Events: unix.POLLOUT}}
			unix.Poll(pfd, -1)
			continue
		}
		if err != nil {
			e.Log.Printf(params.LevelError, "splice fd %d into fd %d: %d bytes read from the connection lost: %v", in, out, len(b), err)
			break
		}
		b = b[w:]
	}
	return got, errno
}

// TCPShutdown serves shutdown on an offloaded connection.
func (e *Engine) TCPShutdown(fd, how int) unix.Errno {
	t := e.tcpConn(fd)
	if t == nil {
		return ErrPassOS
	}
	if err := t.c.Shutdown(how); err != nil {
		return errnoOf(err)
	}
	t.notify(t.c.Events())
	return 0
}

// TCPAddrs serves getsockname and getpeername on an offloaded connection.
func (e *Engine) TCPAddrs(fd int) (local, remote netip.AddrPort, v6 bool, errno unix.Errno) {
	t := e.tcpConn(fd)
	if t == nil {
		return local, remote, false, ErrPassOS
	}
	local, remote = t.c.Addrs()
	return local, remote, t.v6, 0
}

// TCPListenerIPv6 says whether fd is an offloaded AF_INET6 listener,
// whose accept gives peers as sockaddr_in6.
func (e *Engine) TCPListenerIPv6(fd int) bool {
	l := e.listener(fd)
	return l != nil && l.v6
}

// TCPUnread serves FIONREAD (SIOCINQ), and with out SIOCOUTQ: the bytes
// written and not yet acknowledged.
func (e *Engine) TCPUnread(fd int, out bool) (int, unix.Errno) {
	t := e.tcpConn(fd)
	if t == nil {
		return 0, ErrPassOS
	}
	if out {
		return t.c.Unacked(), 0
	}
	return t.c.Unread(), 0
}

// TCPConnOf is fd's offloaded connection, for the socket options the
// preload library serves itself (TCP_INFO, SO_LINGER); nil if none.
func (e *Engine) TCPConnOf(fd int) *stack.TCPConn {
	if t := e.tcpConn(fd); t != nil {
		return t.c
	}
	return nil
}

// TCPSetOption serves setsockopt's integer options on an offloaded
// connection. One netstack has no equivalent of is accepted and logged,
// as the kernel would have accepted it. On an offloaded listener,
// TCP_DEFER_ACCEPT goes to netstack's half too; the kernel's half keeps
// every option.
func (e *Engine) TCPSetOption(fd, level, name, v int) unix.Errno {
	if l := e.listener(fd); l != nil && level == unix.IPPROTO_TCP && name == unix.TCP_DEFER_ACCEPT {
		l.nl.SetDeferAccept(v)
		return ErrPassOS
	}
	t := e.tcpConn(fd)
	if t == nil {
		return ErrPassOS
	}
	err := t.c.SetOption(level, name, v)
	if errors.Is(err, unix.ENOPROTOOPT) && level == unix.SOL_SOCKET {
		return ErrPassOS // the mirror takes it (SO_PRIORITY and the like), without effect on netstack
	}
	if errors.Is(err, unix.ENOPROTOOPT) {
		e.Log.Printf(params.LevelDebug, "fd %d: setsockopt level %d option %d: netstack has no such option; accepted, without effect", fd, level, name)
		return 0
	}
	return errnoOf(err)
}

// TCPOption serves getsockopt's integer options on an offloaded connection.
func (e *Engine) TCPOption(fd, level, name int) (int, unix.Errno) {
	t := e.tcpConn(fd)
	if t == nil {
		return 0, ErrPassOS
	}
	if t.v6 {
		switch {
		case level == unix.SOL_SOCKET && name == unix.SO_DOMAIN:
			return unix.AF_INET6, 0
		case level == unix.IPPROTO_IPV6 && name == unix.IPV6_V6ONLY:
			return 0, 0
		}
	}
	v, err := t.c.Option(level, name)
	if errors.Is(err, unix.ENOPROTOOPT) && level == unix.SOL_SOCKET {
		return 0, ErrPassOS
	}
	return v, errnoOf(err)
}

// TCPSetCongestion serves TCP_CONGESTION on an offloaded connection. An
// algorithm netstack has is set. One only the kernel has is accepted
// without effect and logged, as refusing it would stop a program the
// kernel lets run; getsockopt then names the one netstack runs. One the
// kernel would refuse fails with the kernel's errno.
func (e *Engine) TCPSetCongestion(fd int, name string) unix.Errno {
	t := e.tcpConn(fd)
	if t == nil {
		return ErrPassOS
	}
	err := t.c.SetCongestion(name)
	if !errors.Is(err, unix.ENOENT) {
		return errnoOf(err)
	}
	if errno := kernelTakesCongestion(name); errno != 0 {
		return errno
	}
	e.Log.Printf(params.LevelInfo, "fd %d: TCP_CONGESTION %q: netstack has %s; accepted as the kernel would, and the connection keeps %s",
		fd, name, strings.Join(t.c.Stack().Congestions(), " and "), t.c.Congestion())
	return 0
}

// kernelTakesCongestion says, by a throwaway socket's setsockopt, whether
// the kernel takes the congestion control algorithm name for this
// process (its namespace's allowed algorithms, its capabilities): 0, or
// the kernel's errno.
func kernelTakesCongestion(name string) unix.Errno {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return errnoOf(err)
	}
	defer unix.Close(fd)
	return errnoOf(unix.SetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION, name))
}

// TCPCongestion serves getsockopt's TCP_CONGESTION on an offloaded
// connection: the algorithm netstack runs.
func (e *Engine) TCPCongestion(fd int) (string, unix.Errno) {
	t := e.tcpConn(fd)
	if t == nil {
		return "", ErrPassOS
	}
	return t.c.Congestion(), 0
}

// TCPSetTimeout follows SO_RCVTIMEO (recv) and SO_SNDTIMEO.
func (e *Engine) TCPSetTimeout(fd int, recv bool, d time.Duration) {
	if t := e.tcpConn(fd); t != nil {
		if recv {
			t.rcvtimeo.Store(int64(d))
		} else {
			t.sndtimeo.Store(int64(d))
		}
	}
}

// closeTCP forgets fd if it names an offloaded listener or connection;
// the last fd's close closes it. False when fd is neither.
func (e *Engine) closeTCP(fd int) bool {
	if l := e.listeners.Swap(fd, nil); l != nil {
		if l.refs.Add(-1) == 0 {
			if e.p.StatsFile != "" {
				rec := listenerRecord(fd, l)
				e.writeCloseReport(&rec)
			}
			l.cancel()
			e.closeNetstackListener(fd, l)
			highfd.Close(l.wake)
		}
		return true
	}
	if t := e.conns.Swap(fd, nil); t != nil {
		if t.refs.Add(-1) == 0 {
			if e.p.StatsFile != "" {
				rec := connRecord(fd, t)
				e.writeCloseReport(&rec)
			}
			e.logLost(fd, t)
			t.end()
			e.Log.Printf(params.LevelDebug, "fd %d: tcp connection closed", fd)
		}
		return true
	}
	return false
}

// dupTCP makes newfd name oldfd's listener or connection.
func (e *Engine) dupTCP(oldfd, newfd int) (State, bool) {
	if l := e.listener(oldfd); l != nil {
		l.refs.Add(1)
		e.use(newfd)
		e.listeners.Store(newfd, l)
		return StateOffloaded, true
	}
	if t := e.tcpConn(oldfd); t != nil {
		t.refs.Add(1)
		e.use(newfd)
		e.conns.Store(newfd, t)
		return StateTCP, true
	}
	return StateOS, false
}

// sharedListenersToKernel hands the offloaded listeners of ls back to
// the kernel: a kernel listener the engine does not serve shares their
// port (stack.ErrShared).
func (e *Engine) sharedListenersToKernel(ls []*stack.NetstackListener, reason string) {
	for fd := range e.fdsInUse() {
		if l := e.listeners.Load(fd); l != nil && slices.Contains(ls, l.nl) {
			e.handover(fd, l, reason)
		}
	}
}

// handoverGrace is how long a listener in handover waits before it looks
// whether netstack still holds connections for it: the handshakes
// netstack had begun finish meanwhile (within a round trip, or one
// retransmission of a lost SYN-ACK on a slow path). handoverMax bounds
// the wait for the application to accept what netstack holds.
const (
	handoverGrace = time.Second
	handoverMax   = 30 * time.Second
)

// handover takes the offloaded listener fd (only if it is l) back to the
// kernel, for cause, without resetting a connection: new connections go
// to the kernel socket at once (stack.NetstackListener.Handover), the
// connections netstack made keep their segments, and accept hands out
// those netstack holds until none is left; then the listener is the
// kernel's alone. A listener whose rule cannot be handed over goes back
// at once, as a closed listener does.
func (e *Engine) handover(fd int, l *tcpListener, cause string) {
	if l == nil || e.listeners.Load(fd) != l {
		return
	}
	// Every fd naming l (dup) goes back with it.
	back := func() {
		for fd := range e.fdsInUse() {
			e.listenerToKernel(fd, l, cause)
		}
	}
	started, err := l.nl.Handover()
	if err != nil {
		e.Log.Printf(params.LevelInfo, "fd %d: %v: the connections netstack holds are reset", fd, err)
		back()
		return
	}
	if !started {
		return
	}
	e.Log.Printf(params.LevelInfo, "fd %d: tcp listener %s: %s; new connections go to the kernel now, and accept hands out those netstack holds first", fd, l.nl.Addr(), cause)
	go func() {
		start := time.Now()
		time.Sleep(handoverGrace)
		for l.nl.Pending() && time.Since(start) < handoverMax && l.refs.Load() > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		if l.refs.Load() > 0 && l.nl.Pending() {
			e.Log.Printf(params.LevelInfo, "fd %d: tcp listener %s: the connections netstack held that the application did not accept within %v of the handover are reset", fd, l.nl.Addr(), handoverMax)
		}
		back()
	}()
}

// listenerToKernel leaves the listener fd (only if it is l, when l is
// set) to its kernel socket, for cause. netstack's connections not yet
// accepted are reset, as a closed listener's are; an accept waiting on
// fd goes on in the kernel.
func (e *Engine) listenerToKernel(fd int, l *tcpListener, cause string) {
	if l == nil {
		l = e.listeners.Swap(fd, nil)
	} else if !e.listeners.CompareAndSwap(fd, l, nil) {
		return
	}
	if l == nil {
		return
	}
	e.onState(fd, StateKernel)
	e.noteStream(fd, func(n *kernelStream) { n.reason = cause })
	l.mark() // wakes the accepts waiting on fd: they go on in the kernel
	if l.refs.Add(-1) == 0 {
		l.cancel()
		e.closeNetstackListener(fd, l)
		highfd.Close(l.wake)
		if l.nl.InHandover() && !l.forking.Load() {
			e.Log.Printf(params.LevelInfo, "fd %d: tcp listener %s: handed over to the kernel", fd, l.nl.Addr())
		} else {
			e.Log.Printf(params.LevelInfo, "fd %d: tcp listener %s: %s", fd, l.nl.Addr(), cause)
		}
	}
}

// startOpen starts opening ifname's stack on a goroutine, in the calling
// thread's network namespace. Caller holds e.mu.
func (e *Engine) startOpen(ifname string) error {
	ns, err := e.beginOpen(ifname)
	if err != nil {
		return err
	}
	go e.openStack(ifname, ns)
	return nil
}

// beginOpen readies the opening of ifname's stack in the calling
// thread's network namespace, whose handle it returns for openStack.
// Caller holds e.mu and marks the stack opening (e.opening).
func (e *Engine) beginOpen(ifname string) (netns.NsHandle, error) {
	ns, err := netns.Get()
	if err != nil {
		return -1, e.afterConfine(fmt.Errorf("stack %s: network namespace: %w", ifname, err))
	}
	if e.opened == nil {
		e.opened = map[string]chan struct{}{}
	}
	if e.opened[ifname] == nil { // a retry keeps the first one's
		e.opened[ifname] = make(chan struct{})
	}
	e.opens.Add(1)
	return netns.NsHandle(highfd.Move(int(ns))), nil
}

// watchPeers hands the peer-notification helper st's connections, so
// that their peers learn of this process's end however it comes. A
// helper that cannot run is said once, at WARNING: the process is served
// as before.
func (e *Engine) watchPeers(ifname string, st *stack.Stack) {
	if e.peers == nil {
		return
	}
	if err := e.peers.Watch(ifname, st.Program().ConnMap(), st.Program().SYNMap()); err != nil {
		e.noHelper(err)
	}
}

// exitWait bounds how long a process's exit waits for its TCP
// connections' closing handshakes.
const exitWait = 500 * time.Millisecond

// exitTCP closes the TCP sockets at the process's exit, as the kernel
// closes a dying process's: each connection sends its FIN (its RST with
// unread data), and the exit waits, within exitWait, for netstack to
// finish the handshakes, so that the peers' last segments still find
// netstack; then the stacks close and take their steering off the
// interfaces.
func (e *Engine) exitTCP() {
	for fd := range e.fdsInUse() {
		e.closeTCP(fd)
	}
	for fd := range e.fdsInUse() {
		e.closeTCP(fd)
	}
	// The connections the application closed before count too: one it
	// closed just before exiting waits for the peer's last ack.
	for deadline := time.Now().Add(exitWait); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		busy := false
		for _, st := range e.openStacks() {
			busy = busy || st.TCPClosing() > 0
		}
		if !busy {
			break
		}
	}
	// The stacks with TCP close (netstack's goroutines end); the others
	// stay open for the sends the exit flushes (FlushStacks), and for
	// CloseStacks.
	e.mu.Lock()
	var closing []*stack.Stack
	for name, st := range e.stacks {
		if st.HasTCP() {
			closing = append(closing, st)
			delete(e.stacks, name)
		}
	}
	e.mu.Unlock()
	for _, st := range closing {
		st.Close()
	}
	// What the closes left is for the helper to tell of now.
	if e.peers != nil {
		e.peers.Close()
	}
}

// tcpRecords adds the TCP sockets to snap, each under its first fd, and
// their steering rules to owner.
func (e *Engine) tcpRecords(snap *stats.Snapshot, owner map[ruleKey]int) {
	full := func() bool {
		if e.p.StatsFDNum > 0 && len(snap.Sockets) >= e.p.StatsFDNum {
			snap.Process.SocketsHidden++
			return true
		}
		return false
	}
	seenL := map[*tcpListener]bool{}
	seenC := map[*tcpConn]bool{}
	for fd := range e.fdsInUse() {
		l := e.listeners.Load(fd)
		if l == nil || seenL[l] || full() {
			continue
		}
		seenL[l] = true
		snap.Sockets = append(snap.Sockets, listenerRecord(fd, l))
		owner[ruleKey{l.ifname, uint32(l.nl.Rule())}] = fd
	}
	for fd := range e.fdsInUse() {
		t := e.conns.Load(fd)
		if t == nil || seenC[t] || full() {
			continue
		}
		seenC[t] = true
		snap.Sockets = append(snap.Sockets, connRecord(fd, t))
		owner[ruleKey{t.ifname, uint32(t.c.Rule())}] = fd
	}
	// The notes of sockets gone are dropped here, where all are read.
	type leftOn struct {
		fd     int
		reason string
	}
	var left []leftOn
	e.streamMu.Lock()
	for fd, n := range e.streams {
		switch {
		case inodeOf(fd) != n.inode:
			delete(e.streams, fd)
		case n.reason != "":
			left = append(left, leftOn{fd, n.reason})
		}
	}
	e.streamMu.Unlock()
	slices.SortFunc(left, func(a, b leftOn) int { return a.fd - b.fd })
	for _, l := range left {
		if full() {
			break
		}
		snap.Sockets = append(snap.Sockets, kernelTCPRecord(l.fd, l.reason))
	}
}

// listenerRecord describes the offloaded listener l, named by fd.
func listenerRecord(fd int, l *tcpListener) stats.Socket {
	rec := stats.Socket{FD: fd, Proto: "tcp", State: stats.StateOffloaded, Interface: l.ifname, Local: l.nl.Addr().String(),
		Blocking: true, Rules: []uint32{uint32(l.nl.Rule())}}
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
		rec.Blocking = fl&unix.O_NONBLOCK == 0
	}
	rec.TCP = stats.TCPSocket{State: "LISTEN", Backlog: uint64(l.backlog), Accepted: l.accepted.Load()}
	rec.Counters.RxOSPackets = l.acceptedOS.Load() // connections the kernel's listener took
	return rec
}

// connRecord describes the offloaded connection t, named by fd.
func connRecord(fd int, t *tcpConn) stats.Socket {
	local, remote := t.c.Addrs()
	ti := t.c.Info()
	rec := stats.Socket{FD: fd, Proto: "tcp", State: stats.StateOffloaded, Interface: t.ifname,
		Local: local.String(), Remote: remote.String(), Blocking: !t.nonblock.Load(), Rules: []uint32{uint32(t.c.Rule())}}
	rec.TCP = stats.TCPSocket{State: t.c.StateName(), RTTMicros: uint64(ti.Rtt), Retransmits: uint64(ti.Total_retrans),
		RecvQueue: uint64(t.c.Unread()), SendQueue: uint64(t.c.Unacked())}
	rec.Counters = stats.SocketCounters{RxOffloadPackets: uint64(ti.Segs_in), RxOffloadBytes: t.rxBytes.Load(),
		RxEagain: t.rxEagain.Load(), RxErrors: t.rxErrors.Load(), RxPollHit: t.rxPollHit.Load(), RxPollMiss: t.rxPollMiss.Load(),
		TxOffloadPackets: uint64(ti.Segs_out), TxOffloadBytes: t.txBytes.Load(), TxErrors: t.txErrors.Load()}
	return rec
}

// kernelTCPRecord describes the TCP socket fd, which the kernel serves
// for reason, from the kernel's own view of it (names, TCP_INFO).
func kernelTCPRecord(fd int, reason string) stats.Socket {
	local, remote := sockAddrs(fd)
	rec := stats.Socket{FD: fd, Proto: "tcp", State: stats.StateKernel, Reason: reason, Local: local.String(), Blocking: true}
	if remote.IsValid() && remote.Port() != 0 {
		rec.Remote = remote.String()
	}
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
		rec.Blocking = fl&unix.O_NONBLOCK == 0
	}
	rec.ReusePort = reusePort(fd)
	if ti, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
		rec.TCP = stats.TCPSocket{State: stack.TCPStateName(ti.State), RTTMicros: uint64(ti.Rtt), Retransmits: uint64(ti.Total_retrans)}
		if n, err := unix.IoctlGetInt(fd, unix.SIOCINQ); err == nil { // EINVAL on a listener
			rec.TCP.RecvQueue = uint64(n)
		}
		if n, err := unix.IoctlGetInt(fd, unix.SIOCOUTQ); err == nil { // EINVAL on a listener
			rec.TCP.SendQueue = uint64(n)
		}
		rec.Counters.RxOSPackets, rec.Counters.TxOSPackets = uint64(ti.Segs_in), uint64(ti.Segs_out)
		rec.Counters.RxOSBytes, rec.Counters.TxOSBytes = ti.Bytes_received, ti.Bytes_acked
	}
	return rec
}
