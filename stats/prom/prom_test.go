package prom

import (
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vmaxdp/vmaxdp/stats"
)

// What Write prints, Prometheus's own parser reads: two processes' sockets
// in one family, a high-water mark as a gauge.
func TestPrometheusParses(t *testing.T) {
	snap := func(pid int) *stats.Snapshot {
		return &stats.Snapshot{
			Process: stats.Process{PID: pid, Program: "sockperf", Version: "dev"},
			Sockets: []stats.Socket{{FD: 14, Proto: "udp", State: stats.StateOffloaded, Interface: "vx0", Local: "198.18.0.2:11111",
				Counters: stats.SocketCounters{RxOffloadPackets: 140479898, RxOffloadBytes: 280959796}}},
		}
	}
	var b strings.Builder
	if err := Write(&b, []*stats.Snapshot{snap(10), snap(11)}); err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(b.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	mf := fams["vmaxdp_socket_rx_offload_packets_total"]
	if mf == nil || len(mf.Metric) != 2 || mf.Metric[0].Counter.GetValue() != 140479898 {
		t.Errorf("vmaxdp_socket_rx_offload_packets_total: %v", mf)
	}
	if mf := fams["vmaxdp_socket_rx_queue_bytes_max"]; mf == nil || mf.GetType().String() != "GAUGE" {
		t.Errorf("the high-water mark is not a gauge: %v", mf)
	}
}
