package report_test

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/internal/engine"
	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/internal/record"
	"github.com/vmaxdp/vmaxdp/internal/recordtest"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/report"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// Scenarios with known causes, recorded on a test bed and reported: the
// report must name the cause, with its evidence and advice, as its top
// finding and raise no other error.

// expect checks the top finding and that no other finding is an error.
func expect(t *testing.T, rep *report.Report, rule string, inTitle string, inEvidence ...string) {
	t.Helper()
	if len(rep.Findings) == 0 {
		t.Fatalf("no finding, want %s", rule)
	}
	f := rep.Findings[0]
	if f.Rule != rule || !strings.Contains(f.Title, inTitle) {
		t.Fatalf("top finding %s %q, want %s containing %q", f.Rule, f.Title, rule, inTitle)
	}
	for _, want := range inEvidence {
		found := false
		for _, e := range f.Evidence {
			found = found || strings.Contains(e, want)
		}
		if !found {
			t.Errorf("evidence %q lacks %q", f.Evidence, want)
		}
	}
	if f.Fix == "" || f.Explanation == "" {
		t.Errorf("finding without explanation or fix: %+v", f)
	}
	for _, g := range rep.Findings[1:] {
		if g.Severity == "error" {
			t.Errorf("another error finding: %s %q", g.Rule, g.Title)
		}
	}
}

func TestScenarioClosedPort(t *testing.T) {
	b := testutil.Bed(t, nil)
	const n, port = 50, 9
	data := recordtest.While(t, &record.Options{Probes: probes.Options{
		Probes: recordtest.Select(t, "drops,rx"),
		Filter: probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B), L4Proto: unix.IPPROTO_UDP, DstPort: port},
	}}, func() error { return testutil.SendUDP(b, port, n, 32) })
	rep := recordtest.Report(t, data)
	expect(t, rep, "no_socket", "udp 198.18.0.2:9", "NO_SOCKET: 50 drops at __udp4_lib_rcv", "Udp.NoPorts +50", "from 198.18.0.1")
	if !strings.Contains(rep.Findings[0].Fix, "198.18.0.2:9") {
		t.Errorf("fix does not name the port: %s", rep.Findings[0].Fix)
	}
}

func TestScenarioReceiveBuffer(t *testing.T) {
	b := testutil.Bed(t, nil)
	const port, n = 7000, 200
	var fd int
	err := b.Do(testbed.B, func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: b.Addr(testbed.B).As4()})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	data := recordtest.While(t, &record.Options{Probes: probes.Options{
		Probes: recordtest.Select(t, "drops"),
		Filter: probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B), Port: port},
	}}, func() error { return testutil.SendUDP(b, port, n, 1000) })
	rep := recordtest.Report(t, data)
	// The kernel doubles SO_RCVBUF: 4096 becomes 8192.
	expect(t, rep, "socket_rcvbuf", "udp 198.18.0.2:7000", "SOCKET_RCVBUFF", "sk_rcvbuf 8192", "Udp.RcvbufErrors +")
	if !strings.Contains(rep.Findings[0].Fix, "SO_RCVBUF") || !strings.Contains(rep.Findings[0].Fix, "rmem_max") {
		t.Errorf("fix: %s", rep.Findings[0].Fix)
	}
}

