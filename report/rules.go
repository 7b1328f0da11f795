package report

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/vmaxdp/vmaxdp/tracefmt"
)

// Severities, most urgent first.
var severityRank = map[string]int{"error": 0, "warning": 1, "info": 2}

// findings runs the rule base. Each rule looks at what Build gathered and
// says what it concludes, from which evidence, and what to do; the
// findings come most severe and most frequent first.
func (b *builder) findings(rep *Report) []Finding {
	var out []Finding
	handled := map[string]bool{}
	for _, rule := range []func(*Report, map[string]bool) []Finding{
		b.ruleLost, b.ruleNoSocket, b.ruleRcvbuf, b.ruleBacklog, b.ruleXSK, b.ruleXDPAborted,
		b.ruleBudget, b.ruleNIC, b.ruleNotOffloaded, b.ruleVmaxdpSocket, b.ruleOtherDrops,
	} {
		out = append(out, rule(rep, handled)...)
	}
	slices.SortStableFunc(out, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(severityRank[a.Severity], severityRank[b.Severity]), cmp.Compare(b.Count, a.Count))
	})
	return out
}

// counterTotal sums a counter over every device and namespace, and lists
// where it moved.
func (b *builder) counterTotal(source, name string) (uint64, []string) {
	var sum uint64
	var where []string
	for k, s := range b.counters {
		if k.source == source && k.name == name && s.total > 0 {
			sum += s.total
			where = append(where, fmt.Sprintf("%s %s +%d on %s", source, name, s.total, counterName(CounterDelta{Device: k.device, Netns: k.netns})))
		}
	}
	slices.Sort(where)
	return sum, where
}

func (b *builder) reasonCount(name string) uint64 {
	for k, r := range b.byReason.rows {
		if b.reasonName(k) == name {
			return r.count
		}
	}
	return 0
}

// reasonEvidence is the evidence line of a drop reason: count and where.
func (b *builder) reasonEvidence(name string, n uint64) string {
	return fmt.Sprintf("kfree_skb reason %s: %d drops%s", name, n, b.topLocation(name))
}

// topLocation names where drops of one reason happened most.
func (b *builder) topLocation(name string) string {
	var best uint64
	var loc string
	for addr, r := range b.byLocation.rows {
		for reason, n := range r.reasons {
			if b.reasonName(reason) == name && n > best {
				best, loc = n, b.location(addr)
			}
		}
	}
	if loc == "" {
		return ""
	}
	return " at " + loc
}

// destinations groups the flows dropped for one reason by destination.
func (b *builder) destinations(name string, n int) []string {
	byDst := map[string]uint64{}
	srcs := map[string]map[string]bool{}
	for k, r := range b.byFlow.rows {
		if b.reasonName(k.reason) != name {
			continue
		}
		d := tracefmt.ProtoName(k.proto) + " " + k.dst.String()
		byDst[d] += r.count
		if srcs[d] == nil {
			srcs[d] = map[string]bool{}
		}
		srcs[d][k.src.Addr().String()] = true
	}
	keys := make([]string, 0, len(byDst))
	for k := range byDst {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, c string) int { return cmp.Or(cmp.Compare(byDst[c], byDst[a]), cmp.Compare(a, c)) })
	var out []string
	for _, k := range keys[:min(n, len(keys))] {
		out = append(out, fmt.Sprintf("%s (%d, from %s)", k, byDst[k], strings.Join(slices.Sorted(maps.Keys(srcs[k])), ", ")))
	}
	return out
}

func (b *builder) ruleLost(rep *Report, _ map[string]bool) []Finding {
	var lost, seen uint64
	var ev []string
	for _, p := range rep.Probes {
		lost += p.Lost
		seen += p.Seen
		if p.Lost > 0 {
			ev = append(ev, fmt.Sprintf("%s: %d of %d events lost (%.1f%%)", p.Name, p.Lost, p.Seen, 100*p.LostShare))
		}
	}
	if lost == 0 {
		return nil
	}
	return []Finding{{
		Rule: "events_lost", Severity: "warning", Count: lost,
		Title:       fmt.Sprintf("nettrace lost %d of %d events (%.1f%%): the counts below are lower bounds", lost, seen, 100*float64(lost)/float64(seen)),
		Evidence:    ev,
		Explanation: "The recorder could not keep up: the ring buffer was full when the kernel had events to write. Each loss is counted per probe and CPU, and `nettrace script` marks where it happened.",
		Fix:         "Record with -aggregate (the kernel counts and nothing is lost), a larger -ring-size, or narrower filters (-e, -netns, -dev, -port).",
	}}
}

