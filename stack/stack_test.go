package stack_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/sockperf"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// bedStack brings up a bed with a stack on side B.
func bedStack(t testing.TB, opts *stack.Options) (*testbed.Bed, *stack.Stack) {
	return bedStackOn(t, nil, opts)
}

// bedStackOn brings up a bed made with bedOpts, with a stack on side B.
func bedStackOn(t testing.TB, bedOpts *testbed.Options, opts *stack.Options) (*testbed.Bed, *stack.Stack) {
	return stackOn(t, testutil.Bed(t, bedOpts), opts)
}

// bedStackOnBed opens a stack with default options on side B of bed.
func bedStackOnBed(t testing.TB, bed *testbed.Bed) (*testbed.Bed, *stack.Stack) {
	return stackOn(t, bed, nil)
}

func stackOn(t testing.TB, bed *testbed.Bed, opts *stack.Options) (*testbed.Bed, *stack.Stack) {
	if opts == nil {
		opts = &stack.Options{}
	}
	if opts.XSK == nil {
		opts.XSK = &xsk.Options{NoHugePages: true}
	}
	var st *stack.Stack
	err := bed.Do(testbed.B, func() (err error) {
		st, err = stack.Open(bed.Link(testbed.B), opts)
		return err
	})
	testutil.SkipIfNotSupported(t, err)
	t.Cleanup(func() { st.Close() })
	return bed, st
}

// resolved makes side B's kernel know side A's address, for a test that
// counts offloaded sends: those made while the kernel resolves it go
// through the kernel socket.
func resolved(t testing.TB, bed *testbed.Bed) {
	t.Helper()
	if err := testutil.Resolve(bed, testbed.B); err != nil {
		t.Fatal(err)
	}
}

// kernelConn opens a kernel UDP socket on side A.
func kernelConn(t testing.TB, bed *testbed.Bed, laddr string) *net.UDPConn {
	var c *net.UDPConn
	err := bed.Do(testbed.A, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(laddr)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadBuffer(8 << 20)
	t.Cleanup(func() { c.Close() })
	return c
}

func payload(i, n int) []byte {
	b := bytes.Repeat([]byte{byte(i)}, n)
	binary.BigEndian.PutUint32(b, uint32(i))
	return b
}

func TestReceiveFromKernel(t *testing.T) {
	bed, st := bedStack(t, nil)
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9000"))
	if err != nil {
		t.Fatal(err)
	}
	k := kernelConn(t, bed, "198.18.0.1:0")
	dst := netip.AddrPortFrom(bed.Addr(testbed.B), 9000)
	const n = 1000 // within the 2048-frame RX ring
	sizes := []int{12, 64, 1472}
	for i := 0; i < n; i++ {
		if _, err := k.WriteToUDPAddrPort(payload(i, sizes[i%len(sizes)]), dst); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	for i := 0; i < n; i++ {
		m, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:m], payload(i, sizes[i%len(sizes)])) {
			t.Fatalf("datagram %d: %d bytes, payload differs", i, m)
		}
		if from != netip.AddrPortFrom(bed.Addr(testbed.A), uint16(k.LocalAddr().(*net.UDPAddr).Port)) {
			t.Fatalf("datagram %d from %s", i, from)
		}
	}
	if got := c.Counters.RxOffloadPackets.Load(); got != n {
		t.Errorf("RxOffloadPackets = %d, want %d", got, n)
	}
	pc, _ := st.Program().Counters()
	if pc.Redirected != n {
		t.Errorf("steering program redirected %d, want %d", pc.Redirected, n)
	}
}

func TestSendToKernel(t *testing.T) {
	bed, st := bedStack(t, nil)
	k := kernelConn(t, bed, "198.18.0.1:9100")
	resolved(t, bed)
	c, err := st.DialUDP(netip.AddrPort{}, netip.MustParseAddrPort("198.18.0.1:9100"))
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 2048)
		k.SetReadDeadline(time.Now().Add(5 * time.Second))
		for i := 0; i < n; i++ {
			m, from, err := k.ReadFromUDPAddrPort(buf)
			if err != nil {
				done <- fmt.Errorf("datagram %d: %w", i, err)
				return
			}
			if !bytes.Equal(buf[:m], payload(i, 100)) || from != c.LocalAddrPort() && from.Port() != c.LocalAddrPort().Port() {
				done <- fmt.Errorf("datagram %d: %d bytes from %s", i, m, from)
				return
			}
		}
		done <- nil
	}()
	for i := 0; i < n; i++ {
		if _, err := c.Write(payload(i, 100)); err != nil {
			t.Fatal(err)
		}
		if i%128 == 127 {
			time.Sleep(time.Millisecond) // let the reader keep up: this tests integrity, not rate
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := c.Counters.TxOffloadPackets.Load(); got != n {
		t.Errorf("TxOffloadPackets = %d, want %d (os %d)", got, n, c.Counters.TxOSPackets.Load())
	}
}

// TestSendGather: a datagram sent as pieces (sendmsg's iovecs) reaches a
// kernel receiver as the pieces one after the other, whatever their
// count and sizes, empty ones included; one too long for a frame goes
// whole through the kernel socket, with more pieces than the kernel path
// keeps on its stack as well.
func TestSendGather(t *testing.T) {
	bed, st := bedStack(t, nil)
	k := kernelConn(t, bed, "198.18.0.1:9110")
	resolved(t, bed)
	c, err := st.ListenUDP(netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	to := netip.MustParseAddrPort("198.18.0.1:9110")
	cases := []struct {
		name   string
		sizes  []int
		kernel bool
	}{
		{"none", nil, false},
		{"one empty", []int{0}, false},
		{"small", []int{1, 2, 3}, false},
		{"empty between", []int{8, 0, 100, 0, 1}, false},
		{"twenty", []int{5, 9, 1, 70, 3, 3, 0, 12, 40, 1, 1, 2, 8, 30, 7, 100, 0, 4, 4, 60}, false},
		{"too long", []int{1000, 2000, 1000}, true},
		{"too long, twenty", []int{300, 100, 0, 250, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 1}, true},
	}
	buf := make([]byte, 8192)
	for i, tc := range cases {
		var vec [][]byte
		var want []byte
		for j, n := range tc.sizes {
			p := bytes.Repeat([]byte{byte(i*31 + j)}, n)
			vec = append(vec, p)
			want = append(want, p...)
		}
		offloaded, os := c.Counters.TxOffloadPackets.Load(), c.Counters.TxOSPackets.Load()
		n, err := c.WriteVecFromTo(vec, netip.Addr{}, to)
		if err != nil || n != len(want) {
			t.Fatalf("%s: WriteVecFromTo = %d, %v; want %d", tc.name, n, err, len(want))
		}
		k.SetReadDeadline(time.Now().Add(3 * time.Second))
		m, _, err := k.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:m], want) {
			t.Fatalf("%s: the kernel read %d bytes (%v), want the %d bytes sent", tc.name, m, err, len(want))
		}
		dOff, dOS := c.Counters.TxOffloadPackets.Load()-offloaded, c.Counters.TxOSPackets.Load()-os
		if tc.kernel && (dOff != 0 || dOS != 1) || !tc.kernel && (dOff != 1 || dOS != 0) {
			t.Errorf("%s: offloaded %d, through the kernel socket %d", tc.name, dOff, dOS)
		}
	}
}