// An application under vmaxdp that never reads: its datagrams hold the
// AF_XDP queue's frames, the fill ring runs dry and the kernel fails the
// steering program's redirects with -ENOMEM. The xdp_redirect_err events
// and the queue's XDP_STATISTICS (which the process publishes, so this
// needs no sock_diag) agree.
func TestScenarioFillRingStarved(t *testing.T) {
	b := testutil.Bed(t, nil)
	const port, n = 7002, 300
	p := params.Defaults()
	p.RxBufs = 128
	engineSockets(t, b, p, port)
	data := recordtest.While(t, &record.Options{StatsDir: p.StatsDir, Probes: probes.Options{
		Probes: recordtest.Select(t, "drops,xdp"),
		Filter: probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B)},
	}}, func() error {
		if err := testutil.SendUDP(b, port, n, 64); err != nil {
			return err
		}
		return waitPublished(p.StatsDir, func(snap *stats.Snapshot) bool {
			return len(snap.Queues) == 1 && snap.Queues[0].Statistics.RxFillRingEmptyDescs > 0
		})
	})
	rep := recordtest.Report(t, data)
	expect(t, rep, "xsk_fill_ring_empty", "fill-ring", "err=-12 on vmxb", "vmaxdp redirected +", "xsk rx_fill_ring_empty_descs +")
	// 64 of the 128 frames prime the fill ring; the rest of the datagrams
	// find none.
	if got := rep.Findings[0].Count; got < n-64-8 || got > n-64 {
		t.Errorf("%d redirect failures, want about %d", got, n-64)
	}
}

// engineSockets starts an engine (counters files in a test directory) and
// opens, binds and offloads a UDP socket on side B for each port, as the
// preload library would, and returns their fds by port; all is closed
// with the test.
func engineSockets(t *testing.T, b *testbed.Bed, p *params.Params, ports ...int) map[int]int {
	t.Helper()
	p.StatsDir = t.TempDir()
	e, err := engine.New(&engine.Options{Params: p, Program: "report.test", Stderr: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.CloseStacks() })
	fds := map[int]int{}
	err = b.Do(testbed.B, func() error {
		for _, port := range ports {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return err
			}
			fds[port] = fd
			t.Cleanup(func() {
				e.Close(fd)
				unix.Close(fd)
			})
			e.Socket(fd, false)
			if err := unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: b.Addr(testbed.B).As4()}); err != nil {
				return err
			}
			if st := e.Bind(fd); st != engine.StateOffloaded {
				return fmt.Errorf("bind: not offloaded: %s: %w", e.Reason(fd), backend.ErrNotSupported)
			}
		}
		return nil
	})
	testutil.SkipIfNotSupported(t, err)
	return fds
}

// waitPublished waits until this process's counters file in dir satisfies
// ok, so that the recorder's last snapshot sees what the test caused.
func waitPublished(dir string, ok func(*stats.Snapshot) bool) error {
	r, err := stats.Open(filepath.Join(dir, stats.FileName(os.Getpid())))
	if err != nil {
		return err
	}
	defer r.Close()
	_, err = testutil.AwaitStats(r, 5*time.Second, ok)
	return err
}

// Traffic for a port vmaxdp does not serve stays on the kernel: the
// report says how much and which flows, as information, not as an error.
func TestScenarioNotOffloaded(t *testing.T) {
	b := testutil.Bed(t, nil)
	const offloaded, kernel, n = 7100, 7101, 100
	var st *stack.Stack
	err := b.Do(testbed.B, func() (err error) {
		st, err = stack.Open(b.Link(testbed.B), &stack.Options{XSK: &xsk.Options{NoHugePages: true}})
		return err
	})
	testutil.SkipIfNotSupported(t, err)
	defer st.Close()
	c, err := st.ListenUDP(netip.AddrPortFrom(b.Addr(testbed.B), offloaded))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var kc *net.UDPConn
	if err := b.Do(testbed.B, func() (err error) {
		kc, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(testbed.B), kernel)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	kc.SetReadBuffer(1 << 20)
	data := recordtest.While(t, &record.Options{Probes: probes.Options{
		Probes: recordtest.Select(t, "drops,rx"),
		Filter: probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B)},
	}}, func() error {
		if err := testutil.SendUDP(b, offloaded, 20, 64); err != nil {
			return err
		}
		return testutil.SendUDP(b, kernel, n, 64)
	})
	rep := recordtest.Report(t, data)
	var f *report.Finding
	for i := range rep.Findings {
		if rep.Findings[i].Severity == "error" {
			t.Errorf("error finding: %s %q", rep.Findings[i].Rule, rep.Findings[i].Title)
		}
		if rep.Findings[i].Rule == "not_offloaded" {
			f = &rep.Findings[i]
		}
	}
	if f == nil {
		t.Fatal("no not_offloaded finding")
	}
	if f.Count < n || !strings.Contains(f.Title, "vmxb") || !strings.Contains(f.Title, "(20 offloaded)") {
		t.Errorf("finding %q (count %d), want >= %d passed and 20 offloaded on vmxb", f.Title, f.Count, n)
	}
	found := false
	for _, e := range f.Evidence {
		found = found || strings.Contains(e, "198.18.0.2:7101 (100)")
	}
	if !found {
		t.Errorf("evidence %q does not name the kernel flow to port %d", f.Evidence, kernel)
	}
}

