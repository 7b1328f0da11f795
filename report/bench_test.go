package report

import (
	"bufio"
	"bytes"
	"io"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

// writeMix writes n events in the mix of a receive-path recording with
// drops: each packet is received, delivered or dropped, and consumed, with
// a NAPI poll and a softirq around every eight packets, flows spread over
// 1024 source ports.
func writeMix(tb testing.TB, out io.Writer, n int) {
	m := &tracefile.Meta{Tool: "nettrace", Mode: "events", ClockMonotonic: 1e12, CapLen: 128, DropReasons: map[uint32]string{2: "NO_SOCKET", 6: "SOCKET_RCVBUFF"}}
	for _, p := range probes.All {
		m.Probes = append(m.Probes, tracefile.Probe{ID: uint16(p.ID), Name: p.Name, Attach: "tp_btf"})
	}
	w, err := tracefile.NewWriter(out, m)
	if err != nil {
		tb.Fatal(err)
	}
	w.WriteJSON(tracefile.TypeSymbol, tracefile.Symbol{Addr: 0xffffffff81000000, Name: "__udp4_lib_rcv"})
	w.WriteJSON(tracefile.TypeInterface, tracefile.Interface{Netns: 4026531840, Ifindex: 2, Name: "vmxb"})
	// Ethernet + IPv4 + UDP, 198.18.0.1 > 198.18.0.2:7000
	pkt := make([]byte, 42)
	pkt[12], pkt[13] = 0x08, 0x00
	ip := pkt[14:]
	ip[0], ip[9] = 0x45, 17
	copy(ip[12:], []byte{198, 18, 0, 1, 198, 18, 0, 2})
	ip[22], ip[23] = 7000>>8, 7000&0xff
	seq := []probes.ID{probes.SoftirqEntry, probes.NapiPoll, probes.NetifReceiveSkb, probes.SkbCopyDatagramIovec, probes.ConsumeSkb,
		probes.NetifReceiveSkb, probes.KfreeSkb, probes.SoftirqExit}
	for i := range n {
		id := seq[i%len(seq)]
		pktNo := uint64(i / len(seq) * 2)
		if i%len(seq) >= 5 {
			pktNo++
		}
		ip[20], ip[21] = byte(pktNo>>8&3), byte(pktNo)
		e := tracefile.Event{Time: 1e12 + uint64(i)*300, Skb: 0xffff888100000000 + pktNo%4096*256, Location: 0xffffffff81000123,
			CPU: uint32(i / 64 % 2), Netns: 4026531840, Ifindex: 2, Len: 92, Reason: 2, Probe: uint16(id),
			Protocol: 0x800, Flags: tracefile.FlagEthernet, Data: pkt}
		e.Arg[0], e.Arg[1] = 8, 64
		if id == probes.SoftirqEntry || id == probes.SoftirqExit {
			e.Arg[0] = vecNetRX
		}
		if err := w.WriteEvent(&e); err != nil {
			tb.Fatal(err)
		}
	}
	if err := w.Close(&tracefile.End{Time: 1e12 + uint64(n)*300}); err != nil {
		tb.Fatal(err)
	}
}

// BenchmarkBuild measures nettrace report's reading speed; events/s is the
// figure to hold against perf script's (bench/nettrace.sh runs both).
func BenchmarkBuild(b *testing.B) {
	const n = 200000
	var buf bytes.Buffer
	writeMix(b, &buf, n)
	data := buf.Bytes()
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		r, err := tracefile.NewReader(bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		rep, err := Build(r, nil)
		if err != nil || rep.Drops.Total != n/8 {
			b.Fatal(err, rep.Drops.Total)
		}
	}
	b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkBuild10M streams ten million events through Build without a
// file and reports the largest heap seen: memory must not grow with the
// recording.
func BenchmarkBuild10M(b *testing.B) {
	const n = 10_000_000
	for b.Loop() {
		pr, pw := io.Pipe()
		go func() {
			bw := bufio.NewWriterSize(pw, 1<<20)
			writeMix(b, bw, n)
			bw.Flush()
			pw.Close()
		}()
		var peak atomic.Uint64
		stop := make(chan struct{})
		go func() {
			var ms runtime.MemStats
			for {
				runtime.ReadMemStats(&ms)
				peak.Store(max(peak.Load(), ms.HeapAlloc))
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		}()
		r, err := tracefile.NewReader(bufio.NewReaderSize(pr, 1<<20))
		if err != nil {
			b.Fatal(err)
		}
		rep, err := Build(r, nil)
		close(stop)
		if err != nil || rep.Drops.Total != n/8 {
			b.Fatal(err, rep.Drops.Total)
		}
		b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MiB")
	}
}