// TestSendSegmented: a send longer than its segment size (UDP_SEGMENT,
// the socket's or the send's own) reaches a kernel receiver as the
// kernel's UDP GSO cuts it: datagrams of that size, the last one shorter,
// the bytes in order across the pieces and across transmit batches; all
// leave from the stack. A send's own size stands for the socket's, 0 as
// well; a send of more segments than the stack makes goes to the kernel
// socket with its size, which cuts it; segments longer than the MTU are
// refused, as the kernel refuses them.
func TestSendSegmented(t *testing.T) {
	bed, st := bedStack(t, nil)
	k := kernelConn(t, bed, "198.18.0.1:9115")
	resolved(t, bed)
	c, err := st.ListenUDP(netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	to := netip.MustParseAddrPort("198.18.0.1:9115")
	cases := []struct {
		name    string
		socket  int   // SetSegment
		meta    int   // the send's own, -1: none
		pieces  []int // one datagram's
		batch   []int // or these, one send
		want    []int // datagram sizes read
		viaOS   bool
		refused bool
	}{
		{name: "socket's, cut", socket: 100, meta: -1, pieces: []int{400}, want: []int{100, 100, 100, 100}},
		{name: "send's, pieces across segments", meta: 100, pieces: []int{30, 170, 0, 50}, want: []int{100, 100, 50}},
		{name: "shorter than the segment", socket: 100, meta: -1, pieces: []int{80}, want: []int{80}},
		{name: "send's 0 stands for the socket's", socket: 100, meta: 0, pieces: []int{400}, want: []int{400}},
		{name: "send's stands for the socket's", socket: 100, meta: 150, pieces: []int{400}, want: []int{150, 150, 100}},
		{name: "64 segments", meta: 20, pieces: []int{1000, 280}, want: slices.Repeat([]int{20}, 64)},
		{name: "across transmit batches", socket: 20, meta: -1, batch: []int{1000, 1000, 1000}, want: slices.Repeat([]int{20}, 150)},
		{name: "batch", socket: 100, meta: -1, batch: []int{250, 50, 0}, want: []int{100, 100, 50, 50, 0}},
		{name: "more segments than the stack makes", meta: 10, pieces: []int{650}, want: slices.Repeat([]int{10}, 65), viaOS: true},
		{name: "segments longer than the MTU", meta: 1600, pieces: []int{3000}, refused: true},
	}
	buf := make([]byte, 8192)
	for i, tc := range cases {
		c.SetSegment(tc.socket)
		var vec [][]byte
		var want []byte
		for j, n := range append(tc.pieces, tc.batch...) {
			p := make([]byte, n)
			for x := range p {
				p[x] = byte(i*53 + j*7 + x)
			}
			vec = append(vec, p)
			want = append(want, p...)
		}
		offloaded, os := c.Counters.TxOffloadPackets.Load(), c.Counters.TxOSPackets.Load()
		if tc.batch != nil {
			if n, err := c.WriteBatchToUDPAddrPort(vec, to); err != nil || n != len(vec) {
				t.Fatalf("%s: WriteBatchToUDPAddrPort = %d, %v; want %d", tc.name, n, err, len(vec))
			}
		} else {
			m := stack.SendMeta{Segment: tc.meta, SegmentSet: tc.meta >= 0}
			n, err := c.WriteMsg(vec, m, to, nil)
			if tc.refused {
				if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EMSGSIZE) {
					t.Errorf("%s: WriteMsg = %d, %v; want EINVAL or EMSGSIZE, as the kernel refuses it", tc.name, n, err)
				}
				continue
			}
			if err != nil || n != len(want) {
				t.Fatalf("%s: WriteMsg = %d, %v; want %d", tc.name, n, err, len(want))
			}
		}
		var sizes []int
		var got []byte
		for range tc.want {
			k.SetReadDeadline(time.Now().Add(3 * time.Second))
			m, _, err := k.ReadFromUDPAddrPort(buf)
			if err != nil {
				break
			}
			sizes = append(sizes, m)
			got = append(got, buf[:m]...)
		}
		if !slices.Equal(sizes, tc.want) || !bytes.Equal(got, want) {
			t.Errorf("%s: the kernel read datagrams of %v bytes (same bytes as sent: %v), want %v", tc.name, sizes, bytes.Equal(got, want), tc.want)
		}
		dOff, dOS := c.Counters.TxOffloadPackets.Load()-offloaded, c.Counters.TxOSPackets.Load()-os
		if wantOff, wantOS := len(tc.want), 0; tc.viaOS && (dOff != 0 || dOS != uint64(len(tc.want))) || !tc.viaOS && (dOff != uint64(wantOff) || dOS != uint64(wantOS)) {
			t.Errorf("%s: offloaded %d, through the kernel socket %d", tc.name, dOff, dOS)
		}
	}
}

// TestStampedSendLeavesAtOnce: a send that asks for a transmit stamp is
// kicked at once, also one that follows another with no wait between,
// which the stack leaves on the ring for a coalesced kick (as the plain
// sends here show, with a coalescing delay of a second): its stamp says
// when it left. Before, a stamped send that followed another waited for
// the kick timer, up to TxKickDelay after its stamp.
func TestStampedSendLeavesAtOnce(t *testing.T) {
	bed, st := bedStack(t, &stack.Options{TxKickDelay: time.Second})
	k := kernelConn(t, bed, "198.18.0.1:9120")
	resolved(t, bed)
	to := netip.MustParseAddrPort("198.18.0.1:9120")
	c, err := st.DialUDP(netip.AddrPort{}, to)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	for i := range n {
		if _, err := c.Write(payload(i, 64)); err != nil {
			t.Fatal(err)
		}
	}
	if !stack.TxUnkicked(c) {
		t.Fatal("plain sends that follow one another left nothing for a coalesced kick: the test cannot tell")
	}
	c.FlushSends()
	for i := range n {
		var ts stack.TxStamp
		if _, err := c.WriteStamped([][]byte{payload(n+i, 64)}, netip.Addr{}, to, &ts); err != nil {
			t.Fatal(err)
		}
		if ts.At == 0 {
			t.Fatalf("stamped send %d: no stamp", i)
		}
		if stack.TxUnkicked(c) {
			t.Fatalf("stamped send %d was left on the ring for a later kick", i)
		}
	}
	buf := make([]byte, 128)
	for i := range 2 * n {
		k.SetReadDeadline(time.Now().Add(3 * time.Second))
		if m, _, err := k.ReadFromUDPAddrPort(buf); err != nil || !bytes.Equal(buf[:m], payload(i, 64)) {
			t.Fatalf("datagram %d: %d bytes, %v", i, m, err)
		}
	}
}

// TestLongSendKeepsOrder: a datagram too long for a frame, which the
// kernel socket sends (and fragments), leaves after the socket's earlier
// sends that were left on the TX ring for a coalesced kick, as the
// kernel keeps a socket's datagrams in order. Before, it overtook them.
func TestLongSendKeepsOrder(t *testing.T) {
	bed, st := bedStack(t, &stack.Options{TxKickDelay: time.Second})
	k := kernelConn(t, bed, "198.18.0.1:9121")
	resolved(t, bed)
	to := netip.MustParseAddrPort("198.18.0.1:9121")
	c, err := st.DialUDP(netip.AddrPort{}, to)
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{64, 64, 3000, 64}
	for i, n := range sizes {
		if _, err := c.Write(payload(i, n)); err != nil {
			t.Fatal(err)
		}
		if i == 1 && !stack.TxUnkicked(c) {
			t.Fatal("a send that follows another left nothing for a coalesced kick: the test cannot tell")
		}
	}
	c.FlushSends()
	buf := make([]byte, 4096)
	for i, n := range sizes {
		k.SetReadDeadline(time.Now().Add(3 * time.Second))
		m, _, err := k.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:m], payload(i, n)) {
			t.Fatalf("datagram %d: read %d bytes (%v), want send %d's %d", i, m, err, i, n)
		}
	}
}

// TestStaleNextHop: once its cached next hop expires, a send to a known
// destination does not wait for the kernel's tables: it goes out through
// the engine at once with the entry it had, while a background lookup
// refreshes it. Here the neighbour stops answering ARP and the kernel has
// forgotten it, so a lookup on the send path would have waited
// ResolveTimeout and sent through the kernel; the refresh then finds it
// unresolvable, and the next send goes through the kernel.
func TestStaleNextHop(t *testing.T) {
	bed, st := bedStack(t, &stack.Options{ResolveTimeout: 300 * time.Millisecond})
	k := kernelConn(t, bed, "198.18.0.1:9101")
	// Not connected: a connected socket keeps its own copy of the hop.
	c, err := st.ListenUDP(netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	send := func(i int) {
		t.Helper()
		if _, err := c.WriteToUDPAddrPort(payload(i, 64), netip.MustParseAddrPort("198.18.0.1:9101")); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 128)
	recv := func(i int) {
		t.Helper()
		k.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _, err := k.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], payload(i, 64)) {
			t.Errorf("datagram %d: got %x", i, buf[:n])
		}
	}
	send(0) // through the kernel socket, which resolves the neighbour
	recv(0)
	stack.WaitNextHopRefreshes(st) // the stack has the answer
	os0 := c.Counters.TxOSPackets.Load()
	for _, cmd := range [][]string{
		{"ip", "-n", bed.NSName(testbed.A), "link", "set", "dev", bed.Link(testbed.A), "arp", "off"},
		{"ip", "-n", bed.NSName(testbed.B), "neigh", "flush", "dev", bed.Link(testbed.B)},
	} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(cmd, " "), err, out)
		}
	}
	stack.ExpireNextHops(st)
	send(1)
	if got := c.Counters.TxOffloadPackets.Load(); got != 1 {
		t.Errorf("the send after expiry was not offloaded: TxOffloadPackets = %d, TxOSPackets = %d", got, c.Counters.TxOSPackets.Load())
	}
	stack.WaitNextHopRefreshes(st)

	if got := st.Counters.NeighUnresolved.Load(); got != 1 {
		t.Errorf("NeighUnresolved = %d after the refresh, want 1", got)
	}
	send(2)
	if got := c.Counters.TxOSPackets.Load() - os0; got != 1 {
		t.Errorf("the send after the refresh found the neighbour gone did not go through the kernel: TxOSPackets = %d more", got)
	}
	recv(1)
}

