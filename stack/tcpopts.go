package stack

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
)

// inheritedOptions are the options a netstack connection takes from a
// kernel socket: for an accepted connection, the listener's (the
// kernel's accepted socket is a copy of its listener, options and all);
// for connect, the connecting socket's own, set before connect.
var inheritedOptions = [...]struct {
	level, name int
	what        string
}{
	{unix.IPPROTO_TCP, unix.TCP_NODELAY, "TCP_NODELAY"},
	{unix.IPPROTO_TCP, unix.TCP_CORK, "TCP_CORK"},
	{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, "TCP_KEEPIDLE"},
	{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL, "TCP_KEEPINTVL"},
	{unix.IPPROTO_TCP, unix.TCP_KEEPCNT, "TCP_KEEPCNT"},
	{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, "TCP_USER_TIMEOUT"},
	{unix.IPPROTO_TCP, unix.TCP_MAXSEG, "TCP_MAXSEG"},
	{unix.IPPROTO_TCP, unix.TCP_SYNCNT, "TCP_SYNCNT"},
	{unix.IPPROTO_TCP, unix.TCP_LINGER2, "TCP_LINGER2"},
	{unix.IPPROTO_TCP, unix.TCP_WINDOW_CLAMP, "TCP_WINDOW_CLAMP"},
	{unix.SOL_SOCKET, unix.SO_KEEPALIVE, "SO_KEEPALIVE"},
	{unix.SOL_SOCKET, unix.SO_RCVBUF, "SO_RCVBUF"},
	{unix.SOL_SOCKET, unix.SO_SNDBUF, "SO_SNDBUF"},
	{unix.IPPROTO_IP, unix.IP_TOS, "IP_TOS"},
	{unix.IPPROTO_IP, unix.IP_TTL, "IP_TTL"},
}

// optionDefaults are a fresh kernel TCP socket's values of
// inheritedOptions and its TCP_CONGESTION, in the stack's network
// namespace (its sysctls): a socket's value that differs is one the
// application set.
type optionDefaults struct {
	ints       [len(inheritedOptions)]int
	congestion string
}

// kernelOptionDefaults reads a fresh socket's options. Call it in the
// stack's network namespace.
func kernelOptionDefaults() (optionDefaults, error) {
	var d optionDefaults
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return d, fmt.Errorf("tcp: kernel socket for the default options: %w", err)
	}
	defer unix.Close(fd)
	for i, o := range inheritedOptions {
		if d.ints[i], err = unix.GetsockoptInt(fd, o.level, o.name); err != nil {
			return d, fmt.Errorf("tcp: default %s: %w", o.what, err)
		}
	}
	if d.congestion, err = KernelCongestion(fd); err != nil {
		return d, fmt.Errorf("tcp: default TCP_CONGESTION: %w", err)
	}
	return d, nil
}

// KernelCongestion reads the kernel socket fd's TCP_CONGESTION.
func KernelCongestion(fd int) (string, error) {
	s, err := unix.GetsockoptString(fd, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	return strings.TrimRight(s, "\x00"), err
}

// defaultOption is a fresh kernel socket's value of one of
// inheritedOptions, or 0 before netstack runs.
func (st *Stack) defaultOption(level, name int) int {
	t := st.tcp.Load()
	if t == nil {
		return 0
	}
	for i, o := range inheritedOptions {
		if o.level == level && o.name == name {
			return t.defaults.ints[i]
		}
	}
	return 0
}

// copyOptions gives ep the options of the kernel socket fd that differ
// from a fresh socket's, and its SO_LINGER. An option netstack refuses
// is named in the error, and the others are set all the same.
func copyOptions(ep tcpip.Endpoint, fd int, def *optionDefaults) error {
	var errs []error
	for i, o := range inheritedOptions {
		v, err := unix.GetsockoptInt(fd, o.level, o.name)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s of fd %d: %w", o.what, fd, err))
			continue
		}
		if v == def.ints[i] {
			continue
		}
		if o.level == unix.SOL_SOCKET && (o.name == unix.SO_RCVBUF || o.name == unix.SO_SNDBUF) {
			v /= 2 // the kernel reports twice what was set, and setOption doubles it as the kernel does
		}
		if err := setOption(ep, o.level, o.name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s %d: %w", o.what, v, err))
		}
	}
	switch cc, err := KernelCongestion(fd); {
	case err != nil:
		errs = append(errs, fmt.Errorf("TCP_CONGESTION of fd %d: %w", fd, err))
	case cc != def.congestion:
		if err := setCongestion(ep, cc); err != nil {
			errs = append(errs, fmt.Errorf("TCP_CONGESTION %s: netstack has no such algorithm: %w", cc, err))
		}
	}
	if l, err := unix.GetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER); err != nil {
		errs = append(errs, fmt.Errorf("SO_LINGER of fd %d: %w", fd, err))
	} else if l.Onoff != 0 {
		ep.SocketOptions().SetLinger(tcpip.LingerOption{Enabled: true, Timeout: time.Duration(l.Linger) * time.Second})
	}
	return errors.Join(errs...)
}

// InheritOptions gives c the options of the kernel listener fd it was
// accepted through, as the kernel's accepted socket has its listener's.
func (c *TCPConn) InheritOptions(fd int) error {
	t := c.st.tcp.Load()
	if t == nil {
		return fmt.Errorf("tcp: options from fd %d: %w", fd, net.ErrClosed)
	}
	if err := copyOptions(c.ep, fd, &t.defaults); err != nil {
		return fmt.Errorf("tcp %s>%s: options of listener fd %d: %w", c.key.local, c.key.remote, fd, err)
	}
	return nil
}
