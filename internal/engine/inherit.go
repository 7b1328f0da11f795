package engine

import (
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/params"
)

// Inherited serves fd, a socket the process started with: activated,
// one socket activation passed it (systemd's LISTEN_FDS, which
// systemd-socket-activate follows too). No socket, bind or listen call of
// this process names it, so without this it stayed on the kernel without
// a word.
//
// An activated UDP socket is taken as socket, setsockopt, bind and
// connect would have taken it (inheritedUDP). An activated TCP listener
// (VMAXDP_TCP=1; with TCP off, TCP sockets are not looked at) is offloaded as if the process had called listen on it.
// The connections the kernel already has on its port, the one that
// started the service among them, keep their segments on the kernel: the
// steering program leaves a listener's segment to the kernel when the
// kernel has a connection for it. Any other inherited socket stays on the
// kernel, and the log says why: a connection, which the kernel serves
// already, or a socket a fork and exec left open, which the parent may
// still serve (a steering rule of this process would take its traffic).
func (e *Engine) Inherited(fd int, activated bool) State {
	if fd < 0 || fd >= MaxFD {
		return StateOS
	}
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil || (dom != unix.AF_INET && dom != unix.AF_INET6) {
		return StateOS
	}
	e.Announce()
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return StateOS
	}
	local, remote := sockAddrs(fd)
	if dom == unix.AF_INET6 {
		local, remote = sockAddrs6(fd)
	}
	kind := "UDP socket"
	switch typ {
	case unix.SOCK_STREAM:
		if !e.p.TCP {
			e.Log.Printf(params.LevelDebug, "fd %d: inherited TCP socket %s not offloaded: %sTCP=0", fd, local, params.Prefix)
			return StateOS
		}
		if on, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || on == 0 {
			what := fmt.Sprintf("inherited TCP socket %s", local)
			if remote.IsValid() && remote.Port() != 0 {
				what = fmt.Sprintf("inherited TCP connection %s>%s", local, remote)
			}
			e.tcpNotOffloaded(fd, what, "the process started with it, and the kernel serves it; vmaxdp offloads the connections the process accepts or makes")
			return StateOS
		}
		kind = "TCP listener"
		if activated {
			e.Log.Printf(params.LevelDebug, "fd %d: %s %s from socket activation", fd, kind, local)
			return e.Listen(fd, somaxconn())
		}
	case unix.SOCK_DGRAM:
		if proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || proto != unix.IPPROTO_UDP {
			return StateOS
		}
		if activated {
			e.Log.Printf(params.LevelDebug, "fd %d: %s %s from socket activation", fd, kind, local)
			return e.inheritedUDP(fd, dom, local, remote)
		}
	default:
		return StateOS
	}
	e.logNotOffloaded(fd, fmt.Sprintf("inherited %s %s", kind, local),
		"the process started with it, not from socket activation (LISTEN_FDS), so another process may serve it too; vmaxdp offloads the sockets the process makes and those socket activation passes it")
	if typ == unix.SOCK_STREAM {
		e.noteStream(fd, func(n *kernelStream) { n.reason = "inherited, not from socket activation" })
	}
	return StateOS
}

// somaxconn is the kernel's largest listen backlog: what systemd's sockets
// ask for by default, and the most any inherited listener has (the
// backlog it was given cannot be read back from the socket).
func somaxconn() int {
	b, err := os.ReadFile("/proc/sys/net/core/somaxconn")
	if err != nil {
		return unix.SOMAXCONN
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return unix.SOMAXCONN
	}
	return n
}

// inheritedUDP takes fd, an inherited UDP socket of family dom, as
// socket, setsockopt, bind and connect would have taken it. The options
// the engine follows are read back off the kernel socket: those that
// differ from a fresh socket's were set. The multicast groups it joined
// cannot be read back: their datagrams reach it through the kernel
// socket, which the engine reads as well.
func (e *Engine) inheritedUDP(fd, dom int, local, remote netip.AddrPort) State {
	fresh, err := unix.Socket(dom, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		e.logNotOffloaded(fd, fmt.Sprintf("inherited UDP socket %s", local), fmt.Sprintf("a fresh socket to compare its options with: %v", err))
		return StateOS
	}
	fresh = highfd.Move(fresh)
	defer highfd.Close(fresh)
	fl, _ := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	// As for a socket the process makes, VMAXDP_TX_MC_LOOPBACK=0 turns
	// the kernel socket's IP_MULTICAST_LOOP off; the replay below then
	// reads it off.
	if st := e.Socket(fd, fl&unix.O_NONBLOCK != 0); st != StateCandidate {
		return st
	}
	for _, o := range intOptions {
		v, err := unix.GetsockoptInt(fd, o.level, o.name)
		if err != nil {
			continue // one this kernel or family lacks, or none can read
		}
		if def, err := unix.GetsockoptInt(fresh, o.level, o.name); err == nil && v != def {
			if o.halved {
				v /= 2
			}
			o.follow(e, fd, v)
		}
	}
	cmsgs := make([]sockOpt, 0, len(cmsgOptions)+len(foreignCmsgOptions)+len(ipv6CmsgOptions))
	for _, o := range cmsgOptions {
		cmsgs = append(cmsgs, o.sockOpt)
	}
	for _, o := range foreignCmsgOptions {
		cmsgs = append(cmsgs, o.sockOpt)
	}
	if dom == unix.AF_INET6 {
		for name := range ipv6CmsgOptions {
			cmsgs = append(cmsgs, sockOpt{unix.IPPROTO_IPV6, name})
		}
	}
	for _, o := range cmsgs {
		if v, err := unix.GetsockoptInt(fd, o.level, o.name); err == nil && v != 0 {
			e.SetCmsgOption(fd, o.level, o.name, true)
		}
	}
	if flags, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPING_OLD); err == nil && flags != 0 {
		e.SetTimestamping(fd, flags, false) // the layout it was set with cannot be read back
	}
	if tv, err := unix.GetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO); err == nil && tv.Nano() > 0 {
		e.SetRcvTimeo(fd, time.Duration(tv.Nano()))
	}
	if dev := boundDevice(fd); dev != "" {
		e.SetBoundDevice(fd, dev)
	}
	if dom == unix.AF_INET {
		if a, err := unix.GetsockoptInet4Addr(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_IF); err == nil && a != [4]byte{} {
			e.SetMulticastIf(fd, netip.AddrFrom4(a), 0)
		}
	}
	switch {
	case remote.IsValid() && remote.Port() != 0:
		return e.Connect(fd)
	case local.Port() != 0:
		return e.Bind(fd)
	}
	return StateCandidate // the first send decides, as for a socket the process made
}
