package xsk

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

func setsockoptInt(fd, opt, v int) error {
	return unix.SetsockoptInt(fd, unix.SOL_XDP, opt, v)
}

func setsockoptRaw(fd, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), size, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockoptRaw(fd, opt int, p unsafe.Pointer, size uintptr) error {
	l := uint32(size)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}

// kick wakes the kernel side of a ring without blocking: sendto for TX,
// recvfrom for RX and fill, as need_wakeup asks. Raw syscalls: the unix
// wrappers allocate a Sockaddr per call.
func kickTx(fd int) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return e
}

func kickRx(fd int) unix.Errno {
	_, _, e := unix.Syscall6(unix.SYS_RECVFROM, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return e
}
