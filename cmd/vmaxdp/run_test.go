package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/internal/sockperf"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/testbed"
)

func TestMain(m *testing.M) {
	// Most tests check that an offloaded side's kernel sent and delivered
	// nothing, from the first datagram: their programs' first sends wait
	// for the stack, as the latency profile's do. TestRunApps runs on the
	// default, where the kernel socket sends until the stack is open.
	os.Setenv("VMAXDP_FIRST_SEND_WAIT", "1000")
	code := testutil.Main(m)
	if toolsDir != "" {
		os.RemoveAll(toolsDir)
	}
	os.Exit(code)
}

var (
	toolsOnce sync.Once
	toolsDir  string
	toolsErr  error
)

// tools builds vmaxdp and libvmaxdp.so side by side with make build, whose
// link flags the library needs (preload/main.go), once per test binary.
func tools(t testing.TB) (vmaxdp string) {
	t.Helper()
	toolsOnce.Do(func() {
		if toolsDir, toolsErr = os.MkdirTemp("", "vmaxdp-run-test-"); toolsErr != nil {
			return
		}
		cmd := exec.Command("make", "-s", "-C", "../..", "build", "BIN="+toolsDir)
		if out, err := cmd.CombinedOutput(); err != nil {
			toolsErr = fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, out)
		}
	})
	if toolsErr != nil {
		t.Fatal(toolsErr)
	}
	return filepath.Join(toolsDir, "vmaxdp")
}

// buildC builds testdata/NAME.c, linked with libs (-lfoo), with
// _FORTIFY_SOURCE, as Debian builds its packages (dpkg-buildflags): such
// a program calls the checking variants of some calls (__read_chk,
// __poll_chk, ...), which must reach the engine too.
func buildC(t testing.TB, name string, libs ...string) string {
	t.Helper()
	prog := filepath.Join(t.TempDir(), name)
	args := append([]string{"-O2", "-D_FORTIFY_SOURCE=2", "-Wall", "-pthread", "-o", prog, "testdata/" + name + ".c"}, libs...)
	if out, err := exec.Command("cc", args...).CombinedOutput(); err != nil {
		t.Skipf("no C compiler to build the test program: %v\n%s", err, out)
	}
	return prog
}

// cProgram is a C test program running under vmaxdp run in side B of a bed.
type cProgram struct {
	out  *sockperf.SyncBuffer
	done chan error
	pid  int // the program's: ip netns exec, prlimit and vmaxdp run exec it
}

// waitOffloaded waits until the program has bound a socket and decided
// its sockets: a socket's stack opens after its bind returns
// (engine.stackOrWait).
func (p *cProgram) waitOffloaded(t *testing.T) {
	t.Helper()
	if err := sockperf.WaitOffloaded(context.Background(), "", p.pid, 10*time.Second, true); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
}

// startC starts prog with args under vmaxdp run in b's side B, env added
// to the environment, for at most 30 s.
func startC(t *testing.T, b *testbed.Bed, prog string, env []string, args ...string) *cProgram {
	t.Helper()
	return startArgv(t, b, env, append([]string{tools(t), "run", "--", prog}, args...)...)
}

// startArgv starts argv in b's side B, env added to the environment, for
// at most 30 s.
func startArgv(t *testing.T, b *testbed.Bed, env []string, argv ...string) *cProgram {
	t.Helper()
	return startOn(t, b, testbed.B, env, argv...)
}

// startOn starts argv in b's side, env added to the environment, for at
// most 30 s.
func startOn(t *testing.T, b *testbed.Bed, side testbed.Side, env []string, argv ...string) *cProgram {
	t.Helper()
	return startFor(t, b, side, 30*time.Second, env, argv...)
}

// startFor starts argv in b's side, env added to the environment, and
// kills it after limit.
func startFor(t *testing.T, b *testbed.Bed, side testbed.Side, limit time.Duration, env []string, argv ...string) *cProgram {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", b.NSName(side)}, argv...)...)
	cmd.Env = append(append(os.Environ(), "VMAXDP_TRACELEVEL=4"), env...)
	p := &cProgram{out: &sockperf.SyncBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	// The program and whatever it forks are one process group, killed
	// together; Wait returns even if a straggler holds the output open.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p.pid = cmd.Process.Pid
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cancel()
		<-p.done
		p.done <- nil
		// A program killed here leaves its stats file behind: only its
		// own exit removes it.
		os.Remove(filepath.Join(params.Defaults().StatsDir, stats.FileName(p.pid)))
	})
	return p
}

// startReceiver starts argv, a UDP receiver, in b's side B for at most
// limit, and returns once it is ready: under vmaxdp (under) once its
// socket on laddr is offloaded, on the kernel once a socket is bound to
// laddr's port and, when group is valid, the namespace is a member of it.
func startReceiver(t *testing.T, b *testbed.Bed, limit time.Duration, under bool, laddr netip.AddrPort, group netip.Addr, argv ...string) *cProgram {
	t.Helper()
	r := startFor(t, b, testbed.B, limit, nil, argv...)
	var err error
	if under {
		err = r.waitFor("offloaded on " + b.Link(testbed.B) + " (udp_receiver " + laddr.String())
	} else {
		err = waitUDPBound(b, testbed.B, int(laddr.Port()), group)
	}
	if err != nil {
		t.Fatalf("%s: %v\n%s", argv[0], err, tail(r.out.String(), 20))
	}
	return r
}

// waitUDPBound waits up to 10 s for a kernel socket of side's namespace
// bound to port and, when group is valid, for the namespace's membership
// of it: a receiver on the kernel says nothing when it is ready.
func waitUDPBound(b *testbed.Bed, side testbed.Side, port int, group netip.Addr) error {
	hexPort := fmt.Sprintf(":%04X ", port)
	var hexGroup string
	if group.IsValid() {
		g := group.As4()
		hexGroup = fmt.Sprintf("%02X%02X%02X%02X", g[3], g[2], g[1], g[0]) // /proc/net/igmp's byte order
	}
	read := func(f string) string {
		out, _ := exec.Command("ip", "netns", "exec", b.NSName(side), "cat", f).Output()
		return string(out)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(read("/proc/net/udp"), hexPort) && (hexGroup == "" || strings.Contains(read("/proc/net/igmp"), hexGroup)) {
			return nil
		}
	}
	if hexGroup != "" {
		return fmt.Errorf("%s: no UDP socket on port %d and membership of %s within 10 s", b.NSName(side), port, group)
	}
	return fmt.Errorf("%s: no UDP socket on port %d within 10 s", b.NSName(side), port)
}

// waitFor waits up to 10 s for the program to print line.
func (p *cProgram) waitFor(line string) error { return p.waitForN(line, 1) }

// waitForN waits up to 10 s for the program to print line n times, in
// whatever its log writes between them.
func (p *cProgram) waitForN(line string, n int) error {
	for deadline := time.Now().Add(10 * time.Second); strings.Count(p.out.String(), line) < n; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("program printed %q %d times, want %d", line, strings.Count(p.out.String(), line), n)
		}
	}
	return nil
}

// wantSaid checks that the program's output (its own and vmaxdp's log)
// holds each of wants, showing its last lines when one is missing.
func (p *cProgram) wantSaid(t *testing.T, wants ...string) {
	t.Helper()
	out := p.out.String()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, tail(out, 30))
		}
	}
}

// gone says how the program exited, or "" while it runs.
func (p *cProgram) gone() string {
	select {
	case err := <-p.done:
		p.done <- err
		return fmt.Sprintf("the program exited (%v)", err)
	default:
		return ""
	}
}

// exited waits for the program to exit and returns how it did.
func (p *cProgram) exited() error {
	err := <-p.done
	p.done <- err
	return err
}

// stop ends the program and what it forked, SIGTERM first, and waits for
// it to exit.
func (p *cProgram) stop() {
	syscall.Kill(-p.pid, syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(5 * time.Second):
		syscall.Kill(-p.pid, syscall.SIGKILL)
		p.exited()
	}
}

// wait waits for the program to exit and checks that its socket was
// offloaded (as fd 3: vmaxdp must not shift the application's fd
// numbers) and that each of checks printed "ok CHECK".
func (p *cProgram) wait(t *testing.T, b *testbed.Bed, checks ...string) {
	t.Helper()
	err := p.exited()
	log := p.out.String()
	if !strings.Contains(log, "fd 3: offloaded on "+b.Link(testbed.B)) {
		t.Errorf("the socket was not offloaded as fd 3: the checks did not reach the engine")
	}
	for _, check := range checks {
		if !regexp.MustCompile(`(?m)^ok ` + regexp.QuoteMeta(check) + `\b`).MatchString(log) {
			t.Errorf("check %s did not pass", check)
		}
	}
	if err != nil || t.Failed() {
		t.Errorf("program: %v\n%s", err, log)
	}
}

// sendFromA sends each of msgs from side A to port on side B.
func sendFromA(t *testing.T, b *testbed.Bed, port int, msgs ...string) {
	t.Helper()
	err := b.Do(testbed.A, func() error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(testbed.B), uint16(port))))
		if err != nil {
			return err
		}
		defer c.Close()
		for _, m := range msgs {
			if _, err := c.Write([]byte(m)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRunRefusesBadInput: vmaxdp run checks parameters and the rules file
// before it starts the program, and names what is wrong and where.
func TestRunRefusesBadInput(t *testing.T) {
	vmaxdp := tools(t)
	conf := filepath.Join(t.TempDir(), "rules.conf")
	os.WriteFile(conf, []byte("# fine\nuse vmaxdp udp_receiver *:*\nuse fast udp_receiver *:1\n"), 0o644)
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"VMAXDP_RX_POLL=lots"}, []string{"true"}, `VMAXDP_RX_POLL: "lots" is not an integer`},
		{[]string{"VMAXDP_TRACELEVEL=9"}, []string{"true"}, "VMAXDP_TRACELEVEL: 9 is out of range 0..6"},
		{nil, []string{"-config", conf, "true"}, conf + `:3: syntax error: transport "fast"`},
		{nil, []string{"-config", "/nonexistent/rules.conf", "true"}, "no such file"},
		{[]string{"VMAXDP_LIB=/nonexistent/lib.so"}, []string{"true"}, "preload library"},
		{[]string{"VMAXDP_BACKEND=dpdk"}, []string{"true"}, `VMAXDP_BACKEND: "dpdk": want auto, xdp or verbs`},
		{[]string{"VMAXDP_BACKEND=verbs"}, []string{"-interface", "lo", "true"}, "VMAXDP_BACKEND=verbs: no interface can use it: interface lo: no RDMA device behind it"},
		{nil, []string{"/nonexistent/program"}, "no such file"},
	} {
		cmd := exec.Command(vmaxdp, append([]string{"run"}, c.args...)...)
		cmd.Env = append(os.Environ(), c.env...)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%v run %v: err %v, output %q; want an error containing %q", c.env, c.args, err, out, c.want)
		}
	}
	// The engine checks the same at start-up when preloaded without vmaxdp run.
	cmd := exec.Command("true")
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+filepath.Join(toolsDir, libName), "VMAXDP_CONFIG_FILE="+conf)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), conf+":3") {
		t.Errorf("LD_PRELOAD with a bad rules file: err %v, output %q; want exit 1 naming %s:3", err, out, conf)
	}
}

