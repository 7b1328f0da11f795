package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
	"github.com/vmaxdp/vmaxdp/steer"
)

// TCP sockets on netstack (tcplink.go has the link under them).

// NetstackListener is netstack's half of a listening socket whose
// kernel half the caller keeps (it holds the port, and takes the
// connections that come another way): a netstack endpoint listening on
// the same address, and the steering rule that brings it the interface's
// TCP to that address. Accept never blocks; Notify says when to try.
type NetstackListener struct {
	st    *Stack
	local netip.AddrPort
	ep    tcpip.Endpoint
	wq    waiter.Queue
	rule  steer.RuleID
	once  sync.Once
	// reusePort: the kernel listener has SO_REUSEPORT, and so has this
	// one, which netstack puts in a group with the stack's others on its
	// address and port. inode names the kernel listener.
	reusePort bool
	inode     uint64
	// handover: the listener is going back to the kernel (Handover).
	handover atomic.Bool
}

// ListenNetstack listens in netstack on laddr, whose port the kernel
// socket kfd of the caller's holds (address unspecified: every address of
// the interface; kfd -1: no socket to ask). With SO_REUSEPORT on kfd, the
// listener joins a group with the stack's others on laddr, over which
// netstack spreads connections by flow as the kernel spreads them; a
// kernel listener on the port the stack does not serve (another
// process's, or one of the caller's it was not asked to serve) would get
// none, so then it returns ErrShared, and the watcher closes the group's
// listeners (Options.SharedListeners) when such a listener comes later.
func (st *Stack) ListenNetstack(laddr netip.AddrPort, kfd int) (*NetstackListener, error) {
	if !laddr.Addr().Is4() {
		return nil, fmt.Errorf("tcp listen %s: %w: IPv4 only", laddr, unix.EAFNOSUPPORT)
	}
	if laddr.Port() == 0 {
		return nil, fmt.Errorf("tcp listen %s: %w: no port", laddr, unix.EINVAL)
	}
	t, err := st.tcpStack()
	if err != nil {
		return nil, fmt.Errorf("tcp listen %s: %w", laddr, err)
	}
	l := &NetstackListener{st: st, local: laddr}
	if kfd >= 0 {
		v, err := unix.GetsockoptInt(kfd, unix.SOL_SOCKET, unix.SO_REUSEPORT)
		l.reusePort = err == nil && v != 0
		_, l.inode = shareable(kfd)
	}
	if l.reusePort && st.diag != nil {
		served := func() map[uint64]bool {
			s := st.listenerInodes()
			s[l.inode] = true
			return s
		}
		hit, who, err := st.sharedWith(unix.IPPROTO_TCP, laddr.Port(), []netip.Addr{laddr.Addr()}, served)
		if err != nil {
			return nil, fmt.Errorf("tcp listen %s: %w", laddr, err)
		}
		if len(hit) > 0 {
			st.kickShare() // the stack's listeners on the port follow
			return nil, fmt.Errorf("tcp listen %s: %w: %s", laddr, ErrShared, sharedCause(laddr, who, "connections"))
		}
	}
	if err := l.listen(t); err != nil {
		return nil, fmt.Errorf("tcp listen %s: %w", laddr, err)
	}
	if kfd >= 0 {
		if secs, err := unix.GetsockoptInt(kfd, unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT); err == nil && secs > 0 {
			l.SetDeferAccept(secs)
		}
	}
	st.mu.Lock()
	st.listeners[l] = struct{}{}
	st.mu.Unlock()
	if l.reusePort {
		st.kickShare() // the watcher looks at its port from now on
	}
	return l, nil
}

// listenerInodes are the inodes of the kernel listeners whose netstack
// listeners the stack has.
func (st *Stack) listenerInodes() map[uint64]bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	served := map[uint64]bool{}
	for l := range st.listeners {
		served[l.inode] = true
	}
	return served
}

