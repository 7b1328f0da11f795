package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/apps"
	"github.com/vmaxdp/vmaxdp/internal/sockperf"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunApps: unmodified programs from Debian that were not written with
// vmaxdp in mind (knot, unbound, dnsmasq and nsd driven by dnsperf, iperf3
// with 64 and 1400 B datagrams, memcached's UDP protocol driven by
// memcaslap), with vmaxdp under the server, the client and both, against
// the kernel on the other side, on a plain bed (as `ip link add` makes it)
// and on a tuned one. Every run must lose nothing (the load is paced where
// the generator can be, so that the kernel loses nothing either); an
// offloaded side must say so in its log and the kernel must have delivered
// (nearly) nothing in its namespace, so a silent fall-back fails; nsd,
// which forks its servers after opening its sockets, must be served by
// the kernel and say why. knot and unbound run a second time with two
// threads, whose sockets are a SO_REUSEPORT group: each must be served
// offloaded.
func TestRunApps(t *testing.T) {
	testutil.RequireRoot(t)
	vmaxdp := tools(t)
	list := installed(t, apps.All)
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		for _, a := range list {
			for _, p := range placements[1:] {
				t.Run(a.Name+"/"+p.name, func(t *testing.T) { runApp(t, vmaxdp, b, a, p) })
			}
		}
	})
}