// udpInDatagrams reads Udp InDatagrams of a namespace: what the kernel
// delivered to its sockets.
func udpInDatagrams(t *testing.T, b *testbed.Bed, s testbed.Side) int {
	t.Helper()
	return testutil.UDPStat(t, b, s, "InDatagrams")
}

func requireSockperf(t *testing.T) {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("sockperf"); err != nil {
		t.Skip(sockperf.ErrNotInstalled)
	}
}

// TestRunSockperf is the proof of vmaxdp run: unmodified sockperf, server
// and client in two namespaces, each I/O mode, blocking and not, unicast
// and multicast, small and full-size messages, one side or both under
// vmaxdp. Every run must end with no message dropped, duplicated or out of
// order; an offloaded side must say so in its log, and an offloaded server
// must have received (nearly) nothing through the kernel.
//
// The ping-pongs run here, their two beds side by side (sockperf sleeps
// 2 s between warm-up and measurement; one message in flight loses
// nothing to a busy core); the rates, which count every message, run in
// TestRunSockperfRates with nothing beside them: here, one bed's rate ran
// as the other bed was torn down, and its server lost 276 of 50,023
// datagrams at an RX ring starved of buffers.
func TestRunSockperf(t *testing.T) {
	requireSockperf(t)
	vmaxdp := tools(t)
	testutil.EachBedParallel(t, nil, func(t *testing.T, b *testbed.Bed) { runSockperfCases(t, vmaxdp, b, false) })
}

// TestRunSysmonBatch: with VMAXDP_SYSMON_BATCH=1 (the latency profile
// sets it), the application's Go sysmon thread runs SCHED_BATCH (package
// sysmon: its wake-ups took a polling thread's CPU, sockperf ping-pong's
// p99 14-23 us against the kernel's 5-7), and no other thread of the
// application changes policy, those sysmon creates included; by default
// no thread does. sockperf's server polls under vmaxdp, its client on
// side A's kernel.
func TestRunSysmonBatch(t *testing.T) {
	requireSockperf(t)
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	srv := b.Addr(testbed.B).String()
	run := func(port int, env []string) (*cProgram, func() []int) {
		p := startArgv(t, b, env, tools(t), "run", "--", "sockperf", "sr", "-i", srv, "-p", strconv.Itoa(port), "--nonblocked")
		p.waitOffloaded(t)
		startOn(t, b, testbed.A, nil, "sockperf", "pp", "-i", srv, "-p", strconv.Itoa(port), "-m", "64", "-t", "5")
		return p, func() (batched []int) {
			ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", p.pid))
			if err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			for _, e := range ents {
				tid, _ := strconv.Atoi(e.Name())
				if a, err := unix.SchedGetAttr(tid, 0); err == nil && a.Policy == unix.SCHED_BATCH {
					batched = append(batched, tid)
				}
			}
			return batched
		}
	}

	p, batch := run(11191, []string{"VMAXDP_SYSMON_BATCH=1"})
	var batched []int
	for deadline := time.Now().Add(5 * time.Second); len(batched) != 1 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		batched = batch()
	}
	if len(batched) != 1 {
		t.Fatalf("threads SCHED_BATCH: %v, want one (sysmon)\n%s", batched, tail(p.out.String(), 30))
	}
	// sysmon sleeps in nanosleep (runtime.usleep) whenever it is looked at.
	tid, inSleep := batched[0], 0
	for i := 0; i < 20; i++ {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/syscall", p.pid, tid)); err == nil && strings.HasPrefix(string(b), strconv.Itoa(unix.SYS_NANOSLEEP)+" ") {
			inSleep++
		}
		time.Sleep(time.Millisecond)
	}
	if inSleep < 10 {
		t.Errorf("thread %d, SCHED_BATCH, was in nanosleep in %d of 20 looks: not sysmon", tid, inSleep)
	}
	// The threads Go makes later (sysmon makes them) do not inherit it.
	time.Sleep(time.Second)
	if later := batch(); len(later) != 1 || later[0] != tid {
		t.Errorf("a second later, threads SCHED_BATCH: %v, want %d alone", later, tid)
	}
	p.wantSaid(t, fmt.Sprintf("Go's sysmon thread %d: SCHED_BATCH", tid))

	p, batch = run(11192, nil)
	time.Sleep(time.Second)
	if batched := batch(); len(batched) != 0 {
		t.Errorf("by default, threads SCHED_BATCH: %v, want none", batched)
	}
	if strings.Contains(p.out.String(), "sysmon") {
		t.Errorf("by default, the log speaks of sysmon:\n%s", tail(p.out.String(), 30))
	}
}

// TestRunSockperfRates is TestRunSockperf's rates (ul, tp), one bed after
// the other.
func TestRunSockperfRates(t *testing.T) {
	requireSockperf(t)
	vmaxdp := tools(t)
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) { runSockperfCases(t, vmaxdp, b, true) })
}

// runSockperfCases runs sockperf's ping-pongs on b, or with rates its
// one-way modes (ul, tp).
func runSockperfCases(t *testing.T, vmaxdp string, b *testbed.Bed, rates bool) {
	srv := b.Addr(testbed.B).String()
	feed := filepath.Join(t.TempDir(), "feed.txt")
	var fb strings.Builder
	for p := 11120; p < 11123; p++ {
		fmt.Fprintf(&fb, "U:%s:%d\n", srv, p)
	}
	os.WriteFile(feed, []byte(fb.String()), 0o644)
	one := func(port int) []string { return []string{"-i", srv, "-p", strconv.Itoa(port)} }
	cli := func(mode string, addr []string, more ...string) []string {
		return append(append([]string{mode}, addr...), append(more, "-t", "1")...)
	}
	mc := []string{"-i", "224.18.0.1", "-p", "11130"}
	mcSSM := []string{"-i", "232.18.0.1", "-p", "11131"}
	mcTx := []string{"--mc-tx-if", b.Addr(testbed.A).String(), "-m", "64"}
	type tc struct {
		name             string
		server, client   []string
		srvOff, cliOff   bool
		throughputServer bool
		env              []string
	}
	cases := []tc{
		{"pp/recvfrom/14B", one(11111), cli("pp", one(11111), "-m", "14"), true, true, false, nil},
		{"pp/recvfrom/1472B", one(11111), cli("pp", one(11111), "-m", "1472", "--data-integrity"), true, true, false, nil},
		{"pp/recvfrom/nonblocked", append(one(11112), "--nonblocked"), cli("pp", one(11112), "-m", "64", "--nonblocked"), true, true, false, nil},
		{"pp/select", []string{"-f", feed, "-F", "s"}, cli("pp", nil, "-f", feed, "-F", "s", "-m", "64"), true, true, false, nil},
		{"pp/poll/nonblocked", []string{"-f", feed, "-F", "p", "--nonblocked"}, cli("pp", nil, "-f", feed, "-F", "p", "-m", "64", "--nonblocked"), true, true, false, nil},
		{"pp/epoll", []string{"-f", feed, "-F", "e"}, cli("pp", nil, "-f", feed, "-F", "e", "-m", "300"), true, true, false, nil},
		{"pp/multicast", append(mc, "--mc-rx-if", srv), cli("pp", mc, mcTx...), true, true, false, nil},
		{"pp/multicast/server-only", append(mc, "--mc-rx-if", srv), cli("pp", mc, mcTx...), true, false, false, nil},
		{"pp/multicast/client-only", append(mc, "--mc-rx-if", srv), cli("pp", mc, mcTx...), false, true, false, nil},
		// Source-specific: sockperf joins with IP_ADD_SOURCE_MEMBERSHIP.
		{"pp/multicast/source-filter", append(mcSSM, "--mc-rx-if", srv, "--mc-source-filter", b.Addr(testbed.A).String()),
			cli("pp", mcSSM, mcTx...), true, true, false, nil},
		{"pp/server-only", one(11113), cli("pp", one(11113), "-m", "64"), true, false, false, nil},
		{"pp/client-only", one(11114), cli("pp", one(11114), "-m", "64"), false, true, false, nil},
		{"pp/server-only/1472B", one(11113), cli("pp", one(11113), "-m", "1472", "--data-integrity"), true, false, false, nil},
		{"pp/client-only/1472B", one(11114), cli("pp", one(11114), "-m", "1472", "--data-integrity"), false, true, false, nil},
		// ul runs a sender and a receiver thread: with the server, three
		// pollers on this machine's two cores starve one another, so the
		// receivers poll less (VMA's advice when CPUs are short).
		{"ul", one(11115), cli("ul", one(11115), "-m", "64", "--mps", "20000"), true, true, false, []string{"VMAXDP_RX_POLL=1000"}},
		{"tp", one(11116), cli("tp", one(11116), "-m", "64", "--mps", "50000"), true, false, true, nil},
	}
	for _, c := range cases {
		if (c.client[0] != "pp") != rates {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			before := [2]int{udpInDatagrams(t, b, testbed.A), udpInDatagrams(t, b, testbed.B)}
			// The sockets' counters as they close (VMAXDP_STATS_FILE):
			// where a lost datagram went, for a failure to say.
			statsFile := filepath.Join(t.TempDir(), "stats")
			run := &sockperf.Run{Bed: b, Vmaxdp: vmaxdp, ServerOffload: c.srvOff, ClientOffload: c.cliOff,
				Server: c.server, Client: c.client, Env: append([]string{"VMAXDP_TRACELEVEL=4", "VMAXDP_STATS_FILE=" + statsFile}, c.env...)}
			res, srvLog, err := run.Do(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			kernel := udpInDatagrams(t, b, testbed.B) - before[1]
			kernelCli := udpInDatagrams(t, b, testbed.A) - before[0]
			if c.throughputServer {
				if res.Sent == 0 || res.ServerReceived != res.Sent {
					counters, _ := os.ReadFile(statsFile)
					t.Errorf("tp: client sent %d, server received %d; want them equal\nthe sockets' counters as they closed:\n%s", res.Sent, res.ServerReceived, counters)
				}
			} else {
				if res.Observations == 0 || res.Dropped+res.Duplicated+res.OOO != 0 {
					t.Errorf("%d observations, %d dropped, %d duplicated, %d out of order\n%s", res.Observations, res.Dropped, res.Duplicated, res.OOO, res.Output)
				}
			}
			messages := max(res.Sent, res.ServerReceived)
			if c.srvOff {
				if !strings.Contains(srvLog, "offloaded on "+b.Link(testbed.B)) {
					t.Errorf("server log says nothing of offload:\n%s", srvLog)
				}
				if kernel != 0 {
					t.Errorf("the kernel delivered %d datagrams in the server's namespace during %d messages: not offloaded", kernel, messages)
				}
			} else if kernel < messages/2 {
				t.Errorf("server on the kernel, but the kernel delivered only %d datagrams of %d", kernel, messages)
			}
			if c.cliOff {
				if !strings.Contains(res.Output, "offloaded on "+b.Link(testbed.A)) {
					t.Errorf("client log says nothing of offload:\n%s", res.Output)
				}
				// The client's socket is decided at its first send, and the
				// kernel serves it until its stack has opened (tens of
				// milliseconds).
				if !c.throughputServer && kernelCli > messages/20 {
					t.Errorf("the kernel delivered %d datagrams in the client's namespace during %d messages: its replies were not offloaded", kernelCli, messages)
				}
			}
			t.Logf("avg %.3f us, p50 %.3f, p99 %.3f; sent %d, server received %d, kernel delivered %d (server) %d (client)", res.Latency, res.P50, res.P99, res.Sent, res.ServerReceived, kernel, kernelCli)
		})
	}
}

