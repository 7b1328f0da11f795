// Package header provides typed views over the bytes of Ethernet, IPv4 and
// UDP headers: getters and setters that read and write the frame in place,
// never copying and never allocating, and a parser that validates a frame
// the way the kernel would and names what is wrong with it.
//
// A view is only as long as the bytes under it: callers check lengths
// (Parse does) before using getters.
package header

import (
	"encoding/binary"
	"net/netip"
)

const (
	EthernetLen = 14
	VLANLen     = 4
	IPv4MinLen  = 20
	UDPLen      = 8
	TCPMinLen   = 20

	EtherTypeIPv4   = 0x0800
	EtherTypeARP    = 0x0806
	EtherTypeVLAN   = 0x8100
	EtherTypeQinQ   = 0x88a8
	ProtocolUDP     = 17
	ProtocolTCP     = 6
	DefaultTTL      = 64
	ipv4FlagMF      = 0x2000
	ipv4FlagDF      = 0x4000
	ipv4OffsetMask  = 0x1fff
	ipv4FragMask    = ipv4FlagMF | ipv4OffsetMask
	udpChecksumNone = 0
)

// MAC is an Ethernet address.
type MAC [6]byte

// Ethernet is a view of an Ethernet header.
type Ethernet []byte

func (e Ethernet) Dst() (m MAC)     { copy(m[:], e[0:6]); return }
func (e Ethernet) Src() (m MAC)     { copy(m[:], e[6:12]); return }
func (e Ethernet) Type() uint16     { return binary.BigEndian.Uint16(e[12:]) }
func (e Ethernet) SetDst(m MAC)     { copy(e[0:6], m[:]) }
func (e Ethernet) SetSrc(m MAC)     { copy(e[6:12], m[:]) }
func (e Ethernet) SetType(t uint16) { binary.BigEndian.PutUint16(e[12:], t) }

// IPv4 is a view of an IPv4 header.
type IPv4 []byte

func (ip IPv4) Version() uint8        { return ip[0] >> 4 }
func (ip IPv4) HeaderLen() int        { return int(ip[0]&0xf) * 4 }
func (ip IPv4) TotalLen() int         { return int(binary.BigEndian.Uint16(ip[2:])) }
func (ip IPv4) ID() uint16            { return binary.BigEndian.Uint16(ip[4:]) }
func (ip IPv4) FlagsFragment() uint16 { return binary.BigEndian.Uint16(ip[6:]) }
func (ip IPv4) TTL() uint8            { return ip[8] }
func (ip IPv4) Protocol() uint8       { return ip[9] }
func (ip IPv4) Checksum() uint16      { return binary.BigEndian.Uint16(ip[10:]) }
func (ip IPv4) Src() netip.Addr       { return netip.AddrFrom4([4]byte(ip[12:16])) }
func (ip IPv4) Dst() netip.Addr       { return netip.AddrFrom4([4]byte(ip[16:20])) }

// IsFragment reports whether the packet is part of a fragmented datagram.
func (ip IPv4) IsFragment() bool { return ip.FlagsFragment()&ipv4FragMask != 0 }

// IPv4Fields are the fields Encode writes; the rest are fixed (IHL 5, no
// options, not a fragment).
type IPv4Fields struct {
	TotalLen uint16
	ID       uint16
	NoDF     bool // DF clear (IP_MTU_DISCOVER's DONT, INTERFACE, OMIT)
	TOS      uint8
	TTL      uint8
	Protocol uint8
	Src, Dst netip.Addr
}

// Encode writes a 20-byte header with its checksum.
func (ip IPv4) Encode(f IPv4Fields) {
	ip[0] = 0x45
	ip[1] = f.TOS
	binary.BigEndian.PutUint16(ip[2:], f.TotalLen)
	binary.BigEndian.PutUint16(ip[4:], f.ID)
	df := uint16(ipv4FlagDF)
	if f.NoDF {
		df = 0
	}
	binary.BigEndian.PutUint16(ip[6:], df)
	ip[8] = f.TTL
	ip[9] = f.Protocol
	ip[10], ip[11] = 0, 0
	s, d := f.Src.As4(), f.Dst.As4()
	copy(ip[12:16], s[:])
	copy(ip[16:20], d[:])
	binary.BigEndian.PutUint16(ip[10:], ^Fold(Sum(ip[:IPv4MinLen], 0)))
}

