package stack

import (
	"github.com/safchain/ethtool"
)

// virtualLink reports whether ifname has no bus (veth, tun, bridges and
// the like): its frames come from this host's kernel, which leaves UDP
// checksums partial when the sender's link offloads them (CHECKSUM_PARTIAL:
// the pseudo-header sum only), as a default veth does. On a link with a bus
// frames come from a wire, where such a checksum is simply wrong.
func virtualLink(ifname string) bool {
	et, err := ethtool.NewEthtool()
	if err != nil {
		return false
	}
	defer et.Close()
	bus, err := et.BusInfo(ifname)
	return err == nil && bus == ""
}
