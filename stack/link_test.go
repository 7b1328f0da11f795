package stack_test

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// run runs a command (ip, ethtool) in side s's namespace.
func run(t testing.TB, b *testbed.Bed, s testbed.Side, args ...string) error {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", b.NSName(s)}, args...)...).CombinedOutput()
	if err != nil {
		return errors.New(strings.TrimSpace(string(out)))
	}
	return nil
}

func mustRun(t testing.TB, b *testbed.Bed, s testbed.Side, args ...string) {
	t.Helper()
	if err := run(t, b, s, args...); err != nil {
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
}

// eventually polls cond every 10 ms for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 5 s: %s", what)
		}
	}
}

// echo sends msg from a kernel socket on side A to c and reads it there.
func echo(t *testing.T, a *net.UDPConn, c *stack.UDPConn, msg string) {
	t.Helper()
	if _, err := a.WriteToUDPAddrPort([]byte(msg), netip.AddrPortFrom(c.Stack().Addr(), c.LocalAddrPort().Port())); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 9000)
	n, _, err := c.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != msg {
		t.Fatalf("read %q, %v; want %q", buf[:n], err, msg)
	}
}

// TestQueuesAsRunning: a veth made as `ip link add` makes it allocates
// more RX queues than it runs; the stack serves the running ones (ethtool
// -l), and a queue asked for that does not run is named with the reason
// while the others serve. Before, every socket stayed on the kernel with
// "xsk vmxb/q1: bind: invalid argument".
func TestQueuesAsRunning(t *testing.T) {
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, nil)
	if n := len(st.Backends()); n != bed.Queues {
		t.Errorf("the stack serves %d queues; the interface runs %d", n, bed.Queues)
	}
	if u := st.UnservedQueues(); len(u) != 0 {
		t.Errorf("unserved queues: %v", u)
	}
	bed2, st2 := bedStackOn(t, &testbed.Options{Plain: true}, &stack.Options{Queues: []int{0, 1}})
	u := st2.UnservedQueues()
	if len(u) != 1 || u[0].Queue != 1 || !strings.Contains(u[0].Error(), "runs 1 RX queues (ethtool -l vmxb)") {
		t.Errorf("unserved queues: %v; want queue 1, not running", u)
	}
	c, err := st2.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9100"))
	if err != nil {
		t.Fatal(err)
	}
	echo(t, kernelConn(t, bed2, "198.18.0.1:0"), c, "on the running queue")
	if c.Counters.RxOffloadPackets.Load() != 1 {
		t.Errorf("offloaded %d datagrams, want 1", c.Counters.RxOffloadPackets.Load())
	}
}

// TestChannelsGrow: more RX queues set with ethtool -L while the stack
// runs are served without a restart, receive-only where no TX queue of
// that number runs; the kernel refuses to take a served queue away.
func TestChannelsGrow(t *testing.T) {
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, nil)
	mustRun(t, bed, testbed.B, "ethtool", "-L", bed.Link(testbed.B), "rx", "2")
	eventually(t, "the stack serves the second queue", func() bool { return len(st.Backends()) == 2 })
	if q1 := st.Backends()[1].(*xsk.Socket); q1.Queue() != 1 || !q1.RxOnly() {
		t.Errorf("second queue %s: receive-only %v; want queue 1, receive-only (one TX queue runs)", q1, q1.RxOnly())
	}
	if err := run(t, bed, testbed.B, "ethtool", "-L", bed.Link(testbed.B), "rx", "1"); err == nil {
		t.Errorf("the kernel let a served queue go; the stack must follow that too")
	} else {
		t.Logf("ethtool -L rx 1 while served: %v", err)
	}
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9101"))
	if err != nil {
		t.Fatal(err)
	}
	echo(t, kernelConn(t, bed, "198.18.0.1:0"), c, "two queues")
}