// TestUDPSendUnresolved: a UDP send to a neighbour the kernel has not
// resolved returns at once, as the kernel's does: while the kernel
// resolves it, the datagrams go through the kernel socket, which queues
// them beside its ARP request, and once the stack has the answer they are
// offloaded, all in the order sent. To a host of the subnet nobody holds
// they go through the kernel socket too, which drops them when it gives up
// (three requests, 100 ms apart here), and the stack counts the
// neighbour unresolved. Before, a send waited for ARP up to a second in
// the caller's thread.
func TestUDPSendUnresolved(t *testing.T) {
	bed, st := bedStack(t, nil)
	testutil.ARPRetrans(t, bed, testbed.B, 100*time.Millisecond)
	if out, err := exec.Command("ip", "-n", bed.NSName(testbed.B), "neigh", "flush", "dev", bed.Link(testbed.B)).CombinedOutput(); err != nil {
		t.Fatalf("ip neigh flush: %v: %s", err, out)
	}
	k := kernelConn(t, bed, "198.18.0.1:9102")
	c, err := st.ListenUDP(netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	sendAll := func(to netip.AddrPort, from, n int) time.Duration {
		t.Helper()
		start := time.Now()
		for i := from; i < from+n; i++ {
			if _, err := c.WriteToUDPAddrPort(payload(i, 64), to); err != nil {
				t.Fatalf("send %d to %s: %v", i, to, err)
			}
		}
		return time.Since(start)
	}

	// A neighbour that answers: a burst while the kernel resolves it
	// (within its unres_qlen_bytes, 212992 of buffer), and one after.
	peer := netip.MustParseAddrPort("198.18.0.1:9102")
	const burst = 100
	if took := sendAll(peer, 0, burst); took > 100*time.Millisecond {
		t.Errorf("%d sends to a new neighbour took %v: they waited for ARP", burst, took)
	}
	stack.WaitNextHopRefreshes(st)
	sendAll(peer, burst, 1)
	buf := make([]byte, 128)
	k.SetReadDeadline(time.Now().Add(2 * time.Second))
	for i := range burst + 1 {
		n, _, err := k.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:n], payload(i, 64)) {
			t.Fatalf("datagram %d: got %x, want them in order", i, buf[:n])
		}
	}
	off, os := c.Counters.TxOffloadPackets.Load(), c.Counters.TxOSPackets.Load()
	t.Logf("to a new neighbour: %d offloaded, %d through the kernel socket", off, os)
	if os == 0 || off == 0 || off+os != burst+1 {
		t.Errorf("TxOffloadPackets %d, TxOSPackets %d; want the first through the kernel, the last offloaded, %d in all", off, os, burst+1)
	}

	// A host nobody holds.
	a := bed.Addr(testbed.A).As4()
	a[3] = 99
	nobody := netip.AddrPortFrom(netip.AddrFrom4(a), 9102)
	const many = 50
	if took := sendAll(nobody, 0, many); took > 100*time.Millisecond {
		t.Errorf("%d sends to a host nobody holds took %v: they waited for ARP", many, took)
	}
	if got := c.Counters.TxOSPackets.Load() - os; got != many {
		t.Errorf("to a host nobody holds: TxOSPackets %d more, want %d", got, many)
	}
	stack.WaitNextHopRefreshes(st)
	if n := st.Counters.NeighUnresolved.Load(); n != 1 {
		t.Errorf("NeighUnresolved %d, want 1", n)
	}

	// More hosts nobody holds than the stack waits for at once (16): the
	// sends to the others go through the kernel socket too.
	os = c.Counters.TxOSPackets.Load()
	start := time.Now()
	for i := range 24 {
		a[3] = byte(100 + i)
		sendAll(netip.AddrPortFrom(netip.AddrFrom4(a), 9102), 0, 2)
	}
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Errorf("sends to 24 hosts nobody holds took %v", took)
	}
	if got := c.Counters.TxOSPackets.Load() - os; got != 48 {
		t.Errorf("to 24 hosts nobody holds: TxOSPackets %d more, want 48", got)
	}
}

func TestMulticast(t *testing.T) {
	bed, st := bedStack(t, nil)
	group := netip.MustParseAddr("224.1.2.3")
	c, err := st.ListenUDP(netip.AddrPortFrom(netip.IPv4Unspecified(), 9200))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.JoinGroup(group); err != nil {
		t.Fatal(err)
	}
	k := kernelConn(t, bed, "198.18.0.1:0")
	const n = 100
	for i := 0; i < n; i++ {
		if _, err := k.WriteToUDPAddrPort(payload(i, 64), netip.AddrPortFrom(group, 9200)); err != nil {
			t.Fatal(err)
		}
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	for i := 0; i < n; i++ {
		m, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:m], payload(i, 64)) {
			t.Fatalf("datagram %d: %v", i, err)
		}
	}
	if c.Counters.RxOffloadPackets.Load() != n {
		t.Errorf("RxOffloadPackets = %d, want %d", c.Counters.RxOffloadPackets.Load(), n)
	}
	if err := c.LeaveGroup(group); err != nil {
		t.Fatal(err)
	}
}

// Everything the engine did not ask for still reaches the kernel.
// TestSourceFilteredMulticast: source-filter options applied to the kernel
// socket (IP_ADD_SOURCE_MEMBERSHIP, IP_DROP_SOURCE_MEMBERSHIP,
// IP_BLOCK_SOURCE) and read back by SteerGroup filter the steered path
// as the kernel filters its own: refused sources are counted in
// RxSourceFiltered and never delivered, accepted ones come through the
// engine, and a socket that is no longer a member is no longer steered.
func TestSourceFilteredMulticast(t *testing.T) {
	bed, st := bedStack(t, nil)
	src1, src2 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.3")
	if out, err := exec.Command("ip", "-n", bed.NSName(testbed.A), "addr", "add", src2.String()+"/24", "dev", bed.Link(testbed.A)).CombinedOutput(); err != nil {
		t.Fatalf("add a second source on side A: %v\n%s", err, out)
	}
	group := netip.MustParseAddr("224.1.2.4")
	const port, n = 9201, 20
	c, err := st.ListenUDP(netip.AddrPortFrom(netip.IPv4Unspecified(), port))
	if err != nil {
		t.Fatal(err)
	}
	senders := map[netip.Addr]*net.UDPConn{src1: kernelConn(t, bed, src1.String()+":0"), src2: kernelConn(t, bed, src2.String()+":0")}
	option := func(name int, src netip.Addr) {
		t.Helper()
		var mreq [12]byte // struct ip_mreq_source: group, interface, source
		copy(mreq[0:], group.AsSlice())
		copy(mreq[4:], st.Addr().AsSlice())
		copy(mreq[8:], src.AsSlice())
		if err := unix.SetsockoptString(c.FD(), unix.IPPROTO_IP, name, string(mreq[:])); err != nil {
			t.Fatalf("setsockopt %d %s: %v", name, src, err)
		}
		if err := c.SteerGroup(group); err != nil {
			t.Fatal(err)
		}
	}
	// expect sends n datagrams from each source, refused ones first, and
	// checks that exactly the accepted ones arrive, through the engine.
	expect := func(step string, accepted ...netip.Addr) {
		t.Helper()
		filtered, offloaded := c.Counters.RxSourceFiltered.Load(), c.Counters.RxOffloadPackets.Load()
		var refused []netip.Addr
		for _, src := range []netip.Addr{src1, src2} {
			if !slices.Contains(accepted, src) {
				refused = append(refused, src)
			}
		}
		for _, src := range append(refused, accepted...) {
			for i := 0; i < n; i++ {
				if _, err := senders[src].WriteToUDPAddrPort(payload(i, 32), netip.AddrPortFrom(group, port)); err != nil {
					t.Fatal(err)
				}
			}
		}
		buf := make([]byte, 2048)
		got := map[netip.Addr]int{}
		for {
			c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			_, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				break
			}
			got[from.Addr()]++
		}
		for _, src := range []netip.Addr{src1, src2} {
			if want := map[bool]int{true: n}[slices.Contains(accepted, src)]; got[src] != want {
				t.Errorf("%s: %d datagrams from %s, want %d", step, got[src], src, want)
			}
		}
		if d := c.Counters.RxOffloadPackets.Load() - offloaded; d != uint64(n*len(accepted)) {
			t.Errorf("%s: %d datagrams came through the engine, want %d", step, d, n*len(accepted))
		}
		wantFiltered := uint64(n * len(refused))
		if len(accepted) == 0 {
			wantFiltered = 0 // not a member: not steered at all
		}
		if d := c.Counters.RxSourceFiltered.Load() - filtered; d != wantFiltered {
			t.Errorf("%s: RxSourceFiltered +%d, want +%d", step, d, wantFiltered)
		}
	}
	option(unix.IP_ADD_SOURCE_MEMBERSHIP, src1)
	expect("include {src1}", src1)
	option(unix.IP_ADD_SOURCE_MEMBERSHIP, src2)
	expect("include {src1, src2}", src1, src2)
	option(unix.IP_DROP_SOURCE_MEMBERSHIP, src1)
	expect("include {src2}", src2)
	option(unix.IP_DROP_SOURCE_MEMBERSHIP, src2)
	expect("no membership")
	if err := c.JoinGroup(group); err != nil {
		t.Fatal(err)
	}
	option(unix.IP_BLOCK_SOURCE, src2)
	expect("exclude {src2}", src1)
	option(unix.IP_UNBLOCK_SOURCE, src2)
	expect("exclude {}", src1, src2)
}

