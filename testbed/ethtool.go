package testbed

import (
	"fmt"

	"github.com/safchain/ethtool"
)

// disableTxChecksum turns off TX checksum offload on ifname (ethtool -K
// IF tx off) in the calling thread's namespace. On veth, offload means the
// sender never computes the UDP checksum and the peer's XDP program sees a
// partial one; a test bed must look like a wire, where frames carry real
// checksums. These are the TX checksum features veth can change.
func disableTxChecksum(ifname string) error {
	et, err := ethtool.NewEthtool()
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer et.Close()
	if err := et.Change(ifname, map[string]bool{"tx-checksum-ip-generic": false, "tx-checksum-sctp": false}); err != nil {
		return fmt.Errorf("ethtool -K %s tx off: %w", ifname, err)
	}
	return nil
}
