package header

import "encoding/binary"

// Result says what Parse found wrong with a frame, or Ok.
type Result uint8

const (
	Ok Result = iota
	NotIPv4
	Truncated
	BadIHL
	BadLength
	BadIPChecksum
	Fragment
	NotUDP
	BadUDPLength
	BadUDPChecksum
	// PartialUDPChecksum: the UDP checksum field holds only the folded
	// pseudo-header sum, as the kernel leaves it for a link that computes
	// checksums on transmit (CHECKSUM_PARTIAL). Parse fills the Packet
	// anyway: whether that is good is the link's to say (from this host's
	// kernel over veth it is; from a wire it is a bad checksum).
	PartialUDPChecksum
	// BadTCPChecksum and PartialTCPChecksum are CheckTCP's findings, as
	// their UDP namesakes.
	BadTCPChecksum
	PartialTCPChecksum
	NumResults
)

var resultNames = [NumResults]string{"ok", "not_ipv4", "truncated", "bad_ihl", "bad_length", "bad_ip_checksum", "fragment", "not_udp", "bad_udp_length", "bad_udp_checksum", "partial_udp_checksum", "bad_tcp_checksum", "partial_tcp_checksum"}

func (r Result) String() string {
	if r < NumResults {
		return resultNames[r]
	}
	return "unknown"
}

// Packet holds the views of a parsed Ethernet/IPv4/UDP frame.
type Packet struct {
	Eth     Ethernet
	IP      IPv4
	UDP     UDP
	Payload []byte
}

// Parse validates an Ethernet (optionally one VLAN tag) / IPv4 / UDP frame
// and fills p with views into it. It checks what the kernel checks before
// delivering a datagram: header lengths, total length against the frame,
// the IPv4 header checksum, no fragment, the UDP length, and the UDP
// checksum when the sender set one (see PartialUDPChecksum). Bytes after the IPv4 total length
// (Ethernet padding) are not part of the packet.
func Parse(frame []byte, p *Packet) Result { return ParseOn(frame, p, false) }

// ParseOn is Parse for a frame of a link that carries this host's
// kernel's frames (virtual: a veth, a link without a bus), whose partial
// checksums are good: a UDP checksum field that holds the folded
// pseudo-header sum is found partial (PartialUDPChecksum) before the
// payload is summed, as the kernel trusts CHECKSUM_PARTIAL without
// summing. A full checksum that happens to hold that value is found
// partial too, which such a link delivers all the same. The sum was 3.5%
// of a memcached client's samples under vmaxdp (memcaslap, its server's
// kernel sending with TX checksum offload on).
func ParseOn(frame []byte, p *Packet, virtual bool) Result {
	if len(frame) < EthernetLen {
		return Truncated
	}
	p.Eth = Ethernet(frame[:EthernetLen])
	off := EthernetLen
	et := p.Eth.Type()
	if et == EtherTypeVLAN || et == EtherTypeQinQ {
		if len(frame) < EthernetLen+VLANLen {
			return Truncated
		}
		et = uint16(frame[16])<<8 | uint16(frame[17])
		off += VLANLen
	}
	if et != EtherTypeIPv4 {
		return NotIPv4
	}
	rest := frame[off:]
	if len(rest) < IPv4MinLen {
		return Truncated
	}
	ip := IPv4(rest)
	if ip.Version() != 4 {
		return NotIPv4
	}
	hl := ip.HeaderLen()
	if hl < IPv4MinLen || hl > len(rest) {
		return BadIHL
	}
	tl := ip.TotalLen()
	if tl < hl || tl > len(rest) {
		return BadLength
	}
	if Fold(Sum(rest[:hl], 0)) != 0xffff {
		return BadIPChecksum
	}
	p.IP = IPv4(rest[:tl])
	if p.IP.IsFragment() {
		return Fragment
	}
	if p.IP.Protocol() != ProtocolUDP {
		return NotUDP
	}
	seg := rest[hl:tl]
	if len(seg) < UDPLen {
		return BadUDPLength
	}
	p.UDP = UDP(seg)
	ul := p.UDP.Length()
	if ul < UDPLen || ul > len(seg) {
		return BadUDPLength
	}
	seg = seg[:ul]
	p.UDP = UDP(seg[:UDPLen])
	p.Payload = seg[UDPLen:]
	if p.UDP.Checksum() != udpChecksumNone {
		switch checkSum(p.IP, seg, ProtocolUDP, UDPChecksumOffset, virtual) {
		case sumPartial:
			return PartialUDPChecksum
		case sumBad:
			return BadUDPChecksum
		}
	}
	return Ok
}

// What checkSum finds of a transport checksum.
const (
	sumOk = iota
	sumPartial
	sumBad
)

// checkSum checks the transport checksum of seg, ip's segment of protocol
// proto whose checksum field is at off: right, partial (the folded
// pseudo-header sum, see PartialUDPChecksum), or bad. virtual: partial
// is looked for first (ParseOn).
func checkSum(ip IPv4, seg []byte, proto uint8, off int, virtual bool) int {
	pseudo := PseudoSum(ip.Src(), ip.Dst(), proto, len(seg))
	partial := binary.BigEndian.Uint16(seg[off:]) == Fold(pseudo)
	switch {
	case virtual && partial:
		return sumPartial
	case Fold(Sum(seg, pseudo)) == 0xffff:
		return sumOk
	case partial:
		return sumPartial
	}
	return sumBad
}

// CheckTCP checks the TCP segment of ip, a packet Parse found NotUDP and
// whose protocol is TCP: Ok, BadLength when it cannot hold a TCP header,
// BadTCPChecksum, or PartialTCPChecksum (see PartialUDPChecksum).
func CheckTCP(ip IPv4) Result { return CheckTCPOn(ip, false) }

// CheckTCPOn is CheckTCP for a frame of a link that carries this host's
// kernel's frames (virtual): a partial checksum is found before the
// segment is summed, as ParseOn finds a datagram's.
func CheckTCPOn(ip IPv4, virtual bool) Result {
	seg := ip[ip.HeaderLen():]
	if len(seg) < TCPMinLen {
		return BadLength
	}
	switch checkSum(ip, seg, ProtocolTCP, TCPChecksumOffset, virtual) {
	case sumPartial:
		return PartialTCPChecksum
	case sumBad:
		return BadTCPChecksum
	}
	return Ok
}
