package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/vmaxdp/vmaxdp/internal/sockperf"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// vmaxdpStats runs `vmaxdp stats args...` and returns its stdout; stderr
// goes into the error.
func vmaxdpStats(vmaxdp string, args ...string) (string, error) {
	var out, errb bytes.Buffer
	cmd := exec.Command(vmaxdp, append([]string{"stats"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		return "", err
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return out.String(), fmt.Errorf("vmaxdp stats %s: %w: %s", strings.Join(args, " "), err, errb.String())
		}
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return out.String(), fmt.Errorf("vmaxdp stats %s: no answer in 20 s", strings.Join(args, " "))
	}
	return out.String(), nil
}

func snapshotJSON(t *testing.T, vmaxdp, dir string, pid int) *stats.Snapshot {
	t.Helper()
	out, err := vmaxdpStats(vmaxdp, "-k", dir, "-p", strconv.Itoa(pid), "--json", "-c", "1")
	if err != nil {
		t.Fatal(err)
	}
	var snaps []*stats.Snapshot
	if err := json.Unmarshal([]byte(out), &snaps); err != nil || len(snaps) != 1 {
		t.Fatalf("--json: %v (%d snapshots)\n%s", err, len(snaps), out)
	}
	return snaps[0]
}

// offloadedSocket is the first offloaded socket of a snapshot.
func offloadedSocket(s *stats.Snapshot) *stats.Socket {
	for i := range s.Sockets {
		if s.Sockets[i].Offloaded() {
			return &s.Sockets[i]
		}
	}
	return nil
}

// promValue finds the value of a metric with the given labels in parsed
// families.
func promValue(fams map[string]*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	mf := fams[name]
	if mf == nil {
		return 0, false
	}
next:
	for _, m := range mf.Metric {
		for k, v := range labels {
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == k && lp.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		if m.Counter != nil {
			return m.Counter.GetValue(), true
		}
		return m.Gauge.GetValue(), true
	}
	return 0, false
}

func parseProm(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("the Prometheus parser refuses the exposition: %v\n%s", err, text)
	}
	return fams
}

var rowRx = regexp.MustCompile(`(?m)^(\d+)\s+Rx:\s+(\d+)`)

// TestStatsSockperf is the proof of vmaxdp stats: sockperf's throughput
// server under vmaxdp run, a kernel client, and every view of the counters
// while it runs and after, down to the exact message count.
func TestStatsSockperf(t *testing.T) {
	requireSockperf(t)
	vmaxdp := tools(t)
	b := testutil.Bed(t, nil)
	dir := t.TempDir()
	closeFile := filepath.Join(dir, "close.txt")
	srv := []string{"-i", b.Addr(testbed.B).String(), "-p", "11140"}

	var moving []int // the offloaded socket's rx packets, sampled while the client runs
	var movingErr error
	sampled, clientDone := make(chan struct{}), make(chan struct{})
	run := &sockperf.Run{Bed: b, Vmaxdp: vmaxdp, ServerOffload: true, Server: srv,
		Client: append([]string{"tp"}, append(srv, "-t", "2", "-m", "64", "--mps", "20000")...),
		Env:    []string{"VMAXDP_STATS_DIR=" + dir, "VMAXDP_STATS_FILE=" + closeFile},
		OnServer: func(pid int) {
			go func() {
				defer close(sampled)
				// The client warms up for about two seconds, then sends
				// for two: sample until it ends (bounded).
				for i := 0; i < 40; i++ {
					select {
					case <-clientDone:
						return
					case <-time.After(250 * time.Millisecond):
					}
					out, err := vmaxdpStats(vmaxdp, "-k", dir, "-p", strconv.Itoa(pid), "-c", "1")
					if err != nil {
						movingErr = err
						return
					}
					if m := rowRx.FindStringSubmatch(out); m != nil {
						if n, _ := strconv.Atoi(m[2]); n > 0 {
							moving = append(moving, n)
						}
					}
				}
			}()
		},
	}
	run.AfterClient = func(pid int, res sockperf.Result) error {
		close(clientDone)
		<-sampled
		p := strconv.Itoa(pid)
		if _, err := os.Stat(filepath.Join(dir, stats.FileName(pid))); err != nil {
			t.Errorf("the server's stats file: %v", err)
		}
		// The counters settle at the client's count, exactly.
		n := uint64(res.Sent)
		var s *stats.Snapshot
		for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			s = snapshotJSON(t, vmaxdp, dir, pid)
			if sk := offloadedSocket(s); sk != nil && sk.Counters.RxOffloadPackets >= n || time.Now().After(deadline) {
				break
			}
		}
		sk := offloadedSocket(s)
		if sk == nil {
			t.Fatalf("no offloaded socket in %+v", s.Sockets)
		}
		if sk.Counters.RxOffloadPackets != n || sk.Counters.RxOffloadBytes != 64*n || sk.Counters.RxQueueDrops != 0 {
			t.Errorf("socket fd %d: %d packets, %d bytes, %d drops; the client sent %d of 64 bytes", sk.FD,
				sk.Counters.RxOffloadPackets, sk.Counters.RxOffloadBytes, sk.Counters.RxQueueDrops, n)
		}
		if len(sk.Rules) != 1 {
			t.Fatalf("socket rules %v, want one", sk.Rules)
		}
		for _, r := range s.Rules {
			if r.ID == sk.Rules[0] && (r.FD != sk.FD || r.Counters.MatchedPackets != n || r.Redirected() != n || r.Counters.RedirectFailures != 0) {
				t.Errorf("rule %+v: want fd %d, %d matched and redirected, no failures", r, sk.FD, n)
			}
		}
		fd := strconv.Itoa(sk.FD)

		// View 1, as vma_stats prints it.
		out, err := vmaxdpStats(vmaxdp, "-k", dir, "-p", p, "-c", "1")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "------------ total offloaded -------------") || !regexp.MustCompile(`(?m)^`+fd+`\s+Rx:\s+`+strconv.FormatUint(n, 10)+` `).MatchString(out) {
			t.Errorf("view 1 lacks fd %s with %d packets:\n%s", fd, n, out)
		}
		// Views 2 to 5, and -s selecting nothing.
		for _, v := range []struct{ args, want []string }{
			{[]string{"-v", "2"}, []string{"Fd=[" + fd + "]", "- Offloaded on " + b.Link(testbed.B), "Rx poll:"}},
			{[]string{"-v", "3"}, []string{"QUEUE=[" + b.Link(testbed.B) + "/q0]", "Backend:              AF_XDP", "BUFFER_POOL(RX)", "BUFFER_POOL(TX)", "STEER=[" + b.Link(testbed.B) + "]", "[matched/redirected/redirect failures/too long]"}},
			{[]string{"-v", "4"}, []string{"Group Membership Information"}},
			{[]string{"-v", "5"}, []string{"udp   Yes       " + b.Addr(testbed.B).String() + ":11140"}},
			{[]string{"-d", "2", "-i", "0.3"}, []string{"pkt/s Kbyte/s eagain/s"}},
		} {
			out, err := vmaxdpStats(vmaxdp, append([]string{"-k", dir, "-p", p, "-c", "1"}, v.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range v.want {
				if !strings.Contains(out, w) {
					t.Errorf("vmaxdp stats %s lacks %q:\n%s", strings.Join(v.args, " "), w, out)
				}
			}
		}
		if out, _ := vmaxdpStats(vmaxdp, "-k", dir, "-p", p, "-c", "1", "-s", "1000-1010"); rowRx.MatchString(out) {
			t.Errorf("-s 1000-1010 still shows a socket:\n%s", out)
		}

		// Prometheus text, parsed by the Prometheus project's parser.
		out, err = vmaxdpStats(vmaxdp, "-k", dir, "--prometheus", "-c", "1")
		if err != nil {
			t.Fatal(err)
		}
		fams := parseProm(t, out)
		if v, ok := promValue(fams, "vmaxdp_socket_rx_offload_packets_total", map[string]string{"pid": p, "fd": fd, "ifname": b.Link(testbed.B)}); !ok || v != float64(n) {
			t.Errorf("vmaxdp_socket_rx_offload_packets_total{fd=%s} = %v (found %v), want %d", fd, v, ok, n)
		}
		if v, ok := promValue(fams, "vmaxdp_rule_matched_packets_total", map[string]string{"pid": p, "fd": fd}); !ok || v != float64(n) {
			t.Errorf("vmaxdp_rule_matched_packets_total{fd=%s} = %v (found %v), want %d", fd, v, ok, n)
		}
		if _, ok := promValue(fams, "vmaxdp_queue_rx_ring_full_total", map[string]string{"pid": p, "queue": "0"}); !ok {
			t.Error("no vmaxdp_queue_rx_ring_full_total{queue=0}")
		}

		// stats serve: /metrics over loopback.
		srvCtx, stop := context.WithCancel(context.Background())
		defer stop()
		serve := exec.CommandContext(srvCtx, vmaxdp, "stats", "serve", "--listen", "127.0.0.1:0", "-k", dir)
		pipe, _ := serve.StdoutPipe()
		if err := serve.Start(); err != nil {
			t.Fatal(err)
		}
		defer serve.Wait()
		line, _ := bufio.NewReader(pipe).ReadString('\n')
		url := regexp.MustCompile(`http://\S+/metrics`).FindString(line)
		if url == "" {
			t.Fatalf("stats serve printed %q", line)
		}
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(url)
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		body.ReadFrom(resp.Body)
		resp.Body.Close()
		if v, ok := promValue(parseProm(t, body.String()), "vmaxdp_socket_rx_offload_packets_total", map[string]string{"pid": p, "fd": fd}); !ok || v != float64(n) {
			t.Errorf("/metrics: vmaxdp_socket_rx_offload_packets_total{fd=%s} = %v (found %v), want %d", fd, v, ok, n)
		}
		stop()

		// -S: the dump here and in the process's log; -l: the log level.
		out, err = vmaxdpStats(vmaxdp, "-k", dir, "-p", p, "-S", fd, "WARNING")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, "vmaxdp WARNING: ============ DUMPING FD "+fd+" STATISTICS") || !strings.Contains(out, "Rx Offload : ") {
			t.Errorf("-S %s printed:\n%s", fd, out)
		}
		if _, err := vmaxdpStats(vmaxdp, "-k", dir, "-p", p, "-l", "4"); err != nil {
			t.Fatal(err)
		}
		// -z: zeroed, and the process acknowledged it before -z returned.
		if _, err := vmaxdpStats(vmaxdp, "-k", dir, "-p", p, "-z"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * engineInterval)
		if sk := offloadedSocket(snapshotJSON(t, vmaxdp, dir, pid)); sk == nil || sk.Counters.RxOffloadPackets != 0 {
			t.Errorf("after -z: %+v, want rx_offload_packets 0", sk)
		}
		return nil
	}
	res, srvLog, err := run.Do(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if movingErr != nil {
		t.Error(movingErr)
	}
	if len(moving) < 2 || moving[len(moving)-1] <= moving[0] {
		t.Errorf("rx packets sampled while the client ran: %v, want them growing", moving)
	}
	for _, w := range []string{"DUMPING FD", "log level set to DEBUG by vmaxdp stats", "counters zeroed by vmaxdp stats"} {
		if !strings.Contains(srvLog, w) {
			t.Errorf("server log lacks %q:\n%s", w, srvLog)
		}
	}
	// At exit: the stats file is gone, VMAXDP_STATS_FILE has the socket.
	if left, _ := filepath.Glob(filepath.Join(dir, "vmaxdp.*.stats")); len(left) != 0 {
		t.Errorf("stats files left after the server exited: %v", left)
	}
	closed, _ := os.ReadFile(closeFile)
	if !regexp.MustCompile(`(?m)^vmaxdp: \[fd=\d+\] Rx Offload: \d+ KB / \d+ / 0 \[bytes/packets/errors\]$`).Match(closed) ||
		!strings.Contains(string(closed), "Rx poll:") {
		t.Errorf("%s:\n%s\nwant the socket's report (the VMA manual's example 5)", closeFile, closed)
	}
	if !regexp.MustCompile(`(?m)^vmaxdp: \[` + b.Link(testbed.B) + `/q0\] Rx ring: \d+ / \d+ / \d+ \[rx_ring_full/rx_dropped/rx_fill_ring_empty_descs\]$`).Match(closed) {
		t.Errorf("%s:\n%s\nwant its queue's line", closeFile, closed)
	}
	t.Logf("sent %d, sampled rx %v", res.Sent, moving)
}

// engineInterval mirrors engine.PublishInterval without importing the
// engine into the command's tests.
const engineInterval = 100 * time.Millisecond

// TestStatsRuleReason: a socket a rule keeps on the kernel shows the rule,
// by file and line, as its reason in the views.
func TestStatsRuleReason(t *testing.T) {
	requireSockperf(t)
	vmaxdp := tools(t)
	b := testutil.Bed(t, nil)
	dir := t.TempDir()
	conf := filepath.Join(dir, "rules.conf")
	os.WriteFile(conf, []byte("use os udp_receiver *:11142\n"), 0o644)
	feed := filepath.Join(dir, "feed.txt")
	addr := b.Addr(testbed.B).String()
	os.WriteFile(feed, []byte(fmt.Sprintf("U:%s:11141\nU:%s:11142\n", addr, addr)), 0o644)
	want := "not offloaded: udp_receiver " + addr + ":11142: rule " + conf + ":1: use os udp_receiver *:11142"
	run := &sockperf.Run{Bed: b, Vmaxdp: vmaxdp, ServerOffload: true, Server: []string{"-f", feed},
		Client: []string{"pp", "-i", addr, "-p", "11141", "-t", "1", "-m", "64"},
		Env:    []string{"VMAXDP_STATS_DIR=" + dir, "VMAXDP_CONFIG_FILE=" + conf},
		AfterClient: func(pid int, _ sockperf.Result) error {
			for _, v := range []string{"1", "2", "5"} {
				out, err := vmaxdpStats(vmaxdp, "-k", dir, "-c", "1", "-v", v)
				if err != nil {
					return err
				}
				w := want
				if v == "5" {
					w = "rule " + conf + ":1: use os udp_receiver *:11142"
				}
				if !strings.Contains(out, w) {
					t.Errorf("view %s lacks %q:\n%s", v, w, out)
				}
			}
			return nil
		}}
	if _, _, err := run.Do(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestStatsProcessSelection: no process is vma_stats' error and exit
// status; the files of dead processes are cleaned unless -F.
func TestStatsProcessSelection(t *testing.T) {
	vmaxdp := tools(t)
	dir := t.TempDir()
	out, err := exec.Command(vmaxdp, "stats", "-k", dir).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.HasPrefix(string(out), "vmaxdp stats: failed to identify process...") {
		t.Errorf("no process: exit %v, output %q", err, out)
	}
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Skipf("sleep(1): %v", err)
	}
	w, err := stats.Create(dir, sleep.Process.Pid)
	if err != nil {
		sleep.Process.Kill()
		t.Fatal(err)
	}
	w.Publish(&stats.Snapshot{Process: stats.Process{PID: sleep.Process.Pid, Program: "sleep"}})
	if out, err := vmaxdpStats(vmaxdp, "-k", dir, "-n", "sleep", "-c", "1"); err != nil || !strings.Contains(out, "total offloaded") {
		t.Errorf("-n sleep: %v\n%s", err, out)
	}
	sleep.Process.Kill()
	sleep.Wait()
	if _, err := vmaxdpStats(vmaxdp, "-k", dir, "-F"); err == nil {
		t.Error("a dead process's file was shown")
	}
	if _, err := os.Stat(w.Path()); err != nil {
		t.Errorf("-F removed %s: %v", w.Path(), err)
	}
	out, _ = exec.Command(vmaxdp, "stats", "-k", dir).CombinedOutput()
	if !strings.Contains(string(out), "removed "+w.Path()) {
		t.Errorf("stale file not reported removed: %s", out)
	}
	if _, err := os.Stat(w.Path()); !os.IsNotExist(err) {
		t.Errorf("stale %s: %v, want it removed", w.Path(), err)
	}
	// A file of another format is an error naming it, never garbage.
	bad := filepath.Join(dir, stats.FileName(os.Getpid()))
	os.WriteFile(bad, []byte("VMXSTATS\x09\x00\x00\x00 and more bytes of a future format....................."), 0o600)
	out, err = exec.Command(vmaxdp, "stats", "-k", dir, "-p", strconv.Itoa(os.Getpid())).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "format version 9") {
		t.Errorf("other format: %v, %s", err, out)
	}
}

// TestStatsFileAtAbnormalEnd: a process that ends without writing its
// VMAXDP_STATS_FILE report (a signal whose default action ends it,
// SIGKILL, _exit) has it written by its helper, from its last published
// counters, and its stats file removed; one that exits writes its own,
// and the helper writes none.
func TestStatsFileAtAbnormalEnd(t *testing.T) {
	b := pythonBed(t)
	// Python leaves SIGTERM at SIG_DFL.
	script := `import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2])))
for i in range(int(sys.argv[3])):
    s.recv(2048)
print("got all", flush=True)
if s.recv(2048) == b"_exit":
    os._exit(0)
`
	const n = 40
	for i, end := range []string{"SIGTERM", "SIGKILL", "_exit", "exit"} {
		t.Run(end, func(t *testing.T) {
			port := 11250 + i
			dir := t.TempDir()
			report := filepath.Join(dir, "report.txt")
			p := startArgv(t, b, []string{"VMAXDP_STATS_DIR=" + dir, "VMAXDP_STATS_FILE=" + report},
				tools(t), "run", "--", "python3", "-c", script, b.Addr(testbed.B).String(), strconv.Itoa(port), strconv.Itoa(n))
			if err := p.waitFor("offloaded on " + b.Link(testbed.B)); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			msgs := make([]string, n)
			for k := range msgs {
				msgs[k] = fmt.Sprintf("datagram %d", k)
			}
			sendFromA(t, b, port, msgs...)
			if err := p.waitFor("got all"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			// The counters reach the stats file at the next publish.
			time.Sleep(3 * engineInterval)
			switch end {
			case "SIGTERM", "SIGKILL":
				sig := map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGKILL": syscall.SIGKILL}[end]
				if err := syscall.Kill(p.pid, sig); err != nil {
					t.Fatal(err)
				}
				var ee *exec.ExitError
				if err := p.exited(); !errors.As(err, &ee) || !ee.ProcessState.Sys().(syscall.WaitStatus).Signaled() || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != sig {
					t.Fatalf("the program ended with %v, want death by %v", err, sig)
				}
			default:
				// The end's datagram: "_exit", or anything else for a
				// return from the script.
				sendFromA(t, b, port, end)
				if err := p.exited(); err != nil {
					t.Fatalf("the program: %v\n%s", err, tail(p.out.String(), 20))
				}
			}
			// The end's datagram counts once the process counted it: in
			// its own report, and in the helper's if a publish came
			// between it and _exit.
			count := strconv.Itoa(n)
			switch end {
			case "exit":
				count = strconv.Itoa(n + 1)
			case "_exit":
				count = fmt.Sprintf("(%d|%d)", n, n+1)
			}
			offloaded := regexp.MustCompile(`(?m)^vmaxdp: \[fd=\d+\] Rx Offload: \d+ KB / ` + count + ` / 0 \[bytes/packets/errors\]$`)
			var got []byte
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if got, _ = os.ReadFile(report); offloaded.Match(got) {
					break
				}
			}
			// A helper that wrote a second report would have done so by now.
			time.Sleep(300 * time.Millisecond)
			got, _ = os.ReadFile(report)
			if k := len(offloaded.FindAll(got, -1)); k != 1 {
				t.Errorf("%s:\n%s\nwant the socket's report with its %s datagrams once, found %d", report, got, count, k)
			}
			byHelper := strings.Contains(string(got), "ended without writing its report")
			if want := end != "exit"; byHelper != want {
				t.Errorf("%s:\n%s\nwritten by the helper: %v, want %v", report, got, byHelper, want)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, "vmaxdp.*.stats")); len(left) != 0 {
				t.Errorf("stats files left after the program ended: %v", left)
			}
		})
	}
}