// TestRunRuleKeepsSocketOnKernel: a rules line saying os keeps sockperf's
// socket on the kernel, and the log names the rule by file and line.
func TestRunRuleKeepsSocketOnKernel(t *testing.T) {
	requireSockperf(t)
	vmaxdp := tools(t)
	b := testutil.Bed(t, nil)
	conf := filepath.Join(t.TempDir(), "rules.conf")
	os.WriteFile(conf, []byte("application-id sockperf *\nuse os udp_receiver *:11117\nuse vmaxdp udp_receiver *:*\n"), 0o644)
	srv := []string{"-i", b.Addr(testbed.B).String(), "-p", "11117"}
	run := &sockperf.Run{Bed: b, Vmaxdp: vmaxdp, ServerOffload: true, Server: srv,
		Client: append([]string{"pp"}, append(srv, "-t", "1", "-m", "64")...), Env: []string{"VMAXDP_CONFIG_FILE=" + conf}}
	before := udpInDatagrams(t, b, testbed.B)
	res, srvLog, err := run.Do(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := "not offloaded: udp_receiver " + b.Addr(testbed.B).String() + ":11117: rule " + conf + ":2: use os udp_receiver *:11117"; !strings.Contains(srvLog, want) {
		t.Errorf("server log lacks %q:\n%s", want, srvLog)
	}
	if res.Observations == 0 || res.Dropped != 0 {
		t.Errorf("%d observations, %d dropped", res.Observations, res.Dropped)
	}
	if kernel := udpInDatagrams(t, b, testbed.B) - before; kernel < res.Sent/2 {
		t.Errorf("the kernel delivered %d of %d datagrams: the rule did not keep the socket on the kernel", kernel, res.Sent)
	}
}

// TestRunBackend: VMAXDP_BACKEND on a bed with no RDMA device (none
// here, nor an RDMA subsystem). auto serves the sockets with AF_XDP and
// its log says why not verbs; verbs stops vmaxdp run before the program
// starts, naming the interface and what is missing; the engine preloaded
// without vmaxdp run leaves the socket on the kernel with that reason.
func TestRunBackend(t *testing.T) {
	requireSockperf(t)
	vmaxdp := tools(t)
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	srv := []string{"-i", b.Addr(testbed.B).String(), "-p", "11119"}
	run := &sockperf.Run{Bed: b, Vmaxdp: vmaxdp, ServerOffload: true, Server: srv,
		Client: append([]string{"pp"}, append(srv, "-t", "1", "-m", "64")...), Env: []string{"VMAXDP_BACKEND=auto", "VMAXDP_TRACELEVEL=4"}}
	res, srvLog, err := run.Do(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := "backend AF_XDP (auto; verbs: interface " + b.Link(testbed.B) + ": no RDMA device behind it"
	if !strings.Contains(srvLog, want) || !strings.Contains(srvLog, "offloaded on "+b.Link(testbed.B)) {
		t.Errorf("server log lacks %q or the offload:\n%s", want, tail(srvLog, 20))
	}
	if res.Observations == 0 || res.Dropped != 0 {
		t.Errorf("%d observations, %d dropped", res.Observations, res.Dropped)
	}

	out, err := exec.Command("ip", "netns", "exec", b.NSName(testbed.B), "env", "VMAXDP_BACKEND=verbs", vmaxdp, "run", "--", "true").CombinedOutput()
	if want := "VMAXDP_BACKEND=verbs: no interface can use it: interface " + b.Link(testbed.B) + ": no RDMA device behind it"; err == nil || !strings.Contains(string(out), want) {
		t.Errorf("vmaxdp run with VMAXDP_BACKEND=verbs: %v, %q; want it to stop saying %q", err, out, want)
	}

	p := startArgv(t, b, []string{"VMAXDP_BACKEND=verbs", "LD_PRELOAD=" + filepath.Join(toolsDir, libName)}, append([]string{"sockperf", "sr"}, srv...)...)
	want = "not offloaded: udp_receiver " + b.Addr(testbed.B).String() + ":11119: VMAXDP_BACKEND=verbs: interface " + b.Link(testbed.B) + ": no RDMA device behind it"
	if err := p.waitFor(want); err != nil {
		t.Errorf("%v:\n%s", err, p.out.String())
	}
}

// TestRunForkExec: a program that forks and execs while it holds an
// offloaded socket keeps working, and so does its child: the child's
// inherited socket is the kernel's, the parent's goes back to the kernel
// (it shares it with the child: the log says so), and the program the
// child execs gets an engine of its own.
func TestRunForkExec(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "forkexec")
	b := testutil.Bed(t, nil)
	const port = 11150
	p := startC(t, b, prog, nil, strconv.Itoa(port))
	waitFor := p.waitFor
	err := b.Do(testbed.A, func() error {
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		got := map[string]bool{} // the child's message may come with any answer
		exchange := func(to int, msg string, want ...string) error {
			dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(testbed.B), uint16(to)))
			if _, err := c.WriteToUDP([]byte(msg), dst); err != nil {
				return err
			}
			buf := make([]byte, 64)
			c.SetReadDeadline(time.Now().Add(3 * time.Second))
			for _, w := range want {
				for !got[w] {
					n, _, err := c.ReadFromUDP(buf)
					if err != nil {
						return fmt.Errorf("sent %q to port %d: no %q came back (got %v): %w", msg, to, w, got, err)
					}
					got[string(buf[:n])] = true
				}
			}
			return nil
		}
		if err := waitFor("parent ready"); err != nil {
			return err
		}
		p.waitOffloaded(t)
		if err := exchange(port, "one", "one"); err != nil {
			return err
		}
		if err := exchange(port, "two", "two", "child"); err != nil {
			return err
		}
		if err := waitFor("child ready"); err != nil {
			return err
		}
		return exchange(port+1, "three", "three")
	})
	if err != nil {
		t.Fatalf("%v\nprogram output:\n%s", err, p.out.String())
	}
	p.wait(t, b)
	if !strings.Contains(p.out.String(), "shared with a child process after fork") {
		t.Errorf("the parent did not say why the socket it shares with its child went back to the kernel:\n%s", p.out.String())
	}
	// The program the child execs runs under an engine of its own (which
	// may not have decided its socket before it ends: its stack opens in
	// the background, and the queue is the parent's).
	if !regexp.MustCompile(`Cmd Line: \S+ -child`).MatchString(p.out.String()) {
		t.Errorf("the program the child execs did not start an engine of its own:\n%s", p.out.String())
	}
}

// TestRunSignals: an application's signals under vmaxdp run (see
// testdata/signals.c): none is lost to vmaxdp's threads, a handler ends a
// blocking call with EINTR as in the kernel (restarted after SA_RESTART),
// while the call spins as well as while it sleeps, the application reads
// back its own handlers, and Go's runtime sends its threads no SIGURG.
func TestRunSignals(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "signals")
	b := testutil.Bed(t, nil)
	for i, mode := range []struct{ name, poll string }{{"spinning", "-1"}, {"sleeping", "0"}} {
		t.Run(mode.name, func(t *testing.T) {
			port := 11160 + i
			p := startC(t, b, prog, []string{"VMAXDP_RX_POLL=" + mode.poll, "VMAXDP_SELECT_POLL=" + mode.poll}, strconv.Itoa(port))
			if err := p.waitFor("bound\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			p.waitOffloaded(t)
			sendFromA(t, b, port, "go")
			// The restart check waits for a datagram sent after its
			// alarm (50 ms) has come.
			if err := p.waitFor("restart waiting"); err == nil {
				time.Sleep(300 * time.Millisecond)
				sendFromA(t, b, port, "wake")
			}
			p.wait(t, b, "sigwait", "sigaction", "signal", "recvfrom", "poll", "select", "epoll_wait", "ppoll", "restart", "preempt")
		})
	}
}

// TestRunCancel: pthread_cancel ends a thread that waits in a call the
// engine serves (recvfrom, recvmsg, poll, select, epoll_wait), spinning
// and sleeping, as it would one waiting in the kernel's call; with
// cancellation disabled the call goes on waiting, and a cancel pending at
// the call acts as it starts (testdata/cancel.c). udp-sender under vmaxdp
// hung in pthread_join at the end of every transfer.
func TestRunCancel(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "cancel")
	b := testutil.Bed(t, nil)
	for i, mode := range []struct{ name, poll string }{{"spinning", "-1"}, {"sleeping", "0"}} {
		t.Run(mode.name, func(t *testing.T) {
			port := 11176 + i
			p := startC(t, b, prog, []string{"VMAXDP_RX_POLL=" + mode.poll, "VMAXDP_SELECT_POLL=" + mode.poll}, strconv.Itoa(port))
			if err := p.waitFor("bound\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			p.waitOffloaded(t)
			sendFromA(t, b, port, "go")
			if err := p.waitFor("disabled waiting"); err == nil {
				sendFromA(t, b, port, "wake")
			}
			p.wait(t, b, "recvfrom", "recvmsg", "poll", "select", "epoll_wait", "disabled", "pending")
		})
	}
}

