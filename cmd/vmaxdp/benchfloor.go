package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/bench"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// runBenchFloor is `vmaxdp bench floor`: bench.Floor on a bed of its own
// (as `ip link add` makes it, or tuned), printed as a table whose every
// line has its figure, its ratio to the raw AF_XDP floor and to the
// kernel's spinning sockets, and what it costs over the layer below.
func runBenchFloor(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("vmaxdp bench floor", flag.ContinueOnError)
	d := fs.Duration("duration", 2*time.Second, "length of each measurement")
	size := fs.Int("size", 64, "UDP payload bytes")
	tuned := fs.Bool("tuned", false, "run on a tuned bed (TX checksum offload off) instead of a plain one")
	rounds := fs.Int("rounds", 3, "rounds of every layer, interleaved; the table has each figure's median")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench floor: unexpected %q: %w", fs.Arg(0), errUsage)
	}
	if *rounds < 1 {
		return fmt.Errorf("bench floor: -rounds %d: want at least 1: %w", *rounds, errUsage)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("bench floor: this binary: %w", err)
	}
	bed, err := testbed.Up(fmt.Sprintf("floor%d", os.Getpid()), &testbed.Options{Plain: !*tuned})
	if err != nil {
		return err
	}
	defer bed.Down()
	fmt.Fprintf(out, "vmaxdp %s bench floor: %s bed, %d B payload, %s per measurement, every layer in one run; medians of %d interleaved rounds\n",
		version, bedKind(bed), *size, *d, *rounds)
	var all [][]bench.FloorLine
	for range *rounds {
		lines, err := bench.Floor(bed, self, &bench.Options{Duration: *d, Size: *size})
		if err != nil {
			return err
		}
		all = append(all, lines)
	}
	writeFloor(out, medianFloor(all))
	return nil
}

// medianFloor is, per layer, the median of the rounds' figures. Where
// two spinning processes share this machine's two CPUs, one round's
// figure can be half another's.
func medianFloor(rounds [][]bench.FloorLine) []bench.FloorLine {
	lines := slices.Clone(rounds[0])
	for i := range lines {
		var pp, oneWay []float64
		for _, r := range rounds {
			pp, oneWay = append(pp, r[i].PingPong), append(oneWay, r[i].OneWay)
		}
		lines[i].PingPong, lines[i].OneWay = median(pp), median(oneWay)
	}
	return lines
}

// writeFloor prints Floor's lines: ping-pong as the average round trip,
// one-way as messages a second, each with its ratios. One-way has a
// ratio to the blocking kernel too: sockperf's receiver blocks unless
// told otherwise, so it is the kernel's rate for the same command.
func writeFloor(out io.Writer, lines []bench.FloorLine) {
	var raw, kernel, block bench.FloorLine
	for _, l := range lines {
		switch l.Layer {
		case bench.LayerRaw:
			raw = l
		case bench.LayerKernelSpin:
			kernel = l
		case bench.LayerKernelBlock:
			block = l
		}
	}
	rtt := func(pp float64) float64 {
		if pp == 0 {
			return 0
		}
		return 1e6 / pp
	}
	ratio := func(a, b float64) string {
		if a == 0 || b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", a/b)
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "layer\tround trip (us)\tx raw\tx kernel spin\tover the layer below\tone-way (msg/s)\tx raw\tx kernel spin\tx kernel blocking\t")
	var prev float64
	for _, l := range lines {
		if l.Note != "" {
			fmt.Fprintf(w, "%s\t%s\t\t\t\t\t\t\t\t\n", l.Layer, l.Note)
			continue
		}
		r := rtt(l.PingPong)
		over := "-"
		if prev > 0 && l.Layer != bench.LayerKernelSpin && l.Layer != bench.LayerKernelBlock {
			over = fmt.Sprintf("%+.0f%%", (r/prev-1)*100)
		}
		if l.Layer != bench.LayerKernelSpin && l.Layer != bench.LayerKernelBlock {
			prev = r
		}
		fmt.Fprintf(w, "%s\t%.2f\t%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t\n", l.Layer, r, ratio(r, rtt(raw.PingPong)), ratio(r, rtt(kernel.PingPong)), over,
			l.OneWay, ratio(l.OneWay, raw.OneWay), ratio(l.OneWay, kernel.OneWay), ratio(l.OneWay, block.OneWay))
	}
	w.Flush()
}
