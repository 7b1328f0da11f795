package engine

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
)

// Inherited serves fd, a socket the process started with: one a
// supervisor made and passed (systemd's socket activation, inetd), or one
// a program that exec'd this one left open. No socket, bind or listen
// call of this process names it, so without this it stayed on the kernel
// without a word.
//
// A TCP listener (VMAXDP_TCP=1) is offloaded as if the process had called
// listen on it. The connections the kernel already has on its port, the
// one that started a socket-activated service among them, keep their
// segments on the kernel: the steering program leaves a listener's
// segment to the kernel when the kernel has a connection for it. Any other
// inherited socket (a UDP socket, whose options and multicast groups the
// engine cannot read back; a connection, which the kernel already
// serves) stays on the kernel, and the log says so, once per kind at
// INFO.
func (e *Engine) Inherited(fd int) State {
	if fd < 0 || fd >= MaxFD {
		return StateOS
	}
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil || (dom != unix.AF_INET && dom != unix.AF_INET6) {
		return StateOS
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return StateOS
	}
	local, remote := sockAddrs(fd)
	if dom == unix.AF_INET6 {
		local, remote = sockAddrs6(fd)
	}
	switch typ {
	case unix.SOCK_STREAM:
		if on, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err == nil && on != 0 {
			e.Log.Printf(params.LevelDebug, "fd %d: inherited TCP listener %s", fd, local)
			return e.Listen(fd, somaxconn())
		}
		what := fmt.Sprintf("inherited TCP connection %s>%s", local, remote)
		e.tcpNotOffloaded(fd, what, "the process started with it, and the kernel serves it; vmaxdp offloads the connections the process accepts or makes")
	case unix.SOCK_DGRAM:
		what := fmt.Sprintf("inherited UDP socket %s", local)
		if remote.IsValid() && remote.Port() != 0 {
			what += ">" + remote.String()
		}
		e.logNotOffloaded(fd, what, "the process started with it (socket activation, inetd), and vmaxdp cannot read back its multicast groups and options; vmaxdp offloads the UDP sockets the process makes")
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
