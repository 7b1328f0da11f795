// Package tracefmt turns a trace file into what people and tools read:
// perf-script-style text, JSON lines, a Perfetto (Chrome JSON) trace and
// pcapng. It streams: one event in memory at a time.
//
// It must not reach the running kernel: everything it prints comes from
// the file (symbols, interface names and drop reasons included).
package tracefmt

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/tracefile"
)

// Options select what is printed.
type Options struct {
	// Probes, when not nil, keeps only events of these probe IDs.
	Probes map[uint16]bool
}

// Stats says what a formatter read.
type Stats struct {
	Events int64  // printed
	Lost   uint64 // counted lost by the recorder
	// Incomplete holds the reader's ErrTruncated error when the file was
	// cut short; the events before the cut were printed.
	Incomplete error
}

// lossDelta is what one probe lost on one CPU since the previous Loss
// record that named them.
type lossDelta struct {
	Probe uint16
	CPU   uint32
	Lost  uint64
}

// handlers receive what each walks past; nil ones are skipped.
type handlers struct {
	event func(*tracefile.Event) error
	// loss gets every entry of a Loss record, turned from the file's
	// cumulative counts into deltas (zero when only the event count moved).
	loss func(time uint64, deltas []lossDelta) error
	// record gets the other non-event records.
	record func(*tracefile.Record) error
}

// each reads every record of r and hands them to h. A truncated file ends
// the walk without an error (Stats.Incomplete says so).
func each(r *tracefile.Reader, opts *Options, h handlers) (Stats, error) {
	var (
		st     Stats
		rec    tracefile.Record // outside the loop: &rec escapes to h.record
		err    error
		loss   tracefile.Loss
		deltas []lossDelta
	)
	cum := map[[2]uint32]uint64{}
	for {
		rec, err = r.Next()
		if err == io.EOF {
			break
		}
		if errors.Is(err, tracefile.ErrTruncated) {
			st.Incomplete = err
			break
		}
		if err != nil {
			return st, err
		}
		switch rec.Type {
		case tracefile.TypeEvent:
			ev := r.Event()
			if opts != nil && opts.Probes != nil && !opts.Probes[ev.Probe] {
				continue
			}
			st.Events++
			err = h.event(ev)
		case tracefile.TypeLoss:
			if h.loss == nil {
				continue
			}
			loss.Entries = loss.Entries[:0]
			if err := rec.Decode(&loss); err != nil {
				return st, err
			}
			deltas = deltas[:0]
			for _, e := range loss.Entries {
				k := [2]uint32{uint32(e.Probe), e.CPU}
				deltas = append(deltas, lossDelta{Probe: e.Probe, CPU: e.CPU, Lost: e.Lost - min(e.Lost, cum[k])})
				cum[k] = e.Lost
			}
			err = h.loss(loss.Time, deltas)
		default:
			if h.record != nil {
				err = h.record(&rec)
			}
		}
		if err != nil {
			return st, err
		}
	}
	if end := r.End(); end != nil {
		for _, p := range end.Probes {
			st.Lost += p.Lost
		}
	}
	return st, nil
}

// Text writes one line per event in perf script's default layout:
//
//	comm tid [cpu] secs.usecs: system:event: the tracepoint's print format
//
// Losses are marked where the recorder noticed them, as comment lines
// starting with "#", and summed at the end.
func Text(w io.Writer, r *tracefile.Reader, opts *Options) (Stats, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	p := newPrinter(r)
	var buf []byte
	st, err := each(r, opts, handlers{
		event: func(e *tracefile.Event) error {
			buf = p.appendLine(buf[:0], e)
			_, err := bw.Write(buf)
			return err
		},
		loss: func(time uint64, deltas []lossDelta) error {
			for _, d := range deltas {
				switch {
				case d.Lost == 0:
				case d.CPU == tracefile.CPUAny:
					fmt.Fprintf(bw, "# LOST %d %s events before %s (nested: the probe was already running on that cpu)\n", d.Lost, p.name(d.Probe), p.time(time))
				default:
					fmt.Fprintf(bw, "# LOST %d %s events on cpu %d before %s (ring buffer full)\n", d.Lost, p.name(d.Probe), d.CPU, p.time(time))
				}
			}
			return nil
		},
	})
	if err != nil {
		bw.Flush()
		return st, err
	}
	fmt.Fprintf(bw, "# nettrace: %d events, %d lost", st.Events, st.Lost)
	if st.Incomplete != nil {
		fmt.Fprintf(bw, "; INCOMPLETE: %v", st.Incomplete)
	}
	bw.WriteString("\n")
	return st, bw.Flush()
}

// printer formats events with what the file knows.
type printer struct {
	r     *tracefile.Reader
	meta  *tracefile.Meta
	names map[uint16]string
	width int
}

