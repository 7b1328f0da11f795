package header_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/vmaxdp/vmaxdp/stack/header"
)

var fields = header.UDPFields{
	DstMAC: header.MAC{2, 0, 0, 0, 0, 2}, SrcMAC: header.MAC{2, 0, 0, 0, 0, 1},
	Src: netip.MustParseAddrPort("198.18.0.1:4000"), Dst: netip.MustParseAddrPort("198.18.0.2:5000"),
	ID: 7, TTL: 64,
}

func build(payload []byte) []byte {
	f := make([]byte, header.UDPHeadersLen+len(payload))
	copy(f[header.UDPHeadersLen:], payload)
	return f[:header.BuildUDP(f, &fields, len(payload))]
}

// gopacket, an independent implementation, must agree with what we build.
func TestBuildMatchesGopacket(t *testing.T) {
	for _, n := range []int{0, 1, 12, 64, 1472} {
		payload := bytes.Repeat([]byte{0xab, 0xcd, 0x01}, n)[:n]
		frame := build(payload)
		pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
		if el := pkt.ErrorLayer(); el != nil {
			t.Fatalf("n=%d: gopacket: %v", n, el.Error())
		}
		ip := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		udp := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if ip.SrcIP.String() != "198.18.0.1" || ip.DstIP.String() != "198.18.0.2" || udp.SrcPort != 4000 || udp.DstPort != 5000 {
			t.Fatalf("n=%d: addresses %v:%d -> %v:%d", n, ip.SrcIP, udp.SrcPort, ip.DstIP, udp.DstPort)
		}
		if !bytes.Equal(udp.Payload, payload) {
			t.Fatalf("n=%d: payload differs", n)
		}
		// Recompute both checksums with gopacket and compare.
		ipc, udpc := ip.Checksum, udp.Checksum
		udp.SetNetworkLayerForChecksum(ip)
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true, FixLengths: true},
			pkt.Layer(layers.LayerTypeEthernet).(*layers.Ethernet), ip, udp, gopacket.Payload(payload)); err != nil {
			t.Fatal(err)
		}
		if ip.Checksum != ipc || udp.Checksum != udpc {
			t.Fatalf("n=%d: checksums ip %#x/%#x udp %#x/%#x (ours/gopacket)", n, ipc, ip.Checksum, udpc, udp.Checksum)
		}
		var p header.Packet
		if r := header.Parse(frame, &p); r != header.Ok || !bytes.Equal(p.Payload, payload) {
			t.Fatalf("n=%d: Parse = %v", n, r)
		}
	}
}

func TestParseRejects(t *testing.T) {
	good := build([]byte("hello"))
	cases := []struct {
		name string
		mod  func(f []byte) []byte
		want header.Result
	}{
		{"truncated ethernet", func(f []byte) []byte { return f[:10] }, header.Truncated},
		{"arp", func(f []byte) []byte { f[12], f[13] = 0x08, 0x06; return f }, header.NotIPv4},
		{"truncated ip", func(f []byte) []byte { return f[:30] }, header.Truncated},
		{"ihl 4", func(f []byte) []byte { f[14] = 0x44; return f }, header.BadIHL},
		{"ihl past end", func(f []byte) []byte { f[14] = 0x4f; return f }, header.BadIHL},
		{"total length past frame", func(f []byte) []byte { f[16], f[17] = 0x05, 0xdc; return f }, header.BadLength},
		{"ip checksum", func(f []byte) []byte { f[24] ^= 0xff; return f }, header.BadIPChecksum},
		{"fragment", func(f []byte) []byte { setIP(f, 20, 0x20, 0x00); return f }, header.Fragment},
		{"tcp", func(f []byte) []byte { setIP(f, 23, 6); return f }, header.NotUDP},
		{"udp length", func(f []byte) []byte { f[38], f[39] = 0, 4; return f }, header.BadUDPLength},
		{"udp checksum", func(f []byte) []byte { f[len(f)-1] ^= 1; return f }, header.BadUDPChecksum},
	}
	for _, c := range cases {
		f := c.mod(bytes.Clone(good))
		var p header.Packet
		if r := header.Parse(f, &p); r != c.want {
			t.Errorf("%s: Parse = %v, want %v", c.name, r, c.want)
		}
	}
	// A checksum field holding the pseudo-header sum is what the kernel
	// leaves for a link with TX checksum offload: named, and parsed.
	f0 := bytes.Clone(good)
	seg := f0[34:]
	c := header.Fold(header.PseudoSum(fields.Src.Addr(), fields.Dst.Addr(), header.ProtocolUDP, len(seg)))
	seg[6], seg[7] = byte(c>>8), byte(c)
	var pp header.Packet
	if r := header.Parse(f0, &pp); r != header.PartialUDPChecksum || string(pp.Payload) != "hello" || pp.UDP.DstPort() != 5000 {
		t.Errorf("partial checksum: Parse = %v, payload %q; want partial_udp_checksum and the datagram", r, pp.Payload)
	}
	// A zero UDP checksum means "none" and is accepted.
	f := bytes.Clone(good)
	f[40], f[41] = 0, 0
	var p header.Packet
	if r := header.Parse(f, &p); r != header.Ok {
		t.Errorf("zero UDP checksum: Parse = %v", r)
	}
}

