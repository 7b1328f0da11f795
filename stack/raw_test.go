package stack_test

import (
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// rawSocket opens an AF_PACKET socket that sends whole frames on ifname,
// for injecting frames the kernel's own stack would never build, and
// receives those of Ethernet type proto (0: none) as they cross it.
func rawSocket(ifname string, proto uint16) (*os.File, error) {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(proto)))
	if err != nil {
		return nil, fmt.Errorf("AF_PACKET: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(proto), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind AF_PACKET to %s: %w", ifname, err)
	}
	return os.NewFile(uintptr(fd), "packet:"+ifname), nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
