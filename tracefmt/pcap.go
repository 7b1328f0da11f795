package tracefmt

import (
	"fmt"
	"io"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/vmaxdp/vmaxdp/tracefile"
)

// Pcap writes the captured headers of traced packets as pcapng, one packet
// per event that captured bytes, with the event, device, skb, reason and
// location in the packet's comment. Events whose capture starts at the
// Ethernet header go to an Ethernet interface, the others (no MAC header
// yet, e.g. locally generated packets freed early) to a raw IPv4 one.
func Pcap(w io.Writer, r *tracefile.Reader, opts *Options) (Stats, error) {
	m := r.Meta()
	eth := pcapgo.NgInterface{Name: "nettrace-ethernet", Description: "nettrace: captures from the Ethernet header", LinkType: layers.LinkTypeEthernet, SnapLength: uint32(max(m.CapLen, 1)), TimestampResolution: 9, OS: m.Kernel}
	nw, err := pcapgo.NewNgWriterInterface(w, eth, pcapgo.NgWriterOptions{SectionInfo: pcapgo.NgSectionInfo{Application: "nettrace " + m.Version, OS: "Linux " + m.Kernel, Comment: "recorded on " + m.Hostname}})
	if err != nil {
		return Stats{}, fmt.Errorf("pcapng header: %w", err)
	}
	raw := eth
	raw.Name, raw.Description, raw.LinkType = "nettrace-ipv4", "nettrace: captures from the IPv4 header", layers.LinkTypeIPv4
	rawID, err := nw.AddInterface(raw)
	if err != nil {
		return Stats{}, fmt.Errorf("pcapng interface: %w", err)
	}
	p := newPrinter(r)
	var comment []byte
	st, err := each(r, opts, handlers{event: func(e *tracefile.Event) error {
		if len(e.Data) == 0 {
			return nil
		}
		ci := gopacket.CaptureInfo{
			Timestamp:     time.Unix(0, m.ClockRealtime+int64(e.Time)-m.ClockMonotonic),
			CaptureLength: len(e.Data),
			Length:        max(len(e.Data), int(e.Len)),
		}
		if e.Flags&tracefile.FlagEthernet == 0 {
			ci.InterfaceIndex = rawID
		}
		comment = p.appendComment(comment[:0], e)
		return nw.WritePacketWithOptions(ci, e.Data, pcapgo.NgPacketOptions{Comments: []string{string(comment)}})
	}})
	if err != nil {
		return st, err
	}
	if err := nw.Flush(); err != nil {
		return st, fmt.Errorf("pcapng: %w", err)
	}
	return st, nil
}

// appendComment describes an event in one line: the event and the
// tracepoint's fields as nettrace script prints them.
func (p *printer) appendComment(b []byte, e *tracefile.Event) []byte {
	b = append(b, p.name(e.Probe)...)
	b = append(b, ": "...)
	b = p.appendBody(b, e)
	b = append(b, " comm="...)
	b = append(b, e.CommString()...)
	b = append(b, " cpu="...)
	return appendInt(b, int32(e.CPU))
}
