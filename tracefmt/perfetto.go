package tracefmt

import (
	"bufio"
	"encoding/json"
	"io"
	"slices"
	"sort"
	"strconv"

	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

// Perfetto writes the recording in the Chrome JSON trace format, which
// ui.perfetto.dev and chrome://tracing open: one track per CPU with an
// instant per event and a slice per NET_RX/NET_TX softirq, and counter
// tracks for the sampled counters (interfaces, softnet, SNMP UDP) and the
// events lost.
func Perfetto(w io.Writer, r *tracefile.Reader, opts *Options) (Stats, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	p := newPrinter(r)
	first := true
	emit := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if first {
			bw.WriteString("[\n")
			first = false
		} else {
			bw.WriteString(",\n")
		}
		_, err = bw.Write(b)
		return err
	}
	type meta struct {
		Name string            `json:"name"`
		Ph   string            `json:"ph"`
		PID  int               `json:"pid"`
		TID  uint32            `json:"tid"`
		Args map[string]string `json:"args"`
	}
	type instant struct {
		Name string            `json:"name"`
		Ph   string            `json:"ph"`
		S    string            `json:"s,omitempty"`
		TS   float64           `json:"ts"`
		PID  int               `json:"pid"`
		TID  uint32            `json:"tid"`
		Args map[string]string `json:"args,omitempty"`
	}
	type counter struct {
		Name string            `json:"name"`
		Ph   string            `json:"ph"`
		TS   float64           `json:"ts"`
		PID  int               `json:"pid"`
		Args map[string]uint64 `json:"args"`
	}
	const cpusPID, countersPID = 1, 2
	if err := emit(meta{"process_name", "M", cpusPID, 0, map[string]string{"name": "CPUs"}}); err != nil {
		return Stats{}, err
	}
	if err := emit(meta{"process_name", "M", countersPID, 0, map[string]string{"name": "counters"}}); err != nil {
		return Stats{}, err
	}
	us := func(ns uint64) float64 { return float64(ns) / 1e3 }
	cpus := map[uint32]bool{}
	var body []byte
	lost := map[uint16]uint64{} // cumulative, all CPUs
	var ids []int
	st, err := each(r, opts, handlers{
		event: func(e *tracefile.Event) error {
			if !cpus[e.CPU] {
				cpus[e.CPU] = true
				if err := emit(meta{"thread_name", "M", cpusPID, e.CPU, map[string]string{"name": "CPU " + strconv.Itoa(int(e.CPU))}}); err != nil {
					return err
				}
			}
			switch probes.ID(e.Probe) {
			case probes.SoftirqEntry, probes.SoftirqExit:
				name := "NET_RX softirq"
				if e.Arg[0] == 2 {
					name = "NET_TX softirq"
				}
				ph := "B"
				if probes.ID(e.Probe) == probes.SoftirqExit {
					ph = "E"
				}
				return emit(instant{Name: name, Ph: ph, TS: us(e.Time), PID: cpusPID, TID: e.CPU})
			}
			body = p.appendBody(body[:0], e)
			return emit(instant{Name: p.name(e.Probe), Ph: "i", S: "t", TS: us(e.Time), PID: cpusPID, TID: e.CPU,
				Args: map[string]string{"comm": e.CommString(), "fields": string(body)}})
		},
		record: func(rec *tracefile.Record) error {
			if rec.Type != tracefile.TypeCounters {
				return nil
			}
			var c tracefile.Counters
			if err := rec.Decode(&c); err != nil {
				return err
			}
			for _, k := range perfettoCounters(&c) {
				name := c.Source + " " + k
				if c.Device != "" {
					name = c.Device + " " + k
				}
				if err := emit(counter{Name: name, Ph: "C", TS: us(c.Time), PID: countersPID, Args: map[string]uint64{"value": c.Values[k]}}); err != nil {
					return err
				}
			}
			return nil
		},
		// One counter track per probe, its losses over all CPUs so far.
		loss: func(time uint64, deltas []lossDelta) error {
			ids = ids[:0]
			for _, d := range deltas {
				if !slices.Contains(ids, int(d.Probe)) {
					ids = append(ids, int(d.Probe))
				}
				lost[d.Probe] += d.Lost
			}
			sort.Ints(ids)
			for _, id := range ids {
				if err := emit(counter{Name: "lost " + p.name(uint16(id)), Ph: "C", TS: us(time), PID: countersPID, Args: map[string]uint64{"value": lost[uint16(id)]}}); err != nil {
					return err
				}
			}
			return nil
		},
	})
	if err != nil {
		bw.Flush()
		return st, err
	}
	if first {
		bw.WriteString("[")
	}
	bw.WriteString("\n]\n")
	return st, bw.Flush()
}

// perfettoCounters picks the counters worth a track, in a stable order.
func perfettoCounters(c *tracefile.Counters) []string {
	var keys []string
	switch c.Source {
	case "netdev":
		keys = []string{"rx_packets", "tx_packets", "rx_dropped", "tx_dropped"}
	case "softnet":
		keys = []string{"processed", "dropped", "time_squeeze"}
	case "snmp":
		keys = []string{"Udp.InDatagrams", "Udp.NoPorts", "Udp.RcvbufErrors", "Udp.InErrors"}
	case "vmaxdp":
		keys = []string{"redirected", "passed"}
	}
	out := keys[:0]
	for _, k := range keys {
		if _, ok := c.Values[k]; ok {
			out = append(out, k)
		}
	}
	return out
}
