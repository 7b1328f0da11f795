package xsk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/internal/sockdiag"
)

// busyOwner names the process holding an AF_XDP socket on (ifindex, queue),
// found through sock_diag (the kernel's list of AF_XDP sockets with their
// binding) and /proc/*/fd (which process holds that socket's inode). It
// returns a phrase for an error message; on any failure it says what it knows.
func busyOwner(ifindex, queue int) string {
	socks, err := Sockets()
	if err != nil {
		return fmt.Sprintf("another AF_XDP socket is bound to it (its owner cannot be named: %v)", err)
	}
	var ino uint32
	for _, s := range socks {
		if s.Ifindex == ifindex && s.Queue == queue {
			ino = s.Inode
		}
	}
	if ino == 0 {
		return "another AF_XDP socket, in another network namespace or closing, is bound to it"
	}
	pid, _, comm := sockdiag.Owner(uint64(ino))
	if pid == 0 {
		return fmt.Sprintf("AF_XDP socket inode %d is bound to it", ino)
	}
	return fmt.Sprintf("AF_XDP socket inode %d of pid %d (%s) is bound to it", ino, pid, comm)
}

// SocketDiag is one AF_XDP socket as sock_diag reports it.
type SocketDiag struct {
	Inode   uint32
	Ifindex int // 0 when not bound
	Queue   int
	Stats   Statistics
}

// StatisticsMap returns the counters under their XDP_STATISTICS field
// names, the names `vmaxdp stats` and `nettrace report` use.
func StatisticsMap(s *Statistics) map[string]uint64 {
	return map[string]uint64{
		"rx_dropped": s.Rx_dropped, "rx_invalid_descs": s.Rx_invalid_descs,
		"rx_ring_full": s.Rx_ring_full, "rx_fill_ring_empty_descs": s.Rx_fill_ring_empty_descs,
		"tx_invalid_descs": s.Tx_invalid_descs, "tx_ring_empty_descs": s.Tx_ring_empty_descs,
	}
}

// ErrDiagNotSupported: the kernel has no AF_XDP sock_diag
// (CONFIG_XDP_SOCKETS_DIAG).
var ErrDiagNotSupported = fmt.Errorf("AF_XDP sock_diag (CONFIG_XDP_SOCKETS_DIAG): %w", backend.ErrNotSupported)

const (
	sockDiagByFamily = 20
	xdpShowInfo      = 1 << 0
	xdpShowStats     = 1 << 4
	xdpDiagInfo      = 1
	xdpDiagStats     = 9
)

// Sockets lists the AF_XDP sockets of the calling thread's network
// namespace, with their binding and statistics. Any process's sockets are
// listed: this is how tools outside the engine read queue counters.
func Sockets() ([]SocketDiag, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return nil, fmt.Errorf("AF_XDP sock_diag: %w", err)
	}
	defer unix.Close(fd)
	// nlmsghdr (16) + xdp_diag_req (20)
	req := make([]byte, 36)
	binary.NativeEndian.PutUint32(req[0:], 36)
	binary.NativeEndian.PutUint16(req[4:], sockDiagByFamily)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	req[16] = unix.AF_XDP
	binary.NativeEndian.PutUint32(req[24:], xdpShowInfo|xdpShowStats)
	binary.NativeEndian.PutUint32(req[28:], ^uint32(0))
	binary.NativeEndian.PutUint32(req[32:], ^uint32(0))
	var out []SocketDiag
	err = sockdiag.Dump(fd, req, make([]byte, 32768), func(data []byte) {
		// struct xdp_diag_msg: family, type, pad u16, ino u32, cookie [2]u32
		if len(data) < 16 {
			return
		}
		d := SocketDiag{Inode: binary.NativeEndian.Uint32(data[4:])}
		attrs, err := parseAttrs(data[16:])
		if err != nil {
			return
		}
		if info := attrs[xdpDiagInfo]; len(info) >= 8 {
			d.Ifindex = int(binary.NativeEndian.Uint32(info))
			d.Queue = int(binary.NativeEndian.Uint32(info[4:]))
		}
		if st := attrs[xdpDiagStats]; len(st) >= 48 {
			u := func(i int) uint64 { return binary.NativeEndian.Uint64(st[8*i:]) }
			// struct xdp_diag_stats order
			d.Stats = Statistics{Rx_dropped: u(0), Rx_invalid_descs: u(1), Rx_ring_full: u(2), Rx_fill_ring_empty_descs: u(3), Tx_invalid_descs: u(4), Tx_ring_empty_descs: u(5)}
		}
		out = append(out, d)
	})
	switch {
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP):
		return nil, ErrDiagNotSupported
	case err != nil:
		return out, fmt.Errorf("AF_XDP %w", err)
	}
	return out, nil
}

func parseAttrs(b []byte) (map[uint16][]byte, error) {
	out := map[uint16][]byte{}
	for len(b) >= unix.SizeofRtAttr {
		a := (*unix.RtAttr)(unsafe.Pointer(&b[0]))
		if int(a.Len) < unix.SizeofRtAttr || int(a.Len) > len(b) {
			return out, fmt.Errorf("bad attribute length %d", a.Len)
		}
		out[a.Type] = b[unix.SizeofRtAttr:a.Len]
		b = b[min(len(b), (int(a.Len)+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1)):]
	}
	return out, nil
}
