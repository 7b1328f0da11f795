// Package apps runs unmodified programs from Debian on a test bed, a
// server in side B and its load generator in side A, each on the kernel or
// under `vmaxdp run`, and parses what the load generator reports. The
// real-application tests (cmd/vmaxdp) and `vmaxdp bench apps` use it.
//
// Each App writes its own configuration into a directory of the run, so
// nothing outside it and the bed is touched. This package must not
// interpret results beyond parsing them, and every run is bounded in time.
package apps

import (
	"bufio"
	"bytes"
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
	"syscall"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/sockperf"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// ErrNotInstalled is returned when a program an App needs is missing.
var ErrNotInstalled = errors.New("not installed")

// Result is what one load generator run reported.
type Result struct {
	Rate float64 // in the App's Unit
	// Sent and Lost are the requests (or datagrams) the load generator sent
	// and got no answer for (or the receiver never saw).
	Sent, Lost int64
	Output     string // the load generator's whole output
	// ServerRx are the datagrams each fd of the server received offloaded
	// (its VMAXDP_STATS_FILE, written as it exits), when it ran under
	// vmaxdp.
	ServerRx map[int]int64
	// ServerAccepted are the connections each listening fd of the server
	// accepted offloaded (its VMAXDP_STATS_FILE), when it ran under
	// vmaxdp.
	ServerAccepted map[int]int64
	// Reports are the offloaded sockets' counters as they closed, and
	// their queues' at the end, the server's then the load generator's
	// (their VMAXDP_STATS_FILEs); QueueDrops the datagrams those sockets
	// dropped over their receive limit, and RingDrops those their queues'
	// AF_XDP sockets dropped, RX ring full or no buffer (rx_ring_full,
	// rx_dropped): the counterparts of the kernel's receive buffer
	// overflows.
	Reports    string
	QueueDrops int64
	RingDrops  int64
	// Repeated says why the load generator ran a second time: on the
	// kernel, it failed on a defect of its own (App.Defect).
	Repeated string
}

// App is one server program and its load generator.
type App struct {
	Name string
	// Unit of Result.Rate: "queries/s", "datagrams/s", "ops/s".
	Unit string
	// Programs are the executables it needs, and Package the Debian
	// package that has them.
	Programs []string
	Package  string
	// Proto and Port are where the server listens once it serves
	// ("udp"/"tcp"): the run waits for that socket before the client.
	Proto string
	Port  int
	// Server writes the server's configuration into dir and returns its
	// argv; the server listens on addr.
	Server func(dir, addr string) []string
	// Client returns the load generator's argv for d seconds against
	// addr; files of the run are in dir. paced: at a rate the kernel on
	// both sides serves without loss (for tests that count losses);
	// otherwise as fast as it goes.
	Client func(dir, addr string, d time.Duration, paced bool) []string
	// Parse reads the load generator's output.
	Parse func(out string) (Result, error)
	// OneWay: the load flows from client to server only (iperf3), so the
	// client receives no datagram to offload.
	OneWay bool
	// Forks: the server forks its workers after it opened its sockets, so
	// under vmaxdp the kernel serves them (engine.Forked) and the log says
	// why.
	Forks bool
	// Group: the server serves its port with a SO_REUSEPORT group of this
	// many sockets, one per thread (0 or 1: one socket).
	Group int
	// Datagrams is the least number of datagrams the client receives for
	// one of Result.Sent (0: one).
	Datagrams int
	// Defect matches the output of a load generator that failed on a
	// defect of its own, which the kernel triggers now and then: run on
	// the kernel, it is run once more. Under vmaxdp it stays a failure.
	Defect *regexp.Regexp
}

// Missing names the programs of a that are not installed, "" when none.
func (a *App) Missing() string {
	var miss []string
	for _, p := range a.Programs {
		if _, err := exec.LookPath(p); err != nil {
			miss = append(miss, p)
		}
	}
	if len(miss) == 0 {
		return ""
	}
	return fmt.Sprintf("%s (apt-get install %s)", strings.Join(miss, ", "), a.Package)
}

// Run is one run of an App on a bed.
type Run struct {
	Bed *testbed.Bed
	App *App
	// Vmaxdp is the vmaxdp binary for `vmaxdp run`.
	Vmaxdp string
	// ServerOffload and ClientOffload run that side under vmaxdp.
	ServerOffload, ClientOffload bool
	Duration                     time.Duration // of the load (default 2 s)
	// Paced runs the load generator at a rate the kernel serves without
	// loss (App.Client).
	Paced bool
	// Env is added to both sides' environment (VMAXDP_* parameters).
	Env []string
	// Dir holds the run's files (default: a temporary directory, removed).
	Dir string
	// ServerSide and ClientSide are the sides the server and the load
	// generator run on; both zero (or equal), B and A. On a bridged bed,
	// one of them on testbed.Hub is a peer beyond the gateway.
	ServerSide, ClientSide testbed.Side
	// ServerAddr is the address the server serves at (default: its
	// side's Addr).
	ServerAddr netip.Addr
}

// sides are the run's server and client sides (Run.ServerSide).
func (r *Run) sides() (server, client testbed.Side) {
	if r.ServerSide == r.ClientSide {
		return testbed.B, testbed.A
	}
	return r.ServerSide, r.ClientSide
}

// Do starts the server, waits until it listens, runs the load generator
// to its end and stops the server with SIGTERM (SIGKILL after 5 s). It
// returns the load generator's result and everything the server printed
// (vmaxdp's log included).
func (r *Run) Do(ctx context.Context) (res Result, serverLog string, err error) {
	if miss := r.App.Missing(); miss != "" {
		return res, "", fmt.Errorf("%s: %w: %s", r.App.Name, ErrNotInstalled, miss)
	}
	d := r.Duration
	if d == 0 {
		d = 2 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	dir := r.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "vmaxdp-app-"); err != nil {
			return res, "", err
		}
		defer os.RemoveAll(dir)
	}
	ss, cs := r.sides()
	addr := r.Bed.Addr(ss).String()
	if r.ServerAddr.IsValid() {
		addr = r.ServerAddr.String()
	}
	srvOut := &sockperf.SyncBuffer{}
	srv := r.command(ctx, ss, r.ServerOffload, r.App.Server(dir, addr))
	// Daemons point stderr at /dev/null once they run (dnsmasq does):
	// vmaxdp logs into the run's directory, and the logs are read back.
	srv.Env = append(srv.Env, "VMAXDP_LOG_FILE="+filepath.Join(dir, "server-vmaxdp.%d.log"),
		"VMAXDP_STATS_FILE="+filepath.Join(dir, "server-stats.txt"))
	srv.Dir = dir
	srv.Stdout, srv.Stderr = srvOut, srvOut
	// The server and whatever it forks are one process group, stopped
	// together.
	srv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := srv.Start(); err != nil {
		return res, "", fmt.Errorf("%s: start server: %w", r.App.Name, err)
	}
	defer func() {
		syscall.Kill(-srv.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { srv.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-srv.Process.Pid, syscall.SIGKILL)
			<-done
		}
		serverLog = srvOut.String() + readLogs(dir, "server-vmaxdp.*.log")
		if r.ServerOffload {
			report := readLogs(dir, "server-stats.txt")
			res.ServerRx, res.ServerAccepted = perFD(reServerRx, report), perFD(reServerAccepted, report)
			res.Reports = report + res.Reports
		}
		for _, n := range perFD(reQueueDrops, res.Reports) {
			res.QueueDrops += n
		}
		for _, m := range reRingDrops.FindAllStringSubmatch(res.Reports, -1) {
			full, _ := strconv.ParseInt(m[1], 10, 64)
			dropped, _ := strconv.ParseInt(m[2], 10, 64)
			res.RingDrops += full + dropped
		}
	}()
	if err := r.waitListening(ctx, ss); err != nil {
		return res, srvOut.String(), fmt.Errorf("%s: server did not start: %w\n%s", r.App.Name, err, tail(srvOut.String(), 20))
	}
	if r.ServerOffload {
		if err := sockperf.WaitOffloaded(ctx, sockperf.EnvValue(r.Env, "VMAXDP_STATS_DIR"), srv.Process.Pid, 10*time.Second, false); err != nil {
			return res, srvOut.String(), fmt.Errorf("%s: %w", r.App.Name, err)
		}
	}
	var out, repeated string
	for try := 1; ; try++ {
		cli := r.command(ctx, cs, r.ClientOffload, r.App.Client(dir, addr, d, r.Paced))
		cli.Dir = dir
		cli.Env = append(cli.Env, "VMAXDP_LOG_FILE="+filepath.Join(dir, fmt.Sprintf("client-vmaxdp.%d.%%d.log", try)),
			"VMAXDP_STATS_FILE="+filepath.Join(dir, fmt.Sprintf("client-stats.%d.txt", try)))
		b, err := cli.CombinedOutput()
		out = string(b) + readLogs(dir, fmt.Sprintf("client-vmaxdp.%d.*.log", try))
		if err == nil {
			break
		}
		if try == 1 && !r.ClientOffload && r.App.Defect != nil {
			if m := r.App.Defect.FindString(out); m != "" {
				repeated = fmt.Sprintf("the load generator failed on the kernel (%v: %s), a defect of its own; run again", err, m)
				continue
			}
		}
		if repeated != "" {
			err = fmt.Errorf("%w, after %s", err, repeated)
		}
		return res, "", fmt.Errorf("%s: load generator: %w\n%s", r.App.Name, err, tail(out, 30))
	}
	res, err = r.App.Parse(out)
	res.Output, res.Repeated = out, repeated
	if r.ClientOffload { // one try: a repeat is for a load generator on the kernel
		res.Reports = readLogs(dir, "client-stats.*.txt")
	}
	return res, "", err
}