func (b *builder) ruleNoSocket(rep *Report, handled map[string]bool) []Finding {
	const reason = "NO_SOCKET"
	n := b.reasonCount(reason)
	handled[reason] = true
	if n == 0 {
		return nil
	}
	dsts := b.destinations(reason, 3)
	ev := []string{b.reasonEvidence(reason, n)}
	for _, d := range dsts {
		ev = append(ev, "to "+d)
	}
	_, where := b.counterTotal("snmp", "Udp.NoPorts")
	ev = append(ev, where...)
	title := fmt.Sprintf("%d packets to a port where no socket listens", n)
	fix := "Start the receiver on that port in that namespace (`ss -ulpn` there lists the bound ports), or point the sender at the port that listens."
	if len(dsts) > 0 {
		dst := strings.Fields(dsts[0])
		title = fmt.Sprintf("%d packets to %s %s, where no socket listens", n, dst[0], dst[1])
		fix = fmt.Sprintf("Start the receiver on %s %s (`ss -ulpn` in its namespace lists the bound ports), or point the sender at the port that listens.", dst[0], dst[1])
	}
	return []Finding{{
		Rule: "no_socket", Severity: "error", Count: n, Title: title, Evidence: ev,
		Explanation: "The kernel found no socket bound to the destination port and dropped the packets (UDP answers with ICMP port unreachable, TCP with RST).",
		Fix:         fix,
	}}
}

func (b *builder) ruleRcvbuf(rep *Report, handled map[string]bool) []Finding {
	const reason = "SOCKET_RCVBUFF"
	n := b.reasonCount(reason)
	handled[reason] = true
	if n == 0 && len(b.sockets) == 0 {
		return nil
	}
	var ev []string
	if n > 0 {
		ev = append(ev, b.reasonEvidence(reason, n))
	}
	type sock struct {
		addr uint64
		s    sockInfo
	}
	var socks []sock
	for a, s := range b.sockets {
		socks = append(socks, sock{a, s})
	}
	slices.SortFunc(socks, func(x, y sock) int { return cmp.Or(cmp.Compare(y.s.count, x.s.count), cmp.Compare(x.addr, y.addr)) })
	fix := "Raise the receive buffer of the socket that drops, with setsockopt(SO_RCVBUF) (the kernel caps it at net.core.rmem_max: raise that first with sysctl -w), or read faster (a thread per socket, recvmmsg, or vmaxdp run to bypass the kernel)."
	title := fmt.Sprintf("%d packets dropped because a socket's receive buffer was full", n)
	for i, s := range socks {
		if i == 3 {
			break
		}
		ev = append(ev, fmt.Sprintf("socket %#x bound to %s: %d failed enqueues (rc %d), sk_rcvbuf %d bytes, %d bytes queued", s.addr, s.s.dst, s.s.count, s.s.rc, s.s.rcvbuf, s.s.rmem))
		if i == 0 {
			want := max(4*int64(s.s.rcvbuf), 1<<20)
			title = fmt.Sprintf("%d packets dropped: the socket on udp %s does not drain its receive buffer (SO_RCVBUF %d bytes)", max(n, s.s.count), s.s.dst, s.s.rcvbuf)
			fix = fmt.Sprintf("The application on udp %s reads slower than datagrams arrive. Raise its receive buffer: setsockopt(SO_RCVBUF, %d) or more (capped by net.core.rmem_max: sysctl -w net.core.rmem_max=%d), or read faster (a thread per socket, recvmmsg, or vmaxdp run).", s.s.dst, want, want)
		}
	}
	_, where := b.counterTotal("snmp", "Udp.RcvbufErrors")
	ev = append(ev, where...)
	count := n
	if len(socks) > 0 {
		count = max(n, socks[0].s.count)
	}
	return []Finding{{
		Rule: "socket_rcvbuf", Severity: "error", Count: count, Title: title, Evidence: ev,
		Explanation: "Datagrams arrived faster than the application read them; once the bytes queued on the socket reached SO_RCVBUF, the kernel dropped the rest.",
		Fix:         fix,
	}}
}

