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

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/sockdiag"
)

// A socket with SO_REUSEPORT or SO_REUSEADDR may share its address and
// port with kernel sockets the stack does not serve: members of its
// SO_REUSEPORT group in another process, or in this one but left to the
// kernel, receivers of the same multicast group in another process, a
// connected socket on the port. The steering rule would take their
// datagrams too, and they would get none. So the stack looks, through
// sock_diag, at the kernel sockets on the ports of its shareable sockets:
// at each bind, when one of its sockets goes back to the kernel (Unsteer),
// and every shareEvery while it serves any; one it does not serve sends
// every socket of the stack on that address and port back to the kernel
// (Options.Shared), with the reason.

// ErrShared is returned by Adopt when a kernel socket the stack does not
// serve shares the socket's address and port.
var ErrShared = errors.New("port shared")

// sharedCause is why the sockets on local, which who shares, go to the
// kernel: the same words whether Adopt, ListenNetstack or the watcher
// finds it. what is what the kernel spreads: datagrams, connections.
func sharedCause(local netip.AddrPort, who, what string) string {
	return fmt.Sprintf("%s is shared with %s, which vmaxdp does not serve: every socket on it goes to the kernel, which spreads %s over them all", local, who, what)
}

// shareEvery is how often the watcher looks for sockets sharing a port
// with a shareable socket of the stack (milliseconds).
const shareEvery = 250

// shareable reads whether the kernel socket fd may share its address and
// port (SO_REUSEPORT, SO_REUSEADDR), and its inode.
func shareable(fd int) (share bool, inode uint64) {
	for _, opt := range []int{unix.SO_REUSEPORT, unix.SO_REUSEADDR} {
		if v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, opt); err == nil && v != 0 {
			share = true
		}
	}
	var s unix.Stat_t
	if unix.Fstat(fd, &s) == nil {
		inode = s.Ino
	}
	return share, inode
}

// kernelSock is one kernel UDP socket as sock_diag reports it.
type kernelSock struct {
	local netip.Addr // unspecified: any
	v6any bool       // an IPv6 socket bound to :: without IPV6_V6ONLY: it receives IPv4 too
	inode uint64
}

// overlaps says whether the kernel socket receives datagrams sent to
// local's address.
func (k *kernelSock) overlaps(local netip.Addr) bool {
	return k.v6any || k.local.IsUnspecified() || local.IsUnspecified() || k.local == local
}

// diag is a NETLINK_SOCK_DIAG socket in the stack's namespace, kept at a
// high fd; vishvananda/netlink opens one per call, which takes a low fd
// from the application each time.
type diag struct {
	mu  sync.Mutex
	fd  int
	buf []byte
}

func openDiag() (*diag, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("sock_diag socket: %w", err)
	}
	return &diag{fd: highfd.Move(fd), buf: make([]byte, 1<<16)}, nil
}

func (d *diag) close() {
	if d != nil {
		highfd.Close(d.fd)
	}
}

// Offsets in struct inet_diag_req_v2 and struct inet_diag_msg.
const (
	diagReqLen   = 56 // family, protocol, ext, pad, states, sockid (48)
	diagMsgLen   = 72 // family, state, timer, retrans, sockid, expires, rqueue, wqueue, uid, inode
	diagSportOff = 8  // of the sockid in a request; 4 in a message
	diagV6Only   = 11 // INET_DIAG_SKV6ONLY
)

// Which kernel sockets share a port: for UDP every bound one, for TCP
// the listeners.
const (
	diagUDPStates = ^uint32(0)
	diagTCPStates = 1 << 10 // TCP_LISTEN
)

// onPort lists the kernel's sockets of proto (IPPROTO_UDP, IPPROTO_TCP)
// in states bound to port, IPv4 and IPv6.
func (d *diag) onPort(proto uint8, states uint32, port uint16) ([]kernelSock, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []kernelSock
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		req := make([]byte, unix.SizeofNlMsghdr+diagReqLen)
		binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
		binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
		binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
		r := req[unix.SizeofNlMsghdr:]
		r[0], r[1] = family, proto
		binary.NativeEndian.PutUint32(r[4:], states)
		binary.BigEndian.PutUint16(r[diagSportOff:], port) // udp_dump and the TCP listeners' dump filter on it
		err := sockdiag.Dump(d.fd, req, d.buf, func(data []byte) {
			if k, ok := parseDiagMsg(data, family, port); ok {
				out = append(out, k)
			}
		})
		if err != nil {
			return nil, fmt.Errorf("sock_diag protocol %d port %d: %w", proto, port, err)
		}
	}
	return out, nil
}

// parseDiagMsg reads one inet_diag_msg and its attributes.
func parseDiagMsg(b []byte, family uint8, port uint16) (kernelSock, bool) {
	if len(b) < diagMsgLen || b[0] != family || binary.BigEndian.Uint16(b[4:]) != port {
		return kernelSock{}, false
	}
	k := kernelSock{inode: uint64(binary.NativeEndian.Uint32(b[68:]))}
	src := b[8:24]
	if family == unix.AF_INET {
		k.local = netip.AddrFrom4([4]byte(src[:4]))
		return k, true
	}
	switch l := netip.AddrFrom16([16]byte(src)); {
	case l.Is4In6():
		k.local = l.Unmap()
	case l.IsUnspecified():
		k.v6any = true
		for a := b[diagMsgLen:]; len(a) >= 4; {
			alen := int(binary.NativeEndian.Uint16(a))
			if alen < 4 || alen > len(a) {
				break
			}
			if binary.NativeEndian.Uint16(a[2:]) == diagV6Only && alen >= 5 && a[4] != 0 {
				k.v6any = false
			}
			a = a[min(len(a), (alen+3)&^3):]
		}
		if !k.v6any {
			return kernelSock{}, false
		}
	default:
		return kernelSock{}, false // IPv6 only: never an IPv4 datagram
	}
	return k, true
}