func newPrinter(r *tracefile.Reader) *printer {
	p := &printer{r: r, meta: r.Meta(), names: map[uint16]string{}}
	for _, pr := range p.meta.Probes {
		p.names[pr.ID] = pr.Name
		p.width = max(p.width, len(pr.Name))
	}
	return p
}

func (p *printer) name(id uint16) string {
	if n, ok := p.names[id]; ok {
		return n
	}
	return "probe" + strconv.Itoa(int(id))
}

func (p *printer) time(ns uint64) string {
	return string(appendTime(nil, ns))
}

func appendTime(b []byte, ns uint64) []byte {
	var tmp [20]byte
	secs, usecs := ns/1e9, (ns%1e9)/1e3
	b = appendPad(b, strconv.AppendUint(tmp[:0], secs, 10), 5)
	b = append(b, '.')
	return appendZeroPad(b, usecs, 6)
}

// appendPad right-aligns s in width columns.
func appendPad[S []byte | string](b []byte, s S, width int) []byte {
	for i := len(s); i < width; i++ {
		b = append(b, ' ')
	}
	return append(b, s...)
}

func appendZeroPad(b []byte, v uint64, width int) []byte {
	var tmp [20]byte
	s := strconv.AppendUint(tmp[:0], v, 10)
	for i := len(s); i < width; i++ {
		b = append(b, '0')
	}
	return append(b, s...)
}

func appendPtr(b []byte, v uint64) []byte {
	if v == 0 {
		return append(b, "(nil)"...)
	}
	b = append(b, "0x"...)
	return strconv.AppendUint(b, v, 16)
}

func (p *printer) appendLine(b []byte, e *tracefile.Event) []byte {
	var tmp [20]byte
	comm := e.Comm[:]
	for i, c := range comm {
		if c == 0 {
			comm = comm[:i]
			break
		}
	}
	b = appendPad(b, comm, 16)
	b = append(b, ' ')
	b = appendPad(b, strconv.AppendUint(tmp[:0], uint64(e.TID), 10), 5)
	b = append(b, " ["...)
	b = appendZeroPad(b, uint64(e.CPU), 3)
	b = append(b, "] "...)
	b = appendTime(b, e.Time)
	b = append(b, ": "...)
	b = appendPad(b, p.name(e.Probe), p.width)
	b = append(b, ": "...)
	b = p.appendBody(b, e)
	return append(b, '\n')
}

func (p *printer) appendDev(b []byte, e *tracefile.Event) []byte {
	n := 0
	for n < len(e.Dev) && e.Dev[n] != 0 {
		n++
	}
	if n == 0 {
		if name := p.r.Interface(e.Netns, e.Ifindex); name != "" {
			return append(b, name...)
		}
		return append(b, "(no_device)"...)
	}
	return append(b, e.Dev[:n]...)
}

func (p *printer) appendLocation(b []byte, loc uint64) []byte {
	if s, off, ok := p.r.Symbolize(loc); ok {
		b = append(b, s.Name...)
		b = append(b, "+0x"...)
		return strconv.AppendUint(b, off, 16)
	}
	return appendPtr(b, loc)
}

// Reason returns a drop reason's name from the file's table.
func Reason(m *tracefile.Meta, reason uint32) string {
	if n, ok := m.DropReasons[reason]; ok {
		return n
	}
	return strconv.FormatUint(uint64(reason), 10)
}

var softirqNames = [...]string{"HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU"}

var xdpActions = [...]string{"ABORTED", "DROP", "PASS", "TX", "REDIRECT"}

func appendInt(b []byte, v int32) []byte { return strconv.AppendInt(b, int64(v), 10) }