func TestKernelTrafficUntouched(t *testing.T) {
	bed, st := bedStack(t, nil)
	if _, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9300")); err != nil {
		t.Fatal(err)
	}
	// ARP and ICMP: ping from A, with A's neighbour cache flushed first.
	out, err := exec.Command("ip", "netns", "exec", bed.NSName(testbed.A), "sh", "-c",
		"ip neigh flush dev vmxa; ping -c 3 -i 0.2 -W 2 198.18.0.2").CombinedOutput()
	if err != nil {
		t.Fatalf("ping through the steered interface: %v\n%s", err, out)
	}
	// UDP to a port no rule names reaches a kernel socket on B.
	var kb *net.UDPConn
	if err := bed.Do(testbed.B, func() (err error) {
		kb, err = net.ListenUDP("udp4", &net.UDPAddr{Port: 9301})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer kb.Close()
	ka := kernelConn(t, bed, "198.18.0.1:0")
	if _, err := ka.WriteToUDPAddrPort([]byte("to the kernel"), netip.MustParseAddrPort("198.18.0.2:9301")); err != nil {
		t.Fatal(err)
	}
	kb.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 100)
	if n, _, err := kb.ReadFromUDPAddrPort(buf); err != nil || string(buf[:n]) != "to the kernel" {
		t.Fatalf("unsteered UDP: %q %v", buf[:n], err)
	}
	pc, err := st.Program().Counters()
	if err != nil {
		t.Fatal(err)
	}
	if pc.Redirected != 0 || pc.NonIP == 0 || pc.Passed < 4 {
		t.Errorf("steering counters %+v: want nothing redirected, ARP counted as non_ip, ICMP and UDP passed", pc)
	}
}

// A datagram larger than the MTU arrives as fragments, which the steering
// program leaves to the kernel; the socket reads it from its kernel socket.
func TestFragmentsThroughKernelSocket(t *testing.T) {
	bed, st := bedStack(t, nil)
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9400"))
	if err != nil {
		t.Fatal(err)
	}
	k := kernelConn(t, bed, "198.18.0.1:0")
	big := payload(7, 4000)
	if _, err := k.WriteToUDPAddrPort(big, netip.MustParseAddrPort("198.18.0.2:9400")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 8192)
	n, _, err := c.ReadFromUDPAddrPort(buf)
	if err != nil || !bytes.Equal(buf[:n], big) {
		t.Fatalf("fragmented datagram: %d bytes, %v", n, err)
	}
	if c.Counters.RxOSPackets.Load() != 1 {
		t.Errorf("RxOSPackets = %d, want 1", c.Counters.RxOSPackets.Load())
	}
	pc, _ := st.Program().Counters()
	if pc.Fragments < 3 {
		t.Errorf("steering program counted %d fragments, want 3", pc.Fragments)
	}
}