// kickShare asks the watcher to look for shared ports now.
func (st *Stack) kickShare() {
	if st.shareKick >= 0 {
		one := [8]byte{1}
		unix.Write(st.shareKick, one[:])
	}
}

// shareableConns lists the stack's steered shareable sockets, and the
// inodes of all it serves.
func (st *Stack) shareableConns() (share []*UDPConn, served map[uint64]bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	served = map[uint64]bool{}
	for c := range st.conns {
		if !c.steered.Load() {
			continue
		}
		served[c.inode] = true
		if c.shareable {
			share = append(share, c)
		}
	}
	return share, served
}

// sharedWith lists (by index) the addresses of locals, all on port, that
// a kernel socket of proto the stack does not serve shares, with a
// description of one such socket: one sock_diag dump for the port,
// however many sockets of the stack are on it. served gives the inodes
// the stack serves, asked after the dump: a listener is the stack's
// before its kernel socket listens, so one the dump shows listening is
// known by then.
func (st *Stack) sharedWith(proto uint8, port uint16, locals []netip.Addr, servedNow func() map[uint64]bool) (hit []int, who string, err error) {
	states := uint32(diagUDPStates)
	if proto == unix.IPPROTO_TCP {
		states = diagTCPStates
	}
	socks, err := st.diag.onPort(proto, states, port)
	if err != nil {
		return nil, "", err
	}
	served := servedNow()
	var other kernelSock
	for i, local := range locals {
		for _, k := range socks {
			if served[k.inode] || (st.opts.Ours != nil && st.opts.Ours(k.inode)) || !k.overlaps(local) {
				continue
			}
			hit, other = append(hit, i), k
			break
		}
	}
	if len(hit) == 0 {
		return nil, "", nil
	}
	who = describeSocket(other.inode)
	// A socket the application is closing is still listed until its close
	// returns, after the engine forgot it: iperf3's server lost its
	// offload to its own closed listener. One that is still there after
	// the look at /proc is not closing.
	again, err := st.diag.onPort(proto, states, port)
	if err != nil {
		return nil, "", err
	}
	if !slices.ContainsFunc(again, func(a kernelSock) bool { return a.inode == other.inode }) {
		return nil, "", nil
	}
	return hit, who, nil
}

// checkShared sends back to the kernel every steered socket and netstack
// listener that shares its address and port with a kernel socket the
// stack does not serve, and says whether the stack still has shareable
// sockets to watch.
func (st *Stack) checkShared() bool {
	if st.diag == nil {
		return false
	}
	share, _ := st.shareableConns()
	served := func() map[uint64]bool {
		_, s := st.shareableConns()
		return s
	}
	byPort := map[uint16][]*UDPConn{}
	for _, c := range share {
		byPort[c.local.Port()] = append(byPort[c.local.Port()], c)
	}
	ok := forShared(st, unix.IPPROTO_UDP, "datagrams", byPort, func(c *UDPConn) netip.AddrPort { return c.local }, served,
		func(hit []*UDPConn, reason string) {
			if st.opts.Shared != nil {
				st.opts.Shared(hit, reason)
				return
			}
			slog.Info("stack: " + reason)
			for _, c := range hit {
				c.Unsteer()
			}
		})
	return st.checkSharedListeners() || len(share) > 0 || !ok
}

// forShared calls back, for each port of byPort, with the sockets on it
// that a kernel socket of proto the stack does not serve shares, and why
// (what: what the kernel spreads); false when a port could not be looked
// at.
func forShared[T any](st *Stack, proto uint8, what string, byPort map[uint16][]T, local func(T) netip.AddrPort, served func() map[uint64]bool, back func(hit []T, reason string)) bool {
	for port, group := range byPort {
		locals := make([]netip.Addr, len(group))
		for i, m := range group {
			locals[i] = local(m).Addr()
		}
		idx, who, err := st.sharedWith(proto, port, locals, served)
		if err != nil {
			slog.Warn("stack: cannot list the sockets sharing a port", "interface", st.ifname, "protocol", proto, "port", port, "err", err)
			return false
		}
		if len(idx) == 0 {
			continue
		}
		hit := make([]T, len(idx))
		for i, j := range idx {
			hit[i] = group[j]
		}
		back(hit, sharedCause(local(hit[0]), who, what))
	}
	return true
}

// describeSocket names the owner of the socket with this inode: an fd of
// this process, or a process found in /proc.
func describeSocket(inode uint64) string {
	switch pid, fd, comm := sockdiag.Owner(inode); {
	case pid == os.Getpid():
		return fmt.Sprintf("fd %d of this process (the kernel serves it)", fd)
	case pid != 0:
		return fmt.Sprintf("pid %d (%s)", pid, comm)
	}
	return fmt.Sprintf("socket inode %d of another process", inode)
}
