package stats

import (
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"
)

// The views keep vma_stats' headers and layout (the VMA monitoring guide,
// examples 1 to 7), so that a VMA user reads them at once; what VMA has no
// line for (the reason a socket is not offloaded, AF_XDP rings, steering
// rules) is added in the same style.

// ViewOptions select what WriteView prints.
type ViewOptions struct {
	View int // 1 basic, 2 per-socket blocks, 3 with queues, pools and steering, 4 multicast groups
	// Rates: the snapshot holds per-second rates (Deltas; vma_stats -d 2),
	// not totals.
	Rates bool
	// Socket selects sockets by fd (vma_stats -s); nil: all.
	Socket func(fd int) bool
}

const rule = "--------------------------------------------------------------------------"
const block = "======================================================"

func kb(b uint64) uint64 { return b / 1024 }

func pct(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return 100 * float64(part) / float64(whole)
}

// Deltas returns cur minus prev per second of d: every counter field
// (not those tagged gauge) of sockets, queues, programs, rules and
// multiplexers matched by fd, queue, interface and rule id. What prev does
// not have counts from zero.
func Deltas(cur, prev *Snapshot, d time.Duration) *Snapshot {
	out := cloneSnapshot(cur)
	sec := d.Seconds()
	if sec <= 0 {
		sec = 1
	}
	rate := func(dst, old reflect.Value) {
		for i := range dst.NumField() {
			if dst.Type().Field(i).Tag.Get("stats") == "gauge" {
				continue
			}
			f := dst.Field(i)
			var o uint64
			if old.IsValid() {
				o = old.Field(i).Uint()
			}
			if f.Uint() < o { // zeroed in between
				o = 0
			}
			f.SetUint(uint64(float64(f.Uint()-o)/sec + 0.5))
		}
	}
	pick := func(v any) reflect.Value { return reflect.ValueOf(v).Elem() }
	for i := range out.Sockets {
		s := &out.Sockets[i]
		old := find(prev.Sockets, func(p *Socket) bool { return p.FD == s.FD })
		rate(pick(&s.Counters), field(old, func(p *Socket) any { return &p.Counters }))
	}
	for i := range out.Queues {
		q := &out.Queues[i]
		old := find(prev.Queues, func(p *Queue) bool { return p.Interface == q.Interface && p.Queue == q.Queue })
		rate(pick(&q.Counters), field(old, func(p *Queue) any { return &p.Counters }))
		rate(pick(&q.Statistics), field(old, func(p *Queue) any { return &p.Statistics }))
	}
	for i := range out.Programs {
		pr := &out.Programs[i]
		old := find(prev.Programs, func(p *Program) bool { return p.Interface == pr.Interface })
		rate(pick(&pr.Counters), field(old, func(p *Program) any { return &p.Counters }))
		rate(pick(&pr.TCP), field(old, func(p *Program) any { return &p.TCP }))
	}
	for i := range out.Rules {
		r := &out.Rules[i]
		old := find(prev.Rules, func(p *Rule) bool { return p.Interface == r.Interface && p.ID == r.ID })
		rate(pick(&r.Counters), field(old, func(p *Rule) any { return &p.Counters }))
	}
	for _, m := range []struct{ cur, old *Iomux }{{&out.Process.Select, &prev.Process.Select},
		{&out.Process.Poll, &prev.Process.Poll}, {&out.Process.Epoll, &prev.Process.Epoll}} {
		rate(pick(m.cur), pick(m.old))
	}
	return out
}

// find is the element of s that match accepts, nil if none.
func find[T any](s []T, match func(*T) bool) *T {
	for i := range s {
		if match(&s[i]) {
			return &s[i]
		}
	}
	return nil
}

// field is the struct get returns of p, or the invalid Value when p is nil.
func field[T any](p *T, get func(*T) any) reflect.Value {
	if p == nil {
		return reflect.Value{}
	}
	return reflect.ValueOf(get(p)).Elem()
}

func cloneSnapshot(s *Snapshot) *Snapshot {
	c := *s
	c.Sockets = append([]Socket(nil), s.Sockets...)
	c.Queues = append([]Queue(nil), s.Queues...)
	c.Programs = append([]Program(nil), s.Programs...)
	c.Rules = append([]Rule(nil), s.Rules...)
	return &c
}