// TestTxSoftSum: on a plain bed the stack has the kernel finish the UDP
// checksum of a large datagram (TX metadata; a packet socket on the
// peer's link sees the pseudo-header sum), and sums a small one itself
// (it crosses complete); the kernel receiver takes both without a
// checksum error.
func TestTxSoftSum(t *testing.T) {
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, nil)
	if !st.Backends()[0].TxChecksum() {
		t.Skip("the kernel takes no AF_XDP TX metadata (Linux 6.11+): every checksum is summed in the stack")
	}
	var pkt *os.File
	if err := bed.Do(testbed.A, func() (err error) {
		pkt, err = rawSocket(bed.Link(testbed.A), unix.ETH_P_IP)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pkt.Close()
	a := kernelConn(t, bed, "198.18.0.1:9103")
	resolved(t, bed)
	c, err := st.DialUDP(netip.AddrPort{}, netip.MustParseAddrPort("198.18.0.1:9103"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	csumErrs := testutil.UDPStat(t, bed, testbed.A, "InCsumErrors")
	buf := make([]byte, 2048)
	for _, tc := range []struct {
		size int
		want header.Result
	}{{64, header.Ok}, {256, header.Ok}, {257, header.PartialUDPChecksum}, {1400, header.PartialUDPChecksum}} {
		p := payload(tc.size, tc.size)
		if _, err := c.Write(p); err != nil {
			t.Fatal(err)
		}
		a.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := a.Read(buf); err != nil || string(buf[:n]) != string(p) {
			t.Fatalf("%d bytes: the kernel receiver got %d, %v", tc.size, n, err)
		}
		pkt.SetReadDeadline(time.Now().Add(2 * time.Second))
		for {
			n, err := pkt.Read(buf)
			if err != nil {
				t.Fatalf("%d bytes: the packet socket saw no frame of it: %v", tc.size, err)
			}
			var pp header.Packet
			r := header.Parse(buf[:n], &pp)
			if r == header.NotUDP || pp.UDP == nil || pp.UDP.DstPort() != 9103 {
				continue
			}
			if r != tc.want {
				t.Errorf("%d bytes crossed as %s, want %s", tc.size, r, tc.want)
			}
			break
		}
	}
	if d := testutil.UDPStat(t, bed, testbed.A, "InCsumErrors") - csumErrs; d != 0 {
		t.Errorf("the kernel receiver counted %d checksum errors", d)
	}
}

// TestPartialChecksum: on a veth with TX checksum offload on (a plain
// bed, and every container network), the kernel's UDP arrives with the
// pseudo-header sum in its checksum field. The kernel receiving it would
// deliver it, so the stack does, and counts it; a checksum that is simply
// wrong is still dropped. Before, every such datagram was dropped as
// bad_udp_checksum.
func TestPartialChecksum(t *testing.T) {
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, nil)
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9102"))
	if err != nil {
		t.Fatal(err)
	}
	a := kernelConn(t, bed, "198.18.0.1:0")
	const n = 100
	for i := range n {
		echo(t, a, c, string(payload(i, 64)))
	}
	if got := st.Counters.RxPartialChecksum.Load(); got != n {
		t.Errorf("rx_partial_checksum %d, want %d", got, n)
	}
	if got := st.Counters.RxDropped[header.BadUDPChecksum].Load(); got != 0 {
		t.Errorf("bad_udp_checksum %d, want 0", got)
	}
	// A frame whose checksum is neither right nor partial is dropped.
	dstMAC := linkMAC(t, bed, testbed.B)
	f := make([]byte, header.UDPHeadersLen+8)
	copy(f[header.UDPHeadersLen:], "corrupt!")
	f = f[:header.BuildUDP(f, &header.UDPFields{DstMAC: dstMAC, Src: netip.MustParseAddrPort("198.18.0.1:5555"),
		Dst: netip.MustParseAddrPort("198.18.0.2:9102"), TTL: 64}, 8)]
	f[len(f)-1] ^= 0xff
	err = bed.Do(testbed.A, func() error {
		fd, err := rawSocket(bed.Link(testbed.A), 0)
		if err != nil {
			return err
		}
		defer fd.Close()
		_, err = fd.Write(f)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	echo(t, a, c, "after the corrupt one")
	if got := st.Counters.RxDropped[header.BadUDPChecksum].Load(); got != 1 {
		t.Errorf("bad_udp_checksum %d, want 1", got)
	}
}

// TestLinkEvents: a program's interface changes under it. Down: sends go
// through the kernel socket and get the kernel's error, nothing is sent
// into a down link; up: offload resumes. MTU: what the stack sends and
// takes follows it, jumbo datagrams through the kernel socket. Address
// removed and added back: traffic resumes. Deleted: the socket is served
// by its kernel socket, with no hang and no crash.
func TestLinkEvents(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(map[bool]string{false: "tuned", true: "plain"}[plain], func(t *testing.T) {
			linkEvents(t, &testbed.Options{Plain: plain})
		})
	}
}

func linkEvents(t *testing.T, bo *testbed.Options) {
	bed, st := bedStackOn(t, bo, nil)
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9103"))
	if err != nil {
		t.Fatal(err)
	}
	a := kernelConn(t, bed, "198.18.0.1:9104")
	peer := netip.MustParseAddrPort("198.18.0.1:9104")
	echo(t, a, c, "before")

	t.Run("down-up", func(t *testing.T) {
		mustRun(t, bed, testbed.B, "ip", "link", "set", bed.Link(testbed.B), "down")
		eventually(t, "the stack sees the link down", func() bool { return st.KernelOnly() != "" })
		tx := c.Counters.TxOffloadPackets.Load()
		if _, err := c.WriteToUDPAddrPort([]byte("down"), peer); !errors.Is(err, unix.ENETUNREACH) {
			t.Errorf("send on a down link: %v; want the kernel's ENETUNREACH", err)
		}
		if c.Counters.TxOffloadPackets.Load() != tx {
			t.Errorf("the stack sent into a down link")
		}
		mustRun(t, bed, testbed.B, "ip", "link", "set", bed.Link(testbed.B), "up")
		eventually(t, "the stack sees the link up", func() bool { return st.KernelOnly() == "" })
		rx := c.Counters.RxOffloadPackets.Load()
		echo(t, a, c, "up again")
		if c.Counters.RxOffloadPackets.Load() != rx+1 {
			t.Errorf("offload did not resume after up")
		}
	})

	t.Run("mtu", func(t *testing.T) {
		for _, s := range []testbed.Side{testbed.A, testbed.B} {
			mustRun(t, bed, s, "ip", "link", "set", bed.Link(s), "mtu", "9000")
		}
		big := string(payload(1, 8000))
		echo(t, a, c, big)
		if c.Counters.RxOSPackets.Load() != 1 {
			t.Errorf("the 8000-byte datagram did not come through the kernel socket (os packets %d)", c.Counters.RxOSPackets.Load())
		}
		if _, err := c.WriteToUDPAddrPort([]byte(big), peer); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 9000)
		a.SetReadDeadline(time.Now().Add(3 * time.Second))
		if n, _, err := a.ReadFromUDPAddrPort(buf); err != nil || n != len(big) {
			t.Fatalf("the kernel peer read %d bytes, %v; want %d", n, err, len(big))
		}
		for _, s := range []testbed.Side{testbed.A, testbed.B} {
			mustRun(t, bed, s, "ip", "link", "set", bed.Link(s), "mtu", "1280")
		}
		eventually(t, "the stack sends 1280-byte frames at most", func() bool {
			os := c.Counters.TxOSPackets.Load()
			c.WriteToUDPAddrPort(make([]byte, 1400), peer)
			return c.Counters.TxOSPackets.Load() == os+1
		})
		echo(t, a, c, string(payload(2, 1200)))
	})

	t.Run("address", func(t *testing.T) {
		mustRun(t, bed, testbed.B, "ip", "addr", "del", "198.18.0.2/24", "dev", bed.Link(testbed.B))
		mustRun(t, bed, testbed.B, "ip", "addr", "add", "198.18.0.2/24", "dev", bed.Link(testbed.B))
		rx := c.Counters.RxOffloadPackets.Load()
		echo(t, a, c, "address back")
		if c.Counters.RxOffloadPackets.Load() != rx+1 {
			t.Errorf("offload did not resume after the address came back")
		}
		if _, err := c.WriteToUDPAddrPort([]byte("reply"), peer); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("deleted", func(t *testing.T) {
		mustRun(t, bed, testbed.A, "ip", "link", "del", bed.Link(testbed.A))
		eventually(t, "the stack sees the interface gone", func() bool { return strings.Contains(st.KernelOnly(), "deleted") })
		c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, _, err := c.ReadFromUDPAddrPort(make([]byte, 64)); !errors.Is(err, unix.EAGAIN) && !isTimeout(err) {
			t.Errorf("read on a deleted interface: %v; want a timeout", err)
		}
		if _, err := c.WriteToUDPAddrPort([]byte("gone"), peer); err == nil {
			t.Errorf("send to a peer behind a deleted interface succeeded")
		}
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestIdleDetach: with no socket steered for a second, the steering
// program leaves the interface (attached, it makes a veth copy every frame
// the kernel gets: its own traffic pays for vmaxdp's presence), and the
// next socket brings it back.
func TestIdleDetach(t *testing.T) {
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, nil)
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9105"))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	eventually(t, "the idle program is detached", func() bool { return !st.Program().Attached() })
	if out, _ := exec.Command("ip", "-n", bed.NSName(testbed.B), "link", "show", bed.Link(testbed.B)).Output(); strings.Contains(string(out), "xdp") {
		t.Errorf("the interface still has an XDP program: %s", out)
	}
	c, err = st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9106"))
	if err != nil {
		t.Fatal(err)
	}
	echo(t, kernelConn(t, bed, "198.18.0.1:0"), c, "attached again")
	if c.Counters.RxOffloadPackets.Load() != 1 {
		t.Errorf("not offloaded after the program came back")
	}
}

// TestVLANLeftToKernel: a VLAN interface is not served (its frames reach
// XDP on the parent with their tag already taken off by the parent's VLAN
// offload), and says so.
func TestVLANLeftToKernel(t *testing.T) {
	bed := testutil.Bed(t, &testbed.Options{Plain: true})
	if err := run(t, bed, testbed.B, "ip", "link", "add", "link", bed.Link(testbed.B), "name", "vmxb.10", "type", "vlan", "id", "10"); err != nil {
		t.Skipf("no VLAN interface to be had (a kernel without CONFIG_VLAN_8021Q): %v", err)
	}
	mustRun(t, bed, testbed.B, "ip", "addr", "add", "198.18.10.2/24", "dev", "vmxb.10")
	mustRun(t, bed, testbed.B, "ip", "link", "set", "vmxb.10", "up")
	err := bed.Do(testbed.B, func() error {
		st, err := stack.Open("vmxb.10", &stack.Options{XSK: &xsk.Options{NoHugePages: true}})
		if err == nil {
			st.Close()
		}
		return err
	})
	if !errors.Is(err, stack.ErrNotSupported) || !strings.Contains(err.Error(), "VLAN interface") {
		t.Errorf("stack on a VLAN interface: %v; want ErrNotSupported naming it", err)
	}
}
