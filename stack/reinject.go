package stack

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
	"github.com/vmaxdp/vmaxdp/stack/header"
)

// ErrNotLocal: a queued datagram's destination is a group or a broadcast
// address, or no longer an address of the interface. The kernel would
// route it out, not deliver it, so Reinject drops it.
var ErrNotLocal = errors.New("its destination is not an address of the interface")

// Reinject hands the datagrams queued on c to the kernel, which delivers
// each to its socket as if it had just arrived: for a socket the kernel
// serves from now on (Unsteer first) whose reads the stack will not see,
// as an io_uring ring's. Each packet goes, IPv4 header and all, through a
// raw socket (IP_HDRINCL) to its destination, an address of this host, so
// the kernel loops it back to itself with its source as it came; the UDP
// checksum is completed where the link left it partial. The kernel then
// counts each as any datagram (Udp InDatagrams, or RcvbufErrors when the
// socket's buffer is full).
//
// It returns how many it handed over and how many it dropped, with the
// reason of the first drop. The queue is empty after it.
func (c *UDPConn) Reinject() (handed, dropped int, err error) {
	st := c.st
	if !c.Queued() {
		return 0, 0, nil
	}
	// In the interface's namespace, where the stack opened; the caller
	// may be elsewhere.
	fd := -1
	err = netnsutil.Do(st.ns, func() error {
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
		fd = s
		return err
	})
	if err != nil {
		err = fmt.Errorf("raw socket for the queued datagrams: %w", err)
	} else {
		fd = highfd.Move(fd)
		defer highfd.Close(fd)
	}
	st.rxMu.Lock()
	defer st.rxMu.Unlock()
	local := *st.addrs.Load()
	var pkt [1 << 16]byte
	var it rxItem
	for c.popLocked(&it) {
		n := copy(pkt[:], it.buf.Data[it.ipOff:int(it.off)+int(it.n)])
		st.releaseLocked(it.q, it.buf)
		if fd < 0 {
			dropped++
			continue
		}
		ip := header.IPv4(pkt[:n])
		dst := ip.Dst()
		if !slices.Contains(local, dst) {
			if dropped++; err == nil {
				err = fmt.Errorf("datagram from %v to %v: %w", it.from, dst, ErrNotLocal)
			}
			continue
		}
		if u := header.UDP(pkt[ip.HeaderLen():n]); u.Checksum() != 0 {
			u.SetChecksum(0)
			u.SetChecksum(header.UDPChecksum(u, ip.Src(), dst))
		}
		if e := unix.Sendto(fd, pkt[:n], 0, &unix.SockaddrInet4{Addr: dst.As4()}); e != nil {
			if dropped++; err == nil {
				err = fmt.Errorf("datagram from %v to %v through a raw socket: %w", it.from, dst, e)
			}
			continue
		}
		handed++
	}
	return handed, dropped, err
}