func (b *builder) ruleBacklog(rep *Report, handled map[string]bool) []Finding {
	const reason = "CPU_BACKLOG"
	n := b.reasonCount(reason)
	handled[reason] = true
	dropped, where := b.counterTotal("softnet", "dropped")
	if n == 0 && dropped == 0 {
		return nil
	}
	var ev []string
	if n > 0 {
		ev = append(ev, b.reasonEvidence(reason, n))
	}
	ev = append(ev, where...)
	return []Finding{{
		Rule: "cpu_backlog", Severity: "error", Count: max(n, dropped),
		Title:       fmt.Sprintf("%d packets dropped because a CPU's backlog queue was full", max(n, dropped)),
		Evidence:    ev,
		Explanation: "Packets handed to the stack with netif_rx (veth, tunnels, RPS) wait in a per-CPU backlog of net.core.netdev_max_backlog packets; the softirq did not empty it in time.",
		Fix:         "Raise net.core.netdev_max_backlog (sysctl -w net.core.netdev_max_backlog=N, e.g. twice its value), and spread the load over more CPUs with RPS (/sys/class/net/DEV/queues/rx-*/rps_cpus).",
	}}
}

// xskCauses are the errors an XDP redirect to an AF_XDP socket fails with,
// each with the socket statistic that counts the same drops.
var xskCauses = []struct {
	errno                int32
	counter, rule, title string
	explanation, fix     string
	steering             bool // the steering program's counters are evidence too
}{
	{-12, "rx_fill_ring_empty_descs", "xsk_fill_ring_empty", "an AF_XDP queue ran out of fill-ring buffers",
		"The steering program redirected packets to an AF_XDP socket, but the socket's fill ring held no free frame to put them in (the kernel's -ENOMEM): the application held its frames (unread datagrams) or the queue has too few.",
		"Give the queue more RX buffers (VMAXDP_RX_BUFS; xsk.Options.NumFrames in Go) and have the application read its sockets faster, so that frames go back to the fill ring.", true},
	{-105, "rx_ring_full", "xsk_rx_ring_full", "an AF_XDP socket's RX ring was full",
		"The kernel had a frame for the packet but no room on the socket's RX ring: the engine did not drain the ring fast enough.",
		"Poll the queue more often (VMAXDP_RX_POLL, a dedicated polling thread) or give it a larger UMEM (VMAXDP_RX_BUFS), whose size also sets the RX ring's.", false},
}

func (b *builder) ruleXSK(rep *Report, handled map[string]bool) []Finding {
	type agg struct {
		n  uint64
		ev []string
	}
	byErr := map[int32]*agg{}
	for k, n := range b.redirects {
		a := byErr[k.err]
		if a == nil {
			a = &agg{}
			byErr[k.err] = a
			handled[b.reasonName(reasonXDPRedirectErr|uint32(-k.err)&0xffff)] = true
		}
		a.n += n
		a.ev = append(a.ev, fmt.Sprintf("xdp_redirect_err err=%d on %s to map id %d index %d: %d", k.err, b.devLabel(k.dev), k.mapID, k.index, n))
	}
	for _, a := range byErr {
		slices.Sort(a.ev)
	}
	_, redirected := b.counterTotal("vmaxdp", "redirected")
	var out []Finding
	for _, c := range xskCauses {
		total, where := b.counterTotal("xsk", c.counter)
		a := byErr[c.errno]
		if a == nil && total == 0 {
			continue
		}
		var n uint64
		var ev []string
		if a != nil {
			n, ev = a.n, a.ev
			delete(byErr, c.errno)
		}
		ev = append(ev, where...)
		if c.steering {
			ev = append(ev, redirected...)
		}
		out = append(out, Finding{
			Rule: c.rule, Severity: "error", Count: max(n, total),
			Title:    fmt.Sprintf("%d packets dropped: %s", max(n, total), c.title),
			Evidence: ev, Explanation: c.explanation, Fix: c.fix,
		})
	}
	for e, a := range byErr {
		out = append(out, Finding{
			Rule: "xdp_redirect_failed", Severity: "error", Count: a.n,
			Title:       fmt.Sprintf("%d XDP redirects failed with error %d", a.n, e),
			Evidence:    a.ev,
			Explanation: "An XDP program returned XDP_REDIRECT but the target refused the packet, which was dropped.",
			Fix:         "Check that the map entry the program redirects to exists and is bound (bpftool map dump id ID) and that the target interface is up.",
		})
	}
	return out
}