// readLogs reads the files of dir matching pattern, one after the other.
func readLogs(dir, pattern string) string {
	files, _ := filepath.Glob(filepath.Join(dir, pattern))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		b.Write(data)
	}
	return b.String()
}

func (r *Run) command(ctx context.Context, side testbed.Side, offload bool, argv []string) *exec.Cmd {
	args := []string{"netns", "exec", r.Bed.NSName(side)}
	if offload {
		args = append(args, r.Vmaxdp, "run", "--")
	}
	cmd := exec.CommandContext(ctx, "ip", append(args, argv...)...)
	cmd.Env = append(os.Environ(), r.Env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	return cmd
}

// waitListening waits up to 10 s for the server's socket in side ss.
func (r *Run) waitListening(ctx context.Context, ss testbed.Side) error {
	want := fmt.Sprintf(":%04X ", r.App.Port)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var table []byte
		err := r.Bed.Do(ss, func() (err error) {
			table, err = os.ReadFile("/proc/thread-self/net/" + r.App.Proto)
			return err
		})
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(bytes.NewReader(table))
		for sc.Scan() {
			// A TCP socket must be listening (state 0A): a connection of
			// an earlier run in TIME-WAIT has the port too.
			if f := strings.Fields(sc.Text()); len(f) > 3 && strings.HasSuffix(f[1]+" ", want) && (r.App.Proto != "tcp" || f[3] == "0A") {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no %s socket on port %d after 10 s", r.App.Proto, r.App.Port)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// write writes files into dir.
func write(dir string, files map[string]string) {
	for name, text := range files {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte(text), 0o644)
	}
}

// Names of the DNS zone the DNS servers serve, and its records.
const (
	zoneName = "vmaxdp.test"
	zoneFile = `$ORIGIN vmaxdp.test.
$TTL 3600
@    IN SOA ns1 hostmaster 1 3600 900 604800 300
@    IN NS  ns1
ns1  IN A   198.18.0.2
www  IN A   198.18.0.10
mail IN A   198.18.0.11
`
)

func dnsQueries(dir string) string {
	p := filepath.Join(dir, "queries.txt")
	var b strings.Builder
	for range 500 {
		b.WriteString("www.vmaxdp.test A\nmail.vmaxdp.test A\n")
	}
	os.WriteFile(p, []byte(b.String()), 0o644)
	return p
}

func dnsperfClient(dir, addr string, d time.Duration, paced bool) []string {
	argv := []string{"dnsperf", "-s", addr, "-d", dnsQueries(dir), "-l", strconv.FormatFloat(d.Seconds(), 'f', -1, 64)}
	if paced {
		argv = append(argv, "-Q", "20000")
	}
	return argv
}

// dnsperfFlows is dnsperfClient with 32 sockets (-c 32), 32 flows that
// a SO_REUSEPORT group spreads over its members by hash, one flow to one
// member (with 8, all went to one of two members once in 128 runs).
func dnsperfFlows(dir, addr string, d time.Duration, paced bool) []string {
	return append(dnsperfClient(dir, addr, d, paced), "-c", "32")
}

var (
	reServerRx       = regexp.MustCompile(`(?m)\[fd=(\d+)\] Rx Offload: \d+ KB / (\d+) /`)
	reServerAccepted = regexp.MustCompile(`(?m)\[fd=(\d+)\] TCP: LISTEN / .* / (\d+) \[state/`)
	reQueueDrops     = regexp.MustCompile(`(?m)\[fd=(\d+)\] Rx pkt : max \d+ / dropped (\d+) `)
	reRingDrops      = regexp.MustCompile(`(?m)\[\S+/q\d+\] Rx ring: (\d+) / (\d+) / \d+ \[rx_ring_full/rx_dropped/`)
)

// perFD sums, per fd, the counts re finds in the socket reports of a
// VMAXDP_STATS_FILE (re's groups: the fd, the count): datagrams received
// offloaded (reServerRx), connections accepted (reServerAccepted),
// datagrams dropped over the receive limit (reQueueDrops).
func perFD(re *regexp.Regexp, report string) map[int]int64 {
	sum := map[int]int64{}
	for _, m := range re.FindAllStringSubmatch(report, -1) {
		fd, _ := strconv.Atoi(m[1])
		n, _ := strconv.ParseInt(m[2], 10, 64)
		sum[fd] += n
	}
	return sum
}

var (
	reQPS            = regexp.MustCompile(`Queries per second:\s+([0-9.]+)`)
	reQSent          = regexp.MustCompile(`Queries sent:\s+(\d+)`)
	reQLost          = regexp.MustCompile(`Queries lost:\s+(\d+)`)
	reIperfRecv      = regexp.MustCompile(`(?m)-([0-9.]+)\s+sec\s+\S+ \S+\s+\S+ \S+/sec\s+[0-9.]+ ms\s+(\d+)/(\d+) \(.*\)\s+receiver`)
	reMcTPS          = regexp.MustCompile(`Run time: [0-9.]+s Ops: (\d+) TPS: (\d+)`)
	reMcDrop         = regexp.MustCompile(`packet_drop: (\d+)`)
	reMcTimeout      = regexp.MustCompile(`udp_timeout: (\d+)`)
	reMcVerifyFailed = regexp.MustCompile(`verify_failed: (\d+)`)
)

func parseDnsperf(out string) (Result, error) {
	var r Result
	m, s, l := reQPS.FindStringSubmatch(out), reQSent.FindStringSubmatch(out), reQLost.FindStringSubmatch(out)
	if m == nil || s == nil || l == nil {
		return r, fmt.Errorf("dnsperf printed no summary:\n%s", tail(out, 20))
	}
	r.Rate, _ = strconv.ParseFloat(m[1], 64)
	r.Sent, _ = strconv.ParseInt(s[1], 10, 64)
	r.Lost, _ = strconv.ParseInt(l[1], 10, 64)
	return r, nil
}

// parseIperf reads the receiver's line of an iperf3 UDP run: datagrams per
// second the receiver took, datagrams sent and lost.
func parseIperf(out string) (Result, error) {
	var r Result
	m := reIperfRecv.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("iperf3 printed no receiver summary:\n%s", tail(out, 20))
	}
	secs, _ := strconv.ParseFloat(m[1], 64)
	r.Lost, _ = strconv.ParseInt(m[2], 10, 64)
	r.Sent, _ = strconv.ParseInt(m[3], 10, 64)
	if secs > 0 {
		r.Rate = float64(r.Sent-r.Lost) / secs
	}
	return r, nil
}

func parseMemcaslap(out string) (Result, error) {
	var r Result
	m := reMcTPS.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("memcaslap printed no summary:\n%s", tail(out, 20))
	}
	r.Sent, _ = strconv.ParseInt(m[1], 10, 64)
	r.Rate, _ = strconv.ParseFloat(m[2], 64)
	for _, re := range []*regexp.Regexp{reMcDrop, reMcTimeout} {
		if x := re.FindStringSubmatch(out); x != nil {
			n, _ := strconv.ParseInt(x[1], 10, 64)
			r.Lost += n
		}
	}
	return r, nil
}

// parseMemcaslapVerified is parseMemcaslap for a run with --verify: a
// value that came back wrong fails it.
func parseMemcaslapVerified(out string) (Result, error) {
	r, err := parseMemcaslap(out)
	if err != nil {
		return r, err
	}
	m := reMcVerifyFailed.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("memcaslap printed no verify_failed count:\n%s", tail(out, 20))
	}
	if m[1] != "0" {
		return r, fmt.Errorf("memcaslap: %s values came back wrong:\n%s", m[1], tail(out, 20))
	}
	return r, nil
}