func TestReadDeadlineAndBlockingWakeup(t *testing.T) {
	bed, st := bedStack(t, &stack.Options{RxPoll: stack.RxPollNever})
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9500"))
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	buf := make([]byte, 64)
	if _, _, err := c.ReadFromUDPAddrPort(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past deadline: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	k := kernelConn(t, bed, "198.18.0.1:0")
	go func() {
		time.Sleep(100 * time.Millisecond)
		k.WriteToUDPAddrPort([]byte("wake"), netip.MustParseAddrPort("198.18.0.2:9500"))
	}()
	n, _, err := c.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "wake" {
		t.Fatalf("blocking read: %q %v", buf[:n], err)
	}
	if c.Counters.RxPollMiss.Load() == 0 {
		t.Error("reader never slept: RxPollMiss = 0")
	}
}

func TestZeroCopyAndFilter(t *testing.T) {
	bed, st := bedStack(t, nil)
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9600"))
	if err != nil {
		t.Fatal(err)
	}
	c.SetRecvFilter(func(p []byte, _ netip.AddrPort) bool { return p[0] != 'x' })
	k := kernelConn(t, bed, "198.18.0.1:0")
	for _, m := range []string{"xdrop", "keep1", "xdrop", "keep2"} {
		k.WriteToUDPAddrPort([]byte(m), netip.MustParseAddrPort("198.18.0.2:9600"))
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	for _, want := range []string{"keep1", "keep2"} {
		var d stack.Datagram
		if err := c.RecvZeroCopy(&d); err != nil {
			t.Fatal(err)
		}
		if string(d.Payload) != want {
			t.Fatalf("got %q, want %q", d.Payload, want)
		}
		d.Release()
	}
	if c.Counters.RxFiltered.Load() != 2 {
		t.Errorf("RxFiltered = %d, want 2", c.Counters.RxFiltered.Load())
	}
}

// Malformed frames on a steered port are counted, never delivered, never a crash.
func TestMalformedFramesCounted(t *testing.T) {
	bed, st := bedStack(t, nil)
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9700"))
	if err != nil {
		t.Fatal(err)
	}
	dstMAC := linkMAC(t, bed, testbed.B)
	good := func() []byte {
		f := make([]byte, header.UDPHeadersLen+8)
		copy(f[header.UDPHeadersLen:], "payload!")
		return f[:header.BuildUDP(f, &header.UDPFields{DstMAC: dstMAC,
			Src: netip.MustParseAddrPort("198.18.0.1:5555"), Dst: netip.MustParseAddrPort("198.18.0.2:9700"), TTL: 64}, 8)]
	}
	badUDP := good()
	badUDP[len(badUDP)-1] ^= 0xff
	badIP := good()
	badIP[14+10] ^= 0xff
	badIHL := good()
	badIHL[14] = 0x44
	truncated := good()[:14+20+4]
	writeFrames(t, bed, badUDP, badIP, badIHL, truncated, good())
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 64)
	n, _, err := c.ReadFromUDPAddrPort(buf)
	if err != nil || string(buf[:n]) != "payload!" {
		t.Fatalf("the good frame: %q %v", buf[:n], err)
	}
	if got := st.Counters.RxDropped[header.BadUDPChecksum].Load(); got != 1 {
		t.Errorf("bad UDP checksum dropped %d, want 1", got)
	}
	if got := st.Counters.RxDropped[header.BadIPChecksum].Load(); got != 1 {
		t.Errorf("bad IP checksum dropped %d, want 1", got)
	}
	if got := st.Counters.RxDropped[header.BadLength].Load(); got != 1 {
		t.Errorf("truncated frame: bad_length dropped %d, want 1", got)
	}
	pc, _ := st.Program().Counters()
	if pc.ParseErrors != 1 { // the bad IHL never leaves XDP
		t.Errorf("steering parse_errors = %d, want 1", pc.ParseErrors)
	}
}

// TestMartianSources: a datagram from a source the kernel drops on input
// whatever rp_filter says (a group, 0.0.0.0, 127.0.0.0/8) is not
// steered: the program passes it to the kernel, which drops it, and
// counts it (martian_sources). Before, the stack delivered it. One from
// 0.1.2.3 is no martian since Linux 5.3, and is delivered.
func TestMartianSources(t *testing.T) {
	bed, st := bedStack(t, nil)
	_, c := adoptOnB(t, bed, st, 9710)
	martians := []string{"127.0.0.1:5555", "224.1.2.3:5555", "0.0.0.0:5555"}
	var sends []rawSend
	for _, src := range martians {
		sends = append(sends, rawSend{src, "martian"})
	}
	sends = append(sends, rawSend{"0.1.2.3:5555", "zeronet!"}, rawSend{bed.Addr(testbed.A).String() + ":5555", "payload!"})
	sendRawUDP(t, bed, 9710, sends...)
	buf := make([]byte, 64)
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	for _, want := range []string{"zeronet!", "payload!"} {
		if n, from, err := c.ReadFromUDPAddrPort(buf); err != nil || string(buf[:n]) != want {
			t.Fatalf("datagram %q from %v, %v; want %q, the martians' never", buf[:n], from, err, want)
		}
	}
	c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if n, from, err := c.ReadFromUDPAddrPort(buf); err == nil {
		t.Errorf("a datagram %q from %v came after", buf[:n], from)
	}
	if pc, _ := st.Program().Counters(); pc.MartianSources != uint64(len(martians)) {
		t.Errorf("martian_sources %d, want %d", pc.MartianSources, len(martians))
	}
}

// adoptOnB binds a kernel UDP socket to 0.0.0.0:port in side B and serves
// it with st, until the test ends.
func adoptOnB(t *testing.T, bed *testbed.Bed, st *stack.Stack, port int) (int, *stack.UDPConn) {
	t.Helper()
	var fd int
	err := bed.Do(testbed.B, func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrInet4{Port: port})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	c, err := st.Adopt(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return fd, c
}

// rawSend is a datagram sendRawUDP sends: its source and payload.
type rawSend struct{ src, payload string }

// sendRawUDP sends each datagram from side A's link, as a frame built
// whole (any source), to port on side B's address.
func sendRawUDP(t *testing.T, bed *testbed.Bed, port int, sends ...rawSend) {
	t.Helper()
	dstMAC := linkMAC(t, bed, testbed.B)
	var frames [][]byte
	for _, d := range sends {
		f := make([]byte, header.UDPHeadersLen+len(d.payload))
		copy(f[header.UDPHeadersLen:], d.payload)
		frames = append(frames, f[:header.BuildUDP(f, &header.UDPFields{DstMAC: dstMAC, Src: netip.MustParseAddrPort(d.src),
			Dst: netip.AddrPortFrom(bed.Addr(testbed.B), uint16(port)), TTL: 64}, len(d.payload))])
	}
	writeFrames(t, bed, frames...)
}

// linkMAC is the hardware address of side s's link.
func linkMAC(t *testing.T, bed *testbed.Bed, s testbed.Side) header.MAC {
	t.Helper()
	var mac header.MAC
	err := bed.Do(s, func() error {
		ifi, err := net.InterfaceByName(bed.Link(s))
		if err == nil {
			mac = header.MAC(ifi.HardwareAddr)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// writeFrames writes each frame whole onto side A's link.
func writeFrames(t *testing.T, bed *testbed.Bed, frames ...[]byte) {
	t.Helper()
	err := bed.Do(testbed.A, func() error {
		raw, err := rawSocket(bed.Link(testbed.A), 0)
		if err != nil {
			return err
		}
		defer raw.Close()
		for _, f := range frames {
			if _, err := raw.Write(f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestSourceChecks: the stack drops, and counts, what the kernel would
// refuse for its source. With rp_filter 1 (strict) on side B, a source
// the kernel would not route back through the interface (198.18.9.9) and
// one of side B's own addresses are refused, while side A's comes
// through; with rp_filter back at 0 (the watcher reads it every
// second), 198.18.9.9 comes through and B's own address is still
// refused, and so is an address of B's loopback, added while the stack
// runs; with accept_local on, both come through. A kernel socket of
// side B beside the stack's gets the same datagrams, or none, each time.
// Before, the stack delivered them all, and then took the loopback's.
func TestSourceChecks(t *testing.T) {
	bed := testutil.Bed(t, &testbed.Options{Plain: true})
	setSourceConf(t, bed, "1", "0")
	_, st := stackOn(t, bed, nil)
	_, c := adoptOnB(t, bed, st, 9720)
	own := bed.Addr(testbed.B).String() + ":5555"
	read := func(want string) {
		t.Helper()
		buf := make([]byte, 64)
		c.SetReadDeadline(time.Now().Add(3 * time.Second))
		if n, from, err := c.ReadFromUDPAddrPort(buf); err != nil || string(buf[:n]) != want {
			t.Fatalf("datagram %q from %v, %v; want %q", buf[:n], from, err, want)
		}
	}
	sendRawUDP(t, bed, 9720, rawSend{"198.18.9.9:5555", "spoofed"}, rawSend{"198.18.9.9:5555", "spoofed"}, rawSend{own, "own"},
		rawSend{bed.Addr(testbed.A).String() + ":5555", "side A"})
	read("side A")
	if n := st.Counters.RxSourceRejected.Load(); n != 3 {
		t.Errorf("rp_filter 1: %d sources rejected, want 3", n)
	}
	setSourceConf(t, bed, "0", "0")
	for deadline := time.Now().Add(5 * time.Second); stack.RPMode(st) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the watcher did not read rp_filter 0 within 5 s")
		}
	}
	sendRawUDP(t, bed, 9720, rawSend{own, "own"}, rawSend{"198.18.9.9:5555", "spoofed"})
	read("spoofed")
	if n := st.Counters.RxSourceRejected.Load(); n != 4 {
		t.Errorf("rp_filter 0: %d sources rejected in all, want 4", n)
	}

	// The kernel refuses any address of the namespace as a source, not
	// only the interface's: a kernel socket of B's on port 9721 shows it.
	kernelGot := func(sends ...rawSend) []string {
		t.Helper()
		var k *net.UDPConn
		if err := bed.Do(testbed.B, func() (err error) {
			k, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(bed.Addr(testbed.B), 9721)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer k.Close()
		sendRawUDP(t, bed, 9721, sends...)
		var got []string
		buf := make([]byte, 64)
		for {
			k.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			n, err := k.Read(buf)
			if err != nil {
				return got
			}
			got = append(got, string(buf[:n]))
		}
	}
	const lo = "198.18.7.7"
	mustRun(t, bed, testbed.B, "ip", "addr", "add", lo+"/32", "dev", "lo")
	for deadline := time.Now().Add(5 * time.Second); stack.LocalAddrCount(st) != 3; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the stack knows %d addresses of its namespace, want 3 (127.0.0.1, %v, %s)", stack.LocalAddrCount(st), bed.Addr(testbed.B), lo)
		}
	}
	fromLo, fromA := rawSend{lo + ":5555", "lo's"}, rawSend{bed.Addr(testbed.A).String() + ":5555", "side A"}
	if got := kernelGot(fromLo, fromA); !slices.Equal(got, []string{"side A"}) {
		t.Fatalf("B's kernel got %q from lo's address and side A's, want only side A's", got)
	}
	sendRawUDP(t, bed, 9720, fromLo, fromA)
	read("side A")
	if n := st.Counters.RxSourceRejected.Load(); n != 5 {
		t.Errorf("rp_filter 0, an address of lo: %d sources rejected in all, want 5", n)
	}

	setSourceConf(t, bed, "0", "1")
	for deadline := time.Now().Add(5 * time.Second); !stack.AcceptLocal(st); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the watcher did not read accept_local 1 within 5 s")
		}
	}
	fromOwn := rawSend{own, "own"}
	if got := kernelGot(fromLo, fromOwn); !slices.Equal(got, []string{"lo's", "own"}) {
		t.Fatalf("with accept_local, B's kernel got %q, want lo's and own", got)
	}
	sendRawUDP(t, bed, 9720, fromLo, fromOwn)
	read("lo's")
	read("own")
	if n := st.Counters.RxSourceRejected.Load(); n != 5 {
		t.Errorf("accept_local 1: %d sources rejected in all, want 5", n)
	}
	if n := st.Counters.RxSourceUnchecked.Load(); n != 0 {
		t.Errorf("%d sources unchecked, want 0", n)
	}
}

// TestNonblockOSRatio: a nonblocking receive that finds nothing reads the
// kernel socket once every RxPollOSRatio calls (100), as VMA's
// RX_UDP_POLL_OS_RATIO does. Before, auto polling (RxPoll 0) read it at
// every EAGAIN: a recvfrom system call for each empty look of an event
// loop (BIND's named made 5,400 a second, every one EAGAIN). A datagram
// the kernel socket holds (sent over lo) is still found within that many
// calls.
func TestNonblockOSRatio(t *testing.T) {
	bed, st := bedStack(t, nil)
	addr := netip.AddrPortFrom(bed.Addr(testbed.B), 9190)
	c, err := st.ListenUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	recvfroms := testutil.ThreadSyscalls(t, "recvfrom")
	b := make([]byte, 64)
	recv := func() error {
		_, _, _, err := c.RecvFrom(b, stack.RecvNonblock, time.Time{}, nil, nil)
		return err
	}
	recv() // the first reads the kernel socket until it is empty
	const calls, ratio = 1000, 100
	before := recvfroms()
	for range calls {
		if err := recv(); !errors.Is(err, unix.EAGAIN) {
			t.Fatalf("nonblocking receive with nothing sent: %v, want EAGAIN", err)
		}
	}
	// A turn of the ratio for the calls, and one for the receives.
	if n := recvfroms() - before; n > 2*calls/ratio+2 {
		t.Errorf("%d nonblocking receives that found nothing read the kernel socket %d times, want at most %d", calls, n, 2*calls/ratio+2)
	}
	err = bed.Do(testbed.B, func() error {
		k, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(addr))
		if err != nil {
			return err
		}
		defer k.Close()
		_, err = k.Write([]byte("over lo"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // delivered to the kernel socket
	for i := 1; ; i++ {
		err := recv()
		if err == nil {
			if got := string(b[:len("over lo")]); got != "over lo" {
				t.Errorf("received %q, want the datagram sent over lo", got)
			}
			break
		}
		if !errors.Is(err, unix.EAGAIN) || i > ratio {
			t.Fatalf("the datagram the kernel socket holds: not found in %d nonblocking receives (%v)", i, err)
		}
	}
}

// Close returns only once every reader and sender has left the socket, so
// that the descriptors it closes are never used after their number may be
// reused; each of them returns net.ErrClosed.
func TestCloseWaitsForCalls(t *testing.T) {
	bed, st := bedStack(t, &stack.Options{RxPoll: stack.RxPollNever})
	for round := range 20 {
		c, err := st.ListenUDP(netip.AddrPortFrom(bed.Addr(testbed.B), uint16(9100+round)))
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 3)
		go func() { // sleeps at once
			_, _, err := c.ReadFromUDPAddrPort(make([]byte, 64))
			errs <- err
		}()
		go func() { // polls without sleeping
			b := make([]byte, 64)
			for {
				if _, _, _, err := c.RecvFrom(b, stack.RecvNonblock, time.Time{}, nil, nil); !errors.Is(err, unix.EAGAIN) {
					errs <- err
					return
				}
			}
		}()
		go func() { // sends until closed
			b := make([]byte, 64)
			for {
				if _, err := c.WriteToUDPAddrPort(b, netip.AddrPortFrom(bed.Addr(testbed.A), 9)); err != nil {
					errs <- err
					return
				}
			}
		}()
		deadline := time.Now().Add(5 * time.Second)
		for stack.CallsInside(c) < 2 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
		time.Sleep(time.Duration(round%4) * time.Millisecond) // the reader reaches its sleep in some rounds
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if n := stack.CallsInside(c); n != 0 {
			t.Fatalf("round %d: Close returned with %d calls still using the socket's descriptors", round, n)
		}
		for range 3 {
			select {
			case err := <-errs:
				if !errors.Is(err, net.ErrClosed) {
					t.Fatalf("round %d: a call ended with %v, want net.ErrClosed", round, err)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d: a call never returned", round)
			}
		}
	}
}

// multiQueueFlows sends perFlow datagrams on each of flows kernel sockets of
// side A (one source port each, so the veth spreads them over its queues by
// flow hash) to dst, and reads them all back from c: every datagram once,
// intact, and each flow in order. It sends one datagram per flow at a time
// and reads them back before the next round, so that what comes through
// c's kernel socket never overflows its receive buffer.
func multiQueueFlows(t *testing.T, bed *testbed.Bed, c *stack.UDPConn, dst netip.AddrPort, flows, perFlow int) {
	t.Helper()
	senders := make([]*net.UDPConn, flows)
	for i := range senders {
		senders[i] = kernelConn(t, bed, "198.18.0.1:0")
	}
	next := make([]int, flows)
	buf := make([]byte, 2048)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	for seq := range perFlow {
		for i, k := range senders {
			b := payload(seq, 64)
			binary.BigEndian.PutUint32(b[4:], uint32(i))
			if _, err := k.WriteToUDPAddrPort(b, dst); err != nil {
				t.Fatal(err)
			}
		}
		for range flows {
			n, _, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("round %d: %v", seq, err)
			}
			seq, flow := int(binary.BigEndian.Uint32(buf)), int(binary.BigEndian.Uint32(buf[4:]))
			if n != 64 || flow >= flows || seq != next[flow] || !bytes.Equal(buf[8:n], payload(seq, 64)[8:]) {
				t.Fatalf("%d bytes, flow %d seq %d (want seq %d of that flow)", n, flow, seq, next[min(flow, flows-1)])
			}
			next[flow]++
		}
	}
}

// TestMultiQueue: with one AF_XDP socket per queue, flows spread over a
// 4-queue veth all reach the socket through the stack; with a queue left
// without one, its flows reach the socket through the kernel, and the
// steering rule counts them as redirect failures: nothing is lost.
func TestMultiQueue(t *testing.T) {
	const flows, perFlow = 32, 20
	t.Run("every queue", func(t *testing.T) {
		bed, st := bedStackOn(t, &testbed.Options{Queues: 4}, nil)
		if n := len(st.Backends()); n != 4 {
			t.Fatalf("stack opened %d queues on a 4-queue veth", n)
		}
		c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9300"))
		if err != nil {
			t.Fatal(err)
		}
		multiQueueFlows(t, bed, c, netip.AddrPortFrom(bed.Addr(testbed.B), 9300), flows, perFlow)
		busy := 0
		var per []uint64
		for _, be := range st.Backends() {
			n := be.(*xsk.Socket).Counters.RxPackets.Load()
			per = append(per, n)
			if n > 0 {
				busy++
			}
		}
		if busy < 2 {
			t.Errorf("%d flows arrived on %d queue(s) only (%v): the test spreads nothing", flows, busy, per)
		}
		if got := c.Counters.RxOffloadPackets.Load(); got != flows*perFlow {
			t.Errorf("RxOffloadPackets = %d, want %d: all through the stack (per queue %v)", got, flows*perFlow, per)
		}
		t.Logf("datagrams per queue: %v", per)

		// Sockets transmit on the queues in turn, each on one queue.
		k := kernelConn(t, bed, "198.18.0.1:9302")
		before := make([]uint64, 0, 4)
		for _, be := range st.Backends() {
			before = append(before, be.(*xsk.Socket).Counters.TxPackets.Load())
		}
		const senders, each = 4, 10
		for i := 0; i < senders; i++ {
			s, err := st.ListenUDP(netip.AddrPort{})
			if err != nil {
				t.Fatal(err)
			}
			for j := 0; j < each; j++ {
				if _, err := s.WriteToUDPAddrPort(payload(i*each+j, 32), netip.MustParseAddrPort("198.18.0.1:9302")); err != nil {
					t.Fatal(err)
				}
			}
		}
		var tx []uint64
		for i, be := range st.Backends() {
			tx = append(tx, be.(*xsk.Socket).Counters.TxPackets.Load()-before[i])
		}
		if !slices.Equal(tx, []uint64{each, each, each, each}) {
			t.Errorf("datagrams transmitted per queue: %v, want %d on each: one queue per socket, in turn", tx, each)
		}
		buf := make([]byte, 64)
		k.SetReadDeadline(time.Now().Add(2 * time.Second))
		for i := 0; i < senders*each; i++ {
			if _, _, err := k.ReadFromUDPAddrPort(buf); err != nil {
				t.Fatalf("datagram %d of %d: %v", i, senders*each, err)
			}
		}
	})
	t.Run("queue without a socket", func(t *testing.T) {
		bed, st := bedStackOn(t, &testbed.Options{Queues: 2}, &stack.Options{Queues: []int{0}})
		c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9301"))
		if err != nil {
			t.Fatal(err)
		}
		multiQueueFlows(t, bed, c, netip.AddrPortFrom(bed.Addr(testbed.B), 9301), flows, perFlow)
		off, os := c.Counters.RxOffloadPackets.Load(), c.Counters.RxOSPackets.Load()
		if off == 0 || os == 0 || off+os != flows*perFlow {
			t.Fatalf("offloaded %d + through the kernel %d, want both > 0 and %d in all", off, os, flows*perFlow)
		}
		var failures uint64
		for _, id := range c.Rules() {
			rc, err := st.Program().RuleCounters(id)
			if err != nil {
				t.Fatal(err)
			}
			failures += rc.RedirectFailures
		}
		if failures != os {
			t.Errorf("rule redirect_failures = %d, want %d (the datagrams the kernel socket read)", failures, os)
		}
	})
}

// TestProgressEngine: datagrams of a socket nobody reads leave the RX ring
// for the socket's queue within a few progress intervals, with no call on
// the socket; with ProgressNever they stay in the ring.
func TestProgressEngine(t *testing.T) {
	const n = 300
	for _, every := range []time.Duration{5 * time.Millisecond, stack.ProgressNever} {
		bed, st := bedStack(t, &stack.Options{ProgressInterval: every})
		c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9500"))
		if err != nil {
			t.Fatal(err)
		}
		if err := testutil.SendUDP(bed, 9500, n, 64); err != nil {
			t.Fatal(err)
		}
		var queued int
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if queued, _ = c.QueueLen(); queued == n || every == stack.ProgressNever && time.Until(end) < 1900*time.Millisecond {
				break
			}
		}
		drained := st.Counters.RxProgressFrames.Load()
		switch {
		case every > 0 && (queued != n || drained != n):
			t.Errorf("progress every %v: %d of %d datagrams queued, %d frames drained", every, queued, n, drained)
		case every == stack.ProgressNever && (queued != 0 || drained != 0):
			t.Errorf("ProgressNever: %d datagrams queued, %d frames drained with no receive", queued, drained)
		}
		buf := make([]byte, 64)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for i := range n {
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				t.Fatalf("datagram %d: %v", i, err)
			}
		}
		c.Close()
	}
}

// TestSlowReaderSpills: a socket whose reader is behind holds as many
// datagrams as its SO_RCVBUF allows, not as many as its queue has frames,
// and another socket on the queue keeps receiving meanwhile. Before, the
// backlog stopped at the queue's 2,048 receive frames, the fill ring ran
// dry and the interface queue dropped for every socket on it (syslog-ng
// behind a burst of loggen lost three times what a kernel socket did).
func TestSlowReaderSpills(t *testing.T) {
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, nil)
	slow, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9120"))
	if err != nil {
		t.Fatal(err)
	}
	other, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9121"))
	if err != nil {
		t.Fatal(err)
	}
	const rcvbuf = 8 << 20 // what a kernel socket reports for SO_RCVBUF 4 MB
	slow.SetRxBytesLimit(rcvbuf)
	k := kernelConn(t, bed, "198.18.0.1:0")
	frames := st.Backends()[0].(interface{ Occupancy() xsk.RingOccupancy })
	// A kernel socket with this buffer holds rcvbuf/1280 of these (measured
	// on lo): about 6,500.
	const n, size, chunk = 7000, 200, 250
	to := func(port int) netip.AddrPort { return netip.AddrPortFrom(bed.Addr(testbed.B), uint16(port)) }
	send := func(port, from, count int) {
		t.Helper()
		for i := from; i < from+count; i++ {
			if _, err := k.WriteToUDPAddrPort(payload(i, size), to(port)); err != nil {
				t.Fatal(err)
			}
		}
	}
	queued := func(c *stack.UDPConn, want int) {
		t.Helper()
		got := 0
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			st.Poll()
			if got, _ = c.QueueLen(); got == want {
				return
			}
		}
		t.Fatalf("%d of %d datagrams queued; %d spilled, queue drops %d; rings: %+v", got, want,
			st.Counters.RxSpilled.Load(), c.Counters.RxQueueDrops.Load(), frames.Occupancy())
	}
	for i := 0; i < n; i += chunk {
		send(9120, i, chunk)
		queued(slow, i+chunk)
	}
	if sp := st.Counters.RxSpilled.Load(); sp < n-2048 {
		t.Errorf("%d datagrams spilled, want at least %d (all beyond the queue's 2,048 frames)", sp, n-2048)
	}
	// The queue still has frames for the other socket.
	send(9121, 0, 100)
	queued(other, 100)
	readInOrder(t, slow, n, size)
	if d := slow.Counters.RxQueueDrops.Load() + other.Counters.RxQueueDrops.Load(); d != 0 {
		t.Errorf("%d queue drops", d)
	}
}

// TestProgressWatchesIdleQueues: once nobody has polled the queues for an
// interval, the progress engine drains a burst as it arrives rather than
// at its next look. A burst of 4,000 to a socket nobody reads, sent in
// well under the interval: every datagram is queued, in order. Before,
// the first look came up to an interval late, the RX ring had filled and
// the fill ring run dry, and the queue dropped the rest for every socket
// on it (a sleeping Python reader lost up to 584 of a burst of 10,000).
func TestProgressWatchesIdleQueues(t *testing.T) {
	const every = 500 * time.Millisecond
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, &stack.Options{ProgressInterval: every})
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9122"))
	if err != nil {
		t.Fatal(err)
	}
	c.SetRxBytesLimit(8 << 20)
	k := kernelConn(t, bed, "198.18.0.1:0")
	to := netip.AddrPortFrom(bed.Addr(testbed.B), 9122)
	time.Sleep(2*every + 100*time.Millisecond) // looks that find nobody polling
	const n, size = 4000, 200
	start := time.Now()
	for i := range n {
		if _, err := k.WriteToUDPAddrPort(payload(i, size), to); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took > every/2 {
		t.Skipf("the burst took %v, too long to tell a watcher from a look every %v", took, every)
	}
	queued := 0
	for end := time.Now().Add(2 * every); time.Now().Before(end) && queued < n; time.Sleep(time.Millisecond) {
		queued, _ = c.QueueLen()
	}
	if queued != n {
		t.Fatalf("%d of %d datagrams queued; the progress engine drained %d frames", queued, n, st.Counters.RxProgressFrames.Load())
	}
	readInOrder(t, c, n, size)
}

// readInOrder reads n datagrams from c within 5 s, and fails unless they
// are payload(0, size) to payload(n-1, size), in that order.
func readInOrder(t *testing.T, c *stack.UDPConn, n, size int) {
	t.Helper()
	buf := make([]byte, 2048)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i := range n {
		m, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("datagram %d: %v", i, err)
		}
		if !bytes.Equal(buf[:m], payload(i, size)) {
			t.Fatalf("datagram %d: %d bytes, not the %d-th sent", i, m, i)
		}
	}
}

// TestBatchLeavesNothingQueued: in copy mode the kernel sends a TX ring's
// frames only inside a kick, at most 32 a kick, and leaves the rest when
// the device is busy (a full veth peer); frames left on the ring after
// the last send of a burst were never sent. Bursts of 64 to a kernel
// receiver on a plain bed, then silence: every datagram arrives.
func TestBatchLeavesNothingQueued(t *testing.T) {
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, nil)
	k := kernelConn(t, bed, "198.18.0.1:9105")
	k.SetReadBuffer(4 << 20)
	c, err := st.DialUDP(netip.AddrPort{}, netip.MustParseAddrPort("198.18.0.1:9105"))
	if err != nil {
		t.Fatal(err)
	}
	const bursts, size = 8, 64
	msgs := make([][]byte, size)
	for i := range bursts {
		for j := range msgs {
			msgs[j] = payload(i*size+j, 100)
		}
		if n, err := c.WriteBatchToUDPAddrPort(msgs, k.LocalAddr().(*net.UDPAddr).AddrPort()); n != size || err != nil {
			t.Fatalf("burst %d: %d sent, %v", i, n, err)
		}
	}
	buf := make([]byte, 2048)
	got := 0
	k.SetReadDeadline(time.Now().Add(2 * time.Second))
	for got < bursts*size {
		if _, _, err := k.ReadFromUDPAddrPort(buf); err != nil {
			break
		}
		got++
	}
	if got != bursts*size {
		t.Errorf("%d of %d datagrams arrived (TX ring now holds %d)", got, bursts*size, st.Backends()[0].(interface{ Occupancy() xsk.RingOccupancy }).Occupancy().Tx)
	}
}

// TestReopenKeepsOrder: a socket reopened (UDPConn.Reopen, as after the
// application's connect) gives the datagrams its predecessor had queued
// before those that reached the kernel socket while the steering changed
// hands, and those before the ones steered to it after: arrival order.
// Before, the kernel socket's came first (iperf 2's server connects on
// its first datagram).
func TestReopenKeepsOrder(t *testing.T) {
	bed, st := bedStack(t, nil)
	local := netip.AddrPortFrom(bed.Addr(testbed.B), 9310)
	var fd int
	var here *net.UDPConn // side B's own kernel socket: its datagrams go through lo, not the stack
	err := bed.Do(testbed.B, func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: local.Addr().As4(), Port: int(local.Port())}); err != nil {
			return err
		}
		here, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(local.Addr(), 0)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd); here.Close() })
	c, err := st.Adopt(fd)
	if err != nil {
		t.Fatal(err)
	}
	k := kernelConn(t, bed, "198.18.0.1:0")
	send := func(from *net.UDPConn, first, last int) {
		t.Helper()
		for i := first; i <= last; i++ {
			if _, err := from.WriteToUDPAddrPort(payload(i, 32), local); err != nil {
				t.Fatal(err)
			}
		}
	}
	read := func(c *stack.UDPConn) int {
		t.Helper()
		buf := make([]byte, 64)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil || n < 4 {
			t.Fatalf("read: %d bytes, %v", n, err)
		}
		return int(binary.BigEndian.Uint32(buf))
	}
	// The first read finds the kernel socket empty: nothing in it is
	// older than what the stack queues from now on.
	send(k, 0, 0)
	if got := read(c); got != 0 {
		t.Fatalf("datagram %d first, want 0", got)
	}
	send(k, 1, 3)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		pc, _ := st.Program().Counters()
		if pc.Redirected == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the steering program redirected %d of 4 datagrams in 5 s", pc.Redirected)
		}
	}
	c.Pending()      // queues them
	send(here, 4, 6) // as if they came while the rules changed hands
	n, err := c.Reopen(fd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	send(k, 7, 9)
	var order []int
	for range 9 {
		order = append(order, read(n))
	}
	if !slices.Equal(order, []int{1, 2, 3, 4, 5, 6, 7, 8, 9}) {
		t.Errorf("the reopened socket gave %v, want 1 to 9 in order", order)
	}
}