// checkSharedListeners closes the SO_REUSEPORT listeners whose port a
// kernel listener the stack does not serve shares, and says whether any
// is left to watch.
func (st *Stack) checkSharedListeners() bool {
	st.mu.Lock()
	byPort := map[uint16][]*NetstackListener{}
	for l := range st.listeners {
		if l.reusePort && !l.handover.Load() {
			byPort[l.local.Port()] = append(byPort[l.local.Port()], l)
		}
	}
	st.mu.Unlock()
	forShared(st, unix.IPPROTO_TCP, "connections", byPort, (*NetstackListener).Addr, st.listenerInodes,
		func(hit []*NetstackListener, reason string) {
			if st.opts.SharedListeners != nil {
				st.opts.SharedListeners(hit, reason)
				return
			}
			slog.Info("stack: " + reason)
			for _, l := range hit {
				l.Close()
			}
		})
	return len(byPort) > 0
}

// listen opens netstack's listening endpoint and the steering rule.
func (l *NetstackListener) listen(t *tcpState) error {
	st := l.st
	fa := tcpip.FullAddress{NIC: tcpNIC, Port: l.local.Port()}
	if !l.local.Addr().IsUnspecified() {
		fa.Addr = tcpip.AddrFrom4(l.local.Addr().As4())
		if err := st.tcpAddAddr(t.ns, l.local.Addr()); err != nil {
			return err
		}
	}
	ep, terr := t.ns.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, &l.wq)
	if terr != nil {
		return fmt.Errorf("netstack endpoint: %s", terr)
	}
	ep.SocketOptions().SetReusePort(l.reusePort)
	if terr := ep.Bind(fa); terr != nil {
		ep.Close()
		return fmt.Errorf("netstack bind: %s", terr)
	}
	// netstack's accept queue is the kernel's largest, whatever backlog
	// the application asked: once netstack's queue is full it completes
	// handshakes with SYN cookies, and a burst of 64 connects against a
	// backlog of 4 left a third of the clients connected in their view and
	// never accepted (TestRunTCPBacklogFull); the kernel served them all.
	// A longer queue changes nothing the application can see but when
	// connections complete.
	if terr := ep.Listen(unix.SOMAXCONN); terr != nil {
		ep.Close()
		return fmt.Errorf("netstack listen: %s", terr)
	}
	r := steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_TCP, Local: l.local}
	if l.local.Addr().IsUnspecified() {
		r.Kind = steer.RulePort
	}
	id, err := st.addRule(r)
	if err != nil {
		ep.Close()
		return err
	}
	l.ep, l.rule = ep, id
	return nil
}

// SetDeferAccept is TCP_DEFER_ACCEPT: a connection whose handshake
// completes without data waits up to secs seconds for its first data
// before accept gives it out, as on the kernel's listener (which keeps
// the setting too).
func (l *NetstackListener) SetDeferAccept(secs int) {
	o := tcpip.TCPDeferAcceptOption(time.Duration(max(secs, 0)) * time.Second)
	l.ep.SetSockOpt(&o)
}

// Accept takes a connection netstack has established, or returns
// unix.EAGAIN when none waits.
func (l *NetstackListener) Accept() (*TCPConn, error) {
	ep, wq, terr := l.ep.Accept(nil)
	if _, ok := terr.(*tcpip.ErrWouldBlock); ok {
		return nil, unix.EAGAIN
	}
	if terr != nil {
		return nil, fmt.Errorf("tcp accept %s: %w", l.local, tcpipErrno(terr))
	}
	c, err := l.st.adoptTCP(ep, wq, -1)
	if err != nil {
		ep.Abort()
		return nil, fmt.Errorf("tcp accept %s: %w", l.local, err)
	}
	return c, nil
}

// AcceptToKernel takes a connection netstack has established and moves
// it to a new kernel socket (TCPConn.ToKernel), made in the stack's
// network namespace with the options o (nil: none) and as AF_INET6 when
// mapped, for a process that accepts on the kernel listener instead of
// this one; unix.EAGAIN when none waits. One that cannot move is reset,
// and the error (ErrNotMoved) says why.
func (l *NetstackListener) AcceptToKernel(o *KernelOptions, mapped bool) (int, error) {
	c, err := l.Accept()
	if err != nil {
		return -1, err
	}
	if o != nil {
		c.InheritOptions(o)
	}
	if mapped {
		c.SetMapped()
	}
	kfd := -1
	err = netnsutil.Do(l.st.ns, func() (err error) {
		kfd, err = c.ToKernel()
		return err
	})
	if err != nil {
		c.Abort()
		err = fmt.Errorf("%w: %w", ErrNotMoved, err)
	}
	c.Close()
	return kfd, err
}

