// Package prom renders stats snapshots in the Prometheus text exposition
// format: vmaxdp_<block>_<json name>, "_total" on counters, labels pid,
// fd, ifname, queue (and mux, rule, reason where they apply). The
// families are built with the Prometheus project's own data model and
// text encoder.
//
// It is the CLI's (vmaxdp stats --prometheus), apart from package stats
// so that the engine, which every preloaded process starts, does not
// carry the Prometheus and protobuf packages and their net/http: their
// initialisation was 2 ms of every process's start.
package prom

import (
	"io"
	"strconv"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"google.golang.org/protobuf/proto"

	"github.com/vmaxdp/vmaxdp/stats"
)

type families struct {
	order  []string
	byName map[string]*dto.MetricFamily
}

func (f *families) add(name, help string, typ dto.MetricType, v float64, labels ...string) {
	mf := f.byName[name]
	if mf == nil {
		mf = &dto.MetricFamily{Name: proto.String(name), Help: proto.String(help), Type: typ.Enum()}
		f.byName[name] = mf
		f.order = append(f.order, name)
	}
	m := &dto.Metric{}
	for i := 0; i+1 < len(labels); i += 2 {
		m.Label = append(m.Label, &dto.LabelPair{Name: proto.String(labels[i]), Value: proto.String(labels[i+1])})
	}
	if typ == dto.MetricType_COUNTER {
		m.Counter = &dto.Counter{Value: proto.Float64(v)}
	} else {
		m.Gauge = &dto.Gauge{Value: proto.Float64(v)}
	}
	mf.Metric = append(mf.Metric, m)
}

