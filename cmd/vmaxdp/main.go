// Command vmaxdp is the kernel-bypass engine's command-line tool.
//
//	vmaxdp version
//	vmaxdp run [flags] -- program [args...]
//	vmaxdp params [-env]
//	vmaxdp stats [vma_stats options] | vmaxdp stats serve --listen ADDR
//	vmaxdp testbed up|down|status [flags]
//	vmaxdp bench [rxdrop|txonly|echo|xdpcost|all] [flags]
//	vmaxdp bench floor [-tuned] [flags]
//	vmaxdp bench apps [flags]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/bench"
	"github.com/vmaxdp/vmaxdp/internal/peernotify"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// version is set with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, errNoProcess) {
			fmt.Fprintln(os.Stderr, "vmaxdp stats:", err) // vma_stats' words
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "vmaxdp:", err)
		os.Exit(1)
	}
}

const usage = `usage: vmaxdp <command> [arguments]

commands:
  version                 print the version
  run [flags] -- prog ... run an unmodified program with its UDP sockets offloaded
  params [-env]           list the VMAXDP_* parameters, defaults and meanings
  stats [options]         show the counters of running vmaxdp processes (vma_stats)
  stats serve --listen A  serve them as Prometheus /metrics
  testbed up|down|status  manage the veth test bed (two namespaces, 198.18.0.0/24)
  bench [kind...]         measure vmaxdp against the kernel on a test bed
                          kinds: rxdrop txonly echo xdpcost all (default all)
  bench floor             the same workload at every layer, from raw AF_XDP up
  bench apps              Debian programs under vmaxdp against the kernel
  notify-peers -pid N     (started by the preload library) tell the peers of
                          process N's offloaded TCP connections of its end
`

var errUsage = errors.New("bad usage (vmaxdp -h)")

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(out, usage)
		return errUsage
	}
	switch args[0] {
	case "version":
		fmt.Fprintln(out, "vmaxdp", version)
		return nil
	case "run":
		return runRun(args[1:], out)
	case "params":
		return runParams(args[1:], out)
	case "stats":
		return runStats(ctx, args[1:], out)
	case "testbed":
		return runTestbed(args[1:], out)
	case "bench":
		return runBench(ctx, args[1:], out)
	case peernotify.Command:
		return runNotifyPeers(args[1:])
	case "-h", "-help", "--help", "help":
		fmt.Fprint(out, usage)
		return nil
	}
	return fmt.Errorf("unknown command %q: %w", args[0], errUsage)
}

// runNotifyPeers is the peer-notification helper, with the process's
// socket as fd 3 (package peernotify).
func runNotifyPeers(args []string) error {
	fs := flag.NewFlagSet("vmaxdp "+peernotify.Command, flag.ContinueOnError)
	pid := fs.Int("pid", 0, "the process whose TCP peers to tell")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pid <= 0 {
		return fmt.Errorf("%s: -pid: want the process id: %w", peernotify.Command, errUsage)
	}
	return peernotify.Serve(3, *pid, os.Stderr)
}

