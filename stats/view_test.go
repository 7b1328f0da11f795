package stats

import (
	"strings"
	"testing"
	"time"
)

// The basic view prints the guide's example 1 byte for byte for the same
// counters.
func TestViewMatchesVMA(t *testing.T) {
	s := sample()
	s.Sockets[0].Counters.TxOffloadPackets = 140479902
	s.Sockets[0].Counters.TxOffloadBytes = 274502 * 1024
	var b strings.Builder
	WriteView(&b, s, ViewOptions{View: 1})
	want := `fd      ------------ total offloaded -------------   ----- total os ------
               pkt  Kbyte   eagain   error   poll%     pkt   Kbyte   error
14  Rx:  140479898 274374        0       0   100.0       0       0       0
    Tx:  140479902 274502        0       0               0       0       0
`
	if !strings.HasPrefix(b.String(), want) {
		t.Errorf("view 1:\n%s\nwant it to start with the guide's example 1:\n%s", b.String(), want)
	}
	if !strings.Contains(b.String(), "\n15  not offloaded: udp_receiver 0.0.0.0:5001: rule /etc/libvmaxdp.conf:3:") {
		t.Errorf("view 1 does not give fd 15's reason:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "poll() Rx Ready:0/5 [os/offload]\nTimeouts:0 Errors:0 Poll:85.71%") {
		t.Errorf("view 1 lacks the poll() lines:\n%s", b.String())
	}
}

func TestDeltas(t *testing.T) {
	prev, cur := sample(), sample()
	cur.Sockets[0].Counters.RxOffloadPackets += 3000
	cur.Sockets[0].Counters.RxQueueBytesMax = 777 // a gauge: shown as is
	cur.Rules[0].Counters.MatchedPackets += 3000
	d := Deltas(cur, prev, 2*time.Second)
	if c := d.Sockets[0].Counters; c.RxOffloadPackets != 1500 || c.RxOffloadBytes != 0 || c.RxQueueBytesMax != 777 {
		t.Errorf("socket deltas %+v: want 1500 packets/s, 0 bytes/s, max 777", c)
	}
	if d.Rules[0].Counters.MatchedPackets != 1500 {
		t.Errorf("rule deltas %+v", d.Rules[0].Counters)
	}
	if cur.Sockets[0].Counters.RxOffloadPackets != 140479898+3000 {
		t.Error("Deltas changed its input")
	}
	var b strings.Builder
	WriteView(&b, d, ViewOptions{View: 1, Rates: true})
	if !strings.Contains(b.String(), " 14  Rx:      1500 ") {
		t.Errorf("deltas view:\n%s", b.String())
	}
}

// View 4 lists group memberships as the guide's example 4.
func TestViewGroups(t *testing.T) {
	var b strings.Builder
	WriteView(&b, sample(), ViewOptions{View: 4})
	if want := "Group                fd number\n------------------------------\n[224.4.1.3]           14\n"; !strings.Contains(b.String(), want) {
		t.Errorf("view 4:\n%s\nwant\n%s", b.String(), want)
	}
}

// View 4 also lists each SO_REUSEPORT group with the datagrams each of
// its sockets got; view 2 names a socket's group.
func TestViewReusePortGroups(t *testing.T) {
	s := sample()
	s.Sockets = append(s.Sockets,
		Socket{FD: 21, Proto: "udp", State: StateOffloaded, Interface: "vx0", Local: "198.18.0.2:53", ReusePort: true,
			Counters: SocketCounters{RxOffloadPackets: 700}},
		Socket{FD: 20, Proto: "udp", State: StateOffloaded, Interface: "vx0", Local: "198.18.0.2:53", ReusePort: true,
			Counters: SocketCounters{RxOffloadPackets: 650, RxOSPackets: 2}},
		Socket{FD: 22, Proto: "udp", State: StateOffloaded, Interface: "vx0", Local: "198.18.0.2:54", ReusePort: true})
	var b strings.Builder
	WriteView(&b, s, ViewOptions{View: 4})
	want := "[198.18.0.2:53]        20   yes         650 / 2\n" +
		"                       21   yes         700 / 0\n"
	if !strings.Contains(b.String(), want) || strings.Contains(b.String(), ":54") {
		t.Errorf("view 4:\n%s\nwant\n%s", b.String(), want)
	}
	b.Reset()
	WriteView(&b, s, ViewOptions{View: 2})
	if n := strings.Count(b.String(), "- SO_REUSEPORT group = fds [20 21]\n"); n != 2 {
		t.Errorf("view 2 names the group %d times, want 2:\n%s", n, b.String())
	}
}

// The exit report's queue and stack lines: what a queue's AF_XDP socket
// dropped, or why it could not be read; the stack's drops by reason, and
// nothing for a stack that dropped none.
func TestQueueAndStackReports(t *testing.T) {
	var b strings.Builder
	WriteQueueReport(&b, &Queue{Interface: "vmxb", Queue: 1, Statistics: XDPStatistics{RxRingFull: 3, RxDropped: 12, RxFillRingEmptyDescs: 40}})
	WriteQueueReport(&b, &Queue{Interface: "vmxb", Queue: 2, StatisticsError: "xsk vmxb/q2: XDP_STATISTICS: bad file descriptor"})
	WriteStackReport(&b, &Program{Interface: "vmxa"})
	WriteStackReport(&b, &Program{Interface: "vmxb", Stack: StackCounters{RxDropped: []Drop{{"bad_udp_checksum", 3}, {"truncated", 1}}}})
	want := `vmaxdp: [vmxb/q1] Rx ring: 3 / 12 / 40 [rx_ring_full/rx_dropped/rx_fill_ring_empty_descs]
vmaxdp: [vmxb/q2] Rx ring: xsk vmxb/q2: XDP_STATISTICS: bad file descriptor
vmaxdp: [vmxb] Rx dropped: bad_udp_checksum 3 truncated 1
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

// A socket closed before its bind or first send has no reason: its
// lines end with what it is, not with ": ".
func TestNotOffloadedWithoutReason(t *testing.T) {
	s := &Socket{FD: 4, State: StateCandidate}
	var b strings.Builder
	WriteCloseReport(&b, s)
	if want := "vmaxdp: [fd=4] not offloaded yet (not bound, nothing sent)\n"; b.String() != want {
		t.Errorf("close report %q, want %q", b.String(), want)
	}
	b.Reset()
	WriteView(&b, &Snapshot{Sockets: []Socket{*s}}, ViewOptions{View: 3})
	if !strings.Contains(b.String(), "- Not offloaded yet (not bound, nothing sent)\n") {
		t.Errorf("view 3:\n%s\nwant the socket's line without a reason", b.String())
	}
}