// setIP changes IPv4 header bytes from offset off and fixes the checksum.
func setIP(f []byte, off int, b ...byte) {
	copy(f[off:], b)
	f[24], f[25] = 0, 0
	c := ^header.Fold(header.Sum(f[14:34], 0))
	f[24], f[25] = byte(c>>8), byte(c)
}

func FuzzParse(f *testing.F) {
	f.Add(build([]byte("seed")))
	f.Add(build(nil))
	f.Add([]byte{})
	f.Add(buildTCP([]byte("seed")))
	f.Fuzz(func(t *testing.T, frame []byte) {
		var p header.Packet
		switch header.Parse(frame, &p) {
		case header.Ok:
		case header.NotUDP:
			if p.IP.Protocol() == header.ProtocolTCP && header.CheckTCP(p.IP) == header.Ok {
				pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.NoCopy)
				if tcp, _ := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP); tcp == nil {
					t.Fatalf("CheckTCP accepted a segment gopacket does not read: %v", pkt)
				}
			}
			return
		default:
			return
		}
		// Whatever Parse accepts, gopacket decodes to the same datagram.
		pkt := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.NoCopy)
		udp, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if udp == nil || uint16(udp.DstPort) != p.UDP.DstPort() {
			t.Fatalf("Parse accepted a frame gopacket reads differently: %v", pkt)
		}
	})
}

func BenchmarkParse(b *testing.B) {
	frame := build(make([]byte, 64))
	var p header.Packet
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		if header.Parse(frame, &p) != header.Ok {
			b.Fatal("parse")
		}
	}
}

