package stack

import (
	"net/netip"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The companion kernel socket is read and written with raw syscalls: the
// unix wrappers allocate a Sockaddr per call.

// KernelRecvFrom reads a datagram from a kernel UDP socket without
// blocking or allocating; it returns the datagram's full length, which may
// exceed len(b).
func KernelRecvFrom(fd int, b []byte, flags int) (int, netip.AddrPort, unix.Errno) {
	var sa unix.RawSockaddrInet6 // an AF_INET6 socket's is the longer
	sl := uint32(unsafe.Sizeof(sa))
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	n, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), uintptr(p), uintptr(len(b)),
		uintptr(unix.MSG_DONTWAIT|unix.MSG_TRUNC|flags), uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&sl)))
	if e != 0 {
		return 0, netip.AddrPort{}, e
	}
	return int(n), rawAddr(&sa), 0
}

// rawAddr is the source address the kernel wrote into sa, a sockaddr_in
// or a sockaddr_in6; an IPv4-mapped one as IPv4, a link-local one with its
// scope (the interface's index) as its zone.
func rawAddr(sa *unix.RawSockaddrInet6) netip.AddrPort {
	port := uint16(sa.Port>>8) | uint16(sa.Port<<8)
	if sa.Family == unix.AF_INET {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	}
	a := netip.AddrFrom16(sa.Addr).Unmap()
	if sa.Scope_id != 0 && a.Is6() {
		a = a.WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10))
	}
	return netip.AddrPortFrom(a, port)
}

// KernelRecvMsg is KernelRecvFrom that also reads the kernel's ancillary
// data into meta: IP_PKTINFO, IP_TOS, IP_TTL, IP_ORIGDSTADDR,
// SCM_TIMESTAMP(NS) and UDP_GRO, those the socket has turned on.
func KernelRecvMsg(fd int, b []byte, flags int, meta *RecvMeta) (int, netip.AddrPort, unix.Errno) {
	var sa unix.RawSockaddrInet6
	var oob [256]byte
	var iov unix.Iovec
	if len(b) > 0 {
		iov.Base = &b[0]
		iov.SetLen(len(b))
	}
	msg := unix.Msghdr{Name: (*byte)(unsafe.Pointer(&sa)), Namelen: uint32(unsafe.Sizeof(sa)), Iov: &iov, Iovlen: 1,
		Control: &oob[0]}
	msg.SetControllen(len(oob))
	n, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), uintptr(unix.MSG_DONTWAIT|unix.MSG_TRUNC|flags))
	if e != 0 {
		return 0, netip.AddrPort{}, e
	}
	*meta = RecvMeta{}
	parseControl(oob[:msg.Controllen], meta)
	return int(n), rawAddr(&sa), 0
}

// parseControl reads the cmsgs KernelRecvMsg knows into meta, without
// allocating (unix.ParseSocketControlMessage would).
func parseControl(b []byte, meta *RecvMeta) {
	for len(b) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
		if h.Len < unix.SizeofCmsghdr || h.Len > uint64(len(b)) {
			return
		}
		data := b[unix.CmsgLen(0):h.Len]
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&data[0]))
			meta.Ifindex, meta.SpecDst = int(pi.Ifindex), netip.AddrFrom4(pi.Spec_dst)
			meta.Dst = netip.AddrPortFrom(netip.AddrFrom4(pi.Addr), meta.Dst.Port())
		case h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_GRO && len(data) >= 4:
			meta.GROSize = int(*(*int32)(unsafe.Pointer(&data[0])))
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TOS && len(data) >= 1:
			meta.TOS = data[0]
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TTL && len(data) >= 4:
			meta.TTL = uint8(*(*int32)(unsafe.Pointer(&data[0])))
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_ORIGDSTADDR && len(data) >= unix.SizeofSockaddrInet4:
			sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&data[0]))
			meta.Dst = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), sa.Port>>8|sa.Port<<8)
		case h.Level == unix.SOL_SOCKET && (h.Type == unix.SO_TIMESTAMP || h.Type == unix.SO_TIMESTAMP_NEW) && len(data) >= 16:
			tv := (*unix.Timeval)(unsafe.Pointer(&data[0]))
			meta.Stamp = tv.Nano()
		case h.Level == unix.SOL_SOCKET && (h.Type == unix.SO_TIMESTAMPNS || h.Type == unix.SO_TIMESTAMPNS_NEW) && len(data) >= 16:
			ts := (*unix.Timespec)(unsafe.Pointer(&data[0]))
			meta.Stamp = ts.Nano()
		case h.Level == unix.SOL_SOCKET && (h.Type == unix.SO_TIMESTAMPING_OLD || h.Type == unix.SO_TIMESTAMPING_NEW) && len(data) >= 16:
			// The first of scm_timestamping's three: the software stamp.
			if ts := (*unix.Timespec)(unsafe.Pointer(&data[0])); ts.Sec != 0 || ts.Nsec != 0 {
				meta.Stamp = ts.Nano()
			}
		}
		next := unix.CmsgSpace(int(h.Len) - unix.CmsgLen(0))
		if next > len(b) {
			return
		}
		b = b[next:]
	}
}