// TestUDPReinject: what an unsteered socket had queued goes to its kernel
// socket, for a reader the stack will not see (an io_uring ring): in
// order, each payload whole and from its sender, on a plain veth whose
// frames carry partial checksums. A group's datagram is dropped and said
// (ErrNotLocal): sent, it would leave the host.
func TestUDPReinject(t *testing.T) {
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, nil)
	const port = 9320
	group := netip.MustParseAddr("224.1.2.5")
	fd, c := adoptOnB(t, bed, st, port)
	if err := c.JoinGroup(group); err != nil {
		t.Fatal(err)
	}
	k := kernelConn(t, bed, "198.18.0.1:0")
	sizes := []int{1, 64, 1472}
	const n, groupN = 30, 3
	for i := range n {
		if _, err := k.WriteToUDPAddrPort(payload(i, max(4, sizes[i%len(sizes)])), netip.AddrPortFrom(bed.Addr(testbed.B), port)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range groupN {
		if _, err := k.WriteToUDPAddrPort(payload(n+i, 8), netip.AddrPortFrom(group, port)); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		c.Pending() // polls the rings into the queue
		if q, _ := c.QueueLen(); q == n+groupN {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("%d of %d datagrams queued in 5 s", q, n+groupN)
		}
	}
	c.Unsteer()
	handed, dropped, err := c.Reinject()
	if handed != n || dropped != groupN || !errors.Is(err, stack.ErrNotLocal) {
		t.Fatalf("Reinject: %d handed, %d dropped, %v; want %d, %d, ErrNotLocal", handed, dropped, err, n, groupN)
	}
	from := netip.AddrPortFrom(bed.Addr(testbed.A), uint16(k.LocalAddr().(*net.UDPAddr).Port))
	buf := make([]byte, 2048)
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < n; {
		m, src, e := stack.KernelRecvFrom(fd, buf, 0)
		if e == unix.EAGAIN && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
			continue
		}
		if e != 0 {
			t.Fatalf("kernel socket, datagram %d: %v", i, e)
		}
		if want := payload(i, max(4, sizes[i%len(sizes)])); !bytes.Equal(buf[:m], want) || src != from {
			t.Fatalf("kernel socket, datagram %d: %d bytes from %v, want %d from %v", i, m, src, len(want), from)
		}
		i++
	}
	if q, _ := c.QueueLen(); q != 0 {
		t.Errorf("%d datagrams still queued", q)
	}
}

