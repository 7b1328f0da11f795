package main

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// requirePrograms skips the test unless every program is installed.
func requirePrograms(t *testing.T, pkgs string, progs ...string) {
	t.Helper()
	for _, prog := range progs {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("%s is not installed (make deps installs %s)", prog, pkgs)
		}
	}
}

// TestRunCoturn: coturn's TURN server (WebRTC's media relay) under
// vmaxdp, its clients on the kernel. It opens a relay socket for each
// allocation while it runs, and relays between the client and a peer:
// turnutils_uclient's four sessions get back every message they sent
// through it, every socket is offloaded (the listeners and each relay's),
// and side B's kernel takes no UDP datagram.
func TestRunCoturn(t *testing.T) {
	testutil.RequireRoot(t)
	requirePrograms(t, "coturn", "turnserver", "turnutils_uclient", "turnutils_peer")
	b := testutil.Bed(t, &testbed.Options{Plain: true}) // as ip link add makes it
	a, srv := b.Addr(testbed.A).String(), b.Addr(testbed.B).String()
	dir := t.TempDir()
	peer := startOn(t, b, testbed.A, nil, "turnutils_peer", "-L", a, "-p", "3480")
	udpIn := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
	p := startArgv(t, b, []string{"VMAXDP_TRACELEVEL=4"}, tools(t), "run", "--", "turnserver", "-n", "--no-tls", "--no-dtls",
		"-L", srv, "-E", srv, "--relay-ip", srv, "--listening-port", "3478", "--min-port", "49152", "--max-port", "49999",
		"--lt-cred-mech", "--user", "test:pass", "--realm", "vmaxdp.test", "--no-cli", "--log-file", "stdout", "--simple-log",
		"--relay-threads", "2", "--pidfile", filepath.Join(dir, "turnserver.pid"), "--userdb", filepath.Join(dir, "turndb"))
	if err := p.waitFor("offloaded on " + b.Link(testbed.B) + " (udp_receiver " + srv + ":3478"); err != nil {
		t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
	}
	const sessions, messages = 4, 100
	out, err := exec.Command("timeout", "60", "ip", "netns", "exec", b.NSName(testbed.A), "turnutils_uclient", "-u", "test", "-w", "pass",
		"-p", "3478", "-m", strconv.Itoa(sessions), "-n", strconv.Itoa(messages), "-l", "170", "-e", a, "-r", "3480", "-X", "-g", srv).CombinedOutput()
	want := fmt.Sprintf("tot_send_msgs=%d, tot_recv_msgs=%d\n", sessions*messages, sessions*messages)
	if err != nil || !strings.Contains(string(out), want) || !strings.Contains(string(out), "Total lost packets 0 ") {
		t.Errorf("turnutils_uclient: %v: want %q and no loss\n%s", err, want, tail(string(out), 10))
	}
	relays := regexp.MustCompile(`offloaded on `+regexp.QuoteMeta(b.Link(testbed.B))+` \(udp_receiver `+regexp.QuoteMeta(srv)+`:(49\d\d\d)`).
		FindAllString(p.out.String(), -1)
	if len(relays) < sessions {
		t.Errorf("%d relay sockets offloaded, want one for each of %d sessions at least\n%s", len(relays), sessions, tail(p.out.String(), 30))
	}
	if n := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - udpIn; n != 0 {
		t.Errorf("side B's kernel took %d UDP datagrams: not every socket was offloaded", n)
	}
	p.stop()
	syscall.Kill(peer.pid, syscall.SIGTERM)
}

