// Package sockperf runs sockperf, the VMA team's UDP benchmark, on a test
// bed: a server in one namespace and a client in the other, each on the
// kernel or under `vmaxdp run`, and parses what both print. Tests use it to
// prove offload end to end and `vmaxdp bench sockperf` to compare the two.
// It must not interpret results beyond parsing them.
package sockperf

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// ErrNotInstalled is returned when the sockperf binary is missing.
var ErrNotInstalled = errors.New("sockperf not installed (apt-get install sockperf)")

// Result is what sockperf printed. Latencies are in microseconds.
type Result struct {
	Latency, P50, P99, P999, Max float64
	Observations                 int
	Dropped, Duplicated, OOO     int
	Sent, Received               int     // [Total Run] for pp and ul; Sent for tp
	Rate                         float64 // tp: messages per second
	ServerReceived               int     // the server's "Total N messages received"
	Output                       string  // the client's whole output
}

var (
	reLatency = regexp.MustCompile(`Summary: Latency is ([0-9.]+) usec`)
	rePct     = regexp.MustCompile(`percentile ([0-9.]+) =\s+([0-9.]+)`)
	reMax     = regexp.MustCompile(`<MAX> observation =\s+([0-9.]+)`)
	reObs     = regexp.MustCompile(`Total (\d+) observations`)
	reDrops   = regexp.MustCompile(`# dropped messages = (\d+); # duplicated messages = (\d+); # out-of-order messages = (\d+)`)
	reTotal   = regexp.MustCompile(`\[Total Run\].*SentMessages=(\d+); ReceivedMessages=(\d+)`)
	reTPSent  = regexp.MustCompile(`Total of (\d+) messages sent`)
	reRate    = regexp.MustCompile(`Summary: Message Rate is (\d+) \[msg/sec\]`)
	reServer  = regexp.MustCompile(`Total (\d+) messages received and handled`)
)

func atoi(s string) int     { n, _ := strconv.Atoi(s); return n }
func atof(s string) float64 { f, _ := strconv.ParseFloat(s, 64); return f }

// Parse reads a client's output. It fails when the output has neither a
// latency nor a message rate summary.
func Parse(out string) (Result, error) {
	r := Result{Output: out}
	if m := reLatency.FindStringSubmatch(out); m != nil {
		r.Latency = atof(m[1])
	}
	for _, m := range rePct.FindAllStringSubmatch(out, -1) {
		switch m[1] {
		case "50.000":
			r.P50 = atof(m[2])
		case "99.000":
			r.P99 = atof(m[2])
		case "99.900":
			r.P999 = atof(m[2])
		}
	}
	if m := reMax.FindStringSubmatch(out); m != nil {
		r.Max = atof(m[1])
	}
	if m := reObs.FindStringSubmatch(out); m != nil {
		r.Observations = atoi(m[1])
	}
	if m := reDrops.FindStringSubmatch(out); m != nil {
		r.Dropped, r.Duplicated, r.OOO = atoi(m[1]), atoi(m[2]), atoi(m[3])
	}
	if m := reTotal.FindStringSubmatch(out); m != nil {
		r.Sent, r.Received = atoi(m[1]), atoi(m[2])
	}
	if m := reTPSent.FindStringSubmatch(out); m != nil {
		r.Sent = atoi(m[1])
	}
	if m := reRate.FindStringSubmatch(out); m != nil {
		r.Rate = atof(m[1])
	}
	if r.Latency == 0 && r.Rate == 0 {
		return r, fmt.Errorf("sockperf printed no summary:\n%s", tail(out, 20))
	}
	return r, nil
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Run describes one client run against one server.
type Run struct {
	Bed *testbed.Bed
	// Vmaxdp is the vmaxdp binary used for `vmaxdp run`.
	Vmaxdp string
	// ServerOffload and ClientOffload run that side under vmaxdp.
	ServerOffload, ClientOffload bool
	// Server and Client are sockperf's arguments after the mode
	// ("sr"; "pp", "tp" or "ul" as the client's first).
	Server, Client []string
	// Env is added to both sides' environment (VMAXDP_* parameters).
	Env []string
	// Timeout bounds the whole run (default one minute).
	Timeout time.Duration
	// OnServer, when set, is called with the server's pid once it serves,
	// before the client starts.
	OnServer func(pid int)
	// AfterClient, when set, is called with the client's result after it
	// ended, while the server still runs; its error fails the run.
	AfterClient func(pid int, res Result) error
}

func (r *Run) command(ctx context.Context, side testbed.Side, offload bool, args ...string) *exec.Cmd {
	argv := []string{"netns", "exec", r.Bed.NSName(side)}
	if offload {
		argv = append(argv, r.Vmaxdp, "run", "--")
	}
	argv = append(argv, append([]string{"sockperf"}, args...)...)
	cmd := exec.CommandContext(ctx, "ip", argv...)
	cmd.Env = append(os.Environ(), r.Env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	return cmd
}

// WaitOffloaded waits up to timeout until the process pid under vmaxdp,
// publishing its counters in dir (empty: the default), has decided every
// bound socket it has: none waits for its stack to open any more. Only
// snapshots published after the call began count. With bound, a snapshot
// with no bound socket yet does not either: the program has not reached
// its bind (a test that then counted the kernel's deliveries found
// dnsperf's first queries there); without, a program whose sockets come
// later (iperf3's UDP one, after its control connection) is waited for
// no longer.
func WaitOffloaded(ctx context.Context, dir string, pid int, timeout time.Duration, bound bool) error {
	path := filepath.Join(params.StatsDir(dir), stats.FileName(pid))
	since := time.Now().UnixNano()
	last := "no counters file yet"
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline) && ctx.Err() == nil; time.Sleep(10 * time.Millisecond) {
		r, err := stats.Open(path)
		if err != nil {
			continue
		}
		var snap stats.Snapshot
		err = r.Read(&snap)
		r.Close()
		if err != nil || snap.Process.Published < since {
			continue
		}
		nbound, decided := 0, true
		for _, sk := range snap.Sockets {
			if sk.Local == "" || strings.HasSuffix(sk.Local, ":0") {
				continue
			}
			nbound++
			if sk.State == stats.StateCandidate {
				decided = false
				last = fmt.Sprintf("fd %d (%s) undecided", sk.FD, sk.Local)
			}
		}
		if nbound == 0 && bound {
			last = "no bound socket yet"
			continue
		}
		if decided {
			return nil
		}
	}
	return fmt.Errorf("pid %d: sockets not decided after %v: %s", pid, timeout, last)
}

// EnvValue is the value of the variable name in env ("" when unset).
func EnvValue(env []string, name string) string {
	for _, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v
		}
	}
	return ""
}