func (b *builder) ruleXDPAborted(rep *Report, handled map[string]bool) []Finding {
	var out []Finding
	for id, n := range b.aborted {
		out = append(out, Finding{
			Rule: "xdp_aborted", Severity: "error", Count: n,
			Title:       fmt.Sprintf("%d packets dropped: XDP program id %d aborted", n, id),
			Evidence:    []string{fmt.Sprintf("xdp_exception from program id %d: %d", id, n)},
			Explanation: "The XDP program returned XDP_ABORTED or an action the driver does not support: a bug in the program, not a load problem.",
			Fix:         fmt.Sprintf("Inspect program %d (bpftool prog show id %d; bpftool prog dump xlated id %d): check its bounds checks and the actions it returns.", id, id, id),
		})
	}
	for k := range b.byReason.rows {
		if k&reasonXDPException != 0 {
			handled[b.reasonName(k)] = true
		}
	}
	return out
}

func (b *builder) ruleBudget(rep *Report, _ map[string]bool) []Finding {
	squeeze, where := b.counterTotal("softnet", "time_squeeze")
	backlogDrops, _ := b.counterTotal("softnet", "dropped")
	var polls, exhausted uint64
	var ev []string
	for _, p := range rep.NAPI.Polls {
		polls += p.Polls
		exhausted += p.Exhausted
		if p.Exhausted > 0 && len(ev) < 4 {
			ev = append(ev, fmt.Sprintf("napi_poll on %s cpu %d: %d of %d polls used the whole budget of %d", p.Device, p.CPU, p.Exhausted, p.Polls, p.Budget))
		}
	}
	if squeeze == 0 && exhausted == 0 {
		return nil
	}
	ev = append(ev, where...)
	var parts []string
	if exhausted > 0 {
		parts = append(parts, fmt.Sprintf("%d NAPI polls used their whole budget (%.1f%% of %d)", exhausted, 100*float64(exhausted)/float64(polls), polls))
	}
	if squeeze > 0 {
		parts = append(parts, fmt.Sprintf("softirq rounds ended with work left %d times (time_squeeze)", squeeze))
	}
	// Squeezes alone are routine on a busy or virtual machine; they matter
	// when queues overflow or most polls run out of budget.
	sev := "info"
	if backlogDrops > 0 || b.reasonCount("CPU_BACKLOG") > 0 || (polls > 0 && exhausted*10 >= polls) {
		sev = "warning"
	}
	return []Finding{{
		Rule: "napi_budget", Severity: sev, Count: max(exhausted, squeeze), Title: strings.Join(parts, "; "), Evidence: ev,
		Explanation: "A poll that uses its whole budget leaves packets for the next round; when a softirq round ends on net.core.netdev_budget or netdev_budget_usecs with work left (time_squeeze), packets wait and queues can overflow.",
		Fix:         "Raise net.core.netdev_budget (and net.core.netdev_budget_usecs), or spread the queues over more CPUs (RSS, RPS, IRQ affinity).",
	}}
}