// addStruct adds one metric per field of the counter struct at v.
func (f *families) addStruct(block string, v any, labels ...string) {
	for fl := range stats.Fields(v) {
		name := "vmaxdp_" + block + "_" + fl.Name
		typ, help := dto.MetricType_COUNTER, "vmaxdp "+block+" counter "+fl.GoName+"."
		if fl.Gauge {
			typ, help = dto.MetricType_GAUGE, "vmaxdp "+block+" high-water mark "+fl.GoName+"."
		} else {
			name += "_total"
		}
		f.add(name, help, typ, float64(fl.Value), labels...)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// MetricFamilies turns the snapshots of several processes into metric
// families.
func MetricFamilies(snaps []*stats.Snapshot) []*dto.MetricFamily {
	f := &families{byName: map[string]*dto.MetricFamily{}}
	gauge := dto.MetricType_GAUGE
	for _, s := range snaps {
		pid := strconv.Itoa(s.Process.PID)
		f.add("vmaxdp_process_info", "A process running under vmaxdp.", gauge, 1,
			"pid", pid, "program", s.Process.Program, "version", s.Process.Version)
		f.add("vmaxdp_process_sockets_hidden", "Sockets left out by VMAXDP_STATS_FD_NUM.", gauge, float64(s.Process.SocketsHidden), "pid", pid)
		for _, m := range []struct {
			name string
			c    *stats.Iomux
		}{{"select", &s.Process.Select}, {"poll", &s.Process.Poll}, {"epoll", &s.Process.Epoll}} {
			f.addStruct("iomux", m.c, "pid", pid, "mux", m.name)
		}
		for i := range s.Sockets {
			sk := &s.Sockets[i]
			fd := strconv.Itoa(sk.FD)
			f.add("vmaxdp_socket_info", "A socket; state offloaded, kernel (reason says why) or candidate.", gauge, 1,
				"pid", pid, "fd", fd, "ifname", sk.Interface, "proto", sk.Proto, "state", sk.State,
				"local", sk.Local, "remote", sk.Remote, "reason", sk.Reason)
			f.add("vmaxdp_socket_offloaded", "1 when vmaxdp serves the socket.", gauge, b2f(sk.Offloaded()), "pid", pid, "fd", fd, "ifname", sk.Interface)
			f.add("vmaxdp_socket_kernel_drops_total", "Datagrams the socket's kernel socket dropped: its receive buffer was full while the kernel served it.", dto.MetricType_COUNTER, float64(sk.KernelDrops), "pid", pid, "fd", fd, "ifname", sk.Interface)
			if !sk.Offloaded() {
				continue
			}
			l := []string{"pid", pid, "fd", fd, "ifname", sk.Interface}
			f.add("vmaxdp_socket_rx_queue_packets", "Datagrams in the socket's receive queue.", gauge, float64(sk.RxQueuePackets), l...)
			f.add("vmaxdp_socket_rx_queue_bytes", "Payload bytes in the socket's receive queue.", gauge, float64(sk.RxQueueBytes), l...)
			f.add("vmaxdp_socket_rx_bytes_limit", "Payload bytes the receive queue may hold.", gauge, float64(sk.RxBytesLimit), l...)
			f.addStruct("socket", &sk.Counters, l...)
			if sk.Proto == "tcp" {
				f.add("vmaxdp_socket_tcp_info", "A TCP socket's state.", gauge, 1, append(l, "state", sk.TCP.State)...)
				f.add("vmaxdp_socket_tcp_rtt_microseconds", "Smoothed round-trip time.", gauge, float64(sk.TCP.RTTMicros), l...)
				f.add("vmaxdp_socket_tcp_retransmits_total", "Segments retransmitted.", dto.MetricType_COUNTER, float64(sk.TCP.Retransmits), l...)
				f.add("vmaxdp_socket_tcp_recv_queue_bytes", "Bytes not yet read.", gauge, float64(sk.TCP.RecvQueue), l...)
				f.add("vmaxdp_socket_tcp_send_queue_bytes", "Bytes written and not yet acknowledged.", gauge, float64(sk.TCP.SendQueue), l...)
				f.add("vmaxdp_socket_tcp_backlog", "A listener's backlog.", gauge, float64(sk.TCP.Backlog), l...)
				f.add("vmaxdp_socket_tcp_accepted_total", "Connections a listener handed to accept from netstack.", dto.MetricType_COUNTER, float64(sk.TCP.Accepted), l...)
			}
		}
		for i := range s.Queues {
			q := &s.Queues[i]
			l := []string{"pid", pid, "ifname", q.Interface, "queue", strconv.Itoa(q.Queue)}
			f.add("vmaxdp_queue_info", "An AF_XDP queue.", gauge, 1, append(l, "backend", q.Backend, "xdp_mode", q.XDPMode, "zero_copy", strconv.FormatBool(q.ZeroCopy))...)
			for _, g := range []struct {
				name string
				v    uint64
			}{{"ring_size", q.RingSize}, {"rx_ring", q.RxRing}, {"tx_ring", q.TxRing}, {"fill_ring", q.FillRing},
				{"completion_ring", q.CompletionRing}, {"rx_pool_size", q.RxPoolSize}, {"rx_pool_free", q.RxPoolFree},
				{"tx_pool_size", q.TxPoolSize}, {"tx_pool_free", q.TxPoolFree}} {
				f.add("vmaxdp_queue_"+g.name, "AF_XDP queue "+g.name+" (entries or frames).", gauge, float64(g.v), l...)
			}
			f.addStruct("queue", &q.Counters, l...)
			f.addStruct("queue", &q.Statistics, l...)
		}
		for i := range s.Programs {
			p := &s.Programs[i]
			l := []string{"pid", pid, "ifname", p.Interface}
			f.addStruct("program", &p.Counters, l...)
			f.add("vmaxdp_program_rx_frames_total", "Frames the stack received.", dto.MetricType_COUNTER, float64(p.Stack.RxFrames), l...)
			f.add("vmaxdp_program_rx_no_socket_total", "Datagrams steered to the stack that no socket took.", dto.MetricType_COUNTER, float64(p.Stack.RxNoSocket), l...)
			f.add("vmaxdp_program_neigh_unresolved_total", "Sends whose next hop did not resolve.", dto.MetricType_COUNTER, float64(p.Stack.NeighUnresolved), l...)
			f.add("vmaxdp_program_rx_progress_frames_total", "Frames the progress engine drained while no receive polled.", dto.MetricType_COUNTER, float64(p.Stack.RxProgressFrames), l...)
			f.add("vmaxdp_program_rx_partial_checksum_total", "Datagrams delivered with a partial UDP checksum (from this host's kernel, TX checksum offload on).", dto.MetricType_COUNTER, float64(p.Stack.RxPartialChecksum), l...)
			f.add("vmaxdp_program_rx_source_rejected_total", "Datagrams and TCP segments dropped for a source the kernel would refuse (rp_filter, its own address).", dto.MetricType_COUNTER, float64(p.Stack.RxSourceRejected), l...)
			f.add("vmaxdp_program_rx_source_unchecked_total", "Datagrams and TCP segments from a new source dropped past the source checks a second allows.", dto.MetricType_COUNTER, float64(p.Stack.RxSourceUnchecked), l...)
			f.add("vmaxdp_program_rx_spilled_total", "Datagrams copied out of their frames because sockets held half of their queue's receive frames.", dto.MetricType_COUNTER, float64(p.Stack.RxSpilled), l...)
			for _, d := range p.Stack.RxDropped {
				f.add("vmaxdp_program_rx_dropped_total", "Frames the stack's parser dropped, by reason.", dto.MetricType_COUNTER, float64(d.Packets), append(l, "reason", d.Reason)...)
			}
			if p.HasTCP {
				f.addStruct("tcp", &p.TCP, l...)
			}
		}
		for i := range s.Rules {
			r := &s.Rules[i]
			l := []string{"pid", pid, "ifname", r.Interface, "rule", strconv.Itoa(int(r.ID)), "fd", strconv.Itoa(r.FD)}
			f.addStruct("rule", &r.Counters, l...)
		}
	}
	out := make([]*dto.MetricFamily, 0, len(f.order))
	for _, n := range f.order {
		out = append(out, f.byName[n])
	}
	return out
}

// Write writes the snapshots in the Prometheus text exposition
// format.
func Write(w io.Writer, snaps []*stats.Snapshot) error {
	for _, mf := range MetricFamilies(snaps) {
		if _, err := expfmt.MetricFamilyToText(w, mf); err != nil {
			return err
		}
	}
	return nil
}
