package engine

import (
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// TestCounterNames: the published structs name their counters as the
// atomic ones they copy, in the same order (loadCounters copies by index).
func fieldNames(ts ...reflect.Type) []string {
	var n []string
	for _, t := range ts {
		for i := range t.NumField() {
			n = append(n, t.Field(i).Name)
		}
	}
	return n
}

func TestCounterNames(t *testing.T) {
	// stats.TCPCounters: the link's counters, then netstack's.
	if a, b := fieldNames(reflect.TypeFor[stack.TCPCounters](), reflect.TypeFor[stack.NetstackCounters]()), fieldNames(reflect.TypeFor[stats.TCPCounters]()); !slices.Equal(a, b) {
		t.Errorf("stack.TCPCounters and stack.NetstackCounters: %v; stats.TCPCounters: %v", a, b)
	}
	for _, pair := range [][2]any{
		{stack.SocketCounters{}, stats.SocketCounters{}},
		{xsk.Counters{}, stats.QueueCounters{}},
		{muxCounters{}, stats.Iomux{}},
	} {
		a, b := reflect.TypeOf(pair[0]), reflect.TypeOf(pair[1])
		if a.NumField() != b.NumField() {
			t.Errorf("%s has %d fields, %s %d", a, a.NumField(), b, b.NumField())
			continue
		}
		for i := range a.NumField() {
			if a.Field(i).Name != b.Field(i).Name {
				t.Errorf("field %d: %s.%s vs %s.%s", i, a, a.Field(i).Name, b, b.Field(i).Name)
			}
		}
	}
}

// readUntil reads the engine's stats file until ok accepts a snapshot.
func readUntil(t *testing.T, r *stats.Reader, what string, ok func(*stats.Snapshot) bool) *stats.Snapshot {
	t.Helper()
	s, err := testutil.AwaitStats(r, 3*time.Second, ok)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return s
}

func TestStatsPublished(t *testing.T) {
	bed, e, fd := offloaded(t, 9407, false)
	r, err := stats.Open(e.pub.w.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const n = 7
	if err := testutil.SendUDP(bed, 9407, n, 100); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	pfds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if k, errno := e.Poll(MuxSelect, pfds, time.Second, nil, nil); k != 1 || errno != 0 {
		t.Fatalf("select: %d ready, errno %v", k, errno)
	}
	for i := range n {
		if _, _, _, errno := e.Recv(fd, buf, 0, time.Time{}, nil, nil); errno != 0 {
			t.Fatalf("datagram %d: %v", i, errno)
		}
	}
	sock := func(s *stats.Snapshot) *stats.Socket {
		for i := range s.Sockets {
			if s.Sockets[i].FD == fd {
				return &s.Sockets[i]
			}
		}
		return nil
	}
	s := readUntil(t, r, "7 datagrams", func(s *stats.Snapshot) bool {
		sk := sock(s)
		return sk != nil && sk.Counters.RxOffloadPackets == n
	})
	sk := sock(s)
	if !sk.Offloaded() || sk.Counters.RxOffloadBytes != n*100 || sk.Interface == "" || len(sk.Rules) != 1 {
		t.Errorf("socket %+v: want offloaded, %d bytes, one rule", sk, n*100)
	}
	if m := s.Process.Select; m.Calls != 1 || m.RxReadyOffload != 1 || m.PollHit+m.PollMiss != 1 || s.Process.Poll.Calls != 0 {
		t.Errorf("select counters %+v, poll %+v: want one call, one offloaded socket ready", m, s.Process.Poll)
	}
	if s.Process.PID != os.Getpid() || s.Process.Program != "engine.test" {
		t.Errorf("process %+v", s.Process)
	}
	var matched uint64
	for _, rl := range s.Rules {
		if rl.FD == fd && rl.ID == sk.Rules[0] {
			matched = rl.Counters.MatchedPackets
		}
	}
	if matched != n {
		t.Errorf("the socket's rule matched %d packets, want %d (rules %+v)", matched, n, s.Rules)
	}
	if len(s.Queues) == 0 || s.Queues[0].Counters.RxPackets < n || s.Queues[0].RxPoolSize == 0 {
		t.Errorf("queues %+v: want the datagrams counted and the pools sized", s.Queues)
	}

	if err := r.Zero(2 * time.Second); err != nil {
		t.Fatal(err)
	}
	readUntil(t, r, "zeroed counters", func(s *stats.Snapshot) bool {
		sk := sock(s)
		return sk != nil && sk.Counters.RxOffloadPackets == 0 && s.Rules[0].Counters.MatchedPackets == 0
	})

	// At close, VMAXDP_STATS_FILE gets the socket's report.
	if err := testutil.SendUDP(bed, 9407, 1, 100); err != nil {
		t.Fatal(err)
	}
	if _, _, _, errno := e.Recv(fd, buf, 0, time.Time{}, nil, nil); errno != 0 {
		t.Fatal(errno)
	}
	e.Close(fd)
	b, err := os.ReadFile(e.p.StatsFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("vmaxdp: [fd=%d]", fd) + " Rx Offload: 0 KB / 1 / 0 [bytes/packets/errors]"; !strings.Contains(string(b), want) {
		t.Errorf("%s:\n%s\nwant a line %q", e.p.StatsFile, b, want)
	}
	path := e.pub.w.Path()
	e.Shutdown()
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("stats file %s after Shutdown: %v, want it removed", path, err)
	}
}

// TestStatsIPv6OnlyLocal: an AF_INET6 socket of IPv6 only, which the
// kernel serves, shows its address in the stats (it read "invalid
// AddrPort": the IPv4 view of its name has none).
func TestStatsIPv6OnlyLocal(t *testing.T) {
	bed, e := newEngine(t)
	var fd int
	err := bed.Do(testbed.B, func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
			return err
		}
		e.Socket(fd, false)
		if err := unix.Bind(fd, &unix.SockaddrInet6{Port: 9412}); err != nil {
			return err
		}
		e.Bind(fd)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.Close(fd)
		unix.Close(fd)
	})
	if st := settled(e, fd); st != StateKernel {
		t.Fatalf("state %d, want the kernel's", st)
	}
	var rec stats.Socket
	e.socketRecord(e.get(fd), &rec)
	if rec.Local != "[::]:9412" {
		t.Errorf("local %q, want [::]:9412 (reason %q)", rec.Local, rec.Reason)
	}
}