// memcached is memcached on port 11211 (server: its arguments after the
// address) under memcaslap, memaslap's Debian name (client: its
// arguments after the server's address).
func memcached(name, proto string, server, client []string, parse func(string) (Result, error), defect *regexp.Regexp) *App {
	return &App{
		Name: name, Unit: "ops/s", Programs: []string{"memcached", "memcaslap"}, Package: "memcached libmemcached-tools",
		Proto: proto, Port: 11211,
		Server: func(dir, addr string) []string {
			return append([]string{"memcached", "-u", "root", "-p", "11211", "-l", addr}, server...)
		},
		Client: func(dir, addr string, d time.Duration, paced bool) []string {
			return append(append([]string{"memcaslap", "-s", addr + ":11211"}, client...), "-t", strconv.Itoa(max(1, int(d.Seconds())))+"s")
		},
		Parse:  parse,
		Defect: defect,
	}
}

func iperf(size int) *App {
	return &App{
		Name: fmt.Sprintf("iperf3-%dB", size), Unit: "datagrams/s", Programs: []string{"iperf3"}, Package: "iperf3",
		Proto: "tcp", Port: 5201, OneWay: true,
		Server: func(dir, addr string) []string { return []string{"iperf3", "-s", "-1", "-B", addr} },
		Client: func(dir, addr string, d time.Duration, paced bool) []string {
			rate := "0" // unlimited
			if paced {
				rate = strconv.Itoa(size * 8 * 20000) // 20,000 datagrams/s
			}
			return []string{"iperf3", "-c", addr, "-u", "-l", strconv.Itoa(size), "-b", rate, "-t", strconv.FormatFloat(d.Seconds(), 'f', -1, 64)}
		},
		Parse: parseIperf,
	}
}

