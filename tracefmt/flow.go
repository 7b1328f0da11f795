package tracefmt

import (
	"net/netip"
	"strconv"

	"github.com/vmaxdp/vmaxdp/tracefile"
)

// Flow is the IPv4 flow of a captured packet.
type Flow struct {
	Proto uint8 // IPPROTO_*
	Src   netip.AddrPort
	Dst   netip.AddrPort
}

// DecodeFlow reads the flow from an event's captured bytes; ok is false
// when they hold no IPv4 header. Ports are zero for protocols without
// them and for non-first fragments.
func DecodeFlow(e *tracefile.Event) (f Flow, ok bool) {
	d := e.Data
	if e.Flags&tracefile.FlagEthernet != 0 {
		if len(d) < 14 {
			return f, false
		}
		eth := uint16(d[12])<<8 | uint16(d[13])
		d = d[14:]
		if eth == 0x8100 && len(d) >= 4 { // one VLAN tag
			eth = uint16(d[2])<<8 | uint16(d[3])
			d = d[4:]
		}
		if eth != 0x0800 {
			return f, false
		}
	}
	if len(d) < 20 || d[0]>>4 != 4 {
		return f, false
	}
	ihl := int(d[0]&0xf) * 4
	if ihl < 20 {
		return f, false
	}
	f.Proto = d[9]
	src := netip.AddrFrom4([4]byte(d[12:16]))
	dst := netip.AddrFrom4([4]byte(d[16:20]))
	var sport, dport uint16
	fragOff := (uint16(d[6])<<8 | uint16(d[7])) & 0x1fff
	if (f.Proto == 6 || f.Proto == 17) && fragOff == 0 && len(d) >= ihl+4 {
		sport = uint16(d[ihl])<<8 | uint16(d[ihl+1])
		dport = uint16(d[ihl+2])<<8 | uint16(d[ihl+3])
	}
	f.Src = netip.AddrPortFrom(src, sport)
	f.Dst = netip.AddrPortFrom(dst, dport)
	return f, true
}

// ProtoName names an IP protocol.
func ProtoName(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return "ip-proto-" + strconv.Itoa(int(p))
}