// TestRunKamailio: the Kamailio SIP proxy, as telephony runs it: a main
// process binds the UDP socket and forks the processes that serve it.
// Under vmaxdp it keeps working (SIPp's calls through it all complete,
// and no datagram is dropped) and its log says why the kernel serves the
// socket. One receiving process, so that the proxy itself never swaps
// a call's 180 and 200, which SIPp counts as a failed call.
func TestRunKamailio(t *testing.T) {
	testutil.RequireRoot(t)
	requirePrograms(t, "kamailio sip-tester", "kamailio", "sipp")
	const modules = "/usr/lib/x86_64-linux-gnu/kamailio/modules"
	if _, err := os.Stat(modules); err != nil {
		t.Skipf("kamailio's modules: %v", err)
	}
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	a, srv := b.Addr(testbed.A).String(), b.Addr(testbed.B).String()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "kamailio.cfg")
	err := os.WriteFile(cfg, []byte(fmt.Sprintf(`#!KAMAILIO
debug=1
log_stderror=yes
children=1
listen=udp:%s:5060
mpath="%s"
loadmodule "pv.so"
loadmodule "sl.so"
loadmodule "maxfwd.so"
request_route {
	if (!mf_process_maxfwd_header("10")) { sl_send_reply("483", "Too Many Hops"); exit; }
	$du = "sip:%s:5070";
	forward();
}
`, srv, modules, a)), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p := startArgv(t, b, []string{"VMAXDP_TRACELEVEL=3"}, tools(t), "run", "--", "kamailio", "-DD", "-E", "-m", "64", "-f", cfg,
		"-P", filepath.Join(dir, "kamailio.pid"), "-Y", dir)
	const reason = "shared with a child process after fork"
	if err := p.waitFor(reason); err != nil {
		t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
	}
	drops := func() map[string]int {
		n := map[string]int{}
		for _, side := range []testbed.Side{testbed.A, testbed.B} {
			for _, c := range []string{"InErrors", "RcvbufErrors", "NoPorts"} {
				n[side.String()+" "+c] = testutil.SNMPStat(t, b, side, "Udp", c)
			}
		}
		return n
	}
	uas := startOn(t, b, testbed.A, nil, "sipp", "-sn", "uas", "-i", a, "-p", "5070", "-nostdin")
	dropsBefore := drops()
	const calls = 300
	stat := filepath.Join(dir, "uac.csv")
	out, err := exec.Command("timeout", "60", "ip", "netns", "exec", b.NSName(testbed.A), "sipp", "-sn", "uac", "-i", a, "-p", "5080",
		srv+":5060", "-s", "test", "-r", "100", "-m", strconv.Itoa(calls), "-timeout", "50", "-nostdin", "-trace_stat", "-stf", stat).CombinedOutput()
	if err != nil {
		t.Errorf("sipp uac: %v\n%s", err, tail(string(out), 10))
	}
	got := sippStat(t, stat)
	if got["SuccessfulCall(C)"] != calls || got["FailedCall(C)"] != 0 {
		t.Errorf("SIPp: %d of %d calls successful, %d failed, %d retransmissions", got["SuccessfulCall(C)"], calls, got["FailedCall(C)"], got["Retransmissions(C)"])
	}
	// A retransmission is SIPp's timer (500 ms) running out: a lost
	// datagram, or a process that did not run for that long, which a
	// loaded 2-core machine does now and then. The kernels' UDP drop
	// counters tell them apart.
	if n := got["Retransmissions(C)"]; n > 0 {
		var moved []string
		for k, v := range drops() {
			if d := v - dropsBefore[k]; d > 0 {
				moved = append(moved, fmt.Sprintf("%s %d", k, d))
			}
		}
		if len(moved) > 0 {
			t.Errorf("SIPp retransmitted %d times, and the kernels dropped UDP datagrams: %v", n, moved)
		} else {
			t.Logf("SIPp retransmitted %d times with no UDP datagram dropped: late, not lost", n)
		}
	}
	syscall.Kill(uas.pid, syscall.SIGTERM)
	syscall.Kill(p.pid, syscall.SIGTERM)
	if err := p.exited(); err != nil {
		t.Errorf("kamailio: %v\n%s", err, tail(p.out.String(), 20))
	}
}