// threaded names a DNS server run with n threads ("knot-2workers") and
// picks its load generator: with more than one, dnsperf with flows enough
// to spread over the threads' SO_REUSEPORT group.
func threaded(base string, n int, unit string) (string, func(dir, addr string, d time.Duration, paced bool) []string) {
	if n > 1 {
		return fmt.Sprintf("%s-%d%s", base, n, unit), dnsperfFlows
	}
	return base, dnsperfClient
}

// knot is Knot DNS with workers UDP workers: with more than one, each
// has its own socket, the sockets a SO_REUSEPORT group on port 53.
func knot(workers int) *App {
	name, client := threaded("knot", workers, "workers")
	return &App{
		Name: name, Unit: "queries/s", Programs: []string{"knotd", "dnsperf"}, Package: "knot dnsperf",
		Proto: "udp", Port: 53, Group: workers,
		Server: func(dir, addr string) []string {
			return knotServer(dir, fmt.Sprintf("%s@53\n    udp-workers: %d\n    tcp-workers: 1", addr, workers))
		},
		Client: client, Parse: parseDnsperf,
	}
}

// knotServer writes knot's configuration into dir and returns its argv;
// server is its server section from the value of listen on.
func knotServer(dir, server string) []string {
	write(dir, map[string]string{"zone.db": zoneFile, "knot.conf": fmt.Sprintf(`server:
    listen: %s
    background-workers: 1
    rundir: %[2]s
log:
  - target: stderr
    any: warning
database:
    storage: %[2]s/db
zone:
  - domain: %[3]s
    file: %[2]s/zone.db
`, server, dir, zoneName)})
	return []string{"knotd", "-c", filepath.Join(dir, "knot.conf")}
}

