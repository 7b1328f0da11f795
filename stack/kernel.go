package stack

import (
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The companion kernel socket is read and written with raw syscalls: the
// unix wrappers allocate a Sockaddr per call.

// KernelRecvFrom reads a datagram from a kernel UDP socket without
// blocking or allocating; it returns the datagram's full length, which may
// exceed len(b).
func KernelRecvFrom(fd int, b []byte, flags int) (int, netip.AddrPort, unix.Errno) {
	var sa unix.RawSockaddrInet4
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
	port := uint16(sa.Port>>8) | uint16(sa.Port<<8)
	return int(n), netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port), 0
}

func kernelSendTo(fd int, b []byte, to netip.AddrPort) unix.Errno {
	sa := unix.RawSockaddrInet4{Family: unix.AF_INET, Port: to.Port()>>8 | to.Port()<<8, Addr: to.Addr().As4()}
	var p unsafe.Pointer
	if len(b) > 0 {
		p = unsafe.Pointer(&b[0])
	}
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), uintptr(p), uintptr(len(b)), 0,
		uintptr(unsafe.Pointer(&sa)), unsafe.Sizeof(sa))
	return e
}
