package stack_test

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// setSourceConf writes rp_filter and accept_local, in all and on side B's
// link.
func setSourceConf(t testing.TB, bed *testbed.Bed, rp, acceptLocal string) {
	t.Helper()
	err := bed.Do(testbed.B, func() error {
		for _, k := range []string{"all", bed.Link(testbed.B)} {
			for name, v := range map[string]string{"rp_filter": rp, "accept_local": acceptLocal} {
				if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+k+"/"+name, []byte(v), 0); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFIBCopyMatchesKernel: the stack's copy of the routes gives the
// kernel's own verdict (an input route lookup) on every source, in strict
// and loose mode, with accept_local off and on, against routes of every
// kind: connected through side B's link or another one (a veth), via a
// gateway, blackhole, unreachable, prohibit, two metrics for one prefix,
// a longer prefix inside another, multipath over both links, a throw to
// the default table, an address of lo, none, and then a default route. A
// rule of its own makes the copy step aside (ErrFIBCustom), and it is
// taken again once the rule is gone.
func TestFIBCopyMatchesKernel(t *testing.T) {
	bed := testutil.Bed(t, &testbed.Options{Plain: true})
	_, st := stackOn(t, bed, nil)
	b := testbed.B
	gw := bed.Addr(testbed.A).String()
	// A second link of side B's (the kernel here has no dummy links).
	mustRun(t, bed, b, "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
	mustRun(t, bed, b, "ip", "link", "set", "d0", "up")
	mustRun(t, bed, b, "ip", "link", "set", "d1", "up")
	for _, args := range [][]string{
		{"addr", "add", "198.19.20.1/24", "dev", "d0"},
		{"addr", "add", "198.18.7.7/32", "dev", "lo"},
		{"route", "add", "198.19.30.0/24", "via", gw},
		{"route", "add", "blackhole", "198.19.40.0/24"},
		{"route", "add", "unreachable", "198.19.50.0/24"},
		{"route", "add", "prohibit", "198.19.60.0/24"},
		{"route", "add", "198.19.70.0/24", "dev", "d0", "metric", "5"},
		{"route", "add", "198.19.70.0/24", "via", gw, "metric", "10"},
		{"route", "add", "198.19.71.0/24", "via", gw, "metric", "5"},
		{"route", "add", "198.19.71.0/24", "dev", "d0", "metric", "10"},
		{"route", "add", "198.19.80.0/24", "dev", "d0"},
		{"route", "add", "198.19.80.128/25", "via", gw},
		{"route", "add", "198.19.90.0/24", "nexthop", "via", gw, "nexthop", "dev", "d0"},
		{"route", "add", "throw", "198.19.100.0/24"},
		{"route", "add", "198.19.100.0/24", "via", gw, "table", "default"},
		{"route", "add", "throw", "198.19.110.0/24"},
	} {
		mustRun(t, bed, b, append([]string{"ip"}, args...)...)
	}
	sources := []string{"198.18.0.1", "198.18.0.2", "198.18.7.7", "198.19.20.5", "198.19.30.5", "198.19.40.5", "198.19.50.5",
		"198.19.60.5", "198.19.70.5", "198.19.71.5", "198.19.80.5", "198.19.80.200", "198.19.90.5", "198.19.100.5",
		"198.19.110.5", "198.19.120.5"}
	dst := bed.Addr(b)
	compare := func(phase string) {
		t.Helper()
		accepted, all := 0, 0
		defer func() { t.Logf("%s: the kernel took %d of %d", phase, accepted, all) }()
		for _, conf := range [][2]string{{"1", "0"}, {"2", "0"}, {"1", "1"}, {"2", "1"}} {
			setSourceConf(t, bed, conf[0], conf[1])
			for _, s := range sources {
				all++
				copied, kernel, err := stack.SourceVerdicts(st, netip.MustParseAddr(s), dst)
				if err != nil {
					t.Fatalf("%s, rp_filter %s, accept_local %s, source %s: %v", phase, conf[0], conf[1], s, err)
				}
				if kernel {
					accepted++
				}
				if copied != kernel {
					t.Errorf("%s, rp_filter %s, accept_local %s, source %s: the copy says %v, the kernel %v", phase, conf[0], conf[1], s, copied, kernel)
				}
			}
		}
	}
	compare("no default route")
	mustRun(t, bed, b, "ip", "route", "add", "default", "via", gw)
	compare("default route through B's link")
	mustRun(t, bed, b, "ip", "route", "replace", "default", "dev", "d0")
	compare("default route through the other link")

	mustRun(t, bed, b, "ip", "rule", "add", "from", "198.19.0.0/16", "lookup", "100")
	if _, _, err := stack.SourceVerdicts(st, netip.MustParseAddr("198.19.30.5"), dst); !errors.Is(err, stack.ErrFIBCustom) {
		t.Errorf("with a rule of its own: %v, want ErrFIBCustom", err)
	}
	waitFIB(t, st, false)
	mustRun(t, bed, b, "ip", "rule", "del", "from", "198.19.0.0/16", "lookup", "100")
	waitFIB(t, st, true)
}

// waitFIB waits for the watcher to take the copy of the routes (or give
// it up).
func waitFIB(t testing.TB, st *stack.Stack, followed bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); stack.FIBFollowed(st) != followed; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the copy of the routes followed: %v after 5 s, want %v", stack.FIBFollowed(st), followed)
		}
	}
}

// TestSourceChecksManySources: with rp_filter 1, datagrams from 3,000
// sources, each new, all with a route back through side B's link, sent
// within a second, all reach the socket, as the kernel takes them; a
// source whose route is added while the stack runs is refused before and
// taken after. Before, each new source cost a netlink lookup, at most
// 2,000 a second, and those past the cap were dropped
// (RxSourceUnchecked).
func TestSourceChecksManySources(t *testing.T) {
	bed := testutil.Bed(t, &testbed.Options{Plain: true})
	setSourceConf(t, bed, "1", "0")
	gw := bed.Addr(testbed.A).String()
	mustRun(t, bed, testbed.B, "ip", "route", "add", "198.19.128.0/17", "via", gw)
	_, st := stackOn(t, bed, nil)
	waitFIB(t, st, true)
	_, c := adoptOnB(t, bed, st, 9730)
	const n = 3000
	sends := make([]rawSend, n)
	for i := range sends {
		src := netip.AddrFrom4([4]byte{198, 19, 128 + byte(i>>8), byte(i)})
		sends[i] = rawSend{netip.AddrPortFrom(src, 5555).String(), fmt.Sprint(i)}
	}
	buf := make([]byte, 64)
	start := time.Now()
	// In bursts the RX ring holds, read before the next.
	for burst := 0; burst < n; burst += 1000 {
		sendRawUDP(t, bed, 9730, sends[burst:burst+1000]...)
		for i := burst; i < burst+1000; i++ {
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				t.Fatalf("datagram %d of %d: %v (sources rejected %d, unchecked %d)", i, n, err,
					st.Counters.RxSourceRejected.Load(), st.Counters.RxSourceUnchecked.Load())
			}
		}
	}
	if took := time.Since(start); took > time.Second {
		t.Logf("the %d sources took %v, more than the second the cap counts in", n, took)
	}
	if r, u := st.Counters.RxSourceRejected.Load(), st.Counters.RxSourceUnchecked.Load(); r != 0 || u != 0 {
		t.Errorf("sources rejected %d, unchecked %d; want 0 and 0", r, u)
	}

	late := rawSend{"198.19.30.5:5555", "late"}
	sendRawUDP(t, bed, 9730, late)
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if m, from, err := c.ReadFromUDPAddrPort(buf); err == nil {
		t.Fatalf("a source with no route back came through: %q from %v", buf[:m], from)
	}
	mustRun(t, bed, testbed.B, "ip", "route", "add", "198.19.30.0/24", "via", gw)
	for deadline := time.Now().Add(5 * time.Second); ; {
		sendRawUDP(t, bed, 9730, late)
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if m, _, err := c.ReadFromUDPAddrPort(buf); err == nil && string(buf[:m]) == "late" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the source was still refused 5 s after its route was added")
		}
	}
}

// BenchmarkSourceVerdict is the cost of one new source's verdict with
// rp_filter 1: from the copy of the routes (a dozen of them), and from the
// kernel (an input route lookup on the stack's netlink socket), as taken
// under the receive lock before the copy.
func BenchmarkSourceVerdict(b *testing.B) {
	bed := testutil.Bed(b, &testbed.Options{Plain: true})
	setSourceConf(b, bed, "1", "0")
	gw := bed.Addr(testbed.A).String()
	for i := range 10 {
		mustRun(b, bed, testbed.B, "ip", "route", "add", fmt.Sprintf("198.19.%d.0/24", 10*i), "via", gw)
	}
	_, st := stackOn(b, bed, nil)
	waitFIB(b, st, true)
	src, dst := netip.MustParseAddr("198.19.50.5"), bed.Addr(testbed.B)
	for _, kernel := range []bool{false, true} {
		name := "copy"
		if kernel {
			name = "kernel"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ok, decided := stack.SourceVerdict(st, src, dst, kernel); !ok || !decided {
					b.Fatalf("%s: ok %v, decided %v", name, ok, decided)
				}
			}
		})
	}
}