// TestSockAddrsIPv6: an AF_INET6 socket that carries IPv4 (IPV6_V6ONLY
// off, on :: or an IPv4-mapped address, with an IPv4-mapped peer) has
// IPv4 addresses; one with IPv6 traffic only has stack.ErrIPv6.
func TestSockAddrsIPv6(t *testing.T) {
	open := func(v6only int, addr string) int {
		t.Helper()
		fd, err := unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Skipf("no IPv6 here: %v", err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, v6only); err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrInet6{Addr: netip.MustParseAddr(addr).As16()}); err != nil {
			t.Skipf("bind %s: %v", addr, err)
		}
		return fd
	}
	port := func(fd int) uint16 {
		sa, _ := unix.Getsockname(fd)
		return uint16(sa.(*unix.SockaddrInet6).Port)
	}
	for _, c := range []struct {
		v6only int
		addr   string
		want   string // the local address, without the port; "" for ErrIPv6
	}{
		{0, "::", "0.0.0.0"},
		{0, "::ffff:127.0.0.1", "127.0.0.1"},
		{1, "::", ""},
		{0, "::1", ""},
	} {
		fd := open(c.v6only, c.addr)
		local, remote, err := stack.SockAddrs(fd)
		switch {
		case c.want == "" && !errors.Is(err, stack.ErrIPv6):
			t.Errorf("[%s] IPV6_V6ONLY %d: %v, %v, %v; want ErrIPv6", c.addr, c.v6only, local, remote, err)
		case c.want != "" && (err != nil || local != netip.AddrPortFrom(netip.MustParseAddr(c.want), port(fd)) || remote.IsValid()):
			t.Errorf("[%s] IPV6_V6ONLY %d: %v, %v, %v; want %s:%d", c.addr, c.v6only, local, remote, err, c.want, port(fd))
		}
	}
	fd := open(0, "::")
	if err := unix.Connect(fd, &unix.SockaddrInet6{Addr: netip.MustParseAddr("::ffff:127.0.0.1").As16(), Port: 9}); err != nil {
		t.Fatal(err)
	}
	if _, remote, err := stack.SockAddrs(fd); err != nil || remote != netip.MustParseAddrPort("127.0.0.1:9") {
		t.Errorf("connected to [::ffff:127.0.0.1]:9: peer %v, %v", remote, err)
	}
	fd = open(0, "::")
	if err := unix.Connect(fd, &unix.SockaddrInet6{Addr: netip.MustParseAddr("::1").As16(), Port: 9}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := stack.SockAddrs(fd); !errors.Is(err, stack.ErrIPv6) {
		t.Errorf("connected to [::1]:9: %v, want ErrIPv6", err)
	}
}