// TestRunOpenVPN: an OpenVPN 2.6 tunnel (point to point, static key: UDP
// beside a tun device, which poll() watches with the UDP socket) with side
// B's end under vmaxdp and side A's on the kernel. Pings and an iperf3
// TCP transfer through the tunnel all arrive; the UDP socket is offloaded,
// and side B's kernel takes only what came before its stack opened
// (without vmaxdp it takes every datagram of the tunnel, 80,000 in a
// 3-second transfer).
func TestRunOpenVPN(t *testing.T) {
	testutil.RequireRoot(t)
	requirePrograms(t, "openvpn iperf3", "openvpn", "iperf3")
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no tun device for the tunnel: %v", err)
	}
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	a, srv := b.Addr(testbed.A).String(), b.Addr(testbed.B).String()
	key := filepath.Join(t.TempDir(), "static.key")
	if out, err := exec.Command("openvpn", "--genkey", "secret", key).CombinedOutput(); err != nil {
		t.Fatalf("openvpn --genkey: %v\n%s", err, out)
	}
	common := []string{"--dev", "tun", "--proto", "udp", "--secret", key, "--cipher", "AES-256-CBC", "--verb", "3", "--port", "1194"}
	const tunA, tunB = "10.99.0.1", "10.99.0.2"
	pa := startOn(t, b, testbed.A, nil, append([]string{"openvpn", "--local", a, "--remote", srv, "--ifconfig", tunA, tunB}, common...)...)
	udpIn := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
	pb := startArgv(t, b, nil, append([]string{tools(t), "run", "--", "openvpn", "--local", srv, "--remote", a, "--ifconfig", tunB, tunA}, common...)...)
	for _, p := range []*cProgram{pa, pb} {
		if err := p.waitFor("Initialization Sequence Completed"); err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
	}
	out, err := exec.Command("ip", "netns", "exec", b.NSName(testbed.A), "ping", "-c", "20", "-i", "0.05", "-W", "2", tunB).CombinedOutput()
	if err != nil || !strings.Contains(string(out), " 0% packet loss") {
		t.Errorf("ping through the tunnel: %v\n%s", err, tail(string(out), 3))
	}
	srvp := startOn(t, b, testbed.B, nil, "iperf3", "-s", "-1", "--forceflush", "-B", tunB)
	if err := srvp.waitFor("Server listening"); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command("timeout", "30", "ip", "netns", "exec", b.NSName(testbed.A), "iperf3", "-c", tunB, "-t", "2").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "receiver") {
		t.Errorf("iperf3 through the tunnel: %v\n%s", err, tail(string(out), 5))
	}
	pb.wantSaid(t, "offloaded on "+b.Link(testbed.B))
	if n := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - udpIn; n > 20 {
		t.Errorf("side B's kernel took %d UDP datagrams: the tunnel's socket was not offloaded", n)
	}
	syscall.Kill(pb.pid, syscall.SIGTERM)
	syscall.Kill(pa.pid, syscall.SIGTERM)
}

// sippStat reads the last line of a SIPp statistics file (-trace_stat) by
// its header's names.
func sippStat(t *testing.T, path string) map[string]int {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("SIPp's statistics: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) < 2 {
		t.Fatalf("SIPp's statistics %s: no line after the header", path)
	}
	names, values := strings.Split(lines[0], ";"), strings.Split(lines[len(lines)-1], ";")
	got := map[string]int{}
	for i, name := range names {
		if i < len(values) {
			if v, err := strconv.Atoi(values[i]); err == nil {
				got[name] = v
			}
		}
	}
	return got
}