// TCP is a view of a TCP header (at least TCPMinLen bytes).
type TCP []byte

// The bits of TCP.Flags.
const (
	TCPFlagFin = 0x01
	TCPFlagSyn = 0x02
	TCPFlagRst = 0x04
	TCPFlagPsh = 0x08
	TCPFlagAck = 0x10
	TCPFlagUrg = 0x20
)

func (t TCP) SrcPort() uint16 { return binary.BigEndian.Uint16(t[0:]) }
func (t TCP) DstPort() uint16 { return binary.BigEndian.Uint16(t[2:]) }
func (t TCP) Flags() uint8    { return t[13] }

// TCPFields are the fields Encode writes; the rest are zero (no options,
// no acknowledgement number, no urgent pointer).
type TCPFields struct {
	SrcPort, DstPort uint16
	Seq              uint32
	Flags            uint8
	Window           uint16
	Src, Dst         netip.Addr // for the checksum's pseudo-header
}

// Encode writes a 20-byte header with the checksum of t, the header and
// its payload, whole in t.
func (t TCP) Encode(f TCPFields) {
	clear(t[:TCPMinLen])
	binary.BigEndian.PutUint16(t[0:], f.SrcPort)
	binary.BigEndian.PutUint16(t[2:], f.DstPort)
	binary.BigEndian.PutUint32(t[4:], f.Seq)
	t[12] = TCPMinLen / 4 << 4
	t[13] = f.Flags
	binary.BigEndian.PutUint16(t[14:], f.Window)
	binary.BigEndian.PutUint16(t[16:], ^Fold(Sum(t, PseudoSum(f.Src, f.Dst, ProtocolTCP, len(t)))))
}

// UDP is a view of a UDP header.
type UDP []byte

func (u UDP) SrcPort() uint16      { return binary.BigEndian.Uint16(u[0:]) }
func (u UDP) DstPort() uint16      { return binary.BigEndian.Uint16(u[2:]) }
func (u UDP) Length() int          { return int(binary.BigEndian.Uint16(u[4:])) }
func (u UDP) Checksum() uint16     { return binary.BigEndian.Uint16(u[6:]) }
func (u UDP) SetSrcPort(p uint16)  { binary.BigEndian.PutUint16(u[0:], p) }
func (u UDP) SetDstPort(p uint16)  { binary.BigEndian.PutUint16(u[2:], p) }
func (u UDP) SetLength(l uint16)   { binary.BigEndian.PutUint16(u[4:], l) }
func (u UDP) SetChecksum(c uint16) { binary.BigEndian.PutUint16(u[6:], c) }

// Sum adds b to a one's complement running sum (RFC 1071), unfolded.
func Sum(b []byte, sum uint64) uint64 {
	for len(b) >= 8 {
		v := binary.BigEndian.Uint64(b)
		sum += v >> 32
		sum += v & 0xffffffff
		b = b[8:]
	}
	for len(b) >= 2 {
		sum += uint64(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		sum += uint64(b[0]) << 8
	}
	return sum
}

// Fold folds a running sum to 16 bits.
func Fold(sum uint64) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// PseudoSum is the sum of the IPv4 pseudo-header of a transport segment.
func PseudoSum(src, dst netip.Addr, proto uint8, length int) uint64 {
	s, d := src.As4(), dst.As4()
	return uint64(binary.BigEndian.Uint16(s[0:])) + uint64(binary.BigEndian.Uint16(s[2:])) +
		uint64(binary.BigEndian.Uint16(d[0:])) + uint64(binary.BigEndian.Uint16(d[2:])) +
		uint64(proto) + uint64(length)
}

// UDPChecksum computes the checksum of a UDP segment (header and payload,
// checksum field zero) in its transmitted form: 0 becomes 0xffff.
func UDPChecksum(seg []byte, src, dst netip.Addr) uint16 {
	c := ^Fold(Sum(seg, PseudoSum(src, dst, ProtocolUDP, len(seg))))
	if c == 0 {
		c = 0xffff
	}
	return c
}

// MulticastMAC maps an IPv4 group to its Ethernet address (RFC 1112).
func MulticastMAC(group netip.Addr) MAC {
	g := group.As4()
	return MAC{0x01, 0x00, 0x5e, g[1] & 0x7f, g[2], g[3]}
}