// An application under vmaxdp that does not read one of its sockets:
// vmaxdp's progress engine moves the socket's datagrams from the AF_XDP
// ring to its queue, which holds up to its byte limit; vmaxdp drops the
// rest, a drop no kernel event shows. The report finds it in the
// process's counters file.
func TestScenarioVmaxdpQueueFull(t *testing.T) {
	b := testutil.Bed(t, nil)
	const slow, n, size, limit = 7004, 300, 64, 4096
	p := params.Defaults()
	p.RxBytesMin = limit
	fds := engineSockets(t, b, p, slow)
	const dropped = n - limit/size
	data := recordtest.While(t, &record.Options{StatsDir: p.StatsDir, Probes: probes.Options{
		Probes: recordtest.Select(t, "drops"),
		Filter: probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B)},
	}}, func() error {
		if err := testutil.SendUDP(b, slow, n, size); err != nil {
			return err
		}
		return waitPublished(p.StatsDir, func(snap *stats.Snapshot) bool {
			for _, sk := range snap.Sockets {
				if sk.FD == fds[slow] {
					return sk.Counters.RxQueueDrops == dropped
				}
			}
			return false
		})
	})
	rep := recordtest.Report(t, data)
	expect(t, rep, "vmaxdp_socket_queue_full", fmt.Sprintf("vmxb/udp 198.18.0.2:%d pid", slow), fmt.Sprintf("rx_queue_drops +%d", dropped),
		fmt.Sprintf("at most %d datagrams, %d payload bytes", limit/size, limit))
	if f := rep.Findings[0]; f.Count != dropped || !strings.Contains(f.Fix, "SO_RCVBUF") || !strings.Contains(f.Fix, "VMAXDP_RX_BYTES_MIN") {
		t.Errorf("finding count %d (want %d), fix %q", f.Count, dropped, f.Fix)
	}
	found := false
	for _, c := range rep.Counters {
		found = found || c.Source == "vmaxdp_socket" && c.Name == "rx_queue_drops" && c.Delta == dropped && c.Netns == recordtest.NetnsInode(t, b, testbed.B)
	}
	if !found {
		t.Errorf("COUNTERS THAT MOVED lacks vmaxdp_socket rx_queue_drops +%d in side B's namespace: %+v", dropped, rep.Counters)
	}
	noted := 0 // the drops happen as the progress engine drains, over intervals
	for _, iv := range rep.Intervals {
		for _, note := range iv.Notes {
			var k int
			if _, err := fmt.Sscanf(note, "vmaxdp dropped %d datagrams of vmxb/udp 198.18.0.2:7004", &k); err == nil {
				noted += k
			}
		}
	}
	if noted != dropped {
		t.Errorf("interval notes name %d of vmaxdp's %d own drops: %+v", noted, dropped, rep.Intervals)
	}
	// The datagrams never reach the kernel's sockets, and neither the
	// engine nor the recorder (which names the process's interfaces each
	// interval) leaves netlink replies to be purged in the namespace.
	if rep.Drops.Total != 0 {
		t.Errorf("%d kernel drops recorded, want none: %+v", rep.Drops.Total, rep.Drops.ByReason)
	}
}