// KnockAddr is the source address of Knock's connections: an accept that
// gets one knows it is no client's (the preload library).
var KnockAddr = netip.AddrFrom4([4]byte{127, 86, 88, 83})

// Knock makes a connection from KnockAddr to the kernel listener on l's
// address, in the stack's network namespace, and closes it: it wakes a
// process waiting to accept there (in accept, poll, select or epoll),
// which takes a connection AcceptToKernel moved instead of it.
func (l *NetstackListener) Knock() error {
	dst := l.local
	if dst.Addr().IsUnspecified() {
		dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), dst.Port())
	}
	err := netnsutil.Do(l.st.ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		// Over loopback the handshake is done within connect; the bound
		// is for a backlog that is full.
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &unix.Timeval{Sec: 1})
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: KnockAddr.As4()}); err != nil {
			return err
		}
		return unix.Connect(fd, &unix.SockaddrInet4{Addr: dst.Addr().As4(), Port: int(dst.Port())})
	})
	if err != nil {
		return fmt.Errorf("tcp listener %s: knock from %s: %w", l.local, KnockAddr, err)
	}
	return nil
}

// ErrNotMoved: AcceptToKernel accepted a connection that could not move
// to the kernel, and reset it.
var ErrNotMoved = errors.New("accepted, and reset: it could not move to a kernel socket")

// Pending says whether a connection waits to be accepted.
func (l *NetstackListener) Pending() bool {
	return l.ep.Readiness(waiter.ReadableEvents) != 0
}

// Notify calls fn (on netstack's goroutine: it must not call into
// netstack) when a connection may wait; cancel stops it.
func (l *NetstackListener) Notify(fn func()) (cancel func()) {
	e := waiter.NewFunctionEntry(waiter.ReadableEvents, func(waiter.EventMask) { fn() })
	l.wq.EventRegister(&e)
	return func() { l.wq.EventUnregister(&e) }
}

// Addr is the listening address.
func (l *NetstackListener) Addr() netip.AddrPort { return l.local }

// Rule is the listener's steering rule.
func (l *NetstackListener) Rule() steer.RuleID { return l.rule }

// Handover starts the listener's way back to the kernel: from now on a
// new connection to its address goes to the kernel socket, while the
// connections netstack has made keep their segments, so that Accept
// still hands out those it holds and nothing is reset (steer.Program.
// Handover). The rule is the group's: every listener of the stack on the
// address is handed over with it. Close ends the handover. started is
// false when an earlier call started it.
func (l *NetstackListener) Handover() (started bool, err error) {
	if l.handover.Swap(true) {
		return false, nil
	}
	if err := l.st.prog.Handover(l.rule); err != nil {
		return true, fmt.Errorf("tcp listener %s: %w", l.local, err)
	}
	return true, nil
}

// InHandover says whether Handover started.
func (l *NetstackListener) InHandover() bool { return l.handover.Load() }

// Close removes the steering rule, then stops listening in netstack
// (connections not yet accepted are reset, as the kernel resets those of
// a closed listener); accepted connections keep their own rules. In that
// order, a SYN that comes meanwhile finds the kernel's listener: the
// other way round, netstack refused it (RST) while the rule still
// steered it there.
func (l *NetstackListener) Close() error {
	var err error
	l.once.Do(func() {
		l.st.mu.Lock()
		delete(l.st.listeners, l)
		l.st.mu.Unlock()
		err = l.st.removeRule(l.rule)
		l.ep.Close()
	})
	return err
}