// TestArrivalStamp: a datagram's receive stamp is the time the steering
// program redirected it, as the kernel's is the time it came off the
// device, not the time the stack took it off its ring: read 200 ms after
// it was sent, with no progress engine to take it off earlier, it is
// still within 50 ms of the send, with native XDP and with generic XDP,
// on both beds.
func TestArrivalStamp(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		for _, generic := range []bool{false, true} {
			t.Run(fmt.Sprintf("generic=%v", generic), func(t *testing.T) {
				testArrivalStamp(t, b, generic)
			})
		}
	})
}

func testArrivalStamp(t *testing.T, b *testbed.Bed, generic bool) {
	bed, st := stackOn(t, b, &stack.Options{Steer: &steer.Options{Generic: generic}, ProgressInterval: stack.ProgressNever})
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9001"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetRecvStamp(true)
	k := kernelConn(t, bed, "198.18.0.1:0")
	for i := range 3 {
		if age := stampAge(t, k, c, netip.AddrPortFrom(bed.Addr(testbed.B), 9001), i, 200*time.Millisecond); age < -time.Millisecond || age > 50*time.Millisecond {
			t.Errorf("datagram %d: stamped %v after its send, read 200 ms after it: want the arrival (within 50 ms)", i, age)
		}
	}
	if got := c.Counters.RxOffloadPackets.Load(); got != 3 {
		t.Errorf("RxOffloadPackets = %d, want 3: not offloaded", got)
	}
}

// TestArrivalStampMissing: frames that carry no arrival stamp a second
// after the program began writing them (a driver that gives XDP no
// metadata room) are stamped as they come off the ring, and the stack
// says so once.
func TestArrivalStampMissing(t *testing.T) {
	var log sockperf.SyncBuffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&log, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, &stack.Options{ProgressInterval: stack.ProgressNever})
	c, err := st.ListenUDP(netip.MustParseAddrPort("0.0.0.0:9002"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetRecvStamp(true)
	if err := stack.StopArrivalStamps(st); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond)
	k := kernelConn(t, bed, "198.18.0.1:0")
	for i := range 2 {
		if age := stampAge(t, k, c, netip.AddrPortFrom(bed.Addr(testbed.B), 9002), i, 100*time.Millisecond); age < 100*time.Millisecond {
			t.Errorf("datagram %d: stamped %v after its send with no arrival stamp: want the time it was read", i, age)
		}
	}
	if n := strings.Count(log.String(), "carry no arrival stamp"); n != 1 {
		t.Errorf("the stack said %d times that frames carry no arrival stamp, want once:\n%s", n, log.String())
	}
}

// stampAge sends datagram i from k to dst, reads it on c wait later and
// returns how long after the send its receive stamp is.
func stampAge(t *testing.T, k *net.UDPConn, c *stack.UDPConn, dst netip.AddrPort, i int, wait time.Duration) time.Duration {
	t.Helper()
	sent := time.Now()
	if _, err := k.WriteToUDPAddrPort(payload(i, 64), dst); err != nil {
		t.Fatal(err)
	}
	time.Sleep(wait)
	var meta stack.RecvMeta
	if _, _, _, err := c.RecvFrom(make([]byte, 128), 0, time.Now().Add(time.Second), nil, &meta); err != nil {
		t.Fatalf("datagram %d: %v", i, err)
	}
	return time.Duration(meta.Stamp - sent.UnixNano())
}
