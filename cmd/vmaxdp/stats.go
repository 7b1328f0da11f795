package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/stats/prom"
)

const statsUsage = `usage: vmaxdp stats [options]
       vmaxdp stats serve --listen ADDR [-k DIR]

Show the counters of processes running under vmaxdp run (vma_stats'
options and views). Without -p or -n, the only running process is shown
(-f); views 5, --json and --prometheus show every process.

options:
  -p, --pid PID            the process with this pid
  -n, --name APP           the process running this program (base name)
  -f, --find_pid           find the only running process (default)
  -k, --directory DIR      stats directory (default $VMAXDP_STATS_DIR or /dev/shm)
  -F, --forbid_clean       keep the stats files of processes that died
  -i, --interval N         seconds between reports (default 1)
  -c, --cycles N           reports to print, 0 for ever (default 0)
  -v, --view 1|2|3|4|5     1 basic, 2 per-socket blocks, 3 with queues, pools
                           and steering, 4 multicast groups, 5 netstat-like
  -d, --details 1|2        1 totals (default), 2 per-second deltas
  -S, --fd_dump FD [LEVEL] dump FD (0: all) to the process's log at LEVEL
                           (default INFO) and here
  -z, --zero               zero the process's counters
  -l, --log_level LEVEL    set the process's log level (0-6 or a name)
  -D, --details_level N    set the process's log details (0-3)
  -s, --sockets LIST       only these fds: 4-16,1,9
      --json               print the snapshots as JSON
      --prometheus         print the Prometheus text exposition
  -V, --version            print the version
  -h, --help               print this help

-z, -l, -D and -S act and exit unless -c is given.
`

// errNoProcess is vma_stats' "failed to identify process" (exit 1).
var errNoProcess = errors.New("failed to identify process")

type statsFlags struct {
	pid, cycles, view, details, logDetails int
	name, dir, sockets, logLevel, fdDump   string
	findPID, forbidClean, zero, version    bool
	json, prometheus, help                 bool
	interval                               float64
}

func (f *statsFlags) register(fs *flag.FlagSet) {
	both := func(short, long string, fn func(name string)) { fn(short); fn(long) }
	both("p", "pid", func(n string) { fs.IntVar(&f.pid, n, 0, "") })
	both("n", "name", func(n string) { fs.StringVar(&f.name, n, "", "") })
	both("f", "find_pid", func(n string) { fs.BoolVar(&f.findPID, n, false, "") })
	both("k", "directory", func(n string) { fs.StringVar(&f.dir, n, "", "") })
	both("F", "forbid_clean", func(n string) { fs.BoolVar(&f.forbidClean, n, false, "") })
	both("i", "interval", func(n string) { fs.Float64Var(&f.interval, n, 1, "") })
	both("c", "cycles", func(n string) { fs.IntVar(&f.cycles, n, 0, "") })
	both("v", "view", func(n string) { fs.IntVar(&f.view, n, 1, "") })
	both("d", "details", func(n string) { fs.IntVar(&f.details, n, 1, "") })
	both("S", "fd_dump", func(n string) { fs.StringVar(&f.fdDump, n, "", "") })
	both("z", "zero", func(n string) { fs.BoolVar(&f.zero, n, false, "") })
	both("l", "log_level", func(n string) { fs.StringVar(&f.logLevel, n, "", "") })
	both("D", "details_level", func(n string) { fs.IntVar(&f.logDetails, n, -1, "") })
	both("s", "sockets", func(n string) { fs.StringVar(&f.sockets, n, "", "") })
	both("V", "version", func(n string) { fs.BoolVar(&f.version, n, false, "") })
	both("h", "help", func(n string) { fs.BoolVar(&f.help, n, false, "") })
	fs.BoolVar(&f.json, "json", false, "")
	fs.BoolVar(&f.prometheus, "prometheus", false, "")
}

// parseLevel reads a trace level: a number 0-6 or a name (INFO, debug).
func parseLevel(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < params.LevelPanic || n > params.LevelFuncAll {
			return 0, fmt.Errorf("log level %d: want 0 to %d", n, params.LevelFuncAll)
		}
		return n, nil
	}
	if i := slices.Index(params.LevelNames[:], strings.ToUpper(s)); i >= 0 {
		return i, nil
	}
	return 0, fmt.Errorf("log level %q: want 0 to %d or one of %s", s, params.LevelFuncAll, strings.Join(params.LevelNames[:], ", "))
}

// parseFDList reads vma_stats' -s: "4-16,1,9".
func parseFDList(s string) (func(fd int) bool, error) {
	if s == "" {
		return nil, nil
	}
	type span struct{ lo, hi int }
	var spans []span
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a {
			return nil, fmt.Errorf("sockets %q: %q is not an fd or a range lo-hi", s, part)
		}
		spans = append(spans, span{a, b})
	}
	return func(fd int) bool {
		for _, sp := range spans {
			if fd >= sp.lo && fd <= sp.hi {
				return true
			}
		}
		return false
	}, nil
}