func (b *builder) ruleNIC(rep *Report, _ map[string]bool) []Finding {
	var out []Finding
	var ev []string
	var n uint64
	for _, name := range []string{"rx_missed_errors", "rx_fifo_errors", "rx_over_errors"} {
		c, where := b.counterTotal("netdev", name)
		n += c
		ev = append(ev, where...)
	}
	for k, s := range b.counters {
		if k.source == "ethtool" && s.total > 0 && (strings.Contains(k.name, "miss") || strings.Contains(k.name, "no_buf") || strings.Contains(k.name, "fifo")) {
			ev = append(ev, fmt.Sprintf("ethtool %s +%d on %s", k.name, s.total, k.device))
		}
	}
	if n > 0 {
		slices.Sort(ev)
		out = append(out, Finding{
			Rule: "nic_ring_overflow", Severity: "error", Count: n,
			Title:       fmt.Sprintf("%d packets dropped by the NIC for lack of RX descriptors", n),
			Evidence:    ev,
			Explanation: "The NIC's receive ring was full: the host did not refill it in time, so the NIC dropped packets before the kernel saw them (no drop event can show these).",
			Fix:         "Raise the RX ring (ethtool -G DEV rx N, up to ethtool -g's maximum), spread interrupts over more CPUs (RSS, IRQ affinity), and see napi_budget findings.",
		})
	}
	// rx_dropped that no kernel event explains.
	explained := map[string]uint64{}
	for k, r := range b.byDevice.rows {
		explained[b.devName(k)] += r.count
	}
	for k, s := range b.counters {
		if k.source == "netdev" && k.name == "rx_dropped" && s.total > explained[k.device] {
			gap := s.total - explained[k.device]
			out = append(out, Finding{
				Rule: "driver_drops", Severity: "warning", Count: gap,
				Title:       fmt.Sprintf("%d packets dropped on %s without a kernel drop event", gap, k.device),
				Evidence:    []string{fmt.Sprintf("netdev rx_dropped +%d on %s; %d drop events on it", s.total, k.device, explained[k.device])},
				Explanation: "The driver or the core dropped these before any traced drop point (an XDP_DROP, a frame without protocol handler, a full queue inside the driver), or the drop events were not recorded (see -e, filters, losses).",
				Fix:         "Record with -e drops,xdp on that device; check ethtool -S DEV for the driver's own counters and any XDP program attached (ip link show DEV).",
			})
		}
	}
	return out
}

// notOffloadedMin: a few passed packets (ARP, a ping) are the steering
// program working as meant, not a finding.
const notOffloadedMin = 10

func (b *builder) ruleNotOffloaded(rep *Report, _ map[string]bool) []Finding {
	var out []Finding
	for k, s := range b.counters {
		if k.source != "vmaxdp" || k.name != "passed" || s.total < notOffloadedMin {
			continue
		}
		dev := k.device
		var redirected uint64
		if r := b.counters[counterKey{"vmaxdp", k.device, "redirected", k.netns}]; r != nil {
			redirected = r.total
		}
		ev := []string{fmt.Sprintf("vmaxdp steering program on %s: passed +%d, redirected +%d", dev, s.total, redirected)}
		type fl struct {
			key string
			n   uint64
		}
		var flows []fl
		for fk, r := range b.rxFlows.rows {
			if fk.dev.netns == k.netns && b.devName(fk.dev) == dev {
				flows = append(flows, fl{flowString(fk.proto, fk.src.String(), fk.dst.String()), r.count})
			}
		}
		slices.SortFunc(flows, func(a, c fl) int { return cmp.Or(cmp.Compare(c.n, a.n), cmp.Compare(a.key, c.key)) })
		for _, f := range flows[:min(3, len(flows))] {
			ev = append(ev, fmt.Sprintf("received by the kernel on %s: %s (%d)", dev, f.key, f.n))
		}
		out = append(out, Finding{
			Rule: "not_offloaded", Severity: "info", Count: s.total,
			Title:       fmt.Sprintf("%d packets on %s went to the kernel, not to vmaxdp (%d offloaded)", s.total, dev, redirected),
			Evidence:    ev,
			Explanation: "vmaxdp's steering program passes every packet no steering rule matches to the kernel: ARP, ICMP, fragments, and flows whose sockets are not offloaded (by a rule, or because the application is not run under vmaxdp).",
			Fix:         "If these flows should be offloaded, open their sockets under vmaxdp (vmaxdp run, or the stack package) with a rule that selects them.",
		})
	}
	return out
}