// TestRunTCPCancel: pthread_cancel of a thread that waits in a TCP call
// the engine serves (testdata/tcpcancel.c, VMAXDP_TCP=1): accept, read,
// recv, recvmsg, a write on full buffers and a connect whose SYNs side A
// drops (its listener's accept queue is full: a backlog of 0 and one
// connection in it); and a connect with cancellation disabled, which goes
// on until side A makes room and then connects. The connect was no
// cancellation point at all.
func TestRunTCPCancel(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "tcpcancel")
	b := testutil.Bed(t, nil)
	const port, fullPort = 11178, 11179
	var lfd int
	err := b.Do(testbed.A, func() (err error) {
		if lfd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0); err != nil {
			return err
		}
		if err := unix.Bind(lfd, &unix.SockaddrInet4{Addr: b.Addr(testbed.A).As4(), Port: fullPort}); err != nil {
			return err
		}
		return unix.Listen(lfd, 0)
	})
	if err != nil {
		t.Fatal(err)
	}
	var accepted []int
	t.Cleanup(func() {
		for _, fd := range append(accepted, lfd) {
			unix.Close(fd)
		}
	})
	p := startC(t, b, prog, []string{"VMAXDP_TCP=1"}, strconv.Itoa(port), b.Addr(testbed.A).String(), strconv.Itoa(fullPort))
	if err := p.waitFor("listening\n"); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	var c net.Conn
	err = b.Do(testbed.A, func() (err error) {
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(b.Addr(testbed.B), port).String(), 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	defer c.Close()
	if err := p.waitFor("connect disabled waiting"); err == nil {
		// Room in the accept queue from now on, until the program ends.
		for deadline := time.Now().Add(10 * time.Second); p.gone() == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if fd, _, err := unix.Accept4(lfd, unix.SOCK_CLOEXEC); err == nil {
				accepted = append(accepted, fd)
			}
		}
	}
	p.wait(t, b, "accept", "read", "recv", "recvmsg", "write", "connect", "connect-disabled")
}

// TestRunBannerAtFirstSocket: the banner comes from the process that
// makes the first IP socket, not from each wrapper that starts it (a
// shell, a subshell, env; pyenv's shims are more than eight processes for one
// python3): bash's /dev/udp redirection makes one, on loopback. Nor do
// the wrappers' forks get a word.
func TestRunBannerAtFirstSocket(t *testing.T) {
	out, err := exec.Command(tools(t), "run", "--", "sh", "-c", "sh -c true; env bash -c 'exec 3<>/dev/udp/127.0.0.1/9'").CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	banners := regexp.MustCompile(`(?m)Cmd Line: (.*)$`).FindAllStringSubmatch(string(out), -1)
	if len(banners) != 1 || !strings.HasPrefix(banners[0][1], "bash -c exec 3<>/dev/udp") {
		t.Errorf("banners %q, want one, bash's:\n%s", banners, out)
	}
	if strings.Contains(string(out), "fork: ") {
		t.Errorf("a wrapper with no IP socket told of its forks:\n%s", out)
	}
}

// TestRunFortify: poll and ppoll as a _FORTIFY_SOURCE build calls them
// (__poll_chk, __ppoll_chk; memcached and nsd from Debian do) wait on an
// offloaded socket, on both beds; the kernel's own would sleep on the
// kernel socket, which gets nothing once the socket is steered.
func TestRunFortify(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "fortify")
	if out, err := exec.Command("nm", "-D", prog).Output(); err != nil || !strings.Contains(string(out), "__poll_chk") || !strings.Contains(string(out), "__ppoll_chk") {
		t.Skipf("the compiler did not make fortify call __poll_chk and __ppoll_chk (nm: %v):\n%s", err, out)
	}
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		const port = 11172
		p := startC(t, b, prog, nil, strconv.Itoa(port), "1")
		if err := p.waitFor("bound\n"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		p.waitOffloaded(t)
		sendFromA(t, b, port, "one")
		if err := p.waitFor("poll done\n"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		sendFromA(t, b, port, "two")
		p.wait(t, b, "poll", "ppoll")
	})
}

// TestRunRecvmmsg: recvmmsg on an offloaded socket honours its timeout
// (for every datagram after the first, which the kernel does not: see
// testdata/recvmmsg.c) and MSG_WAITFORONE.
func TestRunRecvmmsg(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "recvmmsg")
	b := testutil.Bed(t, nil)
	const port = 11170
	p := startC(t, b, prog, nil, strconv.Itoa(port))
	if err := p.waitFor("ready\n"); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	p.waitOffloaded(t)
	for _, step := range []struct {
		after string
		msgs  []string
	}{{"ready\n", []string{"one\x00", "two\x00", "thr\x00"}}, {"waitforone\n", []string{"four\x00", "five\x00"}}} {
		if err := p.waitFor(step.after); err != nil {
			t.Fatal(err)
		}
		sendFromA(t, b, port, step.msgs...)
	}
	p.wait(t, b, "timeout", "waitforone")
}

// TestRunRawSyscalls: a program that makes its socket calls through
// syscall(2) rather than libc's names (testdata/rawsyscall.c; libuv before
// 1.45 reads and answers with recvmmsg and sendmmsg so, and BIND 9.18's
// named answered nothing under vmaxdp) is offloaded and served: an echo
// of each exchange comes back to a kernel socket in side A, and side B's
// kernel delivers none of the datagrams.
func TestRunRawSyscalls(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "rawsyscall")
	b := testutil.Bed(t, &testbed.Options{Plain: true}) // as ip link add makes it
	const port = 11450
	c := dialB(t, b, port)
	before := udpInDatagrams(t, b, testbed.B)
	p := startC(t, b, prog, nil, strconv.Itoa(port))
	if err := p.waitFor("ready\n"); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	p.waitOffloaded(t)
	for _, step := range []struct {
		after string
		msgs  []string
	}{{"ready\n", []string{"one"}}, {"ready\n", []string{"two", "thr"}}, {"epoll\n", []string{"four"}}, {"poll\n", []string{"five"}}} {
		if err := p.waitFor(step.after); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		for _, m := range step.msgs {
			if _, err := c.Write([]byte(m)); err != nil {
				t.Fatal(err)
			}
		}
		buf := make([]byte, 64)
		for _, m := range step.msgs {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			if err != nil || string(buf[:n]) != m {
				t.Fatalf("echo of %q: %q, %v\n%s", m, buf[:n], err, p.out.String())
			}
		}
	}
	p.wait(t, b, "recvfrom", "sendto", "recvmmsg", "sendmmsg", "epoll_ctl", "epoll_wait", "read", "sendmsg", "poll", "recvmsg", "sendto-after-poll", "getsockname", "close")
	if moved := udpInDatagrams(t, b, testbed.B) - before; moved != 0 {
		t.Errorf("side B's kernel delivered %d UDP datagrams: not offloaded", moved)
	}
}

// TestRunWaits: each of Linux's multiplexer calls waits on an offloaded
// socket and keeps its timeout as the kernel's does (testdata/waits.c, run
// on the kernel, then under vmaxdp): epoll_pwait2 (libevent 2.2 waits
// with it, and it slept on the kernel socket, which offload leaves empty,
// until its timeout, every time), the raw ppoll and pselect6, which
// write the time left back, and select, whose timeval Linux (and glibc)
// leaves holding the time left: a program that loops on select with one
// timeval counts on it for its deadline, and the engine left it whole.
// An epoll fd waited on as a member of another set (an event loop
// embedded in another's), or with poll or select, is readable while an
// offloaded socket in it has a datagram, beside what the kernel sees;
// before, those waits slept to their timeout. So did a wait on a
// duplicate of an epoll fd (dup), which now names the same set, and poll
// for POLLRDNORM alone and epoll for EPOLLRDNORM alone (BSD's code asks
// so), which are told now with the bits asked, as the kernel tells them.
// An epoll fd nested with EPOLLET is reported once for a datagram, as
// the kernel reports it (it was reported at every wait, level-triggered).
// Side B's kernel delivers none of the datagrams under vmaxdp.
func TestRunWaits(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "waits")
	b := testutil.Bed(t, &testbed.Options{Plain: true}) // as ip link add makes it
	const port = 11445
	c := dialB(t, b, port)
	waits := []string{"epoll_pwait2", "sys_epoll_pwait2", "sys_ppoll", "sys_pselect6", "select", "ppoll",
		"nested", "poll-epfd", "select-epfd", "dup-epfd", "dup-closed", "poll-rdnorm", "epoll-rdnorm", "nested-et", "dup-name", "unnested"}
	checks := []string{"epoll_pwait2-kept", "sys_ppoll-left", "sys_pselect6-left", "select-left", "ppoll-kept",
		"nested-join", "nested-outer", "nested-inner", "nested-pipe", "nested-mixed", "nested-drain",
		"select-timeout", "sys_ppoll-timeout", "epoll_pwait2-timeout", "epoll_pwait2-einval", "ppoll-einval", "select-einval",
		"dup-close", "poll-wrnorm", "epoll-rdnorm-add", "nested-et-add", "nested-et-once",
		"unnested-wait", "unnested-del", "unnested-add", "unnested-close", "dup-name-add"}
	for _, w := range waits {
		checks = append(checks, w, w+"-echo")
	}
	for _, under := range []string{"kernel", "vmaxdp"} {
		t.Run(under, func(t *testing.T) {
			before := udpInDatagrams(t, b, testbed.B)
			var p *cProgram
			if under == "kernel" {
				p = startArgv(t, b, nil, prog, strconv.Itoa(port))
			} else {
				p = startC(t, b, prog, nil, strconv.Itoa(port))
			}
			if err := p.waitFor("ready\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			if under == "vmaxdp" {
				p.waitOffloaded(t)
			}
			buf := make([]byte, 64)
			for _, w := range waits {
				// "\n" before: ppoll is also the end of sys_ppoll
				if err := p.waitFor("\n" + w + "\n"); err != nil {
					t.Fatalf("%v\n%s", err, p.out.String())
				}
				if _, err := c.Write([]byte(w)); err != nil {
					t.Fatal(err)
				}
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := c.Read(buf); err != nil || string(buf[:n]) != w {
					t.Fatalf("echo after %s: %q, %v\n%s", w, buf[:n], err, p.out.String())
				}
			}
			if under == "vmaxdp" {
				p.wait(t, b, checks...)
				if moved := udpInDatagrams(t, b, testbed.B) - before; moved != 0 {
					t.Errorf("side B's kernel delivered %d UDP datagrams: not offloaded", moved)
				}
				return
			}
			err := p.exited()
			for _, check := range checks {
				if !regexp.MustCompile(`(?m)^ok ` + regexp.QuoteMeta(check) + `$`).MatchString(p.out.String()) {
					t.Errorf("check %s did not pass on the kernel", check)
				}
			}
			if err != nil || t.Failed() {
				t.Errorf("program: %v\n%s", err, p.out.String())
			}
		})
	}
}