// SyncBuffer collects a process's output while others read it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *SyncBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *SyncBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Do starts the server, waits until it serves, runs the client to its end,
// then stops the server with SIGINT (as a user would) and returns the
// client's result with the server's count. serverLog is everything the
// server printed (vmaxdp's log included).
func (r *Run) Do(ctx context.Context) (res Result, serverLog string, err error) {
	if _, err := exec.LookPath("sockperf"); err != nil {
		return res, "", ErrNotInstalled
	}
	timeout := r.Timeout
	if timeout == 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	srvOut := &SyncBuffer{}
	srv := r.command(ctx, testbed.B, r.ServerOffload, append([]string{"sr"}, r.Server...)...)
	srv.Stdout, srv.Stderr = srvOut, srvOut
	if err := srv.Start(); err != nil {
		return res, "", fmt.Errorf("start sockperf server: %w", err)
	}
	defer func() {
		srv.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { srv.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			srv.Process.Kill()
			<-done
		}
		serverLog = srvOut.String()
		if m := reServer.FindStringSubmatch(serverLog); m != nil {
			res.ServerReceived = atoi(m[1])
		}
	}()
	// The server prints "to block on socket(s)" once it waits for data.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(srvOut.String(), "to block on socket"); {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return res, srvOut.String(), fmt.Errorf("sockperf server did not start:\n%s", tail(srvOut.String(), 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if r.ServerOffload {
		// Its stack opens after bind returns (engine.stackOrWait): the
		// client starts once the server's socket is offloaded, so that
		// what the kernel delivers meanwhile never counts against it.
		if err := WaitOffloaded(ctx, EnvValue(r.Env, "VMAXDP_STATS_DIR"), srv.Process.Pid, 10*time.Second, false); err != nil {
			return res, srvOut.String(), err
		}
	}
	if r.OnServer != nil {
		r.OnServer(srv.Process.Pid)
	}
	cli := r.command(ctx, testbed.A, r.ClientOffload, r.Client...)
	out, err := cli.CombinedOutput()
	if err != nil {
		return res, "", fmt.Errorf("sockperf %s: %w\n%s", strings.Join(r.Client, " "), err, tail(string(out), 30))
	}
	if res, err = Parse(string(out)); err != nil {
		return res, "", err
	}
	if r.AfterClient != nil {
		err = r.AfterClient(srv.Process.Pid, res)
	}
	return res, "", err
}