// ruleVmaxdpSocket reads the counters of the sockets vmaxdp served (its
// processes' counters files): drops in vmaxdp's own receive queues, which
// no kernel event shows, sends that found no transmit frame, and
// transmit stamps its error queues had no room for.
func (b *builder) ruleVmaxdpSocket(rep *Report, _ map[string]bool) []Finding {
	var out []Finding
	last := func(k counterKey, name string) uint64 {
		k.name = name
		if s := b.counters[k]; s != nil {
			return s.prev
		}
		return 0
	}
	for k, s := range b.counters {
		if k.source != "vmaxdp_socket" || s.total == 0 {
			continue
		}
		where := counterName(CounterDelta{Device: k.device, Netns: k.netns})
		switch k.name {
		case "rx_queue_drops":
			out = append(out, Finding{
				Rule: "vmaxdp_socket_queue_full", Severity: "error", Count: s.total,
				Title: fmt.Sprintf("%d datagrams dropped by vmaxdp: the receive queue of %s was full", s.total, where),
				Evidence: []string{
					fmt.Sprintf("vmaxdp_socket rx_queue_drops +%d on %s", s.total, where),
					fmt.Sprintf("its queue held at most %d datagrams, %d payload bytes (rx_queue_packets_max, rx_queue_bytes_max)", last(k, "rx_queue_packets_max"), last(k, "rx_queue_bytes_max")),
				},
				Explanation: "vmaxdp's stack queues each datagram the steering program brought it on the socket it is for, up to a byte limit (twice SO_RCVBUF, as the kernel, and at least VMAXDP_RX_BYTES_MIN); beyond it the datagram is dropped. The application reads slower than datagrams arrive. The kernel never sees these drops: they happen after XDP handed the packet to vmaxdp.",
				Fix:         "Raise the socket's SO_RCVBUF (vmaxdp queues twice it) or VMAXDP_RX_BYTES_MIN, or read faster (a thread per socket, recvmmsg). `vmaxdp stats -v 2` shows the queue while it runs.",
			})
		case "tx_no_bufs":
			out = append(out, Finding{
				Rule: "vmaxdp_tx_no_bufs", Severity: "warning", Count: s.total,
				Title:       fmt.Sprintf("%d sends on %s failed with ENOBUFS: no free AF_XDP transmit frame", s.total, where),
				Evidence:    []string{fmt.Sprintf("vmaxdp_socket tx_no_bufs +%d on %s", s.total, where)},
				Explanation: "Every transmit frame of the AF_XDP queue was on the TX or completion ring: the application sent faster than the interface took the frames back.",
				Fix:         "Give the queue more frames (VMAXDP_RX_BUFS: half the UMEM serves transmit), send in batches (sendmmsg), or retry on ENOBUFS.",
			})
		case "tx_stamp_drops":
			out = append(out, Finding{
				Rule: "vmaxdp_tx_stamp_drops", Severity: "warning", Count: s.total,
				Title:       fmt.Sprintf("%d transmit timestamps dropped by vmaxdp: the error queue of %s was full", s.total, where),
				Evidence:    []string{fmt.Sprintf("vmaxdp_socket tx_stamp_drops +%d on %s", s.total, where)},
				Explanation: "The socket asked for software transmit timestamps (SO_TIMESTAMPING). vmaxdp keeps at most 256 unread in the socket's error queue, as the kernel's receive buffer bounds its own, and drops the next: the application reads its error queue (recvmsg with MSG_ERRQUEUE) slower than it sends. The datagrams themselves were sent.",
				Fix:         "Read the error queue after each send or batch (poll reports POLLERR while a stamp waits), or turn SOF_TIMESTAMPING_TX_SOFTWARE off where the stamps are not read.",
			})
		}
	}
	return out
}