// TestRunIOUring: a program that receives through io_uring
// (testdata/uringrecv.c, liburing), whose calls vmaxdp cannot see.
//   - udp: a server's socket is offloaded at bind; once the process has
//     made its ring, the engine sees the ring's mapping and hands the
//     socket to the kernel, and says why: the 50 datagrams sent after that
//     all arrive, through side B's kernel. Before, the socket stayed
//     steered to the stack and the server got none of them.
//   - udp-queued: below.
//   - tcp (VMAXDP_TCP=1): a client that makes its ring, then connects:
//     the connection stays on the kernel from its connect on, and the
//     ring reads what side A sends. (Offloaded, its fd would name the
//     mirror, whose bytes are the engine's wake-ups.)
func TestRunIOUring(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := os.Stat("/usr/include/liburing.h"); err != nil {
		t.Skip("liburing-dev is not installed (make deps installs it)")
	}
	prog := buildC(t, "uringrecv", "-luring")
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	const ring = "the process has an io_uring ring"
	t.Run("udp", func(t *testing.T) {
		const port, count = 11470, 50
		p := startC(t, b, prog, nil, b.Addr(testbed.B).String(), strconv.Itoa(port), strconv.Itoa(count))
		for _, line := range []string{"ready", "offloaded on " + b.Link(testbed.B), ring} {
			if err := p.waitFor(line); err != nil {
				t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
			}
		}
		wantKernelServed(t, b, p, port, count)
	})
	// Datagrams that come between the bind and the ring wait in the
	// stack's queue; once the ring is seen they reach it all the same,
	// through the kernel socket, each counted by side B's kernel. Before,
	// they were dropped (and the log said so): the ring got none.
	t.Run("udp-queued", func(t *testing.T) {
		const port, count = 11473, 50
		start := filepath.Join(t.TempDir(), "start")
		p := startC(t, b, prog, nil, b.Addr(testbed.B).String(), strconv.Itoa(port), strconv.Itoa(count), "wait", start)
		wantQueuedServed(t, b, p, start, port, count, count)
	})
	t.Run("tcp", func(t *testing.T) {
		const port, size = 11472, 64 * 50
		ln := listenTCPA(t, b, port)
		p := startC(t, b, prog, []string{"VMAXDP_TCP=1"}, b.Addr(testbed.A).String(), strconv.Itoa(port), strconv.Itoa(size), "tcp")
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := p.waitFor("ready"); err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
		if _, err := c.Write(make([]byte, size)); err != nil {
			t.Fatal(err)
		}
		if err := p.exited(); err != nil {
			t.Errorf("uringrecv: %v\n%s", err, tail(p.out.String(), 20))
		}
		p.wantSaid(t, fmt.Sprintf("got %d\n", size), fmt.Sprintf(">%s: %s", netip.AddrPortFrom(b.Addr(testbed.A), port), ring))
		if strings.Contains(p.out.String(), "offloaded on ") {
			t.Errorf("the connection was offloaded:\n%s", tail(p.out.String(), 20))
		}
	})
}

// TestRunPassFD: a process binds a UDP socket and passes it (SCM_RIGHTS)
// to a worker, which receives on it through the kernel, while the
// process keeps its own copy open (testdata/passfd.c). The socket is
// offloaded at bind and handed to the kernel as it is passed, and the log
// says why: the worker gets all 50 datagrams, through side B's kernel.
// Before, the socket stayed steered to the process's stack and the worker
// got none (a process that closed its copy at once gave it back to the
// kernel then).
//
// queued: 20 datagrams come before the pass and wait in the stack's
// queue; the worker gets them too, through the kernel socket, then 30
// more. Before, they were kept for the process's own reads, which a
// broker never makes: the worker got 30. fork-queued: the same with a
// worker forked once the socket is bound (nsd's way), which inherits it.
func TestRunPassFD(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "passfd")
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	const count = 50
	t.Run("after", func(t *testing.T) {
		const port = 11471
		p := startC(t, b, prog, nil, b.Addr(testbed.B).String(), strconv.Itoa(port), strconv.Itoa(count))
		for _, line := range []string{"offloaded on " + b.Link(testbed.B), "ready"} {
			if err := p.waitFor(line); err != nil {
				t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
			}
		}
		wantKernelServed(t, b, p, port, count)
		p.wantSaid(t, "passed to another process (SCM_RIGHTS)")
	})
	t.Run("queued", func(t *testing.T) {
		const port = 11474
		start := filepath.Join(t.TempDir(), "start")
		p := startC(t, b, prog, nil, b.Addr(testbed.B).String(), strconv.Itoa(port), strconv.Itoa(count), start)
		wantQueuedServed(t, b, p, start, port, 20, count)
		p.wantSaid(t, "passed to another process (SCM_RIGHTS)")
	})
	t.Run("fork-queued", func(t *testing.T) {
		const port = 11475
		start := filepath.Join(t.TempDir(), "start")
		p := startC(t, b, prog, nil, b.Addr(testbed.B).String(), strconv.Itoa(port), strconv.Itoa(count), start, "fork")
		wantQueuedServed(t, b, p, start, port, 20, count)
		p.wantSaid(t, "shared with a child process after fork")
	})
}