// WriteView prints one report of a process.
func WriteView(w io.Writer, s *Snapshot, o ViewOptions) {
	deltas := o.Rates
	var socks []*Socket
	for i := range s.Sockets {
		if o.Socket == nil || o.Socket(s.Sockets[i].FD) {
			socks = append(socks, &s.Sockets[i])
		}
	}
	if o.View == 4 {
		writeGroups(w, socks)
		return
	}
	writeTable(w, socks, deltas)
	writeIomux(w, s, deltas)
	if s.Process.SocketsHidden > 0 {
		fmt.Fprintf(w, "%d more sockets not published (VMAXDP_STATS_FD_NUM)\n", s.Process.SocketsHidden)
	}
	if o.View >= 2 {
		groups := reuseGroups(socks)
		for _, sk := range socks {
			writeSocketBlock(w, sk, groups[sk.Local], deltas)
		}
	}
	if o.View >= 3 {
		writeQueues(w, s, deltas)
	}
}

func writeTable(w io.Writer, socks []*Socket, deltas bool) {
	if deltas {
		fmt.Fprintln(w, "fd     --------------- offloaded ---------------- ---------- os ----------")
		fmt.Fprintln(w, "             pkt/s Kbyte/s eagain/s error/s  poll%   pkt/s Kbyte/s error/s")
	} else {
		fmt.Fprintln(w, "fd      ------------ total offloaded -------------   ----- total os ------")
		fmt.Fprintln(w, "               pkt  Kbyte   eagain   error   poll%     pkt   Kbyte   error")
	}
	// The offloaded Rx error column stays 0: the stack's receive path has
	// no error of its own (drops are in view 2); errors reading the kernel
	// socket are in the os column.
	for _, s := range socks {
		c := &s.Counters
		poll := pct(c.RxPollHit, c.RxPollHit+c.RxPollMiss)
		if !s.Offloaded() {
			if deltas {
				fmt.Fprintf(w, "%3d  %s\n", s.FD, notOffloaded(s))
			} else {
				fmt.Fprintf(w, "%-4d%s\n", s.FD, notOffloaded(s))
			}
			continue
		}
		if deltas {
			fmt.Fprintf(w, "%3d  Rx: %9d %7d %8d %7d %6.1f %7d %7d %7d\n", s.FD, c.RxOffloadPackets, kb(c.RxOffloadBytes),
				c.RxEagain, 0, poll, c.RxOSPackets, kb(c.RxOSBytes), c.RxErrors)
			fmt.Fprintf(w, "     Tx: %9d %7d %8d %7d %6s %7d %7d %7d\n", c.TxOffloadPackets, kb(c.TxOffloadBytes),
				c.TxNoBufs, c.TxErrors, "", c.TxOSPackets, kb(c.TxOSBytes), 0)
			continue
		}
		fmt.Fprintf(w, "%-4dRx: %10d %6d %8d %7d %7.1f %7d %7d %7d\n", s.FD, c.RxOffloadPackets, kb(c.RxOffloadBytes),
			c.RxEagain, 0, poll, c.RxOSPackets, kb(c.RxOSBytes), c.RxErrors)
		fmt.Fprintf(w, "    Tx: %10d %6d %8d %7d %7s %7d %7d %7d\n", c.TxOffloadPackets, kb(c.TxOffloadBytes),
			c.TxNoBufs, c.TxErrors, "", c.TxOSPackets, kb(c.TxOSBytes), 0)
	}
	if !deltas {
		fmt.Fprintln(w, rule)
	}
}

// notOffloaded says why s is not offloaded; a candidate closed before
// its bind or first send has no reason.
func notOffloaded(s *Socket) string {
	what := "not offloaded"
	if s.State == StateCandidate {
		what = "not offloaded yet (not bound, nothing sent)"
	}
	if s.Reason == "" {
		return what
	}
	return what + ": " + s.Reason
}