// rawSockaddr4 is to as the kernel takes it: the port in network order.
func rawSockaddr4(to netip.AddrPort) unix.RawSockaddrInet4 {
	return unix.RawSockaddrInet4{Family: unix.AF_INET, Port: to.Port()>>8 | to.Port()<<8, Addr: to.Addr().As4()}
}

// kernelSendVec sends vec's pieces as one datagram to to on the kernel
// socket fd, with a UDP_SEGMENT message of seg when seg >= 0; more than
// 16 pieces take an allocation.
func kernelSendVec(fd int, vec [][]byte, to netip.AddrPort, seg int) unix.Errno {
	sa := rawSockaddr4(to)
	var small [16]unix.Iovec
	iov := small[:0]
	if len(vec) > len(small) {
		iov = make([]unix.Iovec, 0, len(vec))
	}
	for _, p := range vec {
		if len(p) > 0 {
			v := unix.Iovec{Base: &p[0]}
			v.SetLen(len(p))
			iov = append(iov, v)
		}
	}
	m := unix.Msghdr{Name: (*byte)(unsafe.Pointer(&sa)), Namelen: uint32(unsafe.Sizeof(sa))}
	if len(iov) > 0 {
		m.Iov = &iov[0]
		m.SetIovlen(len(iov))
	}
	var ctl [24]byte // unix.CmsgSpace(2)
	if seg >= 0 {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		h.Level, h.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
		h.SetLen(unix.CmsgLen(2))
		*(*uint16)(unsafe.Pointer(&ctl[unix.CmsgLen(0)])) = uint16(seg)
		m.Control = &ctl[0]
		m.SetControllen(len(ctl))
	}
	_, _, e := unix.Syscall(unix.SYS_SENDMSG, uintptr(fd), uintptr(unsafe.Pointer(&m)), 0)
	return e
}

func kernelSendTo(fd int, b []byte, to netip.AddrPort) unix.Errno {
	sa := rawSockaddr4(to)
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(p), uintptr(len(b)), 0,
		uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
	return e
}

// ppoll is ppoll(2) that the Go runtime's own preemption signal (SIGURG)
// cannot interrupt: an application's poll or blocking recvfrom served by
// vmaxdp must not return EINTR when the application got no signal. SIGURG
// is added to the mask (the thread's own when mask is nil) for the wait and
// delivered when ppoll returns; every other signal interrupts it as it
// would the application's own call. (unix.Ppoll cannot carry a mask: it
// passes a sigsetsize of 0, which the kernel refuses with EINVAL.)
func ppoll(pfds []unix.PollFd, ts *unix.Timespec, mask *unix.Sigset_t) (int, error) {
	var m unix.Sigset_t
	if mask != nil {
		m = *mask
	} else if err := unix.PthreadSigmask(unix.SIG_BLOCK, nil, &m); err != nil {
		return 0, err
	}
	const bits = int(unsafe.Sizeof(m.Val[0])) * 8
	m.Val[(int(unix.SIGURG)-1)/bits] |= 1 << ((int(unix.SIGURG) - 1) % bits)
	var p unsafe.Pointer
	if len(pfds) > 0 {
		p = unsafe.Pointer(&pfds[0])
	}
	const sigsetSize = 8 // the kernel's sigset_t: 64 signals
	n, _, e := unix.Syscall6(unix.SYS_PPOLL, uintptr(p), uintptr(len(pfds)), uintptr(unsafe.Pointer(ts)),
		uintptr(unsafe.Pointer(&m)), sigsetSize, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