// TestRunExitFlush: a program that sends a burst and ends at once, each
// way a process ends (testdata/exitburst.c), has sent every datagram, as
// on the kernel: the last sends of a burst wait on the TX ring for a
// coalesced kick. Before, _exit, _Exit, exit_group and exec, which run no
// destructor, lost 3 to 15 of 500, and exit's destructor did not kick
// them either (the rare iperf 2 multicast sender whose receiver never
// reported had lost its last datagram, which ends the test). A vfork
// child's _exit in between leaves the parent's sends alone. So does a
// SIGTERM at its default action (raised, or sent to the process after the
// program set SIG_DFL itself), which still ends the process by the
// signal, and a handler that calls _exit: those lost 1 to 20 before.
// abort(3) (SIGABRT) lost 2 to 4 before its default action kicked too. A
// SIGKILL, which runs nothing in the process, lost the 19 the kick delay
// held (VMAXDP_PEER_NOTIFY=0): the helper that outlives the process sends
// them now. Side A's socket reads with a large buffer, so that its kernel
// drops nothing; side B's kernel sends none.
func TestRunExitFlush(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "exitburst")
	b := testutil.Bed(t, &testbed.Options{Plain: true}) // as ip link add makes it
	const port, count = 11460, 500
	// sigkill's sends wait on the TX ring for their kick for a second,
	// with no progress engine's drain to kick them sooner.
	env := map[string][]string{"sigkill": {"VMAXDP_TX_KICK_DELAY=1000000", "VMAXDP_PROGRESS_ENGINE_INTERVAL=0"}}
	c := testutil.ListenUDP(t, b, testbed.A, port)
	if err := c.SetReadBuffer(8 << 20); err != nil {
		t.Fatal(err)
	}
	// The bursts go from a stack that knows its next hop: while the kernel
	// resolves it, they would go through the kernel socket.
	if err := testutil.Resolve(b, testbed.B); err != nil {
		t.Fatal(err)
	}
	args := []string{b.Addr(testbed.A).String(), strconv.Itoa(port), strconv.Itoa(count)}
	for _, how := range []string{"return", "exit", "_exit", "_Exit", "exit_group", "vfork", "exec", "sigterm", "sigterm-dfl", "handler", "python-sigterm", "sigkill", "abort"} {
		t.Run(how, func(t *testing.T) {
			out := testutil.UDPStat(t, b, testbed.B, "OutDatagrams")
			var p *cProgram
			if how == "python-sigterm" {
				if _, err := exec.LookPath("python3"); err != nil {
					t.Skip("python3 is not installed")
				}
				p = startArgv(t, b, nil, append([]string{tools(t), "run", "--", "python3", "-c", pythonSigterm}, args...)...)
			} else {
				p = startC(t, b, prog, env[how], append(args, how)...)
			}
			seen := make([]bool, count)
			got := 0
			buf := make([]byte, 64)
			// read takes datagrams until all came or none for idle.
			read := func(idle time.Duration) {
				for got < count {
					c.SetReadDeadline(time.Now().Add(idle))
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if i, err := strconv.Atoi(string(buf[:n])); err == nil && i >= 0 && i < count && !seen[i] {
						seen[i] = true
						got++
					}
				}
			}
			if how == "sigkill" {
				// Once the burst has stopped coming, the rest of it waits on
				// the TX ring for a kick the program never makes, and that
				// the kick delay (1 s here) has not made yet: only the
				// helper, which outlives the program, sends it (without it,
				// VMAXDP_PEER_NOTIFY=0, 19 of 500 are lost).
				if err := p.waitFor("sending"); err != nil {
					t.Fatalf("%v\n%s", err, p.out.String())
				}
				read(300 * time.Millisecond)
				syscall.Kill(p.pid, syscall.SIGKILL)
			}
			err := p.exited()
			if sig := endSignal[how]; sig != "" {
				// Ended by the signal, as its default action ends it.
				if err == nil || !strings.HasPrefix(err.Error(), "signal: "+sig) {
					t.Fatalf("ended with %v, want signal: %s\n%s", err, sig, p.out.String())
				}
			} else if err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			said := []string{"fd 3: offloaded on " + b.Link(testbed.B), fmt.Sprintf("sent %d\n", count)}
			switch how {
			case "sigkill":
				// The helper says what it sent for the program.
				said = []string{said[0], fmt.Sprintf("sending %d\n", count), b.Link(testbed.B) + "/q0's TX ring not sent yet: sent them"}
			case "abort":
				said[1] = fmt.Sprintf("sending %d\n", count)
			}
			p.wantSaid(t, said...)
			read(time.Second)
			if got != count {
				t.Errorf("side A received %d of the %d datagrams sent; the first missing: %d", got, count, slices.Index(seen, false))
			}
			if n := testutil.UDPStat(t, b, testbed.B, "OutDatagrams") - out; n != 0 {
				t.Errorf("side B's kernel sent %d datagrams: not offloaded", n)
			}
		})
	}
}

// endSignal is the signal that ends each of TestRunExitFlush's ways that
// end by one.
var endSignal = map[string]string{"sigterm": "terminated", "sigterm-dfl": "terminated", "python-sigterm": "terminated",
	"sigkill": "killed", "abort": "aborted"}

// pythonSigterm is exitburst's sigterm in Python, which reads the
// dispositions it was given as it starts: a burst, then SIGTERM sent to
// itself at its default action.
const pythonSigterm = `import os, signal, socket, sys
assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, signal.getsignal(signal.SIGTERM)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
addr, n = (sys.argv[1], int(sys.argv[2])), int(sys.argv[3])
for i in range(n):
    s.sendto(str(i).encode(), addr)
sys.stdout.write("sent %d\n" % n); sys.stdout.flush()
os.kill(os.getpid(), signal.SIGTERM)
`

// TestRunUDPSegment: sends cut with UDP_SEGMENT (UDP GSO, as QUIC
// servers cut theirs), by the socket's option or by a message of the send
// (testdata/gso.py), reach side A's kernel socket as the kernel's own cut
// them, on the kernel and under vmaxdp, side by side: the same datagrams,
// the same bytes. Under vmaxdp all leave from the stack: side B's kernel
// sends none of them. Before, a send longer than its segment size went to
// the kernel socket, which cut it, and one with a UDP_SEGMENT message did
// too (ngtcp2's server sent all of a download so).
func TestRunUDPSegment(t *testing.T) {
	b := pythonBed(t)
	const port = 11451
	c := testutil.ListenUDP(t, b, testbed.A, port)
	sizes := [][]int{{64}, {100, 100, 100, 100}, {100, 100, 100, 100}, {100, 100, 100, 100}, {150, 100}, {300}, {400}, {100, 100, 50}}
	var want []int
	var wantBytes []byte
	for j, cut := range sizes {
		for _, n := range cut {
			want = append(want, n)
		}
		for x := range sum(cut) {
			wantBytes = append(wantBytes, byte((j*7+x)%251))
		}
	}
	for _, argv := range [][]string{{"python3"}, {tools(t), "run", "--", "python3"}} {
		out := udpOutDatagrams(t, b)
		p := startArgv(t, b, nil, append(argv, "testdata/gso.py", b.Addr(testbed.A).String(), strconv.Itoa(port))...)
		var got []int
		var gotBytes []byte
		buf := make([]byte, 2048)
		for len(got) < len(want) {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			if err != nil {
				break
			}
			got = append(got, n)
			gotBytes = append(gotBytes, buf[:n]...)
		}
		if err := p.exited(); err != nil {
			t.Fatalf("%v: sender: %v\n%s", argv, err, p.out.String())
		}
		if !slices.Equal(got, want) || !bytes.Equal(gotBytes, wantBytes) {
			t.Errorf("%v: datagrams received (bytes): %v, want %v (same bytes as sent: %v)", argv, got, want, bytes.Equal(gotBytes, wantBytes))
		}
		moved := udpOutDatagrams(t, b) - out
		if len(argv) == 1 {
			if moved == 0 {
				t.Errorf("on the kernel, side B's UdpOutDatagrams did not move: the count shows nothing")
			}
			continue
		}
		if moved != 0 {
			t.Errorf("under vmaxdp, side B's kernel sent %d datagrams, want 0 (all from the stack)", moved)
		}
		p.wantSaid(t, "sent", "fd 3: offloaded on "+b.Link(testbed.B))
	}
}

func sum(v []int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}

// udpOutDatagrams is side B's kernel's Udp OutDatagrams.
func udpOutDatagrams(t *testing.T, b *testbed.Bed) int {
	t.Helper()
	return testutil.UDPStat(t, b, testbed.B, "OutDatagrams")
}