// reasonAdvice explains common kernel drop reasons (include/net/dropreason-core.h).
var reasonAdvice = map[string][2]string{
	"NOT_SPECIFIED":           {"The kernel freed the packet as a drop without saying why; the location says which function.", "Read the code at the location; newer kernels name more reasons."},
	"PKT_TOO_SMALL":           {"The packet was shorter than its headers claim.", "Look for a sender or middlebox that truncates packets."},
	"TCP_CSUM":                {"The TCP checksum was wrong.", "Check checksum offload on the sender (ethtool -k) and the path for corruption."},
	"UDP_CSUM":                {"The UDP checksum was wrong.", "Check checksum offload on the sender (ethtool -k) and the path for corruption."},
	"IP_CSUM":                 {"The IPv4 header checksum was wrong.", "Check the sender and the path for corruption."},
	"NETFILTER_DROP":          {"A netfilter rule (iptables/nftables) dropped the packet.", "List the rules (nft list ruleset; iptables -L -v -n) and find the one whose counter moves."},
	"OTHERHOST":               {"The packet was for another host's MAC address (promiscuous mode or a flooded switch).", "Usually harmless; check the sender's ARP entry if it is unexpected."},
	"IP_RPFILTER":             {"Reverse-path filtering dropped a packet whose source is not reachable through the interface it came in on.", "Fix the routing, or relax net.ipv4.conf.DEV.rp_filter (2 = loose)."},
	"IP_INADDRERRORS":         {"The destination address is not valid here.", "Check the sender's destination address."},
	"IP_NOPROTO":              {"No handler for the IP protocol.", "Load the protocol's module, or find who sends it."},
	"IP_INHDR":                {"The IPv4 header was invalid.", "Look for a faulty sender."},
	"SOCKET_FILTER":           {"A socket filter (SO_ATTACH_FILTER, BPF) rejected the packet.", "Check the application's socket filter."},
	"QDISC_DROP":              {"The transmit queue discipline dropped the packet (queue full).", "Raise txqueuelen (ip link set DEV txqueuelen N) or the qdisc's limit; pace the sender."},
	"TC_INGRESS":              {"A tc ingress filter dropped the packet.", "tc filter show dev DEV ingress."},
	"TC_EGRESS":               {"A tc egress filter dropped the packet.", "tc filter show dev DEV egress."},
	"NEIGH_FAILED":            {"Neighbour (ARP) resolution failed for the next hop.", "Check that the next hop answers ARP (ip neigh show)."},
	"NEIGH_QUEUEFULL":         {"Too many packets waited for ARP resolution.", "Check the next hop; raise net.ipv4.neigh.default.unres_qlen_bytes."},
	"DEV_READY":               {"The device was down or not ready.", "ip link set DEV up; check the carrier."},
	"FULL_RING":               {"A driver or tun/tap ring was full.", "Raise the ring size, or drain it faster."},
	"UNICAST_IN_L2_MULTICAST": {"A unicast IP packet came in an L2 multicast frame.", "Look for a misconfigured sender."},
	"QUEUE_PURGE":             {"A socket was closed (or its queue purged) with packets still queued.", "Usually the application's choice at shutdown; if not, read the socket before closing it."},
	"XDP":                     {"An XDP program dropped the packet (XDP_DROP).", "This is the program's decision; check its rules."},
}

func (b *builder) ruleOtherDrops(rep *Report, handled map[string]bool) []Finding {
	var out []Finding
	for k, r := range b.byReason.rows {
		name := b.reasonName(k)
		if handled[name] {
			continue
		}
		adv, ok := reasonAdvice[name]
		sev := "error"
		switch name {
		case "QUEUE_PURGE", "SOCKET_CLOSE":
			sev = "info" // a socket closed with packets queued: the application's choice
		case "NOT_SPECIFIED":
			sev = "warning"
		}
		if !ok {
			adv = [2]string{"The kernel dropped the packet with reason " + name + " (include/net/dropreason-core.h explains each reason).", "Read the code at the location to see which check failed."}
		}
		ev := []string{b.reasonEvidence(name, r.count)}
		for _, d := range b.destinations(name, 3) {
			ev = append(ev, "to "+d)
		}
		out = append(out, Finding{
			Rule: "drop_reason", Severity: sev, Count: r.count,
			Title:    fmt.Sprintf("%d packets dropped: %s", r.count, name),
			Evidence: ev, Explanation: adv[0], Fix: adv[1],
		})
	}
	return out
}