// wantQueuedServed: p, whose socket on port is offloaded at its bind,
// prints "bound", and hands the socket to readers vmaxdp does not see
// once the file start exists, then prints "ready". queued datagrams from
// side A come before start, and wait in the stack's queue; count-queued
// after "ready". It wants p to get all count, and side B's kernel to have
// taken each: the queued ones through the kernel socket (said in the
// log).
func wantQueuedServed(t *testing.T, b *testbed.Bed, p *cProgram, start string, port, queued, count int) {
	t.Helper()
	for _, line := range []string{"bound", "offloaded on " + b.Link(testbed.B)} {
		if err := p.waitFor(line); err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
	}
	udpIn := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
	if err := testutil.SendUDP(b, port, queued, 64); err != nil {
		t.Fatal(err)
	}
	// SendUDP returns before side B has received them all when the veth's
	// NAPI is left to ksoftirqd (make test's load): what it redirects
	// after the hand-back goes to the kernel socket, rightly, but outside
	// the log's count. The steering program's count says when they all
	// wait in the stack's queue.
	pr := waitProgram(t, tools(t), "", p.pid, b.Link(testbed.B), func(pr *stats.Program) bool {
		return pr.Counters.Redirected >= uint64(queued)
	})
	if pr.Counters.Redirected != uint64(queued) {
		t.Fatalf("the steering program redirected %d datagrams, want the %d sent\n%s", pr.Counters.Redirected, queued, tail(p.out.String(), 20))
	}
	if err := os.WriteFile(start, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A forked worker may say "ready" before its parent has handed the
	// socket back: the rest is sent once the log says it has.
	for _, line := range []string{"ready", "datagrams it had queued are handed to its kernel socket"} {
		if err := p.waitFor(line); err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
	}
	if count > queued {
		if err := testutil.SendUDP(b, port, count-queued, 64); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.exited(); err != nil {
		t.Errorf("%v\n%s", err, tail(p.out.String(), 20))
	}
	p.wantSaid(t, fmt.Sprintf("got %d\n", count), fmt.Sprintf("the %d datagrams it had queued are handed to its kernel socket", queued))
	if n := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - udpIn; n != count {
		t.Errorf("side B's kernel took %d UDP datagrams, want the %d sent", n, count)
	}
}

// wantKernelServed sends count datagrams from side A to port on side B,
// where p receives them through the kernel, and wants p to end well,
// saying it got them all, and side B's kernel to have taken each.
func wantKernelServed(t *testing.T, b *testbed.Bed, p *cProgram, port, count int) {
	t.Helper()
	udpIn := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
	if err := testutil.SendUDP(b, port, count, 64); err != nil {
		t.Fatal(err)
	}
	if err := p.exited(); err != nil {
		t.Errorf("%v\n%s", err, tail(p.out.String(), 20))
	}
	p.wantSaid(t, fmt.Sprintf("got %d\n", count))
	if n := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - udpIn; n != count {
		t.Errorf("side B's kernel took %d UDP datagrams, want the %d sent: the socket was not handed to it", n, count)
	}
}