// TestRunUDPGRO: a socket with UDP_GRO on (QUIC servers turn it on) stays
// offloaded and reads what the kernel's would (testdata/gro.py, on the
// kernel and under vmaxdp, side by side): side A's datagrams one by one,
// without a UDP_GRO message, as the kernel's when it coalesced nothing,
// and what its kernel socket takes coalesced (1000 bytes sent to it
// through lo with UDP_SEGMENT at 100) whole, with its segment size, 100.
// Before, UDP_GRO sent the socket to the kernel.
func TestRunUDPGRO(t *testing.T) {
	b := pythonBed(t)
	const port = 11457
	msgs := []string{"one", "two two", "three three three"}
	var said [2][]string
	var moved [2]int
	for i, argv := range [][]string{{"python3"}, {tools(t), "run", "--", "python3"}} {
		before := udpInDatagrams(t, b, testbed.B)
		p := startArgv(t, b, nil, append(argv, "testdata/gro.py", b.Addr(testbed.B).String(), strconv.Itoa(port), strconv.Itoa(len(msgs)))...)
		if err := p.waitFor("ready\n"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		if i == 1 {
			p.waitOffloaded(t)
		}
		sendFromA(t, b, port, msgs...)
		if err := p.exited(); err != nil {
			t.Fatalf("%v: %v\n%s", argv, err, p.out.String())
		}
		moved[i] = udpInDatagrams(t, b, testbed.B) - before
		said[i] = programLines(p)
		if i == 1 {
			p.wantSaid(t, "fd 3: offloaded on "+b.Link(testbed.B))
		}
	}
	sameLines(t, said, len(msgs)+3)
	if !slices.Contains(said[0], "got 1000 gro 100 flags 0") {
		t.Errorf("the kernel did not coalesce the segments sent through lo: the test shows nothing")
	}
	if moved[1] != moved[0]-len(msgs) {
		t.Errorf("side B's kernel delivered %d datagrams under vmaxdp, %d on its own: want side A's %d fewer (offloaded)", moved[1], moved[0], len(msgs))
	}
}

// TestRunBindToDevice: a UDP socket bound to an interface with
// SO_BINDTODEVICE gets what the kernel would give it (testdata/
// bindtodevice.py, side B under vmaxdp, datagrams from side A): bound to
// the stack's interface it is offloaded; bound to another (lo), before or
// after its bind, it is the kernel's, which takes nothing from side A's
// link. Before, the stack served it whatever its interface received. A
// TCP listener likewise (VMAXDP_TCP=1): bound to lo, side A's connect is
// refused, as the kernel refuses it; netstack accepted it before. Bound
// after it accepted a connection, it is handed over to the kernel, which
// refuses the next; netstack accepted that one too before.
func TestRunBindToDevice(t *testing.T) {
	b := pythonBed(t)
	link := b.Link(testbed.B)
	for i, c := range []struct {
		dev, when string
		got       []string // what the program prints after each datagram sent
		log       string
	}{
		{link, "before", []string{"got one"}, "fd 3: offloaded on " + link},
		{"lo", "before", []string{"timeout"}, "bound to interface lo (SO_BINDTODEVICE)"},
		{"lo", "after", []string{"got one", "timeout"}, "bound to interface lo (SO_BINDTODEVICE)"},
		{link, "tcp", []string{"accepted"}, "fd 3: offloaded on " + link + " (tcp_server"},
		{"lo", "tcp", []string{"timeout"}, "bound to interface lo (SO_BINDTODEVICE)"},
		{"lo", "tcp-after", []string{"accepted", "timeout"}, "bound to interface lo (SO_BINDTODEVICE)"},
	} {
		t.Run(c.dev+"/"+c.when, func(t *testing.T) {
			port := 11452 + i
			in := udpInDatagrams(t, b, testbed.B)
			p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, tools(t), "run", "--", "python3", "testdata/bindtodevice.py", c.dev, strconv.Itoa(port), c.when)
			if err := p.waitFor("ready\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			p.waitOffloaded(t)
			// The kernel answers a SYN for a listener bound to another
			// interface with a RST.
			connect := func(refused bool) {
				var conn net.Conn
				err := b.Do(testbed.A, func() (err error) {
					conn, err = net.DialTimeout("tcp4", netip.AddrPortFrom(b.Addr(testbed.B), uint16(port)).String(), 2*time.Second)
					return err
				})
				if (err != nil) != refused {
					t.Errorf("connect from side A: %v, want refused %v", err, refused)
				}
				if conn != nil {
					conn.Close()
				}
			}
			switch c.when {
			case "tcp":
				connect(c.dev != link)
			case "tcp-after":
				connect(false)
			default:
				sendFromA(t, b, port, "one")
			}
			if c.when == "after" || c.when == "tcp-after" {
				if err := p.waitFor("moved\n"); err != nil {
					t.Fatalf("%v\n%s", err, p.out.String())
				}
				if c.when == "tcp-after" {
					connect(true)
				} else {
					sendFromA(t, b, port, "two")
				}
			}
			if err := p.exited(); err != nil {
				t.Errorf("program: %v", err)
			}
			p.wantSaid(t, append(c.got, c.log)...)
			if moved := udpInDatagrams(t, b, testbed.B) - in; c.dev == link && !strings.HasPrefix(c.when, "tcp") && moved != 0 {
				t.Errorf("side B's kernel delivered %d datagrams to a socket bound to %s: not offloaded", moved, link)
			}
		})
	}
}

// dialB is a UDP socket in side A connected to port on side B, closed
// with the test.
func dialB(t *testing.T, b *testbed.Bed, port int) *net.UDPConn {
	t.Helper()
	var c *net.UDPConn
	if err := b.Do(testbed.A, func() (err error) {
		c, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(testbed.B), uint16(port))))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// listenTCPA listens for TCP on side A's address and port, until the
// test ends.
func listenTCPA(t *testing.T, b *testbed.Bed, port int) net.Listener {
	t.Helper()
	var ln net.Listener
	if err := b.Do(testbed.A, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(b.Addr(testbed.A), uint16(port)).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// pythonBed is a plain bed (as ip link add makes it) for a test that runs
// a Python program; it skips when not root or without python3.
func pythonBed(t *testing.T) *testbed.Bed {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	return testutil.Bed(t, &testbed.Options{Plain: true})
}

// sideBySide runs argv in side B on the kernel, then under vmaxdp run
// (env added to both), each to its end, and returns what each printed,
// vmaxdp's log left out; after, when not nil, runs after each run with
// its index (0: the kernel's) and program.
func sideBySide(t *testing.T, b *testbed.Bed, env, argv []string, after func(run int, p *cProgram)) (said [2][]string) {
	t.Helper()
	for i, argv := range [][]string{argv, append([]string{tools(t), "run", "--"}, argv...)} {
		p := startArgv(t, b, env, argv...)
		if err := p.exited(); err != nil {
			t.Fatalf("%v: %v\n%s", argv, err, p.out.String())
		}
		said[i] = programLines(p)
		if after != nil {
			after(i, p)
		}
	}
	return said
}

// programLines is what p printed, vmaxdp's log left out.
func programLines(p *cProgram) []string {
	var lines []string
	for _, l := range strings.Split(p.out.String(), "\n") {
		if l != "" && !strings.HasPrefix(l, "vmaxdp ") {
			lines = append(lines, l)
		}
	}
	return lines
}

// sameLines reports each line where the kernel's run (said[0]) and
// vmaxdp's differ; the kernel's run must have said at least least lines.
func sameLines(t *testing.T, said [2][]string, least int) {
	t.Helper()
	t.Logf("the kernel's run said:\n%s", strings.Join(said[0], "\n"))
	if len(said[0]) < least {
		t.Fatalf("the kernel's run said %d lines, want at least %d", len(said[0]), least)
	}
	for i := range max(len(said[0]), len(said[1])) {
		k, v := "(nothing)", "(nothing)"
		if i < len(said[0]) {
			k = said[0][i]
		}
		if i < len(said[1]) {
			v = said[1][i]
		}
		if k != v {
			t.Errorf("kernel %q, vmaxdp %q", k, v)
		}
	}
}

// TestRunBroadcastSend: an offloaded socket's sends to broadcast addresses
// get what the kernel's get (testdata/broadcast.py, run on the kernel and
// under vmaxdp, side by side): EACCES without SO_BROADCAST, ENETUNREACH
// for 255.255.255.255 with no route to it, and the directed broadcast
// delivered once allowed. Before, the stack sent them all.
func TestRunBroadcastSend(t *testing.T) {
	b := pythonBed(t)
	const port = 11455
	var c *net.UDPConn
	if err := b.Do(testbed.A, func() (err error) {
		c, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The bed's subnet broadcast address: its prefix with every host bit set.
	n := testbed.Prefix.Masked().Addr().As4()
	u := uint32(n[0])<<24 | uint32(n[1])<<16 | uint32(n[2])<<8 | uint32(n[3]) | 1<<(32-testbed.Prefix.Bits()) - 1
	bcast := netip.AddrFrom4([4]byte{byte(u >> 24), byte(u >> 16), byte(u >> 8), byte(u)}).String()
	args := []string{"python3", "testdata/broadcast.py", bcast, b.Addr(testbed.A).String(), strconv.Itoa(port)}
	var got [2][]string
	said := sideBySide(t, b, nil, args, func(i int, p *cProgram) {
		if i == 1 {
			p.wantSaid(t, "fd 3: offloaded on "+b.Link(testbed.B))
		}
		buf := make([]byte, 64)
		for {
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, err := c.Read(buf)
			if err != nil {
				break
			}
			got[i] = append(got[i], string(buf[:n]))
		}
	})
	sameLines(t, said, 5)
	if !slices.Equal(got[0], got[1]) {
		t.Errorf("side A received %q from the kernel's sends, %q under vmaxdp", got[0], got[1])
	}
	t.Logf("side A received %q", got[1])
}

// TestRunUDPSemantics runs testdata/udpsemantics.py on the kernel and
// under vmaxdp, against an echo in side A, and compares what each call
// gave: empty and largest datagrams, truncation, MSG_PEEK, FIONREAD,
// MSG_MORE and UDP_CORK (one datagram of two sends), connect and
// disconnect, a send after shutdown(SHUT_WR) (EPIPE), IP_TOS, IP_TTL and
// IP_MTU_DISCOVER (the DF bit) as the receiver sees them, in order with a send with ancillary data
// (the kernel's), and the receive stamps of SO_TIMESTAMPNS and
// SO_TIMESTAMPING (software) beside IP_PKTINFO, in the kernel's order,
// SIOCGSTAMP and SIOCGSTAMPNS (ENOENT before any datagram, the time of
// the first call after an unstamped read, then a datagram's arrival), and
// datagrams sent as pieces (sendmsg, writev), more than 16 and too long
// for a frame too. Before, under vmaxdp, MSG_MORE and UDP_CORK sent two datagrams and left
// bytes in the kernel socket's cork, a shut down socket sent, IP_TOS was
// not applied, DF was set whatever IP_MTU_DISCOVER said, a send through
// the kernel socket overtook the stack's coalesced ones, and SIOCGSTAMP
// answered ENOENT, from the kernel socket, which read no datagram.
func TestRunUDPSemantics(t *testing.T) {
	b := pythonBed(t)
	const port = 11456
	var echo *net.UDPConn
	rawFD := -1 // a copy of each UDP packet side A receives, IP header and all: its DF bit
	if err := b.Do(testbed.A, func() (err error) {
		if rawFD, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP); err != nil {
			return err
		}
		echo, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(testbed.A), port)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(rawFD)
	defer echo.Close()
	// df finds payload among the raw copies queued (the raw socket has
	// each before the UDP socket does) and says its DF bit.
	df := func(payload []byte) int {
		pkt := make([]byte, 2048)
		for range 1000 {
			n, err := unix.Read(rawFD, pkt)
			if err != nil {
				return -1
			}
			if n < 20 || n < int(pkt[0]&0xf)*4+8 {
				continue
			}
			if hl := int(pkt[0]&0xf) * 4; bytes.Equal(pkt[hl+8:n], payload) {
				return int(pkt[6] >> 6 & 1)
			}
		}
		return -1
	}
	raw, err := echo.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	raw.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
		unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTTL, 1)
	})
	go func() {
		buf, oob := make([]byte, 65536), make([]byte, 128)
		for {
			n, oobn, _, from, err := echo.ReadMsgUDPAddrPort(buf, oob)
			if err != nil {
				return
			}
			reply := buf[:n]
			if bytes.HasPrefix(reply, []byte("meta ")) {
				tos, ttl := -1, -1
				msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
				for _, m := range msgs {
					switch {
					case m.Header.Type == unix.IP_TOS && len(m.Data) >= 1:
						tos = int(m.Data[0])
					case m.Header.Type == unix.IP_TTL && len(m.Data) >= 4:
						ttl = int(binary.NativeEndian.Uint32(m.Data))
					}
				}
				reply = fmt.Appendf(nil, "%s tos=%d ttl=%d df=%d", reply, tos, ttl, df(reply))
			}
			echo.WriteToUDPAddrPort(reply, from)
		}
	}()
	args := []string{"python3", "testdata/udpsemantics.py", b.Addr(testbed.A).String(), strconv.Itoa(port)}
	said := sideBySide(t, b, nil, args, func(i int, p *cProgram) {
		if i == 1 {
			p.wantSaid(t, "fd 3: offloaded on "+b.Link(testbed.B))
			if strings.Contains(p.out.String(), "SO_TIMESTAMPING") {
				t.Errorf("the socket with software receive stamps went to the kernel:\n%s", tail(p.out.String(), 20))
			}
		}
	})
	sameLines(t, said, 31)
}

// TestRunTCPSemantics runs testdata/tcpsemantics.py, a TCP client, on the
// kernel and under vmaxdp (VMAXDP_TCP=1) against an echo server in side A,
// and compares what each call gave (names, MSG_PEEK, MSG_WAITALL,
// FIONREAD, options, SHUT_WR, a refused connect and getpeername after it,
// a non-blocking connect, a peer's close, SO_LINGER 0) and how the server
// saw each connection end. Before, getpeername after a refused connect
// crashed the program under vmaxdp (a Go panic on the zero address).
func TestRunTCPSemantics(t *testing.T) {
	b := pythonBed(t)
	const port, closed = 11457, 11458
	ln := listenTCPA(t, b, port)
	var mu sync.Mutex
	var ends []string // how the server saw each connection end
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 65536)
				end := "eof"
				for {
					n, err := c.Read(buf)
					if err != nil {
						if errors.Is(err, unix.ECONNRESET) {
							end = "reset"
						}
						break
					}
					if string(buf[:n]) == "close-now" {
						end = "closed by the server"
						break
					}
					c.Write(buf[:n])
				}
				mu.Lock()
				ends = append(ends, end)
				mu.Unlock()
			}()
		}
	}()
	args := []string{"python3", "testdata/tcpsemantics.py", b.Addr(testbed.A).String(), strconv.Itoa(port), strconv.Itoa(closed)}
	var ended [2][]string
	said := sideBySide(t, b, []string{"VMAXDP_TCP=1"}, args, func(i int, p *cProgram) {
		if i == 1 {
			p.wantSaid(t, "fd 3: offloaded on "+b.Link(testbed.B)+" (tcp_client")
		}
		time.Sleep(300 * time.Millisecond) // the server's reads see the last close
		mu.Lock()
		ended[i], ends = ends, nil
		mu.Unlock()
		slices.Sort(ended[i])
	})
	sameLines(t, said, 19)
	t.Logf("the server saw the kernel's connections end: %v", ended[0])
	if !slices.Equal(ended[0], ended[1]) {
		t.Errorf("the server saw the kernel's connections end %v, vmaxdp's %v", ended[0], ended[1])
	}
}