func writeIomux(w io.Writer, s *Snapshot, deltas bool) {
	for _, m := range []struct {
		name string
		c    *Iomux
	}{{"select()", &s.Process.Select}, {"poll()", &s.Process.Poll}, {"epoll_wait()", &s.Process.Epoll}} {
		c := m.c
		if c.Calls == 0 {
			continue
		}
		fmt.Fprintf(w, "%s Rx Ready:%d/%d [os/offload]\n", m.name, c.RxReadyOS, c.RxReadyOffload)
		fmt.Fprintf(w, "Timeouts:%d Errors:%d Poll:%.2f%%", c.Timeouts, c.Errors, pct(c.PollHit, c.PollHit+c.PollMiss))
		if s.Process.CPUUsageStats && deltas {
			// PollingNanos is per second here: nanoseconds of a second.
			fmt.Fprintf(w, " Polling CPU:%d%%", min(uint64(pct(c.PollingNanos, uint64(time.Second))), 100))
		}
		fmt.Fprintln(w)
	}
}

func writeSocketBlock(w io.Writer, s *Socket, group []*Socket, deltas bool) {
	per := ""
	if deltas {
		per = "/s"
	}
	c := &s.Counters
	fmt.Fprintln(w, block)
	fmt.Fprintf(w, "\tFd=[%d]\n", s.FD)
	if s.Blocking {
		fmt.Fprintln(w, "- Blocked")
	} else {
		fmt.Fprintln(w, "- Non-blocked")
	}
	if s.Offloaded() {
		fmt.Fprintf(w, "- Offloaded on %s\n", s.Interface)
	} else {
		why := notOffloaded(s)
		fmt.Fprintf(w, "- %s\n", strings.ToUpper(why[:1])+why[1:])
	}
	fmt.Fprintf(w, "- Bound IF  = [%s]\n", s.Local)
	if s.Remote != "" {
		fmt.Fprintf(w, "- Connected = [%s]\n", s.Remote)
	}
	if len(s.Groups) > 0 {
		fmt.Fprintf(w, "- Member of = [%s]\n", strings.Join(s.Groups, "] ["))
	}
	if s.ReusePort && len(group) > 1 {
		fds := make([]string, len(group))
		for i, g := range group {
			fds[i] = fmt.Sprint(g.FD)
		}
		fmt.Fprintf(w, "- SO_REUSEPORT group = fds [%s]\n", strings.Join(fds, " "))
	}
	if s.KernelDrops > 0 {
		fmt.Fprintf(w, "- Kernel socket drops = %d (its receive buffer was full while the kernel served it)\n", s.KernelDrops)
	}
	if !s.Offloaded() {
		return
	}
	fmt.Fprintf(w, "Rx Offload: %d / %d / %d / %d [kilobytes/packets/eagains/errors]%s\n", kb(c.RxOffloadBytes), c.RxOffloadPackets, c.RxEagain, 0, per)
	fmt.Fprintf(w, "Rx OS info: %d / %d / %d [kilobytes/packets/errors]%s\n", kb(c.RxOSBytes), c.RxOSPackets, c.RxErrors, per)
	fmt.Fprintf(w, "Tx Offload: %d / %d / %d / %d [kilobytes/packets/drops/errors]%s\n", kb(c.TxOffloadBytes), c.TxOffloadPackets, c.TxNoBufs, c.TxErrors, per)
	fmt.Fprintf(w, "Tx OS info: %d / %d / %d [kilobytes/packets/errors]%s\n", kb(c.TxOSBytes), c.TxOSPackets, 0, per)
	if c.TxStampDrops > 0 {
		fmt.Fprintf(w, "Tx stamps dropped: %d%s (its error queue was full: the application reads it with recvmsg and MSG_ERRQUEUE)\n", c.TxStampDrops, per)
	}
	if s.Proto == "tcp" {
		tc := &s.TCP
		if tc.State == "LISTEN" {
			fmt.Fprintf(w, "Listen: backlog %d, accepted %d by netstack, %d by the kernel (loopback, other interfaces)\n", tc.Backlog, tc.Accepted, c.RxOSPackets)
		} else {
			fmt.Fprintf(w, "TCP: %s, rtt %d us, retransmits %d, receive queue %d bytes, send queue %d bytes [packets are segments]\n",
				tc.State, tc.RTTMicros, tc.Retransmits, tc.RecvQueue, tc.SendQueue)
		}
	} else {
		fmt.Fprintf(w, "Rx byte: cur %d / max %d / dropped%s %d / limit %d\n", s.RxQueueBytes, c.RxQueueBytesMax, per, c.RxQueueDropBytes, s.RxBytesLimit)
		fmt.Fprintf(w, "Rx pkt : cur %d / max %d / dropped%s %d\n", s.RxQueuePackets, c.RxQueuePacketsMax, per, c.RxQueueDrops)
		fmt.Fprintf(w, "Rx poll: %d / %d (%.2f%%) [miss/hit]\n", c.RxPollMiss, c.RxPollHit, pct(c.RxPollHit, c.RxPollHit+c.RxPollMiss))
	}
	if len(s.Rules) > 0 {
		ids := make([]string, len(s.Rules))
		for i, id := range s.Rules {
			ids[i] = fmt.Sprint(id)
		}
		fmt.Fprintf(w, "Steering rules: %s on %s\n", strings.Join(ids, ", "), s.Interface)
	}
}