// BenchmarkParsePartial: a datagram with a partial checksum (from this
// host's kernel with TX checksum offload on), on a link that delivers it
// (virtual: ParseOn finds it partial before summing) and on one that does
// not (Parse sums it first).
func BenchmarkParsePartial(b *testing.B) {
	for _, n := range []int{64, 1400} {
		f := make([]byte, header.UDPHeadersLen+n)
		pf := fields
		pf.PartialChecksum = true
		f = f[:header.BuildUDP(f, &pf, n)]
		for _, virtual := range []bool{false, true} {
			b.Run(fmt.Sprintf("%dB/virtual=%v", n, virtual), func(b *testing.B) {
				var p header.Packet
				b.ReportAllocs()
				b.SetBytes(int64(len(f)))
				for b.Loop() {
					if header.ParseOn(f, &p, virtual) != header.PartialUDPChecksum {
						b.Fatal("parse")
					}
				}
			})
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	frame := make([]byte, 2048)
	b.ReportAllocs()
	b.SetBytes(header.UDPHeadersLen + 64)
	for b.Loop() {
		header.BuildUDP(frame, &fields, 64)
	}
}

// TestBuildUDPPartialChecksum: a frame built for the device to complete
// parses as a partial checksum, and as valid once completed the way the
// kernel's skb_checksum_help does.
func TestBuildUDPPartialChecksum(t *testing.T) {
	for _, n := range []int{0, 1, 17, 1400} {
		f := make([]byte, header.UDPHeadersLen+n)
		for i := range n {
			f[header.UDPHeadersLen+i] = byte(i*7 + 3)
		}
		fields := header.UDPFields{Src: netip.MustParseAddrPort("198.18.0.2:4000"), Dst: netip.MustParseAddrPort("198.18.0.1:53"), TTL: 64, PartialChecksum: true}
		f = f[:header.BuildUDP(f, &fields, n)]
		var p header.Packet
		if r := header.Parse(f, &p); r != header.PartialUDPChecksum {
			t.Fatalf("%d bytes: %v, want partial", n, r)
		}
		c := ^header.Fold(header.Sum(f[header.UDPChecksumStart:], 0))
		if c == 0 {
			c = 0xffff
		}
		f[header.UDPChecksumStart+header.UDPChecksumOffset] = byte(c >> 8)
		f[header.UDPChecksumStart+header.UDPChecksumOffset+1] = byte(c)
		if r := header.Parse(f, &p); r != header.Ok {
			t.Fatalf("%d bytes completed: %v", n, r)
		}
	}
}

// TestTCPEncodeMatchesGopacket: gopacket reads the fields TCP.Encode
// wrote, and computes the same checksum over them.
func TestTCPEncodeMatchesGopacket(t *testing.T) {
	for _, n := range []int{0, 1, 13} {
		payload := bytes.Repeat([]byte{0x5a}, n)
		f := buildTCP(payload)
		pkt := gopacket.NewPacket(f, layers.LayerTypeEthernet, gopacket.Default)
		if el := pkt.ErrorLayer(); el != nil {
			t.Fatalf("n=%d: gopacket: %v", n, el.Error())
		}
		ip := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		tcp := pkt.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if tcp.SrcPort != 8080 || tcp.DstPort != 49153 || !tcp.ACK || tcp.SYN || tcp.DataOffset != 5 || !bytes.Equal(tcp.Payload, payload) {
			t.Fatalf("n=%d: gopacket read %+v", n, tcp)
		}
		ours := tcp.Checksum
		tcp.SetNetworkLayerForChecksum(ip)
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{ComputeChecksums: true}, tcp, gopacket.Payload(payload)); err != nil {
			t.Fatal(err)
		}
		if tcp.Checksum != ours {
			t.Fatalf("n=%d: checksum %#x, gopacket's %#x", n, ours, tcp.Checksum)
		}
	}
}

// buildTCP makes a frame with a TCP segment (a bare ACK header and
// payload) whose checksum is right.
func buildTCP(payload []byte) []byte {
	src, dst := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	seg := make([]byte, header.TCPMinLen+len(payload))
	copy(seg[header.TCPMinLen:], payload)
	header.TCP(seg).Encode(header.TCPFields{SrcPort: 8080, DstPort: 49153, Flags: header.TCPFlagAck, Src: src, Dst: dst})
	f := make([]byte, header.EthernetLen+header.IPv4MinLen+len(seg))
	header.Ethernet(f).SetType(header.EtherTypeIPv4)
	header.IPv4(f[header.EthernetLen:]).Encode(header.IPv4Fields{TotalLen: uint16(header.IPv4MinLen + len(seg)), TTL: 64,
		Protocol: header.ProtocolTCP, Src: src, Dst: dst})
	copy(f[header.EthernetLen+header.IPv4MinLen:], seg)
	return f
}

// TestCheckTCP: a right checksum, a partial one and a wrong one.
func TestCheckTCP(t *testing.T) {
	f := buildTCP([]byte("hello, tcp"))
	var p header.Packet
	if r := header.Parse(f, &p); r != header.NotUDP {
		t.Fatalf("Parse: %v", r)
	}
	if r := header.CheckTCP(p.IP); r != header.Ok {
		t.Fatalf("right checksum: %v", r)
	}
	seg := p.IP[header.IPv4MinLen:]
	pseudo := header.Fold(header.PseudoSum(p.IP.Src(), p.IP.Dst(), header.ProtocolTCP, len(seg)))
	seg[16], seg[17] = byte(pseudo>>8), byte(pseudo)
	if r := header.CheckTCP(p.IP); r != header.PartialTCPChecksum {
		t.Fatalf("partial checksum: %v", r)
	}
	seg[17]++
	if r := header.CheckTCP(p.IP); r != header.BadTCPChecksum {
		t.Fatalf("wrong checksum: %v", r)
	}
	if r := header.CheckTCP(p.IP[:header.IPv4MinLen+10]); r != header.BadLength {
		t.Fatalf("short segment: %v", r)
	}
}
