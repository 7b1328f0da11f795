package stack

import "golang.org/x/sys/unix"

// virtualLink reports whether ifname has no bus (veth, tun, bridges and
// the like): its frames come from this host's kernel, which leaves UDP
// checksums partial when the sender's link offloads them (CHECKSUM_PARTIAL:
// the pseudo-header sum only), as a default veth does. On a link with a bus
// frames come from a wire, where such a checksum is simply wrong. fd is an
// AF_INET socket in the interface's namespace, for the ethtool ioctl.
func virtualLink(fd int, ifname string) bool {
	info, err := unix.IoctlGetEthtoolDrvinfo(fd, ifname)
	return err == nil && info.Bus_info[0] == 0
}
