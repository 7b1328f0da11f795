package tracefmt

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"

	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

// JSONEvent is one line of `nettrace script --format json`. The schema is
// stable: fields are added, never renamed.
type JSONEvent struct {
	Type     string    `json:"type"` // "event"
	TimeNS   uint64    `json:"time_ns"`
	CPU      uint32    `json:"cpu"`
	PID      uint32    `json:"pid"`
	TID      uint32    `json:"tid"`
	Comm     string    `json:"comm"`
	Event    string    `json:"event"`
	Skb      string    `json:"skb,omitempty"`
	Sk       string    `json:"sk,omitempty"`
	Location string    `json:"location,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Netns    uint32    `json:"netns,omitempty"`
	Ifindex  uint32    `json:"ifindex,omitempty"`
	Dev      string    `json:"dev,omitempty"`
	Len      uint32    `json:"len,omitempty"`
	Protocol uint16    `json:"protocol,omitempty"`
	Args     [4]int32  `json:"args"`
	Flow     *JSONFlow `json:"flow,omitempty"`
	Caplen   int       `json:"caplen"`
}

// JSONFlow is a decoded IPv4 flow.
type JSONFlow struct {
	Proto string `json:"proto"`
	Src   string `json:"src"`
	Dst   string `json:"dst"`
}

// JSONLoss is a line for lost events, where the recorder noticed them.
type JSONLoss struct {
	Type   string `json:"type"` // "loss"
	TimeNS uint64 `json:"time_ns"`
	Event  string `json:"event"`
	CPU    uint32 `json:"cpu"`  // 4294967295 (tracefile.CPUAny): nested hits the kernel skipped, on any CPU
	Lost   uint64 `json:"lost"` // since the previous loss line of this event and CPU
}

// JSONSummary is the last line.
type JSONSummary struct {
	Type       string `json:"type"` // "summary"
	Events     int64  `json:"events"`
	Lost       uint64 `json:"lost"`
	Incomplete string `json:"incomplete,omitempty"`
}

// JSON writes one JSON object per line: events, losses and a summary.
func JSON(w io.Writer, r *tracefile.Reader, opts *Options) (Stats, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	enc := json.NewEncoder(bw)
	p := newPrinter(r)
	st, err := each(r, opts, handlers{
		event: func(e *tracefile.Event) error { return enc.Encode(p.jsonEvent(e)) },
		loss: func(time uint64, deltas []lossDelta) error {
			for _, d := range deltas {
				if d.Lost == 0 {
					continue
				}
				if err := enc.Encode(JSONLoss{Type: "loss", TimeNS: time, Event: p.name(d.Probe), CPU: d.CPU, Lost: d.Lost}); err != nil {
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
	sum := JSONSummary{Type: "summary", Events: st.Events, Lost: st.Lost}
	if st.Incomplete != nil {
		sum.Incomplete = st.Incomplete.Error()
	}
	if err := enc.Encode(sum); err != nil {
		return st, err
	}
	return st, bw.Flush()
}

func (p *printer) jsonEvent(e *tracefile.Event) *JSONEvent {
	j := &JSONEvent{
		Type: "event", TimeNS: e.Time, CPU: e.CPU, PID: e.PID, TID: e.TID, Comm: e.CommString(),
		Event: p.name(e.Probe), Netns: e.Netns, Ifindex: e.Ifindex, Len: e.Len, Protocol: e.Protocol,
		Args: e.Arg, Caplen: len(e.Data),
	}
	if e.Skb != 0 {
		j.Skb = fmt.Sprintf("0x%x", e.Skb)
	}
	if e.Sk != 0 {
		j.Sk = fmt.Sprintf("0x%x", e.Sk)
	}
	if e.Ifindex != 0 || e.Dev[0] != 0 {
		j.Dev = string(p.appendDev(nil, e))
	}
	if e.Location != 0 {
		j.Location = string(p.appendLocation(nil, e.Location))
	}
	if probes.ID(e.Probe) == probes.KfreeSkb {
		j.Reason = Reason(p.meta, e.Reason)
	}
	if f, ok := DecodeFlow(e); ok {
		j.Flow = &JSONFlow{Proto: ProtoName(f.Proto), Src: f.Src.String(), Dst: f.Dst.String()}
	}
	return j
}
