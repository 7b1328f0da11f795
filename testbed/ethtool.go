package testbed

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

const ethtoolSTxCsum = 0x17 // ETHTOOL_STXCSUM

// disableTxChecksum turns off TX checksum offload on ifname (ethtool -K
// IF tx off) in the calling thread's namespace. On veth, offload means the
// sender never computes the UDP checksum and the peer's XDP program sees a
// partial one; a test bed must look like a wire, where frames carry real
// checksums.
func disableTxChecksum(ifname string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	val := struct{ cmd, data uint32 }{ethtoolSTxCsum, 0}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data uintptr
		_    [16]byte
	}
	copy(ifr.name[:], ifname)
	ifr.data = uintptr(unsafe.Pointer(&val))
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr))); e != 0 {
		return fmt.Errorf("ethtool -K %s tx off: %w", ifname, e)
	}
	return nil
}
