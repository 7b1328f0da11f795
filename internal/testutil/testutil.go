// Package testutil holds the helpers privileged tests share: skipping with
// a reason when not root or when a kernel feature is missing, and a test bed
// per test that is removed even when the test fails.
package testutil

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// RequireRoot skips the test when the process is not root.
func RequireRoot(tb testing.TB) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root (network namespaces, XDP, AF_XDP): run `sudo make test`")
	}
}

// SkipIfNotSupported skips on a missing kernel feature and fails on any
// other error, so that a broken feature is never mistaken for an absent one.
func SkipIfNotSupported(tb testing.TB, err error) {
	tb.Helper()
	if errors.Is(err, backend.ErrNotSupported) || errors.Is(err, probes.ErrNotSupported) {
		tb.Skipf("kernel feature missing: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
}

var beds atomic.Int32

// Bed brings up a fresh test bed removed by tb.Cleanup.
func Bed(tb testing.TB, opts *testbed.Options) *testbed.Bed {
	tb.Helper()
	RequireRoot(tb)
	b, err := testbed.Up(testbed.TestName(int(beds.Add(1))), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := b.Down(); err != nil {
			tb.Errorf("remove test bed: %v", err)
		}
	})
	return b
}

// Main runs the tests after removing beds left by killed runs, and fails
// the run when the tests themselves leave a bed behind.
func Main(m *testing.M) int {
	if os.Geteuid() != 0 {
		return m.Run()
	}
	testbed.RemoveStale()
	code := m.Run()
	own := strings.TrimSuffix(testbed.TestName(0), "0")
	left, _ := testbed.List()
	for _, n := range left {
		if strings.HasPrefix(n, own) {
			fmt.Fprintf(os.Stderr, "test bed %s left behind by a test; removing it\n", n)
			testbed.Down(n)
			code = 1
		}
	}
	return code
}

// SendUDP sends n datagrams of size bytes from side A of b to B's address
// and port, 0.5 ms apart. The socket is unconnected, so that an ICMP port
// unreachable does not fail the next send.
func SendUDP(b *testbed.Bed, port, n, size int) error {
	return b.Do(testbed.A, func() error {
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(testbed.B), uint16(port)))
		msg := make([]byte, size)
		for range n {
			if _, err := c.WriteToUDP(msg, to); err != nil {
				return fmt.Errorf("send to %s: %w", to, err)
			}
			time.Sleep(500 * time.Microsecond)
		}
		return nil
	})
}

// ListenUDP is a kernel UDP socket on side s's address and port, closed
// with the test.
func ListenUDP(tb testing.TB, b *testbed.Bed, s testbed.Side, port int) *net.UDPConn {
	tb.Helper()
	var c *net.UDPConn
	if err := b.Do(s, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(s), uint16(port))))
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// ARPRetrans sets how long side s of b waits between its ARP requests
// (retrans_time_ms on its link; a second by default), so that the kernel
// gives up on a neighbour nobody holds after three times that.
func ARPRetrans(tb testing.TB, b *testbed.Bed, s testbed.Side, d time.Duration) {
	tb.Helper()
	arp := fmt.Sprintf("net.ipv4.neigh.%s.retrans_time_ms=%d", b.Link(s), d.Milliseconds())
	if out, err := exec.Command("ip", "netns", "exec", b.NSName(s), "sysctl", "-qw", arp).CombinedOutput(); err != nil {
		tb.Fatalf("sysctl %s: %v: %s", arp, err, out)
	}
}

// Resolve makes side from of b know the other side's link address (ARP)
// before a test's burst: the kernel queues only some 92 datagrams of 1400
// bytes (unres_qlen_bytes) for a next hop it is still resolving and drops
// the rest in its neighbour table, where a busy machine's slow reply made
// a burst lose 508 of 600 before they left A. vmaxdp's sends to such a
// next hop go through the kernel socket, and that queue, too.
func Resolve(b *testbed.Bed, from testbed.Side) error {
	to := testbed.B
	if from == testbed.B {
		to = testbed.A
	}
	return b.Do(from, func() error {
		dst := b.Addr(to).AsSlice()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			neighs, err := netlink.NeighList(0, unix.AF_INET)
			if err != nil {
				return fmt.Errorf("neighbours: %w", err)
			}
			for _, n := range neighs {
				if n.IP.Equal(dst) && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE|netlink.NUD_PERMANENT) != 0 {
					return nil
				}
			}
			// A datagram to the discard port makes the kernel resolve it.
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(to), 9)))
			if err != nil {
				return err
			}
			c.Write([]byte{0})
			c.Close()
		}
		return fmt.Errorf("%s: not resolved in 5 s", b.Addr(to))
	})
}

