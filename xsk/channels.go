package xsk

import (
	"errors"
	"fmt"

	"github.com/safchain/ethtool"
	"golang.org/x/sys/unix"
)

// Channels are the queues an interface runs, as `ethtool -l` reports them
// (combined channels counted in both directions). AF_XDP binds a socket
// with an RX ring only to a queue below Rx, and one with a TX ring only to
// a queue below Tx. Netlink's IFLA_NUM_RX_QUEUES is not this count: it is
// what the driver allocated, often more than it runs (a default veth on a
// two-CPU machine allocates 2 and runs 1).
type Channels struct {
	Rx, Tx int
	// FromDriver is false when the driver does not report its channels
	// (no ETHTOOL_GCHANNELS): Rx and Tx are then the allocated counts, and
	// a queue beyond the running ones fails to bind.
	FromDriver bool
}

// QueueChannels reads ifname's channels in the calling thread's network
// namespace; allocRx and allocTx (netlink's counts) stand in when the
// driver does not report them.
func QueueChannels(ifname string, allocRx, allocTx int) (Channels, error) {
	et, err := ethtool.NewEthtool()
	if err != nil {
		return Channels{}, fmt.Errorf("channels of %s: ethtool socket: %w", ifname, err)
	}
	defer et.Close()
	ch, err := et.GetChannels(ifname)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return Channels{Rx: max(1, allocRx), Tx: max(1, allocTx)}, nil
	}
	if err != nil {
		return Channels{}, fmt.Errorf("channels of %s (ethtool -l): %w", ifname, err)
	}
	c := Channels{Rx: int(ch.RxCount + ch.CombinedCount), Tx: int(ch.TxCount + ch.CombinedCount), FromDriver: true}
	if c.Rx == 0 {
		return Channels{}, fmt.Errorf("channels of %s (ethtool -l): no RX queue running", ifname)
	}
	return c, nil
}