// TCPListener is a listening TCP socket whose connections netstack serves
// for what arrives on the stack's interface. A kernel socket listens on
// the same address first, which keeps the port this process's, and takes
// the connections that come another way (loopback, other interfaces):
// Accept returns both kinds.
type TCPListener struct {
	nl    *NetstackListener
	kl    net.Listener
	conns chan acceptResult
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

type acceptResult struct {
	c   net.Conn
	err error
}

// ListenTCP listens on laddr (address unspecified: every address of the
// interface) with a kernel socket, then steers the interface's TCP to
// that address to netstack. Its connections have TCP_NODELAY set, as Go's
// net sets it. Call it in the stack's network namespace.
func (st *Stack) ListenTCP(laddr netip.AddrPort) (*TCPListener, error) {
	if !laddr.Addr().Is4() {
		return nil, fmt.Errorf("tcp listen %s: %w: IPv4 only", laddr, unix.EAFNOSUPPORT)
	}
	// The kernel's listener (net.Listen sets SO_REUSEADDR, as servers
	// do), in the calling thread's namespace.
	kl, err := net.Listen("tcp4", laddr.String())
	if err != nil {
		return nil, fmt.Errorf("tcp listen %s: %w", laddr, err)
	}
	local := netip.AddrPortFrom(laddr.Addr(), kl.Addr().(*net.TCPAddr).AddrPort().Port())
	nl, err := st.ListenNetstack(local, -1)
	if err != nil {
		kl.Close()
		return nil, err
	}
	l := &TCPListener{nl: nl, kl: kl, conns: make(chan acceptResult), done: make(chan struct{})}
	l.wg.Add(2)
	go l.acceptNetstack()
	go l.acceptKernel()
	return l, nil
}

// offer hands an accepted connection (or the error that ends a loop) to
// Accept; false when the listener closed first.
func (l *TCPListener) offer(c net.Conn, err error) bool {
	select {
	case l.conns <- acceptResult{c, err}:
		return true
	case <-l.done:
		if c != nil {
			c.Close()
		}
		return false
	}
}

func (l *TCPListener) acceptKernel() {
	defer l.wg.Done()
	for {
		c, err := l.kl.Accept()
		if !l.offer(c, err) || err != nil {
			return
		}
	}
}

func (l *TCPListener) acceptNetstack() {
	defer l.wg.Done()
	ready := make(chan struct{}, 1)
	defer l.nl.Notify(func() {
		select {
		case ready <- struct{}{}:
		default:
		}
	})()
	for {
		c, err := l.nl.Accept()
		if errors.Is(err, unix.EAGAIN) {
			select {
			case <-ready:
				continue
			case <-l.done:
				return
			}
		}
		if err != nil {
			l.offer(nil, err)
			return
		}
		// TCP_NODELAY, as Go's net sets on every TCP connection (the
		// kernel's accepted ones have it from l.kl).
		if err := c.SetOption(unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
			c.Close()
			l.offer(nil, fmt.Errorf("tcp accept on %s: TCP_NODELAY: %w", l.nl.local, err))
			return
		}
		if !l.offer(c, nil) {
			return
		}
	}
}

// Accept waits for the next connection, offloaded (a *TCPConn) or the
// kernel's.
func (l *TCPListener) Accept() (net.Conn, error) {
	select {
	case r := <-l.conns:
		if r.err != nil {
			return nil, fmt.Errorf("tcp accept %s: %w", l.nl.local, r.err)
		}
		return r.c, nil
	case <-l.done:
		return nil, fmt.Errorf("tcp accept %s: %w", l.nl.local, net.ErrClosed)
	}
}

// Addr is the listening address.
func (l *TCPListener) Addr() net.Addr { return net.TCPAddrFromAddrPort(l.nl.local) }

// Close stops listening, in netstack and the kernel, and removes the
// listener's steering rule; accepted connections keep their own.
func (l *TCPListener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		err = errors.Join(l.nl.Close(), l.kl.Close())
		l.wg.Wait()
	})
	return err
}

// adoptTCP wraps a connected netstack endpoint, with a 5-tuple rule.
func (st *Stack) adoptTCP(ep tcpip.Endpoint, wq *waiter.Queue, kfd int) (*TCPConn, error) {
	la, terr := ep.GetLocalAddress()
	if terr != nil {
		return nil, fmt.Errorf("netstack local address: %s", terr)
	}
	ra, terr := ep.GetRemoteAddress()
	if terr != nil {
		return nil, fmt.Errorf("netstack remote address: %s", terr)
	}
	r := steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_TCP,
		Local:  netip.AddrPortFrom(netip.AddrFrom4(la.Addr.As4()), la.Port),
		Remote: netip.AddrPortFrom(netip.AddrFrom4(ra.Addr.As4()), ra.Port)}
	id, err := st.addRule(r)
	if err != nil {
		return nil, err
	}
	return st.newTCPConn(ep, wq, r, id, kfd), nil
}

