package main

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunReusePort runs testdata/reuseport.c, a SO_REUSEPORT group with
// one thread per socket, and asks it from side A over 64 flows through
// the kernel: every request is answered, each flow by one socket, and the
// flows are spread over the group. Under vmaxdp run alone the whole group
// is offloaded (the kernel delivers nothing); a group that chooses its
// members itself (SO_ATTACH_REUSEPORT_CBPF, SO_INCOMING_CPU), or that
// shares its port with another process, stays on the kernel and the log
// says why.
func TestRunReusePort(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "reuseport")
	// A plain bed, as `ip link add` makes it: the kernel-stack requests
	// carry partial checksums.
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	const n, seconds = 4, "4"
	t.Run("offloaded", func(t *testing.T) {
		const port = 11180
		// Go's scheduler says how many Ps it runs with (preload's ps).
		p := startC(t, b, prog, []string{"GODEBUG=schedtrace=100"}, fmt.Sprint(port), fmt.Sprint(n), seconds)
		if err := p.waitFor("bound\n"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		p.waitOffloaded(t)
		before := udpInDatagrams(t, b, testbed.B)
		sent, members := askGroup(t, b, "udp4", port, true)
		// Each thread that receives holds a P while back in C, and the
		// engine's goroutines need one: n+1, and no more, lest every
		// goroutine readied wake a thread to look for work on the rest.
		ps := 0
		for _, m := range regexp.MustCompile(`gomaxprocs=(\d+)`).FindAllStringSubmatch(p.out.String(), -1) {
			k, _ := strconv.Atoi(m[1])
			ps = max(ps, k)
		}
		if want := max(n+1, runtime.NumCPU()); ps != want {
			t.Errorf("Go ran with at most %d Ps, want %d: one for each of the %d threads that receive and one for the engine's goroutines", ps, want, n)
		}
		if kernel := udpInDatagrams(t, b, testbed.B) - before; kernel > sent/10 {
			t.Errorf("the kernel delivered %d of %d requests: the group was not offloaded", kernel, sent)
		}
		if members < 2 {
			t.Errorf("%d flows went to %d member of %d: not spread", flows, members, n)
		}
		// vmaxdp stats shows the group: each socket, offloaded, with the
		// datagrams it got, which add up to the requests (the process
		// publishes ten times a second: a busy machine can lag).
		var out []byte
		var rows [][]string
		total := 0
		re := regexp.MustCompile(`(?m)^(?:\[0\.0\.0\.0:11180\])?\s+\d+\s+yes\s+(\d+) / \d+$`)
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			var err error
			out, err = exec.Command(tools(t), "stats", "-p", fmt.Sprint(p.pid), "-v", "4", "-c", "1").CombinedOutput()
			if err != nil {
				t.Fatalf("vmaxdp stats: %v\n%s", err, out)
			}
			rows, total = re.FindAllStringSubmatch(string(out), -1), 0
			for _, r := range rows {
				k, _ := strconv.Atoi(r[1])
				total += k
			}
			if total >= sent || time.Now().After(deadline) {
				break
			}
		}
		if !strings.Contains(string(out), "VMAXDP SO_REUSEPORT Groups\n") || len(rows) != n || total != sent {
			t.Errorf("vmaxdp stats -v 4: %d offloaded members with %d datagrams, want %d with %d:\n%s", len(rows), total, n, sent, out)
		}
		p.wait(t, b)
		// fds are not checked by number: the stack opens while the
		// program binds, and its own fds are made low and moved high.
		if got := len(regexp.MustCompile(`fd \d+: offloaded on `+b.Link(testbed.B)).FindAllString(p.out.String(), -1)); got != n {
			t.Errorf("%d of the group's %d sockets were offloaded:\n%s", got, n, p.out.String())
		}
	})
	t.Run("one flow", func(t *testing.T) {
		const port, threads, requests = 11185, 2, 400
		p := startC(t, b, prog, nil, fmt.Sprint(port), fmt.Sprint(threads), seconds)
		if err := p.waitFor("bound\n"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		p.waitOffloaded(t)
		before, idle := udpInDatagrams(t, b, testbed.B), threadSwitches(t, p.pid)
		if err := pingFlow(b, port, requests); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		after := threadSwitches(t, p.pid)
		// Go's threads are named vmaxdp: named after the thread whose
		// call made them, as before, they passed for the program's.
		names := map[string]int{}
		for _, c := range after {
			names[c.name]++
		}
		if names["vmaxdp"] == 0 || len(after)-names["vmaxdp"] != 2+threads {
			t.Errorf("the threads by name: %v; want the program's %d (its main thread and watchdog, serve0 to serve%d) and Go's, named vmaxdp", names, 2+threads, threads-1)
		}
		var woke []int
		for i := range threads {
			woke = append(woke, wokeSince(idle, after, fmt.Sprintf("serve%d", i))...)
		}
		t.Logf("%d requests of one flow: the threads' voluntary context switches %v", requests, woke)
		if slices.Min(woke) > requests/10 {
			t.Errorf("the thread whose socket the flow does not reach slept and woke %d times for %d requests: woken for its sibling's datagrams", slices.Min(woke), requests)
		}
		if kernel := udpInDatagrams(t, b, testbed.B) - before; kernel > requests/10 {
			t.Errorf("the kernel delivered %d of %d requests: not offloaded", kernel, requests)
		}
		p.wait(t, b)
	})
	for i, sel := range []string{"cbpf", "cpu"} {
		opt := map[string]string{"cbpf": "SO_ATTACH_REUSEPORT_CBPF", "cpu": "SO_INCOMING_CPU"}[sel]
		t.Run(opt, func(t *testing.T) {
			port := 11181 + i
			p := startC(t, b, prog, nil, fmt.Sprint(port), fmt.Sprint(n), seconds, sel)
			if err := p.waitFor("bound\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			p.waitOffloaded(t)
			before := udpInDatagrams(t, b, testbed.B)
			sent, _ := askGroup(t, b, "udp4", port, false)
			if kernel := udpInDatagrams(t, b, testbed.B) - before; kernel < sent {
				t.Errorf("the kernel delivered %d of %d requests: the group was offloaded though %s chooses its members", kernel, sent, opt)
			}
			p.exited()
			if want := regexp.MustCompile(opt + `( \(\d+\))? chooses the socket of its SO_REUSEPORT group`); !want.MatchString(p.out.String()) {
				t.Errorf("the log does not say %q:\n%s", want, p.out.String())
			}
		})
	}
	// Two processes share the port, one under vmaxdp: the kernel must
	// spread their datagrams over both, whichever bound first.
	for i, vmaxdpFirst := range []bool{true, false} {
		name := map[bool]string{true: "shared/vmaxdp_first", false: "shared/kernel_first"}[vmaxdpFirst]
		t.Run(name, func(t *testing.T) {
			port := 11183 + i
			args := []string{fmt.Sprint(port), "2", seconds}
			var under, plain *cProgram
			start := func(offload bool) *cProgram {
				var p *cProgram
				if offload {
					p = startC(t, b, prog, nil, args...)
				} else {
					p = startArgv(t, b, nil, append([]string{prog}, args...)...)
				}
				if err := p.waitFor("bound\n"); err != nil {
					t.Fatalf("%v\n%s", err, p.out.String())
				}
				return p
			}
			if vmaxdpFirst {
				under = start(true)
				under.waitOffloaded(t)
				plain = start(false)
			} else {
				plain = start(false)
				under = start(true)
			}
			// Offloaded first, each of its two members says so once its
			// own steering is gone; the port's rule goes with the last of
			// them, and a request sent after the first line could still
			// be steered. Left to the kernel at bind, it says so once.
			want, lines := fmt.Sprintf("is shared with pid %d (reuseport)", plain.pid), 1
			if vmaxdpFirst {
				lines = 2
			}
			for deadline := time.Now().Add(10 * time.Second); strings.Count(under.out.String(), want) < lines; time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("vmaxdp did not say %q %d times in 10 s:\n%s", want, lines, under.out.String())
				}
			}
			before := udpInDatagrams(t, b, testbed.B)
			sent, _ := askGroup(t, b, "udp4", port, true)
			if kernel := udpInDatagrams(t, b, testbed.B) - before; kernel < sent {
				t.Errorf("the kernel delivered %d of %d requests: vmaxdp kept some though the port is shared", kernel, sent)
			}
			under.exited()
			plain.exited()
			if u, k := servedBy(under), servedBy(plain); u == 0 || k == 0 {
				t.Errorf("the process under vmaxdp served %d requests, the other %d: the kernel spreads flows over both", u, k)
			}
		})
	}
}