func runStats(ctx context.Context, args []string, out io.Writer) error {
	if len(args) > 0 && args[0] == "serve" {
		return runStatsServe(ctx, args[1:], out)
	}
	fs := flag.NewFlagSet("vmaxdp stats", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f statsFlags
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("stats: %w (vmaxdp stats -h)", err)
	}
	if f.help {
		fmt.Fprint(out, statsUsage)
		return nil
	}
	if f.version {
		fmt.Fprintln(out, "vmaxdp stats", version, "(stats format", strconv.Itoa(stats.FormatVersion)+")")
		return nil
	}
	cyclesSet := false
	fs.Visit(func(fl *flag.Flag) { cyclesSet = cyclesSet || fl.Name == "c" || fl.Name == "cycles" })
	dumpLevel := params.LevelInfo
	if f.fdDump != "" && fs.NArg() > 0 {
		l, err := parseLevel(fs.Arg(0))
		if err != nil {
			return fmt.Errorf("stats: -S: %w", err)
		}
		dumpLevel = l
	} else if fs.NArg() > 0 {
		return fmt.Errorf("stats: unexpected argument %q (vmaxdp stats -h)", fs.Arg(0))
	}
	switch {
	case f.view < 1 || f.view > 5:
		return fmt.Errorf("stats: view %d: want 1 to 5", f.view)
	case f.details != 1 && f.details != 2:
		return fmt.Errorf("stats: details %d: want 1 (totals) or 2 (deltas)", f.details)
	case f.interval <= 0:
		return fmt.Errorf("stats: interval %v: want more than 0 seconds", f.interval)
	case f.cycles < 0:
		return fmt.Errorf("stats: cycles %d: want 0 (for ever) or more", f.cycles)
	case f.logDetails < -1 || f.logDetails > 3:
		return fmt.Errorf("stats: details level %d: want 0 to 3", f.logDetails)
	}
	filter, err := parseFDList(f.sockets)
	if err != nil {
		return fmt.Errorf("stats: %w", err)
	}
	dir := params.StatsDir(f.dir)
	all := f.view == 5 || f.json || f.prometheus
	readers, err := selectProcesses(dir, &f, all, os.Stderr)
	if err != nil {
		return err
	}
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()

	acted := false
	for _, r := range readers {
		if f.zero {
			if err := r.Zero(2 * time.Second); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "vmaxdp stats: counters of pid %d zeroed\n", r.PID)
			acted = true
		}
		if f.logLevel != "" || f.logDetails >= 0 {
			level := -1
			if f.logLevel != "" {
				if level, err = parseLevel(f.logLevel); err != nil {
					return fmt.Errorf("stats: -l: %w", err)
				}
			}
			if err := r.SetLog(level, f.logDetails); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "vmaxdp stats: log of pid %d set (level %d, details %d; -1: unchanged)\n", r.PID, level, f.logDetails)
			acted = true
		}
		if f.fdDump != "" {
			fd, err := strconv.Atoi(f.fdDump)
			if err != nil || fd < 0 {
				return fmt.Errorf("stats: -S %q: want an fd number (0: all)", f.fdDump)
			}
			if err := r.Dump(fd, dumpLevel); err != nil {
				return err
			}
			if err := printDump(out, r, fd, dumpLevel); err != nil {
				return err
			}
			acted = true
		}
	}
	if acted && !cyclesSet {
		return nil
	}
	return report(ctx, out, readers, &f, filter)
}

// selectProcesses opens the stats files -p, -n or -f choose, cleaning
// those of dead processes unless -F.
func selectProcesses(dir string, f *statsFlags, all bool, warn io.Writer) ([]*stats.Reader, error) {
	found, err := stats.List(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("stats: %w", err)
	}
	var live []stats.Found
	for _, fo := range found {
		switch {
		case !fo.Alive && !f.forbidClean:
			if err := os.Remove(fo.Path); err == nil {
				fmt.Fprintf(warn, "vmaxdp stats: removed %s: pid %d is gone\n", fo.Path, fo.PID)
			}
		case fo.Err != nil && (f.pid == 0 || fo.PID == f.pid):
			if f.pid != 0 {
				return nil, fo.Err
			}
			fmt.Fprintf(warn, "vmaxdp stats: skipping %v\n", fo.Err)
		case fo.Alive:
			live = append(live, fo)
		}
	}
	var chosen []*stats.Reader
	for _, fo := range live {
		if f.pid != 0 && fo.PID != f.pid {
			continue
		}
		r, err := stats.Open(fo.Path)
		if err != nil {
			return nil, err
		}
		if f.name != "" {
			var s stats.Snapshot
			if err := r.Read(&s); err != nil || s.Process.Program != f.name {
				r.Close()
				continue
			}
		}
		chosen = append(chosen, r)
	}
	what := "no process runs under vmaxdp"
	switch {
	case f.pid != 0:
		what = fmt.Sprintf("no vmaxdp process with pid %d", f.pid)
	case f.name != "":
		what = fmt.Sprintf("no vmaxdp process runs %q", f.name)
	}
	if len(chosen) == 0 {
		return nil, fmt.Errorf("%w... (%s; stats directory %s)", errNoProcess, what, dir)
	}
	if len(chosen) > 1 && !all {
		var pids []string
		for _, r := range chosen {
			pids = append(pids, strconv.Itoa(r.PID))
			r.Close()
		}
		return nil, fmt.Errorf("%w: %d vmaxdp processes (pids %s): choose one with -p or -n", errNoProcess, len(chosen), strings.Join(pids, ", "))
	}
	return chosen, nil
}