// AwaitStats reads the counters file r until ok accepts a snapshot (a
// process publishes every 100 ms), for at most timeout.
func AwaitStats(r *stats.Reader, timeout time.Duration, ok func(*stats.Snapshot) bool) (*stats.Snapshot, error) {
	var s stats.Snapshot
	deadline := time.Now().Add(timeout)
	for {
		err := r.Read(&s)
		if err == nil && ok(&s) {
			return &s, nil
		}
		if time.Now().After(deadline) {
			return &s, fmt.Errorf("%s: not published within %v (last read: %v, sockets %+v)", r.Path, timeout, err, s.Sockets)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// EachBed runs fn in a subtest per kind of test bed, each with opts'
// other settings: "tuned" (testbed's defaults: the queues asked, TX
// checksum offload and IPv6 off) and "plain" (made as `ip link add` makes
// it, testbed.Options.Plain: the kernel's default queues, every offload
// on, IPv6 on), which is what users have.
func EachBed(t *testing.T, opts *testbed.Options, fn func(t *testing.T, b *testbed.Bed)) {
	t.Helper()
	eachBed(t, opts, false, fn)
}

// EachBedParallel is EachBed with the beds' subtests run at the same time:
// for tests that spend most of their time waiting (sockperf sleeps 2 s
// between its warm-up and its measurement), each bed's namespaces keeping
// their counters apart. Not for a test that counts every datagram at a
// rate: one bed's setup and teardown (the kernel's namespace cleanup)
// starve the other's receiver.
func EachBedParallel(t *testing.T, opts *testbed.Options, fn func(t *testing.T, b *testbed.Bed)) {
	t.Helper()
	eachBed(t, opts, true, fn)
}

func eachBed(t *testing.T, opts *testbed.Options, parallel bool, fn func(t *testing.T, b *testbed.Bed)) {
	t.Helper()
	var o testbed.Options
	if opts != nil {
		o = *opts
	}
	for _, plain := range []bool{false, true} {
		name := "tuned"
		if plain {
			name = "plain"
		}
		t.Run(name, func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			bo := o
			if bo.Plain = plain; plain {
				bo.Queues = 0
			}
			fn(t, Bed(t, &bo))
		})
	}
}

// XDPProgram is the id of the XDP program attached to side s's link of
// b; 0 when none is.
func XDPProgram(tb testing.TB, b *testbed.Bed, s testbed.Side) uint32 {
	tb.Helper()
	if x := linkAttrs(tb, b, s).Xdp; x != nil && x.Attached {
		return x.ProgId
	}
	return 0
}

// Ifindex is the index of side s's link of b in its namespace.
func Ifindex(tb testing.TB, b *testbed.Bed, s testbed.Side) int {
	tb.Helper()
	return linkAttrs(tb, b, s).Index
}

// linkAttrs are side s's link's attributes, read in its namespace.
func linkAttrs(tb testing.TB, b *testbed.Bed, s testbed.Side) netlink.LinkAttrs {
	tb.Helper()
	var attrs netlink.LinkAttrs
	err := b.Do(s, func() error {
		l, err := netlink.LinkByName(b.Link(s))
		if err != nil {
			return err
		}
		attrs = *l.Attrs()
		return nil
	})
	if err != nil {
		tb.Fatalf("link %s: %v", b.Link(s), err)
	}
	return attrs
}

// UDPStat reads a Udp counter of /proc/net/snmp in side s's namespace
// ("InDatagrams": what the kernel delivered to its sockets there).
func UDPStat(tb testing.TB, b *testbed.Bed, s testbed.Side, name string) int {
	tb.Helper()
	return SNMPStat(tb, b, s, "Udp", name)
}

// NetCounters reads every counter of /proc/net/snmp and /proc/net/netstat
// in side s's namespace, by "Proto.Name" ("Tcp.OutRsts", "TcpExt.TW").
func NetCounters(tb testing.TB, b *testbed.Bed, s testbed.Side) map[string]int64 {
	tb.Helper()
	m := map[string]int64{}
	err := b.Do(s, func() error {
		for _, file := range []string{"snmp", "netstat"} {
			data, err := os.ReadFile("/proc/thread-self/net/" + file)
			if err != nil {
				return err
			}
			heads := map[string][]string{}
			for _, line := range strings.Split(string(data), "\n") {
				f := strings.Fields(line)
				if len(f) == 0 {
					continue
				}
				proto := strings.TrimSuffix(f[0], ":")
				head, ok := heads[proto]
				if !ok {
					heads[proto] = f[1:]
					continue
				}
				for i, h := range head {
					if i+1 < len(f) {
						n, _ := strconv.ParseInt(f[i+1], 10, 64)
						m[proto+"."+h] = n
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

// CountersMoved lists the counters of prefix ("Tcp") that moved from
// before to after, as "Tcp.OutRsts +2", in name order.
func CountersMoved(before, after map[string]int64, prefix string) string {
	var moved []string
	for k, v := range after {
		if strings.HasPrefix(k, prefix) && v != before[k] {
			moved = append(moved, fmt.Sprintf("%s %+d", k, v-before[k]))
		}
	}
	slices.Sort(moved)
	return strings.Join(moved, ", ")
}

// SNMPStat reads counter name of protocol proto ("Tcp", "Udp", "Ip") of
// /proc/net/snmp in side s's namespace.
func SNMPStat(tb testing.TB, b *testbed.Bed, s testbed.Side, proto, name string) int {
	tb.Helper()
	var n int
	err := b.Do(s, func() error {
		data, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		var head []string
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 || f[0] != proto+":" {
				continue
			}
			if head == nil {
				head = f
				continue
			}
			for i, h := range head {
				if h == name && i < len(f) {
					n, err = strconv.Atoi(f[i])
					return err
				}
			}
		}
		return fmt.Errorf("no %s %s in snmp", proto, name)
	})
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
