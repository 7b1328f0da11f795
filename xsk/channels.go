package xsk

import (
	"errors"
	"fmt"
	"unsafe"

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

// ethtoolChannels is struct ethtool_channels.
type ethtoolChannels struct {
	Cmd                                         uint32
	MaxRx, MaxTx, MaxOther, MaxCombined         uint32
	RxCount, TxCount, OtherCount, CombinedCount uint32
}

// ifreqData is struct ifreq with its data pointer.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

const ethtoolGChannels = 0x3c // ETHTOOL_GCHANNELS

// QueueChannels reads ifname's channels through fd, an AF_INET socket in
// the interface's network namespace (kept by the caller, so that reading
// them again costs no new fd); allocRx and allocTx (netlink's counts)
// stand in when the driver does not report them.
func QueueChannels(fd int, ifname string, allocRx, allocTx int) (Channels, error) {
	if len(ifname) >= unix.IFNAMSIZ {
		return Channels{}, fmt.Errorf("channels of %s: %w", ifname, unix.EINVAL)
	}
	ch := ethtoolChannels{Cmd: ethtoolGChannels}
	var ifr ifreqData
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(&ch)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	switch {
	case errors.Is(e, unix.EOPNOTSUPP):
		return Channels{Rx: max(1, allocRx), Tx: max(1, allocTx)}, nil
	case e != 0:
		return Channels{}, fmt.Errorf("channels of %s (ethtool -l): %w", ifname, e)
	}
	c := Channels{Rx: int(ch.RxCount + ch.CombinedCount), Tx: int(ch.TxCount + ch.CombinedCount), FromDriver: true}
	if c.Rx == 0 {
		return Channels{}, fmt.Errorf("channels of %s (ethtool -l): no RX queue running", ifname)
	}
	return c, nil
}
