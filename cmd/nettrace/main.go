// Command nettrace records the kernel's packet path with eBPF and explains
// it afterwards from the file.
//
//	nettrace record [-o FILE] [-e EVENTS] [-duration D] [filters] [-- COMMAND ARGS]
//	nettrace script [-i FILE] [-format text|json|perfetto] [-e EVENTS]
//	nettrace pcap   [-i FILE] -o OUT.pcapng [-e EVENTS]
//	nettrace report [-i FILE] [-json|-html] [-o OUT] [-top N] [-dev D] [-flow F] [-reason R] [-cpu C] [-time FROM,TO]
//	nettrace list
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/internal/record"
	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/report"
	"github.com/vmaxdp/vmaxdp/tracefile"
	"github.com/vmaxdp/vmaxdp/tracefmt"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "nettrace:", err)
		os.Exit(1)
	}
}

const usage = `usage: nettrace <command> [arguments]

commands:
  record   record packet-path events to a file (root)
  script   print a recording, one line per event (perf script layout)
  pcap     write the captured packet headers of a recording as pcapng
  report   explain a recording: drops and their causes, NAPI, stages, counters, advice
  list     list events, groups and the attach methods this kernel offers
  version  print the version
`

var errUsage = errors.New("bad usage (nettrace -h)")