// knotTCP is Knot DNS answering over TCP with workers TCP workers, each
// listening on its own socket (tcp-reuseport: on), the sockets a
// SO_REUSEPORT group on port 53; dnsperf queries over 32 TCP
// connections, which the group spreads over its members by hash.
func knotTCP(workers int) *App {
	return &App{
		Name: fmt.Sprintf("knot-tcp-%dworkers", workers), Unit: "queries/s", Programs: []string{"knotd", "dnsperf"}, Package: "knot dnsperf",
		Proto: "tcp", Port: 53, Group: workers,
		Server: func(dir, addr string) []string {
			return knotServer(dir, fmt.Sprintf("%s@53\n    udp-workers: 1\n    tcp-workers: %d\n    tcp-reuseport: on", addr, workers))
		},
		Client: func(dir, addr string, d time.Duration, paced bool) []string {
			return append(dnsperfFlows(dir, addr, d, paced), "-m", "tcp")
		},
		Parse: parseDnsperf,
	}
}

// unbound is Unbound with threads threads: with more than one, each has
// its own socket (so-reuseport, on by default), the sockets a
// SO_REUSEPORT group on port 53.
func unbound(threads int) *App {
	name, client := threaded("unbound", threads, "threads")
	return &App{
		Name: name, Unit: "queries/s", Programs: []string{"unbound", "dnsperf"}, Package: "unbound dnsperf",
		Proto: "udp", Port: 53, Group: threads,
		Server: func(dir, addr string) []string {
			write(dir, map[string]string{"unbound.conf": fmt.Sprintf(`server:
    interface: %s
    port: 53
    num-threads: %d
    do-ip6: no
    do-tcp: no
    access-control: 198.18.0.0/15 allow
    chroot: ""
    username: ""
    directory: "%[3]s"
    pidfile: "%[3]s/unbound.pid"
    use-syslog: no
    logfile: ""
    verbosity: 0
    local-zone: "%[4]s." static
    local-data: "www.%[4]s. 3600 IN A 198.18.0.10"
    local-data: "mail.%[4]s. 3600 IN A 198.18.0.11"
remote-control:
    control-enable: no
`, addr, threads, dir, zoneName)})
			return []string{"unbound", "-d", "-c", filepath.Join(dir, "unbound.conf")}
		},
		Client: client, Parse: parseDnsperf,
	}
}

// pdnsRecursor is PowerDNS's recursor with threads workers, each with a
// socket of its own (reuseport=yes, pdns-distributes-queries=no: the
// sockets a SO_REUSEPORT group on port 53), authoritative for the zone
// (auth-zones). The root is
// forwarded to a port of the server's address that nobody serves and the
// security poll is off, so that nothing it asks leaves the bed. No Group:
// pdns_recursor leaves SIGTERM to its default action, which ends it
// without its exit's destructors, so VMAXDP_STATS_FILE gets no report of
// its sockets to count each one's share by (TestRunPowerDNSRecursor
// checks the group's offload).
func pdnsRecursor(threads int) *App {
	name, client := threaded("pdns-recursor", threads, "threads")
	return &App{
		Name: name, Unit: "queries/s", Programs: []string{"pdns_recursor", "dnsperf"}, Package: "pdns-recursor dnsperf",
		Proto: "udp", Port: 53,
		Server: func(dir, addr string) []string {
			write(dir, map[string]string{"zone.db": zoneFile, "recursor.conf": fmt.Sprintf(`local-address=%[1]s
local-port=53
auth-zones=%[3]s=%[2]s/zone.db
forward-zones=.=%[1]s:5399
security-poll-suffix=
allow-from=198.18.0.0/15
threads=%[4]d
reuseport=yes
pdns-distributes-queries=no
socket-dir=%[2]s
daemon=no
write-pid=no
loglevel=3
`, addr, dir, zoneName, threads)})
			return []string{"pdns_recursor", "--config-dir=" + dir}
		},
		Client: client, Parse: parseDnsperf,
	}
}

// bind9 is BIND 9's named, authoritative, with threads worker threads and
// as many UDP sockets, a SO_REUSEPORT group on port 53 (named's default
// is a thread a CPU). Its event loop, libuv before 1.45, reads and
// answers them with recvmmsg and sendmmsg made through syscall(2).
func bind9(threads int) *App {
	name, client := threaded("bind9", threads, "threads")
	return &App{
		Name: name, Unit: "queries/s", Programs: []string{"named", "dnsperf"}, Package: "bind9 dnsperf",
		Proto: "udp", Port: 53, Group: threads,
		Server: func(dir, addr string) []string {
			write(dir, map[string]string{"zone.db": zoneFile, "named.conf": fmt.Sprintf(`options {
    directory "%[2]s";
    listen-on port 53 { %[1]s; };
    listen-on-v6 { none; };
    recursion no;
    dnssec-validation no;
    pid-file "%[2]s/named.pid";
    session-keyfile "%[2]s/session.key";
    managed-keys-directory "%[2]s";
};
controls { };
zone "%[3]s" { type primary; file "%[2]s/zone.db"; };
`, addr, dir, zoneName)})
			return []string{"named", "-g", "-4", "-n", strconv.Itoa(threads), "-c", filepath.Join(dir, "named.conf")}
		},
		Client: client, Parse: parseDnsperf,
	}
}

