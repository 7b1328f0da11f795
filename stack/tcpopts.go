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

// KernelOptions are the options of a kernel TCP socket that a netstack
// connection takes from it (inheritedOptions that differ from a fresh
// socket's, TCP_CONGESTION, SO_LINGER), read once: a listener's are the
// same for each connection it accepts until the application sets one
// again, and reading them took 17 getsockopt calls, 22 us, on the
// application's thread at every accept.
type KernelOptions struct {
	set        [len(inheritedOptions)]bool // the value differs from a fresh socket's
	ints       [len(inheritedOptions)]int
	congestion string // "" when the default
	linger     tcpip.LingerOption
	err        error // the options that could not be read
}

// KernelOptions reads the options of the listener's kernel socket fd
// that the connections it accepts take (InheritOptions). An option that
// cannot be read is named in the error InheritOptions returns.
func (l *NetstackListener) KernelOptions(fd int) (*KernelOptions, error) {
	t := l.st.tcp.Load()
	if t == nil {
		return nil, fmt.Errorf("tcp: options from fd %d: %w", fd, net.ErrClosed)
	}
	return readOptions(fd, &t.defaults), nil
}

func readOptions(fd int, def *optionDefaults) *KernelOptions {
	o := &KernelOptions{}
	var errs []error
	for i, opt := range inheritedOptions {
		v, err := unix.GetsockoptInt(fd, opt.level, opt.name)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("%s of fd %d: %w", opt.what, fd, err))
		case v != def.ints[i]:
			o.set[i], o.ints[i] = true, v
		}
	}
	switch cc, err := KernelCongestion(fd); {
	case err != nil:
		errs = append(errs, fmt.Errorf("TCP_CONGESTION of fd %d: %w", fd, err))
	case cc != def.congestion:
		o.congestion = cc
	}
	if l, err := unix.GetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER); err != nil {
		errs = append(errs, fmt.Errorf("SO_LINGER of fd %d: %w", fd, err))
	} else if l.Onoff != 0 {
		o.linger = tcpip.LingerOption{Enabled: true, Timeout: time.Duration(l.Linger) * time.Second}
	}
	o.err = errors.Join(errs...)
	return o
}

// applyOptions gives ep the options o holds. An option netstack refuses
// is named in the error, and the others are set all the same.
func applyOptions(ep tcpip.Endpoint, o *KernelOptions) error {
	errs := []error{o.err}
	for i, opt := range inheritedOptions {
		if !o.set[i] {
			continue
		}
		v := o.ints[i]
		if opt.level == unix.SOL_SOCKET && (opt.name == unix.SO_RCVBUF || opt.name == unix.SO_SNDBUF) {
			v /= 2 // the kernel reports twice what was set, and setOption doubles it as the kernel does
		}
		if err := setOption(ep, opt.level, opt.name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s %d: %w", opt.what, v, err))
		}
	}
	if o.congestion != "" {
		if err := setCongestion(ep, o.congestion); err != nil {
			errs = append(errs, fmt.Errorf("TCP_CONGESTION %s: netstack has no such algorithm: %w", o.congestion, err))
		}
	}
	if o.linger.Enabled {
		ep.SocketOptions().SetLinger(o.linger)
	}
	return errors.Join(errs...)
}

// copyOptions gives ep the options of the kernel socket fd that differ
// from a fresh socket's, and its SO_LINGER.
func copyOptions(ep tcpip.Endpoint, fd int, def *optionDefaults) error {
	return applyOptions(ep, readOptions(fd, def))
}

// InheritOptions gives c the options of the kernel listener it was
// accepted through (read by KernelOptions), as the kernel's accepted
// socket has its listener's.
func (c *TCPConn) InheritOptions(o *KernelOptions) error {
	if err := applyOptions(c.ep, o); err != nil {
		return fmt.Errorf("tcp %s>%s: options of its listener: %w", c.key.local, c.key.remote, err)
	}
	return nil
}