// newTCPConn wraps ep, whose 5-tuple rule r (id) is installed, and lists
// it by that 5-tuple for finArriving.
func (st *Stack) newTCPConn(ep tcpip.Endpoint, wq *waiter.Queue, r steer.Rule, id steer.RuleID, kfd int) *TCPConn {
	c := &TCPConn{TCPConn: gonet.NewTCPConn(wq, ep), st: st, ep: ep, wq: wq, rule: id, kfd: kfd,
		key: tcpKey{r.Local, r.Remote}}
	st.tcpConns.Store(c.key, c)
	return c
}

// DialTCP connects to raddr through netstack, from the interface address
// the kernel's route to raddr names and a port a kernel socket holds,
// with TCP_NODELAY set as Go's net sets it. Call it in the stack's
// network namespace.
func (st *Stack) DialTCP(ctx context.Context, raddr netip.AddrPort) (*TCPConn, error) {
	kfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("tcp dial %s: kernel socket: %w", raddr, err)
	}
	// TCP_NODELAY, as Go's net sets on every TCP connection.
	if err := unix.SetsockoptInt(kfd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		unix.Close(kfd)
		return nil, fmt.Errorf("tcp dial %s: TCP_NODELAY on fd %d: %w", raddr, kfd, err)
	}
	c, err := st.ConnectTCP(kfd, raddr)
	if err != nil {
		unix.Close(kfd)
		return nil, err
	}
	done := make(chan struct{}, 1)
	cancel := c.Notify(func(ev TCPEvents) {
		if ev&(TCPWritable|TCPHangup|TCPError) != 0 {
			select {
			case done <- struct{}{}:
			default:
			}
		}
	})
	defer cancel()
	for c.Connecting() {
		select {
		case <-ctx.Done():
			c.Abort()
			c.Close()
			return nil, fmt.Errorf("tcp dial %s: %w", raddr, ctx.Err())
		case <-done:
		}
	}
	if errno := c.SoError(); errno != 0 || c.State() != tcp.StateEstablished {
		c.Close()
		if errno == 0 {
			errno = unix.ECONNABORTED
		}
		return nil, fmt.Errorf("tcp dial %s: %w", raddr, errno)
	}
	return c, nil
}

// ConnectTCP starts connecting to raddr through netstack from kfd, a
// kernel TCP socket of the caller's that holds the local port: bound
// here, to the source address of the kernel's route to raddr, unless it
// is bound already. It returns once the SYN is sent; the connection's
// events say when it is established (TCPWritable) or failed (TCPHangup,
// with SoError). The connection owns kfd from then on and closes it when
// netstack is done with the port. Call it in the stack's network
// namespace. The options set on kfd before are the connection's.
func (st *Stack) ConnectTCP(kfd int, raddr netip.AddrPort) (*TCPConn, error) {
	if !raddr.Addr().Is4() {
		return nil, fmt.Errorf("tcp connect %s: %w: IPv4 only", raddr, unix.EAFNOSUPPORT)
	}
	t, err := st.tcpStack()
	if err != nil {
		return nil, fmt.Errorf("tcp connect %s: %w", raddr, err)
	}
	// No wait for ARP here, as the kernel's connect has none: the SYN
	// waits for the answer in the link (tcpLink.park), and netstack sends
	// it again if none comes. A connect that waited up to ResolveTimeout
	// blocked a non-blocking caller, and failed where the kernel's next
	// ARP request, a second later, would have been answered.
	hop, err := st.hopNow(raddr.Addr())
	if err != nil && !errors.Is(err, errNeighPending) {
		return nil, fmt.Errorf("tcp connect %s: %w", raddr, err)
	}
	if hop.viaKernel {
		return nil, fmt.Errorf("tcp connect %s: %w: not reached through %s", raddr, unix.ENETUNREACH, st.ifname)
	}
	local, _, err := SockAddrs(kfd)
	if err != nil {
		return nil, fmt.Errorf("tcp connect %s: %w", raddr, err)
	}
	if local.Port() == 0 {
		if local, err = kernelBind(kfd, hop.src); err != nil {
			return nil, fmt.Errorf("tcp connect %s: %w", raddr, err)
		}
	}
	if local.Addr().IsUnspecified() {
		local = netip.AddrPortFrom(hop.src, local.Port())
	}
	var wq waiter.Queue
	ep, terr := t.ns.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if terr != nil {
		return nil, fmt.Errorf("tcp connect %s: netstack endpoint: %s", raddr, terr)
	}
	if terr := ep.Bind(tcpip.FullAddress{NIC: tcpNIC, Addr: tcpip.AddrFrom4(local.Addr().As4()), Port: local.Port()}); terr != nil {
		ep.Close()
		return nil, fmt.Errorf("tcp connect %s: netstack bind %s: %s", raddr, local, terr)
	}
	// What was set before connect holds after it, as on the kernel's
	// socket; set before the SYN, which carries the window and MSS.
	if err := copyOptions(ep, kfd, &t.defaults); err != nil {
		slog.Warn(fmt.Sprintf("tcp connect %s: options set before connect: %v; connecting without those", raddr, err))
	}
	// The rule goes in before the SYN goes out: the SYN-ACK must find it.
	r := steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_TCP, Local: local, Remote: raddr}
	id, err := st.addRule(r)
	if err != nil {
		ep.Close()
		return nil, fmt.Errorf("tcp connect %s: %w", raddr, err)
	}
	terr = ep.Connect(tcpip.FullAddress{NIC: tcpNIC, Addr: tcpip.AddrFrom4(raddr.Addr().As4()), Port: raddr.Port()})
	if _, started := terr.(*tcpip.ErrConnectStarted); terr != nil && !started {
		ep.Abort()
		st.removeRule(id)
		return nil, fmt.Errorf("tcp connect %s: %w", raddr, tcpipErrno(terr))
	}
	return st.newTCPConn(ep, &wq, r, id, kfd), nil
}

