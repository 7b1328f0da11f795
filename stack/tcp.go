package stack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/vmaxdp/vmaxdp/steer"
)

// TCP sockets on netstack (tcplink.go has the link under them).

// TCPListener is a listening TCP socket whose connections netstack serves
// for what arrives on the stack's interface. A kernel socket listens on
// the same address first, which keeps the port this process's, and takes
// the connections that come another way (loopback, other interfaces):
// Accept returns both kinds.
type TCPListener struct {
	st    *Stack
	local netip.AddrPort
	ep    tcpip.Endpoint
	wq    waiter.Queue
	kl    net.Listener
	rule  steer.RuleID
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
// that address to netstack. Call it in the stack's network namespace.
func (st *Stack) ListenTCP(laddr netip.AddrPort) (*TCPListener, error) {
	if !laddr.Addr().Is4() {
		return nil, fmt.Errorf("tcp listen %s: %w: IPv4 only", laddr, unix.EAFNOSUPPORT)
	}
	t, err := st.tcpStack()
	if err != nil {
		return nil, fmt.Errorf("tcp listen %s: %w", laddr, err)
	}
	// The kernel's listener (net.Listen sets SO_REUSEADDR, as servers
	// do), in the calling thread's namespace.
	kl, err := net.Listen("tcp4", laddr.String())
	if err != nil {
		return nil, fmt.Errorf("tcp listen %s: %w", laddr, err)
	}
	l := &TCPListener{st: st, local: laddr, kl: kl, conns: make(chan acceptResult), done: make(chan struct{})}
	if err := l.listen(t); err != nil {
		kl.Close()
		return nil, fmt.Errorf("tcp listen %s: %w", laddr, err)
	}
	l.wg.Add(2)
	go l.acceptNetstack()
	go l.acceptKernel()
	return l, nil
}

// listen opens netstack's listening endpoint and the steering rule.
func (l *TCPListener) listen(t *tcpState) error {
	st := l.st
	if l.local.Port() == 0 {
		l.local = netip.AddrPortFrom(l.local.Addr(), l.kl.Addr().(*net.TCPAddr).AddrPort().Port())
	}
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
	if terr := ep.Bind(fa); terr != nil {
		ep.Close()
		return fmt.Errorf("netstack bind: %s", terr)
	}
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
	entry, ready := waiter.NewChannelEntry(waiter.ReadableEvents)
	l.wq.EventRegister(&entry)
	defer l.wq.EventUnregister(&entry)
	for {
		ep, wq, terr := l.ep.Accept(nil)
		if _, ok := terr.(*tcpip.ErrWouldBlock); ok {
			select {
			case <-ready:
				continue
			case <-l.done:
				return
			}
		}
		if terr != nil {
			l.offer(nil, errors.New(terr.String()))
			return
		}
		c, err := l.st.adoptTCP(ep, wq, -1)
		if err != nil {
			ep.Abort()
		}
		if !l.offer(c, err) {
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
			return nil, fmt.Errorf("tcp accept %s: %w", l.local, r.err)
		}
		return r.c, nil
	case <-l.done:
		return nil, fmt.Errorf("tcp accept %s: %w", l.local, net.ErrClosed)
	}
}

// Addr is the listening address.
func (l *TCPListener) Addr() net.Addr { return net.TCPAddrFromAddrPort(l.local) }

// Close stops listening, in netstack and the kernel, and removes the
// listener's steering rule; accepted connections keep their own.
func (l *TCPListener) Close() error {
	var err error
	l.once.Do(func() {
		close(l.done)
		l.ep.Close()
		err = errors.Join(l.st.removeRule(l.rule), l.kl.Close())
		l.wg.Wait()
	})
	return err
}

// TCPConn is a TCP connection netstack serves. Its 5-tuple has a steering
// rule of its own, so that it outlives its listener; a connection this
// stack opened also holds its local port in a kernel socket.
type TCPConn struct {
	*gonet.TCPConn
	st   *Stack
	ep   tcpip.Endpoint
	rule steer.RuleID
	kfd  int // the kernel socket that holds the local port, or -1
	once sync.Once
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
	return &TCPConn{TCPConn: gonet.NewTCPConn(wq, ep), st: st, ep: ep, rule: id, kfd: kfd}, nil
}

// DialTCP connects to raddr through netstack, from the interface address
// the kernel's route to raddr names and a port a kernel socket holds.
// Call it in the stack's network namespace.
func (st *Stack) DialTCP(ctx context.Context, raddr netip.AddrPort) (*TCPConn, error) {
	if !raddr.Addr().Is4() {
		return nil, fmt.Errorf("tcp dial %s: %w: IPv4 only", raddr, unix.EAFNOSUPPORT)
	}
	t, err := st.tcpStack()
	if err != nil {
		return nil, fmt.Errorf("tcp dial %s: %w", raddr, err)
	}
	hop, err := st.nextHop(raddr.Addr())
	if err != nil {
		return nil, fmt.Errorf("tcp dial %s: %w", raddr, err)
	}
	if hop.viaKernel {
		return nil, fmt.Errorf("tcp dial %s: %w: not reached through %s", raddr, unix.ENETUNREACH, st.ifname)
	}
	kfd, local, err := kernelBindAny(hop.src)
	if err != nil {
		return nil, fmt.Errorf("tcp dial %s: %w", raddr, err)
	}
	c, err := st.dial(ctx, t, kfd, local, raddr)
	if err != nil {
		unix.Close(kfd)
		return nil, fmt.Errorf("tcp dial %s: %w", raddr, err)
	}
	return c, nil
}

func (st *Stack) dial(ctx context.Context, t *tcpState, kfd int, local, raddr netip.AddrPort) (*TCPConn, error) {
	var wq waiter.Queue
	ep, terr := t.ns.NewEndpoint(tcp.ProtocolNumber, ipv4.ProtocolNumber, &wq)
	if terr != nil {
		return nil, fmt.Errorf("netstack endpoint: %s", terr)
	}
	if terr := ep.Bind(tcpip.FullAddress{NIC: tcpNIC, Addr: tcpip.AddrFrom4(local.Addr().As4()), Port: local.Port()}); terr != nil {
		ep.Close()
		return nil, fmt.Errorf("netstack bind %s: %s", local, terr)
	}
	// The rule goes in before the SYN goes out: the SYN-ACK must find it.
	r := steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_TCP, Local: local, Remote: raddr}
	id, err := st.addRule(r)
	if err != nil {
		ep.Close()
		return nil, err
	}
	entry, ready := waiter.NewChannelEntry(waiter.WritableEvents)
	wq.EventRegister(&entry)
	defer wq.EventUnregister(&entry)
	terr = ep.Connect(tcpip.FullAddress{NIC: tcpNIC, Addr: tcpip.AddrFrom4(raddr.Addr().As4()), Port: raddr.Port()})
	if _, ok := terr.(*tcpip.ErrConnectStarted); ok {
		select {
		case <-ctx.Done():
			terr = nil
			err = ctx.Err()
		case <-ready:
			terr = ep.LastError()
		}
	}
	if terr != nil {
		err = tcpipErrno(terr)
	}
	if err != nil {
		ep.Abort()
		st.removeRule(id)
		return nil, err
	}
	return &TCPConn{TCPConn: gonet.NewTCPConn(&wq, ep), st: st, ep: ep, rule: id, kfd: kfd}, nil
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
	case *tcpip.ErrNetworkUnreachable, *tcpip.ErrHostUnreachable:
		return unix.EHOSTUNREACH
	}
	return errors.New(e.String())
}