// appendBody prints the tracepoint's own print format (tracefs "print
// fmt"), with symbols, reasons and devices resolved.
func (p *printer) appendBody(b []byte, e *tracefile.Event) []byte {
	switch probes.ID(e.Probe) {
	case probes.NetifReceiveSkb, probes.NetifRx, probes.NetDevQueue:
		return p.appendDevSkbLen(b, e)
	case probes.NetDevXmit:
		b = p.appendDevSkbLen(b, e)
		b = append(b, " rc="...)
		return appendInt(b, e.Arg[0])
	case probes.NapiPoll:
		b = append(b, "napi poll on napi struct "...)
		b = appendPtr(b, e.Location)
		b = append(b, " for device "...)
		b = p.appendDev(b, e)
		b = append(b, " work "...)
		b = appendInt(b, e.Arg[0])
		b = append(b, " budget "...)
		return appendInt(b, e.Arg[1])
	case probes.KfreeSkb:
		b = append(b, "skbaddr="...)
		b = appendPtr(b, e.Skb)
		b = append(b, " rx_sk="...)
		b = appendPtr(b, e.Sk)
		b = append(b, " protocol="...)
		b = strconv.AppendUint(b, uint64(e.Protocol), 10)
		b = append(b, " location="...)
		b = p.appendLocation(b, e.Location)
		b = append(b, " reason: "...)
		return append(b, Reason(p.meta, e.Reason)...)
	case probes.ConsumeSkb:
		b = append(b, "skbaddr="...)
		b = appendPtr(b, e.Skb)
		b = append(b, " location="...)
		return p.appendLocation(b, e.Location)
	case probes.SkbCopyDatagramIovec:
		b = append(b, "skbaddr="...)
		b = appendPtr(b, e.Skb)
		b = append(b, " len="...)
		return appendInt(b, e.Arg[0])
	case probes.SoftirqRaise, probes.SoftirqEntry, probes.SoftirqExit:
		b = append(b, "vec="...)
		b = appendInt(b, e.Arg[0])
		b = append(b, " [action="...)
		if v := e.Arg[0]; v >= 0 && int(v) < len(softirqNames) {
			b = append(b, softirqNames[v]...)
		}
		return append(b, ']')
	case probes.XdpException:
		b = append(b, "prog_id="...)
		b = appendInt(b, e.Arg[0])
		b = append(b, " action="...)
		b = appendAction(b, e.Arg[1])
		b = append(b, " ifindex="...)
		return strconv.AppendUint(b, uint64(e.Ifindex), 10)
	case probes.XdpRedirect, probes.XdpRedirectErr:
		// The kernel's to_ifindex: the map index for a redirect without a
		// map (map_id INT_MAX), else 0 (nettrace does not read devmap
		// entries).
		toIfindex, index := int32(0), e.Arg[3]
		if e.Arg[2] == 0x7fffffff {
			toIfindex, index = index, 0
		}
		b = append(b, "prog_id="...)
		b = appendInt(b, e.Arg[0])
		b = append(b, " action=REDIRECT ifindex="...)
		b = strconv.AppendUint(b, uint64(e.Ifindex), 10)
		b = append(b, " to_ifindex="...)
		b = appendInt(b, toIfindex)
		b = append(b, " err="...)
		b = appendInt(b, e.Arg[1])
		b = append(b, " map_id="...)
		b = appendInt(b, e.Arg[2])
		b = append(b, " map_index="...)
		return appendInt(b, index)
	case probes.SockRcvqueueFull:
		b = append(b, "rmem_alloc="...)
		b = appendInt(b, e.Arg[1])
		b = append(b, " truesize="...)
		b = appendInt(b, e.Arg[2])
		b = append(b, " sk_rcvbuf="...)
		return appendInt(b, e.Arg[0])
	case probes.SockExceedBufLimit:
		b = append(b, "allocated="...)
		b = appendInt(b, e.Arg[1])
		b = append(b, " sk_rcvbuf="...)
		b = appendInt(b, e.Arg[2])
		b = append(b, " kind="...)
		if e.Arg[0] == 1 {
			return append(b, "SK_MEM_RECV"...)
		}
		return append(b, "SK_MEM_SEND"...)
	case probes.UdpFailQueueRcvSkb:
		b = append(b, "rc="...)
		b = appendInt(b, e.Arg[0])
		b = append(b, " family=AF_INET src="...)
		f, ok := DecodeFlow(e)
		if !ok {
			return append(b, "? dest=?"...)
		}
		b = f.Src.AppendTo(b)
		b = append(b, " dest="...)
		return f.Dst.AppendTo(b)
	}
	return append(b, "(unknown probe)"...)
}

// appendDevSkbLen prints the net: events' common "dev=%s skbaddr=%p len=%u".
func (p *printer) appendDevSkbLen(b []byte, e *tracefile.Event) []byte {
	b = append(b, "dev="...)
	b = p.appendDev(b, e)
	b = append(b, " skbaddr="...)
	b = appendPtr(b, e.Skb)
	b = append(b, " len="...)
	return strconv.AppendUint(b, uint64(e.Len), 10)
}

func appendAction(b []byte, act int32) []byte {
	if act >= 0 && int(act) < len(xdpActions) {
		return append(b, xdpActions[act]...)
	}
	return appendInt(b, act)
}

// XDPAction names an XDP action as the kernel's tracepoints print it.
func XDPAction(act int32) string { return string(appendAction(nil, act)) }

// SoftirqName names a softirq vector as irq:softirq_* print it.
func SoftirqName(vec int32) string {
	if vec >= 0 && int(vec) < len(softirqNames) {
		return softirqNames[vec]
	}
	return strconv.Itoa(int(vec))
}