// TestRunTCPServerSemantics runs testdata/tcpserver.py on the kernel and
// under vmaxdp (VMAXDP_TCP=1), and compares what a kernel client in side
// A sees of each connection: an echo to the client's EOF, the server's
// names, a close, a close with SO_LINGER 0 (a reset), a close with unread
// data (a reset), a half close (EOF, then the client's bytes still reach
// the server).
func TestRunTCPServerSemantics(t *testing.T) {
	b := pythonBed(t)
	const port = 11459
	cmds := []string{"echo", "names", "close", "linger0", "unread", "halfclose"}
	// client runs one connection: its first line cmd, then what cmd
	// calls for; it says what it saw.
	client := func(cmd string) (saw string) {
		err := b.Do(testbed.A, func() error {
			c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(b.Addr(testbed.B), port).String(), 3*time.Second)
			if err != nil {
				saw = "connect: " + err.Error()
				return nil
			}
			tc := c.(*net.TCPConn)
			defer tc.Close()
			tc.SetDeadline(time.Now().Add(3 * time.Second))
			tc.Write([]byte(cmd + "\n"))
			readAll := func() string {
				got, err := io.ReadAll(tc)
				switch {
				case errors.Is(err, unix.ECONNRESET):
					return fmt.Sprintf("%q then reset", got)
				case err != nil:
					return fmt.Sprintf("%q then %v", got, err)
				}
				return fmt.Sprintf("%q then EOF", got)
			}
			switch cmd {
			case "echo":
				tc.Write([]byte("hello"))
				tc.CloseWrite()
				saw = readAll()
			case "names":
				l, _ := bufio.NewReader(tc).ReadString('\n')
				// The port is the server's; the peer, side A's address.
				saw = strings.TrimSpace(l)
			case "unread":
				buf := make([]byte, 3)
				io.ReadFull(tc, buf)
				tc.Write([]byte("unread bytes"))
				saw = readAll()
			case "halfclose":
				saw = readAll()
				_, err := tc.Write([]byte("after"))
				saw += fmt.Sprintf("; write after: %v", err)
			default:
				saw = readAll()
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return saw
	}
	var saw [2][]string
	var logs [2]string
	argv := []string{"python3", "testdata/tcpserver.py", strconv.Itoa(port), strconv.Itoa(len(cmds))}
	for i, argv := range [][]string{argv, append([]string{tools(t), "run", "--"}, argv...)} {
		p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, argv...)
		if err := p.waitFor("ready\n"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		if i == 1 {
			if err := p.waitFor("offloaded on " + b.Link(testbed.B) + " (tcp_server"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
		}
		for _, cmd := range cmds {
			saw[i] = append(saw[i], cmd+": "+client(cmd))
		}
		if err := p.exited(); err != nil {
			t.Errorf("%v: %v", argv, err)
		}
		logs[i] = p.out.String()
	}
	t.Logf("with the kernel's server the client saw:\n%s", strings.Join(saw[0], "\n"))
	for i := range saw[0] {
		if saw[0][i] != saw[1][i] {
			t.Errorf("kernel %q, vmaxdp %q", saw[0][i], saw[1][i])
		}
	}
	if t.Failed() {
		t.Logf("the server under vmaxdp:\n%s", tail(logs[1], 30))
	}
}

// TestRunFDs runs testdata/fds.c with a soft fd limit of 1024: the
// application keeps its limit and its low fd numbers, and a daemon's
// close-everything loop, closefrom and close_range leave vmaxdp's own fds
// (Go's poller, the AF_XDP socket, the steering maps) alone, so the socket
// still receives through the engine afterwards. Before, the loop killed
// the process ("fatal error: runtime: netpoll failed").
func TestRunFDs(t *testing.T) {
	testutil.RequireRoot(t)
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Skip("prlimit (util-linux) is not installed: it sets the fd limit the program starts with")
	}
	prog := buildC(t, "fds")
	b := testutil.Bed(t, nil)
	const port = 11171
	p := startArgv(t, b, nil, prlimit, "--nofile=1024:4096", "--", tools(t), "run", "--", prog, strconv.Itoa(port), "1024")
	if err := p.waitFor("bound\n"); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	p.waitOffloaded(t)
	sendFromA(t, b, port, "go")
	if err := p.waitFor("ready\n"); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	sendFromA(t, b, port, "hello")
	p.wait(t, b, "rlimit", "closeall-early", "lowfd", "closeall", "dup2", "closefrom", "recv")
	if !strings.Contains(p.out.String(), "refused (EBADF): vmaxdp's engine holds that fd") {
		t.Errorf("the refused dup2 was not logged")
	}
}

// BenchmarkCrossing measures what a call costs an application by the path
// it takes (testdata/crossing.c), as metrics:
//   - kernel-ns: a non-blocking recvfrom on a kernel socket, no vmaxdp;
//   - threaded-ns: the same in a process with a second thread, as every
//     process under vmaxdp is (glibc's calls cost more there);
//   - passthrough-ns: the same under vmaxdp run on a socket that stays on
//     the kernel, which the interposer sends to libc without entering Go:
//     its cost over threaded-ns is the interposer's;
//   - offloaded-ns: the same on an offloaded socket, a crossing into Go and
//     the engine's look at the queue (BenchmarkRecvEmptyNonblocking in
//     internal/engine, without the crossing).
//
// go test -run '^$' -bench Crossing ./cmd/vmaxdp
func BenchmarkCrossing(b *testing.B) {
	testutil.RequireRoot(b)
	vmaxdp := tools(b)
	prog := buildC(b, "crossing")
	bed := testutil.Bed(b, nil)
	run := func(args ...string) map[string]float64 {
		cmd := exec.Command("ip", append([]string{"netns", "exec", bed.NSName(testbed.B)}, args...)...)
		cmd.Env = append(os.Environ(), "VMAXDP_TRACELEVEL=1")
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		m := map[string]float64{}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(line); len(f) == 2 {
				m[f[0]], _ = strconv.ParseFloat(f[1], 64)
			}
		}
		return m
	}
	addr, port := bed.Addr(testbed.B).String(), "11180"
	for b.Loop() {
		kernel := run(prog, addr, port)
		under := run(vmaxdp, "run", "--", prog, addr, port)
		b.ReportMetric(kernel["loopback"], "kernel-ns")
		b.ReportMetric(kernel["threaded"], "threaded-ns")
		b.ReportMetric(under["loopback"], "passthrough-ns")
		b.ReportMetric(under["offloaded"], "offloaded-ns")
	}
}

// BenchmarkProgramStart: what the preload library costs a program that
// makes no socket (a shell's helpers, pyenv's shims, which run a dozen
// programs for each python3): /bin/true, 20 at a time from a shell that
// is not preloaded, without and with the library preloaded, in
// interleaved rounds; ms per program. Its Go runtime starts in each, and
// the engine starts and shuts down. 2026-12-02: 19-22 ms, of which 11
// an RCU grace period the kernel waited for as the engine's first high
// fd grew the fd table beside Go's threads (grow_fd_table in
// interpose.c grows it before they start) and 4-5 the engine's exit,
// which wrote its four MaxFD-long per-fd arrays whole (Engine.use bounds
// the sweeps); 4.5-4.8 ms since, against 0.7 without the library and 2.2
// for an empty Go library's runtime alone.
//
// go test -run '^$' -bench ProgramStart ./cmd/vmaxdp
func BenchmarkProgramStart(b *testing.B) {
	lib := filepath.Join(filepath.Dir(tools(b)), "libvmaxdp.so")
	const n = 20
	run := func(preload bool) float64 {
		env := ""
		if preload {
			env = "LD_PRELOAD=" + lib + " VMAXDP_TRACELEVEL=1 "
		}
		cmd := exec.Command("sh", "-c", fmt.Sprintf("for i in $(seq %d); do %s/bin/true; done", n, env))
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("%v: %v\n%s", cmd.Args, err, out)
		}
		return float64(time.Since(start).Microseconds()) / 1000 / n
	}
	for b.Loop() {
		b.ReportMetric(run(false), "plain-ms")
		b.ReportMetric(run(true), "preloaded-ms")
	}
}

