package header

import (
	"encoding/binary"
	"net/netip"
)

// UDPHeadersLen is the length of the Ethernet, IPv4 and UDP headers that
// BuildUDP writes: the payload starts at this offset of the frame.
const UDPHeadersLen = EthernetLen + IPv4MinLen + UDPLen

// UDPFields are what BuildUDP writes.
type UDPFields struct {
	DstMAC, SrcMAC MAC
	Src, Dst       netip.AddrPort
	ID             uint16
	NoDF           bool  // DF clear (see IPv4Fields)
	TOS            uint8 // IP_TOS
	TTL            uint8
	// PartialChecksum leaves the UDP checksum for the device to complete:
	// the field gets the folded pseudo-header sum (CHECKSUM_PARTIAL), to
	// be finished over the bytes from UDPChecksumStart on, the field at
	// UDPChecksumOffset of them.
	PartialChecksum bool
}

// UDPChecksumStart and UDPChecksumOffset locate the UDP checksum of a
// frame BuildUDP writes: where the checksummed bytes start, and where the
// field is in them. TCPChecksumOffset is the TCP header's.
const (
	UDPChecksumStart  = EthernetLen + IPv4MinLen
	UDPChecksumOffset = 6
	TCPChecksumOffset = 16
)

// SetPartialChecksum writes the folded pseudo-header sum into the
// checksum field at off of seg, a segment of protocol proto from src to
// dst: what the device finishes for CHECKSUM_PARTIAL.
func SetPartialChecksum(seg []byte, off int, src, dst netip.Addr, proto uint8) {
	binary.BigEndian.PutUint16(seg[off:], Fold(PseudoSum(src, dst, proto, len(seg))))
}

// BuildUDP writes the headers of a datagram whose payloadLen bytes are
// already at frame[UDPHeadersLen:], computes both checksums (the UDP one
// partially with f.PartialChecksum), and returns the frame's length.
// frame must hold UDPHeadersLen+payloadLen bytes.
func BuildUDP(frame []byte, f *UDPFields, payloadLen int) int {
	eth := Ethernet(frame)
	eth.SetDst(f.DstMAC)
	eth.SetSrc(f.SrcMAC)
	eth.SetType(EtherTypeIPv4)
	ulen := UDPLen + payloadLen
	IPv4(frame[EthernetLen:]).Encode(IPv4Fields{
		TotalLen: uint16(IPv4MinLen + ulen), ID: f.ID, NoDF: f.NoDF, TOS: f.TOS, TTL: f.TTL, Protocol: ProtocolUDP,
		Src: f.Src.Addr(), Dst: f.Dst.Addr(),
	})
	seg := frame[EthernetLen+IPv4MinLen : UDPHeadersLen+payloadLen]
	u := UDP(seg)
	u.SetSrcPort(f.Src.Port())
	u.SetDstPort(f.Dst.Port())
	u.SetLength(uint16(ulen))
	if f.PartialChecksum {
		SetPartialChecksum(seg, UDPChecksumOffset, f.Src.Addr(), f.Dst.Addr(), ProtocolUDP)
	} else {
		u.SetChecksum(0)
		u.SetChecksum(UDPChecksum(seg, f.Src.Addr(), f.Dst.Addr()))
	}
	return UDPHeadersLen + payloadLen
}