func line(w io.Writer, label string, format string, args ...any) {
	fmt.Fprintf(w, "%-22s"+format+"\n", append([]any{label + ":"}, args...)...)
}

func writeQueues(w io.Writer, s *Snapshot, deltas bool) {
	per := ""
	if deltas {
		per = "/s"
	}
	for i := range s.Queues {
		q := &s.Queues[i]
		name := fmt.Sprintf("%s/q%d", q.Interface, q.Queue)
		copyMode := "copy"
		if q.ZeroCopy {
			copyMode = "zero-copy"
		}
		fmt.Fprintln(w, block)
		fmt.Fprintf(w, "\tQUEUE=[%s]\n", name)
		line(w, "Backend", "%s", q.Backend)
		line(w, "XDP mode", "%s, %s", q.XDPMode, copyMode)
		line(w, "Rx packets"+per, "%d", q.Counters.RxPackets)
		line(w, "Tx packets"+per, "%d", q.Counters.TxPackets)
		line(w, "Drained max", "%d", q.Counters.MaxRxBatch)
		line(w, "Wakeups"+per, "%d / %d [rx/tx]", q.Counters.RxWakeups, q.Counters.TxWakeups)
		line(w, "Tx kick errors"+per, "%d", q.Counters.TxKickErrs)
		line(w, "Tx backlog"+per, "%d (transmits that left frames on the ring: the device stayed busy)", q.Counters.TxBacklog)
		line(w, "Tx deferred"+per, "%d (frames sent with a later send's kick: VMAXDP_TX_KICK_DELAY)", q.Counters.TxDeferred)
		line(w, "Rings", "%d / %d / %d / %d of %d [rx/tx/fill/completion]", q.RxRing, q.TxRing, q.FillRing, q.CompletionRing, q.RingSize)
		if q.StatisticsError != "" {
			line(w, "XDP_STATISTICS", "%s", q.StatisticsError)
		} else {
			st := &q.Statistics
			line(w, "Packets dropped"+per, "%d (rx_dropped)", st.RxDropped)
			line(w, "Rx ring full"+per, "%d (rx_ring_full)", st.RxRingFull)
			line(w, "Invalid descs"+per, "%d / %d [rx/tx]", st.RxInvalidDescs, st.TxInvalidDescs)
			line(w, "Tx ring empty"+per, "%d (tx_ring_empty_descs)", st.TxRingEmptyDescs)
		}
		fmt.Fprintln(w, block)
		fmt.Fprintf(w, "\tBUFFER_POOL(RX)=[%s]\n", name)
		line(w, "Size", "%d", q.RxPoolSize)
		line(w, "Free", "%d (on the fill ring)", q.RxPoolFree)
		line(w, "No buffers error"+per, "%d (rx_fill_ring_empty_descs)", q.Statistics.RxFillRingEmptyDescs)
		line(w, "Held, fill ring full"+per, "%d (fill_no_space)", q.Counters.FillNoSpace)
		fmt.Fprintln(w, block)
		fmt.Fprintf(w, "\tBUFFER_POOL(TX)=[%s]\n", name)
		line(w, "Size", "%d", q.TxPoolSize)
		line(w, "Free", "%d", q.TxPoolFree)
		line(w, "No buffers error"+per, "%d", q.Counters.TxNoBufs)
	}
	for i := range s.Programs {
		p := &s.Programs[i]
		fmt.Fprintln(w, block)
		fmt.Fprintf(w, "\tSTEER=[%s]\n", p.Interface)
		line(w, "XDP mode", "%s, pinned at %s", p.XDPMode, p.PinDir)
		if p.CountersError != "" {
			line(w, "Counters", "%s", p.CountersError)
		} else {
			c := &p.Counters
			line(w, "Redirected"+per, "%d", c.Redirected)
			line(w, "Passed"+per, "%d (non-IP %d, fragments %d, parse errors %d, martian sources %d)", c.Passed, c.NonIP, c.Fragments, c.ParseErrors, c.MartianSources)
		}
		line(w, "Stack rx frames"+per, "%d", p.Stack.RxFrames)
		line(w, "No socket", "%d", p.Stack.RxNoSocket)
		line(w, "Neighbours unresolved", "%d", p.Stack.NeighUnresolved)
		line(w, "Progress engine frames"+per, "%d", p.Stack.RxProgressFrames)
		line(w, "Partial checksums"+per, "%d (delivered: from this host's kernel, TX checksum offload on)", p.Stack.RxPartialChecksum)
		line(w, "Spilled"+per, "%d (copied out of their frames: readers held an eighth of a queue's frames)", p.Stack.RxSpilled)
		line(w, "Sources rejected"+per, "%d (the kernel would refuse them: rp_filter, its own address), %d unchecked", p.Stack.RxSourceRejected, p.Stack.RxSourceUnchecked)
		for _, d := range p.Stack.RxDropped {
			line(w, "Dropped "+d.Reason, "%d", d.Packets)
		}
		for j := range s.Rules {
			r := &s.Rules[j]
			if r.Interface != p.Interface {
				continue
			}
			owner := fmt.Sprintf("fd %d", r.FD)
			if r.FD < 0 {
				owner = "no socket"
			}
			if r.CountersError != "" {
				line(w, fmt.Sprintf("Rule %d", r.ID), "%s (%s): %s", r.Rule, owner, r.CountersError)
				continue
			}
			line(w, fmt.Sprintf("Rule %d", r.ID), "%s (%s): %d / %d / %d / %d [matched/redirected/redirect failures/too long]%s",
				r.Rule, owner, r.Counters.MatchedPackets, r.Redirected(), r.Counters.RedirectFailures, r.Counters.TooLong, per)
		}
		if p.HasTCP {
			// netstack's counters, by their JSON and Prometheus names.
			fmt.Fprintln(w, block)
			fmt.Fprintf(w, "\tTCP=[%s] (netstack)\n", p.Interface)
			for f := range Fields(&p.TCP) {
				suffix := per
				if f.Gauge {
					suffix = ""
				}
				fmt.Fprintf(w, "%-28s%d\n", f.Name+suffix+":", f.Value)
			}
		}
	}
	fmt.Fprintln(w, block)
}

