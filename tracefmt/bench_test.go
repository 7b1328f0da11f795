package tracefmt

import (
	"bytes"
	"io"
	"testing"

	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

// benchTrace writes n events in the mix of a receive path recording.
func benchTrace(b *testing.B, n int) []byte {
	var buf bytes.Buffer
	m := &tracefile.Meta{Tool: "nettrace", Mode: "events", CapLen: 128, DropReasons: map[uint32]string{3: "NO_SOCKET"}}
	for _, id := range []probes.ID{probes.NetifReceiveSkb, probes.KfreeSkb, probes.ConsumeSkb, probes.SkbCopyDatagramIovec, probes.NapiPoll} {
		m.Probes = append(m.Probes, tracefile.Probe{ID: uint16(id), Name: probes.ByID(id).Name, Attach: "tp_btf"})
	}
	w, err := tracefile.NewWriter(&buf, m)
	if err != nil {
		b.Fatal(err)
	}
	w.WriteJSON(tracefile.TypeSymbol, tracefile.Symbol{Addr: 0xffffffff81000000, Name: "__udp4_lib_rcv"})
	mix := []probes.ID{probes.NetifReceiveSkb, probes.SkbCopyDatagramIovec, probes.ConsumeSkb, probes.KfreeSkb, probes.NapiPoll}
	data := make([]byte, 60)
	for i := range n {
		e := tracefile.Event{Time: 1e12 + uint64(i)*1000, Skb: 0xffff888100000000 + uint64(i%64)*256, Location: 0xffffffff81000123,
			PID: 1234, TID: 1234, CPU: uint32(i % 2), Netns: 4026531840, Ifindex: 2, Len: 92, Reason: 3, Probe: uint16(mix[i%len(mix)]),
			Protocol: 0x800, Flags: tracefile.FlagEthernet, Data: data}
		copy(e.Comm[:], "sockperf")
		copy(e.Dev[:], "vmxb")
		if err := w.WriteEvent(&e); err != nil {
			b.Fatal(err)
		}
	}
	if err := w.Close(&tracefile.End{}); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// BenchmarkText measures nettrace script's text path; events/s is the
// figure to hold against perf script's.
func BenchmarkText(b *testing.B) {
	const n = 100000
	data := benchTrace(b, n)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		r, err := tracefile.NewReader(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		st, err := Text(io.Discard, r, nil)
		if err != nil || st.Events != n {
			b.Fatal(st, err)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