// TestRunUpperLinks: a UDP server bound to the address of an interface
// made above side B's veth, as hosts and container networks make them,
// answers every request of a kernel client in side A.
//   - bridge, the veth one of its ports (generic XDP on the bridge sees
//     its frames): offloaded, and side B's kernel delivers none. The stack
//     took the bridge for a wire (its driver names its bus "N/A") and
//     dropped every datagram, whose checksums a kernel sender leaves
//     partial, as bad_udp_checksum.
//   - macvlan on the veth, whose unicast frames no XDP program on the
//     macvlan sees: left to the kernel, which answers, and the log says
//     why. Before, the socket was said to be offloaded on it while the
//     kernel served it.
func TestRunUpperLinks(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	const port, count = 11446, 20
	for _, kind := range []string{"bridge", "macvlan"} {
		t.Run(kind, func(t *testing.T) {
			b := testutil.Bed(t, &testbed.Options{Plain: true}) // as ip link add makes it
			ip := func(args ...string) error {
				out, err := exec.Command("ip", append([]string{"-n", b.NSName(testbed.B)}, args...)...).CombinedOutput()
				if err != nil {
					return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
				}
				return nil
			}
			link, addr := b.Link(testbed.B), b.Addr(testbed.B)
			switch kind {
			case "bridge":
				if err := ip("link", "add", "up0", "type", "bridge"); err != nil {
					t.Skipf("no bridge to be had: %v", err)
				}
				for _, args := range [][]string{{"link", "set", link, "master", "up0"}, {"addr", "del", addr.String() + "/24", "dev", link},
					{"addr", "add", addr.String() + "/24", "dev", "up0"}, {"link", "set", "up0", "up"}} {
					if err := ip(args...); err != nil {
						t.Fatal(err)
					}
				}
			case "macvlan":
				if err := ip("link", "add", "up0", "link", link, "type", "macvlan", "mode", "bridge"); err != nil {
					t.Skipf("no macvlan to be had: %v", err)
				}
				a := addr.As4()
				a[3] += 10
				addr = netip.AddrFrom4(a)
				for _, args := range [][]string{{"addr", "add", addr.String() + "/24", "dev", "up0"}, {"link", "set", "up0", "up"}} {
					if err := ip(args...); err != nil {
						t.Fatal(err)
					}
				}
			}
			before := udpInDatagrams(t, b, testbed.B)
			p := startArgv(t, b, nil, tools(t), "run", "--", "python3", "-c", echoCount, addr.String(), strconv.Itoa(port), strconv.Itoa(count))
			if err := p.waitFor("ready\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			if kind == "bridge" {
				p.waitOffloaded(t) // its stack opens after bind: the kernel socket serves until then
			}
			if err := echoFromA(b, netip.AddrPortFrom(addr, port), count); err != nil {
				t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
			}
			if err := p.waitFor("echoed all\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			moved := udpInDatagrams(t, b, testbed.B) - before
			switch kind {
			case "bridge":
				p.wantSaid(t, "fd 3: offloaded on up0")
				if moved != 0 {
					t.Errorf("side B's kernel delivered %d datagrams: not offloaded", moved)
				}
				bridgeTCP(t, b, addr)
			case "macvlan":
				p.wantSaid(t, "up0 is a macvlan interface on "+link)
				if moved != count {
					t.Errorf("side B's kernel delivered %d datagrams, want all %d", moved, count)
				}
			}
		})
	}
}

// bridgeTCP: TCP through netstack (VMAXDP_TCP=1) on the bridge of
// TestRunUpperLinks, whose address is addr: testdata/tcpserver.py echoes
// 5 connections of a kernel client in side A, and side B's kernel
// accepts none of them.
func bridgeTCP(t *testing.T, b *testbed.Bed, addr netip.Addr) {
	t.Helper()
	const port, conns = 11449, 5
	opens := testutil.SNMPStat(t, b, testbed.B, "Tcp", "PassiveOpens")
	p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, tools(t), "run", "--", "python3", "testdata/tcpserver.py", strconv.Itoa(port), strconv.Itoa(conns))
	if err := p.waitFor("ready\n"); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	err := b.Do(testbed.A, func() error {
		for i := range conns {
			c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(addr, port).String(), 5*time.Second)
			if err != nil {
				return err
			}
			c.SetDeadline(time.Now().Add(5 * time.Second))
			msg := fmt.Sprintf("hello %d", i)
			if _, err := fmt.Fprintf(c, "echo\n%s", msg); err != nil {
				c.Close()
				return err
			}
			c.(*net.TCPConn).CloseWrite()
			got, err := io.ReadAll(c)
			c.Close()
			if err != nil || string(got) != msg {
				return fmt.Errorf("connection %d: echo %q, %v", i, got, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("TCP on the bridge: %v\n%s", err, tail(p.out.String(), 20))
	}
	if n := testutil.SNMPStat(t, b, testbed.B, "Tcp", "PassiveOpens") - opens; n != 0 {
		t.Errorf("TCP on the bridge: side B's kernel accepted %d of %d connections: not offloaded", n, conns)
	}
}

// echoCount is a Python UDP echo server: ADDR PORT COUNT. It prints
// "ready" once bound and "echoed all" after COUNT echoes, each line in
// one write, as every inline Python program here does (testdata/say.py):
// vmaxdp's log shares the output, and with PYTHONUNBUFFERED print writes
// its text and newline apart (TestRunUpperLinks saw "ready", a log line,
// then the newline). A test waits for such a line with its newline: the
// log's Cmd Line holds the program's source, and the text in it.
const echoCount = `import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
sys.stdout.write("ready\n"); sys.stdout.flush()
for _ in range(int(sys.argv[3])):
    d, a = s.recvfrom(2048)
    s.sendto(d, a)
sys.stdout.write("echoed all\n"); sys.stdout.flush()
`

// echoFromA sends count requests from side A to server, each waiting for
// its echo, which must come from server's address.
func echoFromA(b *testbed.Bed, server netip.AddrPort, count int) error {
	return b.Do(testbed.A, func() error {
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 64)
		for i := range count {
			msg := fmt.Sprintf("request %d to %s", i, server)
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.WriteToUDPAddrPort([]byte(msg), server); err != nil {
				return err
			}
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil || string(buf[:n]) != msg || from != server {
				return fmt.Errorf("%s: echo %q from %s, %v", msg, buf[:n], from, err)
			}
		}
		return nil
	})
}

// TestRunWildcardTwoLinks: a UDP server bound to 0.0.0.0 on a host with two
// links (side B with a second veth pair to side A; hosts have a docker0 or
// a second NIC beside their own) is offloaded on the one the default route
// leaves by, and answers what comes through the other from its kernel
// socket, from the address asked. Every such socket used to stay on the
// kernel ("set VMAXDP_INTERFACE"); with no default route it still does,
// and says so.
func TestRunWildcardTwoLinks(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	b := testutil.Bed(t, &testbed.Options{Plain: true}) // as ip link add makes it
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	nsA, nsB := b.NSName(testbed.A), b.NSName(testbed.B)
	ip("link", "add", "w2a", "netns", nsA, "type", "veth", "peer", "name", "w2b", "netns", nsB)
	ip("-n", nsA, "addr", "add", "198.18.1.1/24", "dev", "w2a")
	ip("-n", nsB, "addr", "add", "198.18.1.2/24", "dev", "w2b")
	ip("-n", nsA, "link", "set", "w2a", "up")
	ip("-n", nsB, "link", "set", "w2b", "up")
	const port, count = 11447, 10
	first := netip.AddrPortFrom(b.Addr(testbed.B), port)
	second := netip.AddrPortFrom(netip.MustParseAddr("198.18.1.2"), port)
	serve := func(t *testing.T) *cProgram {
		p := startArgv(t, b, nil, tools(t), "run", "--", "python3", "-c", echoCount, "0.0.0.0", strconv.Itoa(port), strconv.Itoa(2*count))
		if err := p.waitFor("ready\n"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		return p
	}
	t.Run("no-default-route", func(t *testing.T) {
		p := serve(t)
		for _, server := range []netip.AddrPort{first, second} {
			if err := echoFromA(b, server, count); err != nil {
				t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
			}
		}
		p.wantSaid(t, "bound to 0.0.0.0 and 2 interfaces have IPv4 addresses ("+b.Link(testbed.B)+", w2b), and the default route leaves by none: set VMAXDP_INTERFACE")
	})
	t.Run("default-route", func(t *testing.T) {
		ip("-n", nsB, "route", "add", "default", "via", b.Addr(testbed.A).String(), "dev", b.Link(testbed.B))
		p := serve(t)
		p.waitOffloaded(t)
		before := udpInDatagrams(t, b, testbed.B)
		if err := echoFromA(b, first, count); err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
		if moved := udpInDatagrams(t, b, testbed.B) - before; moved != 0 {
			t.Errorf("side B's kernel delivered %d of the datagrams to %s: not offloaded", moved, first)
		}
		if err := echoFromA(b, second, count); err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
		if moved := udpInDatagrams(t, b, testbed.B) - before; moved != count {
			t.Errorf("side B's kernel delivered %d of the datagrams to %s, want all %d", moved, second, count)
		}
		p.wantSaid(t, "fd 3: offloaded on "+b.Link(testbed.B), "sockets bound to 0.0.0.0 are offloaded on "+b.Link(testbed.B)+", the default route's interface; what comes to them through w2b reaches them through the kernel")
	})
}

// TestRunTxStamps: software transmit timestamps without the packet
// (SO_TIMESTAMPING with TX_SOFTWARE, SOFTWARE, OPT_TSONLY and OPT_ID), as
// a trading application times its sends, and with the packet looped back
// (chrony's: no OPT_TSONLY, OPT_CMSG with IP_PKTINFO, SO_SELECT_ERR_QUEUE),
// on an offloaded socket: the error queue gives what the kernel's does
// (testdata/txstamps.c, on the kernel and under vmaxdp, line by line:
// POLLERR, EPOLLERR and select's readable, each stamp's SCM_TIMESTAMPING
// and IP_RECVERR with its key, EAGAIN once read, nothing once turned off;
// select's exceptfds and POLLPRI, the looped frame whole and cut with
// MSG_TRUNC, IP_PKTINFO and the offender; a stamp one sendmsg asks for in
// its ancillary data, as chrony's server does in interleaved mode), and
// side B's kernel sends none of the datagrams under vmaxdp, on both beds.
// Before, such a socket went back to the kernel.
func TestRunTxStamps(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "txstamps")
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) { testTxStamps(t, b, prog) })
}

func testTxStamps(t *testing.T, b *testbed.Bed, prog string) {
	const port, sent = 11448, 11
	c := testutil.ListenUDP(t, b, testbed.A, port)
	out := 0
	said := sideBySide(t, b, nil, []string{prog, b.Addr(testbed.A).String(), strconv.Itoa(port)}, func(i int, p *cProgram) {
		n, buf := 0, make([]byte, 64)
		for {
			c.SetReadDeadline(time.Now().Add(time.Second))
			if _, err := c.Read(buf); err != nil {
				break
			}
			n++
		}
		if n != sent {
			t.Errorf("run %d: side A received %d datagrams, want %d", i, n, sent)
		}
		if i == 0 {
			out = testutil.UDPStat(t, b, testbed.B, "OutDatagrams")
			return
		}
		p.wantSaid(t, "fd 3: offloaded on "+b.Link(testbed.B))
		if strings.Contains(p.out.String(), "SO_TIMESTAMPING") {
			t.Errorf("vmaxdp's log names SO_TIMESTAMPING:\n%s", tail(p.out.String(), 20))
		}
		if moved := testutil.UDPStat(t, b, testbed.B, "OutDatagrams") - out; moved != 0 {
			t.Errorf("side B's kernel sent %d datagrams under vmaxdp: not offloaded", moved)
		}
	})
	sameLines(t, said, 20)
}