// kernelBindAny binds a kernel TCP socket to src and a port the kernel
// picks, which keeps that port from its other sockets.
func kernelBindAny(src netip.Addr) (int, netip.AddrPort, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, netip.AddrPort{}, fmt.Errorf("kernel socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: src.As4()}); err != nil {
		unix.Close(fd)
		return -1, netip.AddrPort{}, fmt.Errorf("kernel socket: bind %s: %w", src, err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return -1, netip.AddrPort{}, fmt.Errorf("kernel socket: getsockname: %w", err)
	}
	return fd, netip.AddrPortFrom(src, uint16(sa.(*unix.SockaddrInet4).Port)), nil
}

// Close closes the connection as netstack does (FIN, or RST with unread
// data); its rule and port stay until netstack has finished with it.
func (c *TCPConn) Close() error {
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

// release removes the connection's rule and kernel socket.
func (c *TCPConn) release() {
	c.st.removeRule(c.rule)
	if c.kfd >= 0 {
		unix.Close(c.kfd)
		c.kfd = -1
	}
}

// State is netstack's TCP state of the connection.
func (c *TCPConn) State() tcp.EndpointState { return tcp.EndpointState(c.ep.State()) }

var (
	_ net.Listener = (*TCPListener)(nil)
	_ net.Conn     = (*TCPConn)(nil)
)