func printDump(out io.Writer, r *stats.Reader, fd, level int) error {
	var s stats.Snapshot
	if err := r.Read(&s); err != nil {
		return err
	}
	n := 0
	for i := range s.Sockets {
		if fd != 0 && s.Sockets[i].FD != fd {
			continue
		}
		var b strings.Builder
		stats.WriteFDDump(&b, &s.Sockets[i])
		for _, l := range strings.Split(strings.TrimRight(b.String(), "\n"), "\n") {
			fmt.Fprintf(out, "vmaxdp %s: %s\n", params.LevelNames[level], l)
		}
		n++
	}
	if n == 0 {
		return fmt.Errorf("stats: -S %d: pid %d has no such socket", fd, r.PID)
	}
	return nil
}

// report prints -c reports -i seconds apart.
func report(ctx context.Context, out io.Writer, readers []*stats.Reader, f *statsFlags, filter func(int) bool) error {
	interval := time.Duration(f.interval * float64(time.Second))
	deltas := f.details == 2
	prev := make([]*stats.Snapshot, len(readers))
	read := func() ([]*stats.Snapshot, error) {
		cur := make([]*stats.Snapshot, len(readers))
		for i, r := range readers {
			cur[i] = new(stats.Snapshot)
			if err := r.Read(cur[i]); err != nil {
				if !r.Alive() {
					return nil, fmt.Errorf("stats: pid %d exited", r.PID)
				}
				return nil, err
			}
		}
		return cur, nil
	}
	if deltas {
		var err error
		if prev, err = read(); err != nil {
			return err
		}
	}
	for cycle := 0; f.cycles == 0 || cycle < f.cycles; cycle++ {
		if deltas || cycle > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(interval):
			}
		}
		cur, err := read()
		if err != nil {
			return err
		}
		shown := cur
		if deltas {
			shown = make([]*stats.Snapshot, len(cur))
			for i := range cur {
				// The processes' own publication times give the interval.
				d := time.Duration(cur[i].Process.Published - prev[i].Process.Published)
				shown[i] = stats.Deltas(cur[i], prev[i], d)
			}
		}
		switch {
		case f.json:
			enc := json.NewEncoder(out)
			if err := enc.Encode(shown); err != nil {
				return err
			}
		case f.prometheus:
			if err := prom.Write(out, shown); err != nil {
				return err
			}
		case f.view == 5:
			stats.WriteNetstat(out, shown)
		default:
			stats.WriteView(out, shown[0], stats.ViewOptions{View: f.view, Socket: filter, Rates: deltas})
		}
		prev = cur
	}
	return nil
}

// runStatsServe serves /metrics for every vmaxdp process of the stats
// directory.
func runStatsServe(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("vmaxdp stats serve", flag.ContinueOnError)
	fs.SetOutput(out)
	listen := fs.String("listen", "127.0.0.1:9465", "address to serve /metrics on")
	dir := fs.String("k", "", "stats directory (default $VMAXDP_STATS_DIR or /dev/shm)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	d := params.StatsDir(*dir)
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("stats serve: %w", err)
	}
	fmt.Fprintf(out, "vmaxdp stats: serving http://%s/metrics for %s\n", ln.Addr(), d)
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		snaps, errs := readAll(d)
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		for _, err := range errs {
			fmt.Fprintf(w, "# %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		}
		if err := prom.Write(w, snaps); err != nil {
			fmt.Fprintf(os.Stderr, "vmaxdp stats serve: %v\n", err)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("stats serve: %w", err)
	}
	return nil
}

// readAll reads the snapshots of the live processes of dir; a file that
// does not read is reported, never fatal, and dead processes' files are
// left for vmaxdp stats to clean.
func readAll(dir string) ([]*stats.Snapshot, []error) {
	found, err := stats.List(dir)
	if err != nil {
		return nil, []error{err}
	}
	var snaps []*stats.Snapshot
	var errs []error
	for _, fo := range found {
		if !fo.Alive {
			continue
		}
		if fo.Err != nil {
			errs = append(errs, fo.Err)
			continue
		}
		r, err := stats.Open(fo.Path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s := new(stats.Snapshot)
		if err := r.Read(s); err != nil {
			errs = append(errs, err)
		} else {
			snaps = append(snaps, s)
		}
		r.Close()
	}
	return snaps, errs
}