// TestRunSharedEphemeralPort: a program whose UDP sockets set
// SO_REUSEADDR and send without binding (memcaslap's 16) gets a port of
// its own for each under vmaxdp, where the kernel's autobind may give
// two of them one port and deliver the answers of both to one socket
// (memcaslap then aborts on an answer it did not ask for). The client's
// namespace has 16 ephemeral ports, so the kernel would share one almost
// surely; under vmaxdp every socket must be offloaded and the run
// complete.
func TestRunSharedEphemeralPort(t *testing.T) {
	testutil.RequireRoot(t)
	vmaxdp := tools(t)
	a, _ := apps.ByName("memcached")
	installed(t, []*apps.App{a})
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	const low, high = 40000, 40015
	if out, err := exec.Command("ip", "netns", "exec", b.NSName(testbed.A), "sysctl", "-w",
		fmt.Sprintf("net.ipv4.ip_local_port_range=%d %d", low, high)).CombinedOutput(); err != nil {
		t.Fatalf("sysctl in %s: %v: %s", b.NSName(testbed.A), err, out)
	}
	run := &apps.Run{Bed: b, App: a, Vmaxdp: vmaxdp, ClientOffload: true,
		Duration: time.Second, Paced: true, Env: []string{"VMAXDP_TRACELEVEL=4"}}
	res, _, err := run.Do(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%.0f %s, sent %d, lost %d", res.Rate, a.Unit, res.Sent, res.Lost)
	if strings.Contains(res.Output, "not offloaded") {
		t.Errorf("a socket of the client stayed on the kernel:\n%s", tail(res.Output, 30))
	}
	ports := map[string]bool{}
	for _, m := range reSender.FindAllStringSubmatch(res.Output, -1) {
		if ports[m[1]] {
			t.Errorf("two sockets offloaded on port %s", m[1])
		}
		ports[m[1]] = true
	}
	if len(ports) != 16 {
		t.Errorf("%d sockets offloaded with a port of their own, want memcaslap's 16:\n%s", len(ports), tail(res.Output, 40))
	}
}

// reSender finds the port of each socket the engine offloaded at its
// first send.
var reSender = regexp.MustCompile(`offloaded on \S+ \(udp_sender 0\.0\.0\.0:(\d+)>`)

// nonZero counts the fds of m with a count above zero.
func nonZero(m map[int]int64) int {
	n := 0
	for _, v := range m {
		if v > 0 {
			n++
		}
	}
	return n
}

// installed are the applications of list whose programs are installed;
// the test skips when there are none.
func installed(t *testing.T, list []*apps.App) []*apps.App {
	var have []*apps.App
	for _, a := range list {
		if miss := a.Missing(); miss != "" {
			t.Logf("%s skipped: not installed: %s", a.Name, miss)
			continue
		}
		have = append(have, a)
	}
	if len(have) == 0 {
		t.Skip("none of the applications is installed (make deps installs them)")
	}
	return have
}

func runApp(t *testing.T, vmaxdp string, b *testbed.Bed, a *apps.App, p placement) {
	before := [2]int{udpInDatagrams(t, b, testbed.A), udpInDatagrams(t, b, testbed.B)}
	overflows := kernelOverflows(t, b, p)
	run := &apps.Run{Bed: b, App: a, Vmaxdp: vmaxdp, ServerOffload: p.server, ClientOffload: p.client,
		Duration: time.Second, Paced: true, Env: []string{"VMAXDP_TRACELEVEL=4", "VMAXDP_FIRST_SEND_WAIT=0"}}
	res, srvLog, err := run.Do(context.Background())
	if errors.Is(err, apps.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if res.Repeated != "" {
		t.Log(res.Repeated)
	}
	kernel := [2]int{udpInDatagrams(t, b, testbed.A) - before[0], udpInDatagrams(t, b, testbed.B) - before[1]}
	t.Logf("%.0f %s, sent %d, lost %d; the kernel delivered %d datagrams on the client's side, %d on the server's", res.Rate, a.Unit, res.Sent, res.Lost, kernel[0], kernel[1])
	if res.Sent == 0 || res.Rate == 0 {
		t.Fatalf("no load went through:\n%s\nthe server's output and log (offloaded datagrams per fd: %v):\n%s", res.Output, res.ServerRx, tail(srvLog, 40))
	}
	if res.Lost != 0 {
		// A receiver whose socket overflowed lost what the kernel loses
		// (make test runs packages side by side on two cores, and the
		// program gets less of them): on the kernel, its receive buffer
		// (Udp RcvbufErrors); offloaded, its queue, over a limit no
		// lower than SO_RCVBUF's (the close report's "Rx pkt" drops), or
		// at its AF_XDP socket's RX ring, full or out of buffers (the
		// report's "Rx ring" line), whose 2,048 frames hold more
		// datagrams than the kernel's default receive buffer.
		own := kernelOverflows(t, b, p) - overflows
		if own+int(res.QueueDrops+res.RingDrops) >= int(res.Lost) {
			t.Logf("%d of %d lost by full receivers: %d receive buffer overflows on the kernel's side, %d datagrams over an offloaded socket's limit, %d dropped at a full RX ring", res.Lost, res.Sent, own, res.QueueDrops, res.RingDrops)
		} else {
			t.Errorf("%d of %d lost (the kernel side's sockets overflowed %d times, the offloaded ones dropped %d over their limit, their RX rings %d); the offloaded sockets and queues at the end:\n%s", res.Lost, res.Sent, own, res.QueueDrops, res.RingDrops, res.Reports)
		}
	}
	// The client's side receives the answers, the server's the requests
	// (iperf3: the datagrams; its control connection is TCP).
	if p.server {
		switch {
		case a.Forks:
			if !strings.Contains(srvLog, "shared with a child process after fork") {
				t.Errorf("%s forks after opening its sockets: the log must say why they stay on the kernel:\n%s", a.Name, tail(srvLog, 30))
			}
		case !strings.Contains(srvLog, "offloaded on "+b.Link(testbed.B)):
			t.Errorf("the server's log says nothing of offload:\n%s", tail(srvLog, 30))
		case kernel[1] > kernelBudget(int(res.Sent), openTime(t, srvLog), run.Duration):
			// A socket is served by the kernel until its stack has
			// opened (tens of milliseconds, more while the client opens
			// its own, over 100 ms at times while other tests' namespaces
			// hold the RTNL lock XDP's attach needs): a silent fall-back
			// would be all of them.
			t.Errorf("the kernel delivered %d datagrams in the server's namespace for %d sent, its stack open in %v: not offloaded\n%s", kernel[1], res.Sent, openTime(t, srvLog), tail(srvLog, 30))
		}
		// A SO_REUSEPORT group: every thread's socket served its share.
		if a.Group > 1 {
			t.Logf("offloaded datagrams per fd of the server: %v", res.ServerRx)
			if serving := nonZero(res.ServerRx); serving < a.Group {
				t.Errorf("%d sockets of the server received offloaded datagrams (per fd: %v), want all %d of its SO_REUSEPORT group", serving, res.ServerRx, a.Group)
			}
		}
	}
	if p.client {
		if !strings.Contains(res.Output, "offloaded on "+b.Link(testbed.A)) {
			t.Errorf("the client's log says nothing of offload:\n%s", tail(res.Output, 30))
		}
		// The client's socket is decided at its first send, and its kernel
		// socket serves it while the stack opens (VMAXDP_FIRST_SEND_WAIT=0,
		// the default): a client process per connection (quic-ngtcp2)
		// has that window at every connection.
		got := int(res.Sent) * max(a.Datagrams, 1)
		if open := openTime(t, res.Output); !a.OneWay && kernel[0] > kernelBudget(got, open, run.Duration) {
			t.Errorf("the kernel delivered %d datagrams in the client's namespace for %d it received, its stack open in %v: not offloaded\n%s", kernel[0], got, open, tail(res.Output, 30))
		}
	}
}

// kernelBudget is what the kernel may deliver of n datagrams that came
// in d to a side under vmaxdp whose stack took open to open: the share
// that came meanwhile, and a tenth.
func kernelBudget(n int, open, d time.Duration) int {
	return n/10 + int(float64(n)*min(open.Seconds()/d.Seconds(), 1))
}

// kernelOverflows counts the receive buffer overflows (Udp
// RcvbufErrors) of the sides of p that the kernel serves.
func kernelOverflows(t *testing.T, b *testbed.Bed, p placement) int {
	n := 0
	if !p.client {
		n += testutil.UDPStat(t, b, testbed.A, "RcvbufErrors")
	}
	if !p.server {
		n += testutil.UDPStat(t, b, testbed.B, "RcvbufErrors")
	}
	return n
}

// openTime is how long the first stack of a vmaxdp log took to open
// (engine.newStack logs it), 0 when it says nothing of it; a time that
// does not parse fails the test, for a budget silently left without it
// fails only at times.
var reOpenTime = regexp.MustCompile(`XDP \S+, \d+ queues, open in ([^,\s]+)`)

func openTime(t *testing.T, log string) time.Duration {
	m := reOpenTime.FindStringSubmatch(log)
	if m == nil {
		return 0
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		t.Errorf("the log's open time %q: %v", m[0], err)
	}
	return d
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestRunDnsmasqForkKeepsUDP: dnsmasq (Debian's, not written with vmaxdp
// in mind) answers a query over TCP in a child it forks; its UDP socket,
// which its poll loop serves, stays offloaded across those forks (the log
// says so): the queries over UDP after them do not reach the kernel's
// stack (its Udp InDatagrams does not move). Kernel client (dnsperf),
// default settings (no TCP offload), both beds.
func TestRunDnsmasqForkKeepsUDP(t *testing.T) {
	testutil.RequireRoot(t)
	for _, prog := range []string{"dnsmasq", "dnsperf"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("%s is not installed (make deps installs it)", prog)
		}
	}
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		dir := t.TempDir()
		logFile := filepath.Join(dir, "vmaxdp.log")
		queries := filepath.Join(dir, "queries")
		if err := os.WriteFile(queries, []byte("host.example.com A\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		p := startArgv(t, b, []string{"VMAXDP_LOG_FILE=" + logFile}, tools(t), "run", "--",
			"dnsmasq", "-k", "--conf-file=/dev/null", "--port=53", "--no-resolv", "--no-hosts", "--user=root",
			"--pid-file=", "--address=/example.com/198.18.0.10")
		p.waitOffloaded(t)
		dnsperf := func(n int, mode string) {
			t.Helper()
			out, err := exec.Command("ip", "netns", "exec", b.NSName(testbed.A), "dnsperf", "-s", b.Addr(testbed.B).String(),
				"-d", queries, "-n", strconv.Itoa(n), "-m", mode, "-t", "2").CombinedOutput()
			want := fmt.Sprintf("Queries completed:    %d ", n)
			// dnsperf 2.10 over TCP once counted its first query timed
			// out 4 ms into the run, then took the answer as one "with an
			// unexpected (maybe timed out) id": the TCP queries are there
			// for the children dnsmasq forks, and an answered one is its
			// own proof.
			if mode == "tcp" && strings.Contains(string(out), "unexpected (maybe timed out) id") {
				want = fmt.Sprintf("Queries completed:    %d ", n-1)
			}
			if err != nil || !strings.Contains(string(out), want) {
				log, _ := os.ReadFile(logFile)
				t.Fatalf("dnsperf -n %d -m %s: %v\n%s\nvmaxdp's log:\n%s", n, mode, err, out, tail(string(log), 20))
			}
		}
		dnsperf(100, "udp")
		dnsperf(5, "tcp") // a child per connection
		before := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
		dnsperf(1000, "udp")
		kernel := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - before
		log, _ := os.ReadFile(logFile)
		if !strings.Contains(string(log), "udp socket stays offloaded across fork") {
			t.Errorf("the log does not say the UDP socket stayed offloaded across the forks:\n%s", tail(string(log), 20))
		}
		if kernel != 0 {
			t.Errorf("the kernel in dnsmasq's namespace received %d of the 1000 queries after the forks: not offloaded\n%s", kernel, tail(string(log), 20))
		}
	})
}

// TestRunSpoofedSources: queries to a DNS server under vmaxdp (dnsmasq,
// Debian's) from addresses of its subnet that nobody holds do not stall
// it: each answer goes through the kernel socket, which queues it beside
// its ARP request and drops it when nobody answers, as it does its own
// (the stack counts each such neighbour, neigh_unresolved). A load
// generator's queries sent meanwhile are all answered, offloaded: the
// kernel in the server's namespace receives none and sends only the
// answers the socket's counters say it sent. Before, the server's thread
// waited for ARP up to a second per spoofed address, and dnsperf's
// queries timed out.
func TestRunSpoofedSources(t *testing.T) {
	testutil.RequireRoot(t)
	for _, prog := range []string{"dnsmasq", "dnsperf"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("%s is not installed (make deps installs it)", prog)
		}
	}
	vmaxdp := tools(t)
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		// The kernel gives up after three requests 100 ms apart (a
		// second apart by default), so that the drops come soon.
		testutil.ARPRetrans(t, b, testbed.B, 100*time.Millisecond)
		dir := t.TempDir()
		logFile := filepath.Join(dir, "vmaxdp.log")
		queries := filepath.Join(dir, "queries")
		if err := os.WriteFile(queries, []byte("host.example.com A\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		p := startArgv(t, b, []string{"VMAXDP_LOG_FILE=" + logFile, "VMAXDP_STATS_DIR=" + dir}, vmaxdp, "run", "--",
			"dnsmasq", "-k", "--conf-file=/dev/null", "--port=53", "--no-resolv", "--no-hosts", "--user=root",
			"--pid-file=", "--address=/example.com/198.18.0.10")
		if err := sockperf.WaitOffloaded(context.Background(), dir, p.pid, 10*time.Second, true); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		server := netip.AddrPortFrom(b.Addr(testbed.B), 53)
		query := []byte("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x04host\x07example\x03com\x00\x00\x01\x00\x01")
		const spoofed = 12
		outBefore := testutil.SNMPStat(t, b, testbed.B, "Udp", "OutDatagrams")
		inBefore := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
		err := b.Do(testbed.A, func() error {
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			frame := make([]byte, header.UDPHeadersLen+len(query))
			for i := range spoofed {
				src := b.Addr(testbed.A).As4()
				src[3] = byte(100 + i)
				copy(frame[header.UDPHeadersLen:], query)
				n := header.BuildUDP(frame, &header.UDPFields{Src: netip.AddrPortFrom(netip.AddrFrom4(src), 5353), Dst: server, TTL: 64}, len(query))
				if err := unix.Sendto(fd, frame[header.EthernetLen:n], 0, &unix.SockaddrInet4{Addr: server.Addr().As4()}); err != nil {
					return fmt.Errorf("query from %v: %w", netip.AddrFrom4(src), err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		const n = 200
		start := time.Now()
		out, err := exec.Command("ip", "netns", "exec", b.NSName(testbed.A), "dnsperf", "-s", server.Addr().String(),
			"-d", queries, "-n", strconv.Itoa(n), "-t", "2").CombinedOutput()
		took := time.Since(start)
		if want := fmt.Sprintf("Queries completed:    %d ", n); err != nil || !strings.Contains(string(out), want) {
			log, _ := os.ReadFile(logFile)
			t.Fatalf("dnsperf -n %d after %d queries from addresses nobody holds (%v): %v\n%s\nvmaxdp's log:\n%s", n, spoofed, took, err, out, tail(string(log), 20))
		}
		pr := waitProgram(t, vmaxdp, dir, p.pid, b.Link(testbed.B), func(pr *stats.Program) bool {
			return pr.Stack.NeighUnresolved >= spoofed
		})
		sk := offloadedSocket(snapshotJSON(t, vmaxdp, dir, p.pid))
		kernelSent := testutil.SNMPStat(t, b, testbed.B, "Udp", "OutDatagrams") - outBefore
		t.Logf("dnsperf's %d queries answered in %v; neighbours unresolved %d; answers offloaded %d, through the kernel socket %d (the kernel's count %d)",
			n, took, pr.Stack.NeighUnresolved, sk.Counters.TxOffloadPackets, sk.Counters.TxOSPackets, kernelSent)
		if pr.Stack.NeighUnresolved != spoofed {
			t.Errorf("neighbours unresolved: %d, want %d", pr.Stack.NeighUnresolved, spoofed)
		}
		if sk.Counters.TxOSPackets < spoofed || sk.Counters.TxOffloadPackets+sk.Counters.TxOSPackets != n+spoofed {
			t.Errorf("answers: %d offloaded, %d through the kernel socket; want %d in all, the %d to addresses nobody holds through the kernel", sk.Counters.TxOffloadPackets, sk.Counters.TxOSPackets, n+spoofed, spoofed)
		}
		if kernelSent != int(sk.Counters.TxOSPackets) {
			t.Errorf("the kernel in dnsmasq's namespace sent %d datagrams, its socket's counters say %d went through it", kernelSent, sk.Counters.TxOSPackets)
		}
		if d := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - inBefore; d != 0 {
			t.Errorf("the kernel in dnsmasq's namespace received %d datagrams: queries went through it", d)
		}
	})
}

// TestOpenTime reads the open time off the line engine.newStack logs (a
// comma follows it).
func TestOpenTime(t *testing.T) {
	line := "vmaxdp DEBUG  : Pid:  2174 Tid:  2180 : vmxa: XDP native, 1 queues, open in 121ms, UDP checksums of sent datagrams completed by the kernel (TX metadata), backend AF_XDP (auto)"
	if got := openTime(t, line); got != 121*time.Millisecond {
		t.Errorf("openTime = %v, want 121ms", got)
	}
	if got := openTime(t, "fd 10: udp socket"); got != 0 {
		t.Errorf("openTime of a log without it = %v, want 0", got)
	}
}