// servedBy adds up the requests testdata/reuseport says its sockets
// served ("served I N").
func servedBy(p *cProgram) (sum int) {
	for _, l := range strings.Split(p.out.String(), "\n") {
		var i, k int
		if _, err := fmt.Sscanf(l, "served %d %d", &i, &k); err == nil {
			sum += k
		}
	}
	return sum
}

// flows and perFlow shape askGroup's load.
const flows, perFlow = 64, 10

// askGroup sends perFlow requests on each of flows sockets of side A
// (flows through the kernel, each its own source port) to port on side
// B, one at a time per flow, and checks every answer: it fails the test
// for a request not answered within a second, or, when sticky, a flow
// answered by two members (a group that chooses its members by CPU
// moves a flow when its datagrams come in on another CPU). It returns
// the requests sent (up to flows*perFlow: a flow stops at its first
// failure) and the members that answered. network is udp4 (a request is
// a datagram) or tcp4 (a line on a connection per flow).
func askGroup(t *testing.T, b *testbed.Bed, network string, port int, sticky bool) (sent, members int) {
	t.Helper()
	to := netip.AddrPortFrom(b.Addr(testbed.B), uint16(port))
	conns := make([]net.Conn, flows)
	err := b.Do(testbed.A, func() error {
		for i := range conns {
			c, err := net.DialTimeout(network, to.String(), 5*time.Second)
			if err != nil {
				return err
			}
			conns[i] = c
		}
		return nil
	})
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]bool{}
	var asked atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, flows)
	for f, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			member := ""
			buf := make([]byte, 256)
			lines := bufio.NewReader(c)
			for k := range perFlow {
				req := fmt.Sprintf("flow %d request %d", f, k)
				wire := req
				if network == "tcp4" {
					wire += "\n"
				}
				if _, err := c.Write([]byte(wire)); err != nil {
					errs <- err
					return
				}
				asked.Add(1)
				c.SetReadDeadline(time.Now().Add(time.Second))
				var answer string
				if network == "tcp4" {
					answer, err = lines.ReadString('\n')
					answer = strings.TrimSuffix(answer, "\n")
				} else {
					var m int
					m, err = c.Read(buf)
					answer = string(buf[:m])
				}
				if err != nil {
					errs <- fmt.Errorf("%s from %s: no answer: %w", req, c.LocalAddr(), err)
					return
				}
				who, echo, _ := strings.Cut(answer, " ")
				switch {
				case echo != req:
					errs <- fmt.Errorf("%s: answered %q", req, answer)
					return
				case sticky && member != "" && who != member:
					errs <- fmt.Errorf("flow %d: answered by members %s and %s", f, member, who)
					return
				}
				member = who
			}
			mu.Lock()
			seen[member] = true
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	return int(asked.Load()), len(seen)
}