// All are the applications, by name.
var All = []*App{
	knot(1),
	unbound(1),
	{
		// dnsmasq listens on every address (no --bind-interfaces), as it
		// does by default: it learns each query's interface and address
		// from IP_PKTINFO and answers from that address.
		Name: "dnsmasq", Unit: "queries/s", Programs: []string{"dnsmasq", "dnsperf"}, Package: "dnsmasq-base dnsperf",
		Proto: "udp", Port: 53,
		Server: func(dir, addr string) []string {
			return []string{"dnsmasq", "-k", "--conf-file=/dev/null", "--port=53", "--no-resolv", "--no-hosts", "--user=root",
				"--pid-file=", "--cache-size=1000", "--address=/" + zoneName + "/198.18.0.10"}
		},
		Client: dnsperfClient, Parse: parseDnsperf,
	},
	{
		// nsd opens its sockets, then forks the processes that serve them.
		Name: "nsd", Unit: "queries/s", Programs: []string{"nsd", "dnsperf"}, Package: "nsd dnsperf",
		Proto: "udp", Port: 53, Forks: true,
		Server: func(dir, addr string) []string {
			write(dir, map[string]string{"zone.db": zoneFile, "nsd.conf": fmt.Sprintf(`server:
    ip-address: %s
    port: 53
    server-count: 1
    do-ip6: no
    username: ""
    chroot: ""
    zonesdir: "%[2]s"
    database: ""
    pidfile: "%[2]s/nsd.pid"
    xfrdfile: "%[2]s/xfrd.state"
    zonelistfile: "%[2]s/zone.list"
    logfile: "%[2]s/nsd.log"
    verbosity: 0
    rrl-ratelimit: 0
remote-control:
    control-enable: no
zone:
    name: %[3]s
    zonefile: zone.db
`, addr, dir, zoneName)})
			return []string{"nsd", "-d", "-c", filepath.Join(dir, "nsd.conf")}
		},
		Client: dnsperfClient, Parse: parseDnsperf,
	},
	iperf(64),
	iperf(1400),
	// memcached's UDP protocol, one worker thread; memcaslap gets and sets
	// over UDP with 16 concurrent requests. It has no rate: it keeps 16
	// requests outstanding, and counts a request that got no answer in
	// time as udp_timeout. Its 16 sockets set SO_REUSEADDR and send
	// unbound, so the kernel's autobind may give two of them one port; the
	// answers of both then reach one socket, and it aborts on one it did
	// not ask for (the Defect). Under vmaxdp each gets a port of its own
	// (engine.bindEphemeral).
	memcached("memcached", "udp", []string{"-U", "11211", "-t", "1"}, []string{"-U", "-T", "1", "-c", "16"},
		parseMemcaslap, regexp.MustCompile(`ms_sort_udp_packet: Assertion .*`)),
	quic(),
	knot(2),
	unbound(2),
	bind9(2),
	pdnsRecursor(2),
}

// TCP are the TCP applications; their offload needs VMAXDP_TCP=1.
var TCP = []*App{
	{
		// redis-server (its event loop: epoll, non-blocking accept, read
		// and write); redis-benchmark's SET and GET over 10 connections.
		Name: "redis", Unit: "requests/s", Programs: []string{"redis-server", "redis-benchmark"}, Package: "redis-server redis-tools",
		Proto: "tcp", Port: 6379,
		Server: func(dir, addr string) []string {
			return []string{"redis-server", "--port", "6379", "--bind", addr, "--save", "", "--appendonly", "no",
				"--protected-mode", "no", "--dir", dir, "--daemonize", "no"}
		},
		// redis-cli first sets 500 keys and reads them back (every reply
		// checked), then redis-benchmark runs; it has no duration: 20,000
		// requests a second of it.
		Client: func(dir, addr string, d time.Duration, paced bool) []string {
			n := max(2000, int(d.Seconds()*20000))
			write(dir, map[string]string{"redis-client.sh": fmt.Sprintf(`set -e
seq 1 500 | sed 's/.*/SET key:& value-&/' | redis-cli -h %[1]s > set.out
seq 1 500 | sed 's/.*/GET key:&/' | redis-cli -h %[1]s > get.out
if [ "$(grep -cx OK set.out)" = 500 ] && seq 1 500 | sed 's/.*/value-&/' | cmp -s - get.out; then
	echo "redis replies verified: 500 SET, 500 GET"
else
	echo "redis replies WRONG"; head -5 set.out get.out
fi
redis-benchmark -h %[1]s -p 6379 -c 10 -n %[2]d -t set,get -q
`, addr, n)})
			return []string{"sh", filepath.Join(dir, "redis-client.sh")}
		},
		Parse: parseRedisBenchmark,
	},
	iperfTCP("iperf3-tcp-P4", "-P", "4"),
	iperfTCP("iperf3-tcp-R", "-R"),
	sockperfTCP("pp"),
	sockperfTCP("tp"),
	knotTCP(2),
	// memcached over TCP as it comes: a listening thread that hands each
	// connection to one of four worker threads, each with its epoll set
	// (libevent), replies written with sendmsg of several buffers;
	// memcaslap's gets and sets over 16 connections from 2 threads, a
	// twentieth of the gets' values checked.
	memcached("memcached-tcp", "tcp", []string{"-U", "0", "-t", "4"}, []string{"-T", "2", "-c", "16", "--verify=0.05"},
		parseMemcaslapVerified, nil),
	lighttpd("lighttpd-keepalive", true),
	lighttpd("lighttpd-close", false),
	nginx(),
}