func runTestbed(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("vmaxdp testbed", flag.ContinueOnError)
	name := fs.String("name", "demo", "bed name: namespaces vmx-NAME-a and vmx-NAME-b")
	queues := fs.Int("queues", 0, "RX/TX queues per veth end (default 1; not with -plain)")
	mtu := fs.Int("mtu", 1500, "MTU of both ends")
	plain := fs.Bool("plain", false, "make the veth pair as `ip link add` does: the kernel's default queues, every offload on (TX checksums partial), IPv6 on")
	bridged := fs.Bool("bridged", false, "join the sides through a bridge in a third namespace, vmx-NAME-h, as a container network has it: the gateway "+testbed.Gateway.String()+" on the bridge, and "+testbed.Beyond.String()+" behind it (a plain bed)")
	if len(args) == 0 {
		return fmt.Errorf("testbed: want up, down or status: %w", errUsage)
	}
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	switch args[0] {
	case "up":
		b, err := testbed.Up(*name, &testbed.Options{Queues: *queues, MTU: *mtu, Plain: *plain, Bridged: *bridged})
		if err != nil {
			return err
		}
		defer b.Close()
		fmt.Fprintf(out, "test bed %s up: %s in %s (%s) <-> %s in %s (%s), %d queue(s), MTU %d, %s\n",
			b.Name, b.Link(testbed.A), b.NSName(testbed.A), b.Addr(testbed.A), b.Link(testbed.B), b.NSName(testbed.B), b.Addr(testbed.B), b.Queues, b.MTU, bedKind(b))
		return nil
	case "down":
		if err := testbed.Down(*name); err != nil {
			return err
		}
		removed, err := testbed.RemoveStale()
		if len(removed) > 0 {
			fmt.Fprintf(out, "removed stale test beds: %s\n", strings.Join(removed, " "))
		}
		return err
	case "status":
		names, err := testbed.List()
		if err != nil {
			return err
		}
		if len(names) == 0 {
			fmt.Fprintln(out, "no test bed")
		}
		for _, n := range names {
			b, err := testbed.Open(n)
			if err != nil {
				fmt.Fprintf(out, "%s: broken: %v (remove it with: vmaxdp testbed down -name %s)\n", n, err, n)
				continue
			}
			fmt.Fprintf(out, "%s: %s %s <-> %s %s, %d queue(s), MTU %d, %s\n", n, b.NSName(testbed.A), b.Addr(testbed.A), b.NSName(testbed.B), b.Addr(testbed.B), b.Queues, b.MTU, bedKind(b))
			b.Close()
		}
		return nil
	}
	return fmt.Errorf("testbed %q: want up, down or status: %w", args[0], errUsage)
}

// bedKind says whether a bed is plain or tuned (testbed.Options.Plain).
func bedKind(b *testbed.Bed) string {
	if b.Bridged {
		return fmt.Sprintf("bridged through %s in %s (gateway %s, %s behind it), plain (kernel defaults, TX checksum offload on)",
			b.Link(testbed.Hub), b.NSName(testbed.Hub), testbed.Gateway, b.Addr(testbed.Hub))
	}
	if b.Plain {
		return "plain (kernel defaults, TX checksum offload on)"
	}
	return "tuned (TX checksum offload off)"
}

func runBench(ctx context.Context, args []string, out io.Writer) error {
	if len(args) > 0 && args[0] == "apps" {
		return runBenchApps(ctx, args[1:], out)
	}
	if len(args) > 0 && args[0] == "floor" {
		return runBenchFloor(args[1:], out)
	}
	fs := flag.NewFlagSet("vmaxdp bench", flag.ContinueOnError)
	d := fs.Duration("duration", 2*time.Second, "length of each measurement")
	size := fs.Int("size", 64, "UDP payload bytes")
	bedName := fs.String("bed", "", "run on this existing test bed (default: a bed of its own, removed afterwards)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	kinds := fs.Args()
	if len(kinds) == 0 || len(kinds) == 1 && kinds[0] == "all" {
		kinds = []string{"xdpcost", "rxdrop", "txonly", "echo"}
	}
	funcs := map[string]func(*testbed.Bed, *bench.Options) (bench.Result, error){
		"rxdrop": bench.RxDrop, "txonly": bench.TxOnly, "echo": bench.Echo, "xdpcost": bench.XDPCost,
	}
	for _, k := range kinds {
		if funcs[k] == nil {
			return fmt.Errorf("bench %q: want rxdrop, txonly, echo, xdpcost or all: %w", k, errUsage)
		}
	}
	var bed *testbed.Bed
	var err error
	if *bedName != "" {
		if bed, err = testbed.Open(*bedName); err != nil {
			return err
		}
		defer bed.Close()
	} else {
		if bed, err = testbed.Up(fmt.Sprintf("bench%d", os.Getpid()), nil); err != nil {
			return err
		}
		defer bed.Down()
	}
	fmt.Fprintf(out, "vmaxdp %s bench on test bed %s: %d B payload, %s per measurement, kernel and vmaxdp in the same run\n", version, bed.Name, *size, *d)
	for _, k := range kinds {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r, err := funcs[k](bed, &bench.Options{Duration: *d, Size: *size})
		if err != nil {
			return err
		}
		fmt.Fprintln(out, r)
	}
	return nil
}