// pingFlow asks port on side B from one kernel socket of side A (one
// flow), requests times, each answer awaited, a millisecond apart so that
// the server's threads sleep between them.
func pingFlow(b *testbed.Bed, port, requests int) error {
	to := netip.AddrPortFrom(b.Addr(testbed.B), uint16(port)).String()
	return b.Do(testbed.A, func() error {
		c, err := net.DialTimeout("udp4", to, 5*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		buf := make([]byte, 256)
		for i := range requests {
			if _, err := fmt.Fprintf(c, "request %d", i); err != nil {
				return err
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := c.Read(buf); err != nil {
				return fmt.Errorf("request %d of %d: %w", i, requests, err)
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	})
}

// threadSwitches are the voluntary context switches of each thread of
// process pid (the kernel's count: each is a sleep that woke), by thread
// id, with the thread's name.
func threadSwitches(t *testing.T, pid int) map[int]threadCount {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("the threads of process %d: %v", pid, err)
	}
	out := map[int]threadCount{}
	for _, task := range tasks {
		tid, _ := strconv.Atoi(filepath.Base(task))
		comm, err1 := os.ReadFile(filepath.Join(task, "comm"))
		status, err2 := os.ReadFile(filepath.Join(task, "status"))
		if err1 != nil || err2 != nil {
			continue // the thread ended
		}
		m := regexp.MustCompile(`(?m)^voluntary_ctxt_switches:\s+(\d+)$`).FindSubmatch(status)
		if m == nil {
			t.Fatalf("%s/status has no voluntary_ctxt_switches", task)
		}
		n, _ := strconv.Atoi(string(m[1]))
		out[tid] = threadCount{strings.TrimSpace(string(comm)), n}
	}
	return out
}

type threadCount struct {
	name string
	n    int
}

// wokeSince are the voluntary context switches since before of the
// threads named name, in thread id order.
func wokeSince(before, after map[int]threadCount, name string) []int {
	var tids []int
	for tid, c := range after {
		if c.name == name {
			tids = append(tids, tid)
		}
	}
	slices.Sort(tids)
	var out []int
	for _, tid := range tids {
		out = append(out, after[tid].n-before[tid].n)
	}
	return out
}

// TestRunPowerDNSRecursor: PowerDNS's recursor (Debian's pdns-recursor,
// not written with vmaxdp in mind) with a socket per thread
// (reuseport=yes, pdns-distributes-queries=no: two workers, a
// SO_REUSEPORT group of two), serving a zone of its own, under vmaxdp
// run, asked by dnsperf from side A on one socket (one flow, its
// default), paced. Every query is answered, the kernel of the
// recursor's namespace receives none, and the worker whose socket the
// flow does not reach stays asleep: with every thread asleep on the
// stack's queues, each query woke it too (it made 0.61-0.67x the
// kernel's queries a second unpaced, where one worker made 1.0x). Both
// beds.
func TestRunPowerDNSRecursor(t *testing.T) {
	testutil.RequireRoot(t)
	for _, prog := range []string{"pdns_recursor", "dnsperf"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("%s is not installed (make deps installs it)", prog)
		}
	}
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		const port, rate, seconds = 11186, 1000, 2
		dir := t.TempDir()
		addr := b.Addr(testbed.B).String()
		files := map[string]string{
			"zone": "$ORIGIN example.test.\n$TTL 3600\n@ IN SOA ns admin 1 3600 600 86400 300\n@ IN NS ns\nns IN A " + addr + "\nwww IN A 198.18.0.10\n",
			// Nothing leaves the bed: the root is forwarded to a port of
			// side B that nobody serves, and the security poll is off.
			"recursor.conf": fmt.Sprintf("local-address=%s\nlocal-port=%d\nauth-zones=example.test=%s/zone\nforward-zones=.=%s:5399\nsecurity-poll-suffix=\nallow-from=198.18.0.0/15\nthreads=2\nreuseport=yes\npdns-distributes-queries=no\nsocket-dir=%s\ndaemon=no\nwrite-pid=no\n",
				addr, port, dir, addr, dir),
			"queries": "www.example.test A\n",
		}
		for name, text := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		p := startArgv(t, b, nil, tools(t), "run", "--", "pdns_recursor", "--config-dir="+dir)
		p.waitOffloaded(t)
		kernel, idle := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams"), threadSwitches(t, p.pid)
		out, err := exec.Command("ip", "netns", "exec", b.NSName(testbed.A), "dnsperf", "-s", addr, "-p", strconv.Itoa(port),
			"-d", filepath.Join(dir, "queries"), "-Q", strconv.Itoa(rate), "-l", strconv.Itoa(seconds), "-t", "2").CombinedOutput()
		m := regexp.MustCompile(`Queries completed:\s+(\d+) `).FindSubmatch(out)
		if err != nil || m == nil || !strings.Contains(string(out), "Queries lost:         0 ") {
			t.Fatalf("dnsperf: %v\n%s\nvmaxdp run:\n%s", err, out, tail(p.out.String(), 20))
		}
		queries, _ := strconv.Atoi(string(m[1]))
		woke := wokeSince(idle, threadSwitches(t, p.pid), "rec/worker")
		t.Logf("%d queries of one flow, all answered: the voluntary context switches of the threads named rec/worker %v", queries, woke)
		if len(woke) != 2 {
			t.Fatalf("%d threads named rec/worker, want pdns_recursor's 2 (Go's are named vmaxdp)", len(woke))
		}
		if idle := slices.Min(woke); idle > queries/10 {
			t.Errorf("the worker whose socket the flow does not reach slept and woke %d times for %d queries: woken for its sibling's", idle, queries)
		}
		if n := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - kernel; n > queries/100 {
			t.Errorf("the kernel in the recursor's namespace received %d of %d queries: not offloaded", n, queries)
		}
	})
}