func writeGroups(w io.Writer, socks []*Socket) {
	fmt.Fprintln(w, "VMAXDP Group Membership Information")
	fmt.Fprintln(w, "Group                fd number")
	fmt.Fprintln(w, "------------------------------")
	for _, s := range socks {
		for _, g := range s.Groups {
			fmt.Fprintf(w, "%-21s %d\n", "["+g+"]", s.FD)
		}
	}
	groups := reuseGroups(socks)
	if len(groups) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "VMAXDP SO_REUSEPORT Groups")
	fmt.Fprintln(w, "Address                fd   offloaded   rx packets [offload/os]")
	fmt.Fprintln(w, "---------------------------------------------------------------")
	for _, local := range slices.Sorted(maps.Keys(groups)) {
		for i, s := range groups[local] {
			addr := ""
			if i == 0 {
				addr = "[" + local + "]"
			}
			if !s.Offloaded() {
				// The kernel counts a socket it serves for all of them.
				fmt.Fprintf(w, "%-22s %-4d %-11s -\n", addr, s.FD, "no")
				continue
			}
			fmt.Fprintf(w, "%-22s %-4d %-11s %d / %d\n", addr, s.FD, "yes", s.Counters.RxOffloadPackets, s.Counters.RxOSPackets)
		}
	}
}

// reuseGroups gathers the sockets with SO_REUSEPORT by local address and
// port: each entry of two or more is a group, in fd order.
func reuseGroups(socks []*Socket) map[string][]*Socket {
	m := map[string][]*Socket{}
	for _, s := range socks {
		if s.ReusePort {
			m[s.Local] = append(m[s.Local], s)
		}
	}
	for local, g := range m {
		if len(g) < 2 {
			delete(m, local)
			continue
		}
		slices.SortFunc(g, func(a, b *Socket) int { return a.FD - b.FD })
	}
	return m
}