// TestPublisherRuleNames: a rule's published name is its own, formatted
// once while the publishes see it, and forgotten once one does not: an id
// reused for another rule gets that rule's name.
func TestPublisherRuleNames(t *testing.T) {
	pub := &publisher{ruleNames: map[steer.Rule]*ruleName{}}
	a := steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_TCP,
		Local: netip.MustParseAddrPort("198.18.0.2:80"), Remote: netip.MustParseAddrPort("198.18.0.1:40000")}
	b := a
	b.Remote = netip.MustParseAddrPort("198.18.0.1:40001")
	pub.gen++
	if got := pub.ruleName(a); got != a.String() {
		t.Errorf("name %q, want %q", got, a.String())
	}
	if got := pub.ruleName(b); got != b.String() {
		t.Errorf("name %q, want %q", got, b.String())
	}
	pub.forgetRules()
	pub.gen++
	pub.ruleName(b)
	pub.forgetRules()
	if _, kept := pub.ruleNames[a]; kept || len(pub.ruleNames) != 1 {
		t.Errorf("after a publish without %v the names are %v, want %v's alone", a, pub.ruleNames, b)
	}
	if n := testing.AllocsPerRun(100, func() { pub.ruleName(b) }); n != 0 {
		t.Errorf("a known rule's name: %.0f allocations, want 0", n)
	}
}