// httpPage is the page the HTTP servers serve (lighttpd, nginx).
const httpPage = "served under the load of ab\n"

// lighttpd is lighttpd 1.4 as it comes (one process, one epoll loop,
// level-triggered, that reads each connection until EAGAIN and answers it
// at once; at most 1,000 requests a keep-alive connection) under ab over 8
// connections: kept alive (-k), or one connection a request (HTTP/1.0: the
// server closes first).
func lighttpd(name string, keepAlive bool) *App {
	return &App{
		Name: name, Unit: "requests/s", Programs: []string{"lighttpd", "ab"}, Package: "lighttpd apache2-utils",
		Proto: "tcp", Port: 8080,
		Server: func(dir, addr string) []string {
			write(dir, map[string]string{
				"www/index.html": httpPage,
				"lighttpd.conf": fmt.Sprintf(`server.document-root = "%[1]s/www"
server.bind = "%[2]s"
server.port = 8080
server.errorlog = "%[1]s/lighttpd.log"
`, dir, addr),
			})
			return []string{"lighttpd", "-D", "-f", filepath.Join(dir, "lighttpd.conf")}
		},
		Client: abClient(8080, 8, keepAlive),
		Parse:  parseAB,
	}
}

// nginx is nginx as one process (master_process off: its event loop,
// edge-triggered, with sendfile, tcp_nopush and keep-alive, at most 1,000
// requests a connection) under ab -k over 20 connections.
func nginx() *App {
	return &App{
		Name: "nginx-keepalive", Unit: "requests/s", Programs: []string{"nginx", "ab"}, Package: "nginx-light apache2-utils",
		Proto: "tcp", Port: 8081,
		Server: func(dir, addr string) []string {
			write(dir, map[string]string{
				"www/index.html": httpPage,
				"nginx.conf": fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 256; }
http {
	access_log off;
	sendfile on; tcp_nopush on; tcp_nodelay on;
	server { listen %[2]s:8081; root %[1]s/www; }
}
`, dir, addr),
			})
			return []string{"nginx", "-c", filepath.Join(dir, "nginx.conf")}
		},
		Client: abClient(8081, 20, true),
		Parse:  parseAB,
	}
}

// abClient is ab, Apache's benchmark, fetching the page at port with
// conns connections, kept alive or one a request. Python first fetches
// the page once and checks it; ab counts an answer of another length, or
// none, as failed.
func abClient(port, conns int, keepAlive bool) func(dir, addr string, d time.Duration, paced bool) []string {
	return func(dir, addr string, d time.Duration, paced bool) []string {
		ka := ""
		if keepAlive {
			ka = "-k"
		}
		write(dir, map[string]string{"http-client.sh": fmt.Sprintf(`python3 -c '
import socket
s = socket.create_connection(("%[1]s", %[2]d), 5)
s.sendall(b"GET /index.html HTTP/1.0\r\n\r\n")
got = b""
while b := s.recv(4096):
    got += b
print("http page", "verified" if got.partition(b"\r\n\r\n")[2] == open("www/index.html", "rb").read() else "WRONG")
'
exec ab -q %[3]s -c %[4]d -s 10 -t %[5]d -n 100000000 http://%[1]s:%[2]d/index.html
`, addr, port, ka, conns, max(1, int(d.Seconds())))})
		return []string{"bash", filepath.Join(dir, "http-client.sh")}
	}
}

// sockperfTCP is sockperf --tcp with 64-byte messages, blocking calls:
// ping-pong (its rate: round trips a second, from the mean latency, half
// a round trip) or throughput (messages a second).
func sockperfTCP(mode string) *App {
	unit := "msg/s"
	if mode == "pp" {
		unit = "round trips/s"
	}
	return &App{
		Name: "sockperf-tcp-" + mode, Unit: unit, Programs: []string{"sockperf"}, Package: "sockperf",
		Proto: "tcp", Port: 11111,
		Server: func(dir, addr string) []string { return []string{"sockperf", "sr", "--tcp", "-i", addr, "-p", "11111"} },
		Client: func(dir, addr string, d time.Duration, paced bool) []string {
			return []string{"sockperf", mode, "--tcp", "-i", addr, "-p", "11111", "-m", "64", "-t", strconv.Itoa(max(1, int(d.Seconds())))}
		},
		Parse: func(out string) (Result, error) { return parseSockperfTCP(mode, out) },
	}
}

// iperfTCP is iperf3 over TCP, its control connection and its data
// connections (args: -P 4, -R) all offloaded under vmaxdp.
func iperfTCP(name string, args ...string) *App {
	return &App{
		Name: name, Unit: "Mbit/s", Programs: []string{"iperf3"}, Package: "iperf3",
		Proto: "tcp", Port: 5201,
		Server: func(dir, addr string) []string { return []string{"iperf3", "-s", "-1", "-B", addr} },
		Client: func(dir, addr string, d time.Duration, paced bool) []string {
			return append([]string{"iperf3", "-c", addr, "-t", strconv.FormatFloat(d.Seconds(), 'f', -1, 64)}, args...)
		},
		Parse: parseIperfTCP,
	}
}

var (
	reRedisRPS = regexp.MustCompile(`(?m)^([A-Z_]+): ([0-9.]+) requests per second`)
	reIperfTCP = regexp.MustCompile(`(?m)^\[(?:SUM|\s*\d+)\]\s+[0-9.]+-[0-9.]+\s+sec\s+[0-9.]+ \w+\s+([0-9.]+) (\w)bits/sec\s+receiver`)
)

// parseRedisBenchmark reads redis-benchmark -q: the mean of its tests'
// rates. A request that failed prints an error, which fails the parse.
func parseRedisBenchmark(out string) (Result, error) {
	var r Result
	out = strings.ReplaceAll(out, "\r", "\n")
	if !strings.Contains(out, "redis replies verified") {
		return r, fmt.Errorf("redis-cli got wrong replies:\n%s", tail(out, 20))
	}
	if strings.Contains(out, "Error") || strings.Contains(out, "error") {
		return r, fmt.Errorf("redis-benchmark failed:\n%s", tail(out, 20))
	}
	ms := reRedisRPS.FindAllStringSubmatch(out, -1)
	if len(ms) == 0 {
		return r, fmt.Errorf("redis-benchmark printed no rate:\n%s", tail(out, 20))
	}
	for _, m := range ms {
		v, _ := strconv.ParseFloat(m[2], 64)
		r.Rate += v / float64(len(ms))
	}
	r.Sent = int64(len(ms))
	return r, nil
}

var (
	reABRate     = regexp.MustCompile(`(?m)^Requests per second:\s+([0-9.]+)`)
	reABComplete = regexp.MustCompile(`(?m)^Complete requests:\s+(\d+)`)
	reABFailed   = regexp.MustCompile(`(?m)^(?:Failed requests|Non-2xx responses):\s+(\d+)`)
)

// parseAB reads ab's summary after the client's check of the page
// (abClient): failed requests and answers other than 2xx are lost.
func parseAB(out string) (Result, error) {
	var r Result
	if !strings.Contains(out, "http page verified") {
		return r, fmt.Errorf("the page came back wrong:\n%s", tail(out, 20))
	}
	m, c := reABRate.FindStringSubmatch(out), reABComplete.FindStringSubmatch(out)
	if m == nil || c == nil {
		return r, fmt.Errorf("ab printed no summary:\n%s", tail(out, 20))
	}
	r.Rate, _ = strconv.ParseFloat(m[1], 64)
	r.Sent, _ = strconv.ParseInt(c[1], 10, 64)
	for _, f := range reABFailed.FindAllStringSubmatch(out, -1) {
		n, _ := strconv.ParseInt(f[1], 10, 64)
		r.Lost += n
	}
	return r, nil
}

var (
	reSockperfLatency = regexp.MustCompile(`Summary: Latency is ([0-9.]+) usec`)
	reSockperfRate    = regexp.MustCompile(`Summary: Message Rate is (\d+) \[msg/sec\]`)
	reSockperfDropped = regexp.MustCompile(`# dropped messages = (\d+)`)
)

// parseSockperfTCP reads sockperf's summary; dropped messages are lost.
func parseSockperfTCP(mode, out string) (Result, error) {
	var r Result
	if mode == "pp" {
		m := reSockperfLatency.FindStringSubmatch(out)
		if m == nil {
			return r, fmt.Errorf("sockperf printed no latency:\n%s", tail(out, 20))
		}
		lat, _ := strconv.ParseFloat(m[1], 64)
		if lat > 0 {
			r.Rate = 1e6 / (2 * lat)
		}
	} else {
		m := reSockperfRate.FindStringSubmatch(out)
		if m == nil {
			return r, fmt.Errorf("sockperf printed no message rate:\n%s", tail(out, 20))
		}
		r.Rate, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := reSockperfDropped.FindStringSubmatch(out); m != nil {
		r.Lost, _ = strconv.ParseInt(m[1], 10, 64)
	}
	r.Sent = 1
	return r, nil
}

// parseIperfTCP reads the receiver's total of an iperf3 TCP run, in Mbit/s.
func parseIperfTCP(out string) (Result, error) {
	var r Result
	ms := reIperfTCP.FindAllStringSubmatch(out, -1)
	if len(ms) == 0 {
		return r, fmt.Errorf("iperf3 printed no receiver summary:\n%s", tail(out, 20))
	}
	m := ms[len(ms)-1] // the [SUM] line comes last with -P
	v, _ := strconv.ParseFloat(m[1], 64)
	switch m[2] {
	case "G":
		v *= 1000
	case "K":
		v /= 1000
	}
	r.Rate, r.Sent = v, 1
	return r, nil
}

// ByName finds an App.
func ByName(name string) (*App, bool) {
	for _, a := range append(All[:len(All):len(All)], TCP...) {
		if a.Name == name {
			return a, true
		}
	}
	return nil, false
}