// WriteNetstat prints the netstat-like view (vma_stats -v 5) of the
// sockets of every process.
func WriteNetstat(w io.Writer, snaps []*Snapshot) {
	fmt.Fprintf(w, "%-5s %-9s %-22s %-21s %-11s %-8s %s\n", "Proto", "Offloaded", "Local Address", "Foreign Address", "State", "PID", "Reason")
	for _, s := range snaps {
		for i := range s.Sockets {
			sk := &s.Sockets[i]
			off := "No"
			if sk.Offloaded() {
				off = "Yes"
			}
			remote := sk.Remote
			if remote == "" {
				remote = "0.0.0.0:*"
			}
			fmt.Fprintf(w, "%-5s %-9s %-22s %-21s %-11s %-8d %s\n", sk.Proto, off, sk.Local, remote, sk.TCP.State, s.Process.PID, sk.Reason)
		}
	}
}

// WriteCloseReport writes a socket's counters in the format of
// VMAXDP_STATS_FILE (the VMA manual's example 5).
func WriteCloseReport(w io.Writer, s *Socket) {
	c := &s.Counters
	p := fmt.Sprintf("vmaxdp: [fd=%d]", s.FD)
	if !s.Offloaded() {
		fmt.Fprintf(w, "%s %s\n", p, notOffloaded(s))
		return
	}
	fmt.Fprintf(w, "%s Tx Offload: %d KB / %d / %d [bytes/packets/errors]\n", p, kb(c.TxOffloadBytes), c.TxOffloadPackets, c.TxErrors)
	fmt.Fprintf(w, "%s Tx OS info: %d KB / %d / %d [bytes/packets/errors]\n", p, kb(c.TxOSBytes), c.TxOSPackets, 0)
	fmt.Fprintf(w, "%s Rx Offload: %d KB / %d / %d [bytes/packets/errors]\n", p, kb(c.RxOffloadBytes), c.RxOffloadPackets, 0)
	fmt.Fprintf(w, "%s Rx OS info: %d KB / %d / %d [bytes/packets/errors]\n", p, kb(c.RxOSBytes), c.RxOSPackets, c.RxErrors)
	if s.Proto == "tcp" {
		t := &s.TCP
		fmt.Fprintf(w, "%s TCP: %s / %d us / %d / %d / %d / %d [state/rtt/retransmits/receive queue/send queue/accepted]\n", p, t.State, t.RTTMicros, t.Retransmits, t.RecvQueue, t.SendQueue, t.Accepted)
		return
	}
	all := c.RxOffloadPackets + c.RxQueueDrops
	fmt.Fprintf(w, "%s Rx byte: max %d / dropped %d (%.2f%%) / limit %d\n", p, c.RxQueueBytesMax, c.RxQueueDropBytes,
		pct(c.RxQueueDropBytes, c.RxOffloadBytes+c.RxQueueDropBytes), s.RxBytesLimit)
	fmt.Fprintf(w, "%s Rx pkt : max %d / dropped %d (%.2f%%)\n", p, c.RxQueuePacketsMax, c.RxQueueDrops, pct(c.RxQueueDrops, all))
	fmt.Fprintf(w, "%s Rx poll: %d / %d (%.2f%%) [miss/hit]\n", p, c.RxPollMiss, c.RxPollHit, pct(c.RxPollHit, c.RxPollHit+c.RxPollMiss))
}

// WriteEndReport writes, in the format of VMAXDP_STATS_FILE, the report
// of every socket of s, then WriteStacksReport's.
func WriteEndReport(w io.Writer, s *Snapshot) {
	for i := range s.Sockets {
		WriteCloseReport(w, &s.Sockets[i])
	}
	WriteStacksReport(w, s)
}

// WriteStacksReport writes, in the format of VMAXDP_STATS_FILE, what
// the stacks of s dropped before any socket counted it: each one's drops
// (WriteStackReport) and each queue's (WriteQueueReport).
func WriteStacksReport(w io.Writer, s *Snapshot) {
	for i := range s.Programs {
		WriteStackReport(w, &s.Programs[i])
	}
	for i := range s.Queues {
		WriteQueueReport(w, &s.Queues[i])
	}
}