// tcpipErrno gives netstack's errors the kernel's names, for errors.Is.
func tcpipErrno(e tcpip.Error) error {
	switch e.(type) {
	case *tcpip.ErrConnectionRefused:
		return unix.ECONNREFUSED
	case *tcpip.ErrTimeout:
		return unix.ETIMEDOUT
	case *tcpip.ErrConnectionReset:
		return unix.ECONNRESET
	case *tcpip.ErrNetworkUnreachable:
		return unix.ENETUNREACH
	case *tcpip.ErrHostUnreachable:
		return unix.EHOSTUNREACH
	case *tcpip.ErrWouldBlock:
		return unix.EAGAIN
	case *tcpip.ErrNotConnected:
		return unix.ENOTCONN
	case *tcpip.ErrClosedForSend:
		return unix.EPIPE
	case *tcpip.ErrConnectionAborted:
		return unix.ECONNABORTED
	case *tcpip.ErrInvalidEndpointState, *tcpip.ErrInvalidOptionValue:
		return unix.EINVAL
	case *tcpip.ErrUnknownProtocolOption, *tcpip.ErrNotSupported:
		return unix.ENOPROTOOPT
	case *tcpip.ErrAlreadyConnected:
		return unix.EISCONN
	case *tcpip.ErrAlreadyConnecting:
		return unix.EALREADY
	case *tcpip.ErrConnectStarted:
		return unix.EINPROGRESS
	case *tcpip.ErrNoSuchFile:
		return unix.ENOENT // an unknown TCP_CONGESTION, as the kernel's
	}
	return errors.New(e.String())
}

// kernelBind binds the kernel socket fd to src and a port the kernel
// picks, which keeps that port from its other sockets; an AF_INET6
// socket to src mapped, as its own connect would.
func kernelBind(fd int, src netip.Addr) (netip.AddrPort, error) {
	var sa unix.Sockaddr = &unix.SockaddrInet4{Addr: src.As4()}
	if dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); err == nil && dom == unix.AF_INET6 {
		sa = &unix.SockaddrInet6{Addr: src.As16()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return netip.AddrPort{}, fmt.Errorf("kernel socket: bind %s: %w", src, err)
	}
	local, _, err := SockAddrs(fd)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("kernel socket: %w", err)
	}
	return local, nil
}

var (
	_ net.Listener = (*TCPListener)(nil)
	_ net.Conn     = (*TCPConn)(nil)
)
