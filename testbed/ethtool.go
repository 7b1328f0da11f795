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

// runningQueues reads the RX queues ifname runs (ethtool -l: netlink's
// count is what the driver allocated) and whether it offloads TX
// checksums, in the calling thread's namespace.
func runningQueues(ifname string) (queues int, txChecksum bool, err error) {
	et, err := ethtool.NewEthtool()
	if err != nil {
		return 0, false, fmt.Errorf("ethtool socket: %w", err)
	}
	defer et.Close()
	ch, err := et.GetChannels(ifname)
	if err != nil {
		return 0, false, fmt.Errorf("ethtool -l %s: %w", ifname, err)
	}
	feats, err := et.Features(ifname)
	if err != nil {
		return 0, false, fmt.Errorf("ethtool -k %s: %w", ifname, err)
	}
	return int(ch.RxCount + ch.CombinedCount), feats["tx-checksum-ip-generic"], nil
}