func run(ctx context.Context, args []string, out, errOut io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(out, usage)
		return errUsage
	}
	switch args[0] {
	case "record":
		return runRecord(ctx, args[1:], errOut)
	case "script":
		return runScript(args[1:], out, errOut)
	case "pcap":
		return runPcap(args[1:], errOut)
	case "report":
		return runReport(args[1:], out, errOut)
	case "list":
		return runList(out)
	case "version":
		fmt.Fprintln(out, "nettrace", version)
		return nil
	case "-h", "-help", "--help", "help":
		fmt.Fprint(out, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q: %w", args[0], errUsage)
}

func runList(out io.Writer) error {
	fmt.Fprintln(out, "events (group):")
	for _, p := range probes.All {
		fmt.Fprintf(out, "  %-30s %s\n", p.Name, strings.Join(p.Groups, ","))
	}
	fmt.Fprintf(out, "groups: %s\n", strings.Join(probes.Groups(), ", "))
	f := probes.KernelFeatures()
	status := func(err error) string {
		if err == nil {
			return "available"
		}
		return err.Error()
	}
	fmt.Fprintf(out, "attach methods:\n  tracepoint (tp_btf): used by every event\n  kprobe: %s\n  fentry: %s\n", status(f.Kprobe), status(f.Fentry))
	return nil
}

func runRecord(ctx context.Context, args []string, errOut io.Writer) error {
	fs := flag.NewFlagSet("nettrace record", flag.ContinueOnError)
	fs.SetOutput(errOut)
	output := fs.String("o", "nettrace.data", "output file (- for standard output)")
	events := fs.String("e", "all", "events and groups, comma-separated (nettrace list)")
	duration := fs.Duration("duration", 0, "stop after this long (default: until the command exits or Ctrl-C)")
	aggregate := fs.Bool("aggregate", false, "count events by probe, reason, location and interface in the kernel instead of recording each")
	interval := fs.Duration("interval", time.Second, "interval of loss, counter and aggregate snapshots")
	nsName := fs.String("netns", "", "only this network namespace: a name under /run/netns or an inode number")
	dev := fs.String("dev", "", "only this interface (in -netns when given)")
	proto := fs.String("proto", "", "only this IPv4 protocol: udp, tcp, icmp or a number")
	src := fs.String("src", "", "only packets from this IPv4 address")
	dst := fs.String("dst", "", "only packets to this IPv4 address")
	host := fs.String("host", "", "only packets from or to this IPv4 address")
	sport := fs.Uint("sport", 0, "only packets from this port")
	dport := fs.Uint("dport", 0, "only packets to this port")
	port := fs.Uint("port", 0, "only packets from or to this port")
	caplen := fs.Int("caplen", tracefile.MaxCapLen, "bytes of each packet to capture (at most 128)")
	ringMiB := fs.Uint("ring-size", 16, "kernel ring buffer size in MiB (a power of two)")
	statsDir := fs.String("stats-dir", "", "where vmaxdp processes publish their counters, recorded with the others (default $VMAXDP_STATS_DIR or /dev/shm; - for none)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sel, err := probes.Select(*events)
	if err != nil {
		return err
	}
	if *ringMiB == 0 || *ringMiB&(*ringMiB-1) != 0 || *ringMiB > 2048 {
		return fmt.Errorf("-ring-size %d: want a power of two MiB up to 2048", *ringMiB)
	}
	opts := &record.Options{
		Probes:   probes.Options{Probes: sel, Aggregate: *aggregate, CapLen: *caplen, RingSize: uint32(*ringMiB) << 20},
		Interval: *interval,
		Command:  fs.Args(),
		Version:  version,
		StatsDir: params.StatsDir(*statsDir),
	}
	if *statsDir == "-" {
		opts.StatsDir = ""
	}
	f := &opts.Probes.Filter
	var nsHandle netns.NsHandle = -1
	if *nsName != "" {
		if nsHandle, f.Netns, err = resolveNetns(*nsName); err != nil {
			return err
		}
		defer nsHandle.Close()
	}
	if *dev != "" {
		if f.Ifindex, err = resolveDev(nsHandle, *dev); err != nil {
			return err
		}
	}
	if f.L4Proto, err = parseProto(*proto); err != nil {
		return err
	}
	for _, a := range []struct {
		flag, v string
		to      *netip.Addr
	}{{"src", *src, &f.Src}, {"dst", *dst, &f.Dst}, {"host", *host, &f.Host}} {
		if a.v == "" {
			continue
		}
		if *a.to, err = netip.ParseAddr(a.v); err != nil || !a.to.Is4() {
			return fmt.Errorf("-%s %q: want an IPv4 address", a.flag, a.v)
		}
	}
	for _, p := range []struct {
		flag string
		v    uint
		to   *uint16
	}{{"sport", *sport, &f.SrcPort}, {"dport", *dport, &f.DstPort}, {"port", *port, &f.Port}} {
		if p.v > 65535 {
			return fmt.Errorf("-%s %d: not a port", p.flag, p.v)
		}
		*p.to = uint16(p.v)
	}

	out := io.Writer(os.Stdout)
	if *output != "-" {
		file, err := os.Create(*output)
		if err != nil {
			return err
		}
		defer file.Close()
		out = file
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	if *duration > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeoutCause(ctx, *duration, fmt.Errorf("duration %s elapsed", *duration))
		defer stop()
	}
	var cmd *exec.Cmd
	opts.Ready = func(notes []string) {
		for _, n := range notes {
			fmt.Fprintln(errOut, "nettrace:", n)
		}
		if len(fs.Args()) == 0 {
			return
		}
		cmd = exec.Command(fs.Args()[0], fs.Args()[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			cancel(fmt.Errorf("command did not start: %w", err))
			return
		}
		go func() {
			err := cmd.Wait()
			status := "exit status 0"
			if err != nil {
				status = err.Error()
			}
			cancel(fmt.Errorf("command exited (%s)", status))
		}()
	}
	if isTerminal(errOut) {
		opts.Progress = func(p record.Progress) {
			rate := float64(p.Events) / p.Elapsed.Seconds()
			fmt.Fprintf(errOut, "\rnettrace: %6.1fs  %d events  %.0f/s  %d lost  %.1f MB   ", p.Elapsed.Seconds(), p.Events, rate, p.Lost, float64(p.Bytes)/1e6)
		}
	}
	sum, err := record.Run(ctx, out, opts)
	if opts.Progress != nil {
		fmt.Fprintln(errOut)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(errOut, "nettrace: %d events, %d lost, %.1f MB written to %s in %.1fs (%v)\n",
		sum.Events, sum.Lost, float64(sum.Bytes)/1e6, *output, sum.Elapsed.Seconds(), context.Cause(ctx))
	return nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

func resolveNetns(name string) (netns.NsHandle, uint32, error) {
	if ino, err := strconv.ParseUint(name, 10, 32); err == nil {
		return -1, uint32(ino), nil
	}
	path := filepath.Join("/run/netns", name)
	h, err := netns.GetFromPath(path)
	if err != nil {
		return -1, 0, fmt.Errorf("-netns %s: %w", name, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(h), &st); err != nil {
		h.Close()
		return -1, 0, fmt.Errorf("-netns %s: %w", name, err)
	}
	return h, uint32(st.Ino), nil
}

func resolveDev(ns netns.NsHandle, name string) (uint32, error) {
	var ifindex uint32
	lookup := func() error {
		ifi, err := net.InterfaceByName(name)
		if err != nil {
			return fmt.Errorf("-dev %s: %w", name, err)
		}
		ifindex = uint32(ifi.Index)
		return nil
	}
	if ns == -1 {
		return ifindex, lookup()
	}
	return ifindex, netnsutil.Do(ns, lookup)
}

func parseProto(s string) (uint8, error) {
	switch s {
	case "":
		return 0, nil
	case "icmp":
		return unix.IPPROTO_ICMP, nil
	case "tcp":
		return unix.IPPROTO_TCP, nil
	case "udp":
		return unix.IPPROTO_UDP, nil
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("-proto %q: want udp, tcp, icmp or a protocol number 1-255", s)
	}
	return uint8(n), nil
}

// openTrace opens a trace file for reading; "-" is standard input.
func openTrace(path string) (*tracefile.Reader, func(), error) {
	in := io.Reader(os.Stdin)
	closeFn := func() {}
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, nil, err
		}
		in, closeFn = f, func() { f.Close() }
	}
	r, err := tracefile.NewReader(in)
	if err != nil {
		closeFn()
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, closeFn, nil
}

func eventFilter(spec string) (*tracefmt.Options, error) {
	if spec == "" {
		return &tracefmt.Options{}, nil
	}
	sel, err := probes.Select(spec)
	if err != nil {
		return nil, err
	}
	o := &tracefmt.Options{Probes: map[uint16]bool{}}
	for _, p := range sel {
		o.Probes[uint16(p.ID)] = true
	}
	return o, nil
}

func runScript(args []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("nettrace script", flag.ContinueOnError)
	fs.SetOutput(errOut)
	input := fs.String("i", "nettrace.data", "trace file (- for standard input)")
	format := fs.String("format", "text", "text (perf script layout), json (one object per line) or perfetto (ui.perfetto.dev)")
	events := fs.String("e", "", "print only these events and groups")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts, err := eventFilter(*events)
	if err != nil {
		return err
	}
	var write func(io.Writer, *tracefile.Reader, *tracefmt.Options) (tracefmt.Stats, error)
	switch *format {
	case "text":
		write = tracefmt.Text
	case "json":
		write = tracefmt.JSON
	case "perfetto":
		write = tracefmt.Perfetto
	default:
		return fmt.Errorf("-format %q: want text, json or perfetto", *format)
	}
	r, closeFn, err := openTrace(*input)
	if err != nil {
		return err
	}
	defer closeFn()
	st, err := write(out, r, opts)
	if err != nil {
		return fmt.Errorf("%s: %w", *input, err)
	}
	warnIncomplete(errOut, *input, st)
	return nil
}

func warnIncomplete(errOut io.Writer, path string, st tracefmt.Stats) {
	if st.Incomplete != nil {
		fmt.Fprintf(errOut, "nettrace: %s: incomplete recording: %v\n", path, st.Incomplete)
	}
	if st.Lost > 0 {
		fmt.Fprintf(errOut, "nettrace: %s: %d events were lost while recording\n", path, st.Lost)
	}
}

func runPcap(args []string, errOut io.Writer) error {
	fs := flag.NewFlagSet("nettrace pcap", flag.ContinueOnError)
	fs.SetOutput(errOut)
	input := fs.String("i", "nettrace.data", "trace file (- for standard input)")
	output := fs.String("o", "", "pcapng file to write (required)")
	events := fs.String("e", "", "write only packets of these events and groups")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *output == "" {
		return fmt.Errorf("pcap: -o OUT.pcapng is required: %w", errUsage)
	}
	opts, err := eventFilter(*events)
	if err != nil {
		return err
	}
	r, closeFn, err := openTrace(*input)
	if err != nil {
		return err
	}
	defer closeFn()
	f, err := os.Create(*output)
	if err != nil {
		return err
	}
	st, err := tracefmt.Pcap(f, r, opts)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("%s: %w", *input, err)
	}
	fmt.Fprintf(errOut, "nettrace: %d events read, packets written to %s\n", st.Events, *output)
	warnIncomplete(errOut, *input, st)
	return nil
}

func runReport(args []string, out, errOut io.Writer) error {
	fs := flag.NewFlagSet("nettrace report", flag.ContinueOnError)
	fs.SetOutput(errOut)
	input := fs.String("i", "nettrace.data", "trace file (- for standard input)")
	output := fs.String("o", "", "write the report to this file instead of standard output")
	asJSON := fs.Bool("json", false, "JSON ("+report.SchemaVersion+"), for scripts")
	asHTML := fs.Bool("html", false, "one self-contained HTML page with plots")
	top := fs.Int("top", 10, "rows per table")
	var opts report.Options
	fs.StringVar(&opts.Filter.Dev, "dev", "", "only this interface's packets and NAPI polls")
	flow := fs.String("flow", "", "only packets of this flow: [udp|tcp|icmp ]SRC[:PORT]>DST[:PORT], * for any")
	reason := fs.String("reason", "", "only drops with these reasons (comma-separated, e.g. NO_SOCKET)")
	cpus := fs.String("cpu", "", "only events on these CPUs (0,2-3)")
	window := fs.String("time", "", "only events in FROM,TO seconds from the start (either may be empty)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("report: unexpected argument %q: %w", fs.Arg(0), errUsage)
	}
	if *asJSON && *asHTML {
		return fmt.Errorf("report: -json and -html exclude each other: %w", errUsage)
	}
	if *top <= 0 {
		return fmt.Errorf("report: -top %d: want a positive number of rows", *top)
	}
	opts.Top = *top
	var err error
	if *flow != "" {
		if opts.Filter.Flow, err = report.ParseFlow(*flow); err != nil {
			return fmt.Errorf("-flow: %w", err)
		}
	}
	if *reason != "" {
		opts.Filter.Reasons = report.ParseReasons(*reason)
	}
	if *cpus != "" {
		if opts.Filter.CPUs, err = report.ParseCPUs(*cpus); err != nil {
			return fmt.Errorf("-cpu: %w", err)
		}
	}
	if *window != "" {
		if opts.Filter.From, opts.Filter.To, err = report.ParseTime(*window); err != nil {
			return fmt.Errorf("-time: %w", err)
		}
	}
	r, closeFn, err := openTrace(*input)
	if err != nil {
		return err
	}
	defer closeFn()
	rep, err := report.Build(r, &opts)
	if err != nil {
		return fmt.Errorf("%s: %w", *input, err)
	}
	w := out
	var f *os.File
	if *output != "" {
		if f, err = os.Create(*output); err != nil {
			return err
		}
		w = f
	}
	switch {
	case *asJSON:
		err = rep.WriteJSON(w)
	case *asHTML:
		err = rep.WriteHTML(w)
	default:
		err = rep.WriteText(w)
	}
	if f != nil {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return err
	}
	if rep.Incomplete != "" {
		fmt.Fprintf(errOut, "nettrace: %s: incomplete recording: %s\n", *input, rep.Incomplete)
	}
	return nil
}
