package stack

import "golang.org/x/sys/unix"

// virtualLink reports whether ifname has no bus (veth, tap, bridges and
// the like): its frames come from this host's kernel, which leaves UDP
// checksums partial when the sender's link offloads them (CHECKSUM_PARTIAL:
// the pseudo-header sum only), as a default veth does. On a link with a bus
// frames come from a wire, where such a checksum is simply wrong. fd is an
// AF_INET socket in the interface's namespace, for the ethtool ioctl.
//
// A virtual driver leaves the bus empty (veth), writes "N/A" (bridge,
// macvlan) or, tun's, "tun" or "tap": a bridge read as a wire dropped
// every datagram a kernel sender on a port sent it.
func virtualLink(fd int, ifname string) bool {
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, ifname)
	if err != nil {
		return false
	}
	switch unix.ByteSliceToString(info.Bus_info[:]) {
	case "", "N/A":
		return true
	}
	return unix.ByteSliceToString(info.Driver[:]) == "tun"
}