// WriteQueueReport writes, in the format of VMAXDP_STATS_FILE, what a
// queue's AF_XDP socket dropped before the stack saw it (the kernel's
// XDP_STATISTICS): with the sockets' reports, where every datagram of a
// process that has ended went.
func WriteQueueReport(w io.Writer, q *Queue) {
	p := fmt.Sprintf("vmaxdp: [%s/q%d]", q.Interface, q.Queue)
	if q.StatisticsError != "" {
		fmt.Fprintf(w, "%s Rx ring: %s\n", p, q.StatisticsError)
		return
	}
	x := &q.Statistics
	fmt.Fprintf(w, "%s Rx ring: %d / %d / %d [rx_ring_full/rx_dropped/rx_fill_ring_empty_descs]\n", p, x.RxRingFull, x.RxDropped, x.RxFillRingEmptyDescs)
}

// WriteStackReport writes, in the format of VMAXDP_STATS_FILE, the frames
// a stack dropped, by reason (vmaxdp stats -v 3's "Dropped"); nothing
// when it dropped none.
func WriteStackReport(w io.Writer, pr *Program) {
	if len(pr.Stack.RxDropped) == 0 {
		return
	}
	fmt.Fprintf(w, "vmaxdp: [%s] Rx dropped:", pr.Interface)
	for _, d := range pr.Stack.RxDropped {
		fmt.Fprintf(w, " %s %d", d.Reason, d.Packets)
	}
	fmt.Fprintln(w)
}

// WriteFDDump writes a socket's dump (vma_stats -S, the guide's example
// 7), one line per item, without the log's prefix.
func WriteFDDump(w io.Writer, s *Socket) {
	c := &s.Counters
	fmt.Fprintf(w, "============ DUMPING FD %d STATISTICS ============\n", s.FD)
	fmt.Fprintln(w, "==================== SOCKET FD ===================")
	fmt.Fprintf(w, "Fd number : %d\n", s.FD)
	fmt.Fprintf(w, "Bind info : %s\n", s.Local)
	if s.Remote != "" {
		fmt.Fprintf(w, "Connection info : %s\n", s.Remote)
	}
	fmt.Fprintf(w, "Protocol : PROTO_%s\n", strings.ToUpper(s.Proto))
	fmt.Fprintf(w, "Is blocking : %t\n", s.Blocking)
	fmt.Fprintf(w, "Is offloaded : %t\n", s.Offloaded())
	if !s.Offloaded() {
		fmt.Fprintf(w, "Reason : %s\n", s.Reason)
	} else {
		fmt.Fprintf(w, "Interface : %s\n", s.Interface)
		fmt.Fprintf(w, "Tx Offload : %d / %d / %d / %d [kilobytes/packets/drops/errors]\n", kb(c.TxOffloadBytes), c.TxOffloadPackets, c.TxNoBufs, c.TxErrors)
		fmt.Fprintf(w, "Rx Offload : %d / %d / %d / %d [kilobytes/packets/eagains/errors]\n", kb(c.RxOffloadBytes), c.RxOffloadPackets, c.RxEagain, 0)
		fmt.Fprintf(w, "Rx OS info : %d / %d / %d [kilobytes/packets/errors]\n", kb(c.RxOSBytes), c.RxOSPackets, c.RxErrors)
		fmt.Fprintf(w, "Rx byte : max %d / dropped %d / limit %d\n", c.RxQueueBytesMax, c.RxQueueDropBytes, s.RxBytesLimit)
		fmt.Fprintf(w, "Rx pkt : max %d / dropped %d\n", c.RxQueuePacketsMax, c.RxQueueDrops)
		fmt.Fprintf(w, "Rx poll : %d / %d (%.2f%%) [miss/hit]\n", c.RxPollMiss, c.RxPollHit, pct(c.RxPollHit, c.RxPollHit+c.RxPollMiss))
		fmt.Fprintf(w, "Rx queue : %d packets, %d bytes\n", s.RxQueuePackets, s.RxQueueBytes)
		if len(s.Groups) > 0 {
			fmt.Fprintf(w, "Member of : %s\n", strings.Join(s.Groups, ", "))
		}
	}
	fmt.Fprintln(w, "==================================================")
}
