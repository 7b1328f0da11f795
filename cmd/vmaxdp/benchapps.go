package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/apps"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// placement is where vmaxdp runs in one run of an application.
type placement struct {
	name           string
	server, client bool
}

var placements = []placement{{"kernel", false, false}, {"server", true, false}, {"client", false, true}, {"both", true, true}}

// runBenchApps is `vmaxdp bench apps`: unmodified programs from Debian on
// a plain bed (as `ip link add` makes it), each with vmaxdp under the
// server, the client, both and neither, in interleaved rounds whose
// placements rotate; it prints each placement's median rate and the median
// of its per-round ratios to the kernel's rate of the same round.
func runBenchApps(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("vmaxdp bench apps", flag.ContinueOnError)
	fs.SetOutput(out)
	rounds := fs.Int("rounds", 5, "interleaved rounds")
	d := fs.Duration("duration", 3*time.Second, "length of each run")
	only := fs.String("apps", "", "comma-separated applications (default: all installed): "+appNames())
	tuned := fs.Bool("tuned", false, "run on a tuned bed (TX checksum offload off) instead of a plain one")
	env := fs.String("env", "", "space-separated VMAXDP_* settings for every vmaxdp side")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rounds < 1 {
		return fmt.Errorf("bench apps: -rounds %d: want at least 1: %w", *rounds, errUsage)
	}
	var list []*apps.App
	if *only == "" {
		for _, a := range apps.All {
			if miss := a.Missing(); miss != "" {
				fmt.Fprintf(out, "%s: skipped, not installed: %s\n", a.Name, miss)
				continue
			}
			list = append(list, a)
		}
	} else {
		for _, n := range strings.Split(*only, ",") {
			a, ok := apps.ByName(n)
			if !ok {
				return fmt.Errorf("bench apps: -apps: %q: want one of %s: %w", n, appNames(), errUsage)
			}
			list = append(list, a)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	bed, err := testbed.Up(fmt.Sprintf("apps%d", os.Getpid()), &testbed.Options{Plain: !*tuned})
	if err != nil {
		return err
	}
	defer bed.Down()
	fmt.Fprintf(out, "vmaxdp %s bench apps: %s bed, %d rounds of %s per run, placements rotated in each round\n", version, bedKind(bed), *rounds, *d)
	for _, a := range list {
		if e := appEnv(a, strings.Fields(*env)); len(e) > 0 {
			fmt.Fprintf(out, "%s: vmaxdp runs with %s\n", a.Name, strings.Join(e, " "))
		}
	}
	// rates[app][placement][round]
	rates := make([][][]float64, len(list))
	lost := make([][]int64, len(list))
	for i := range list {
		rates[i] = make([][]float64, len(placements))
		lost[i] = make([]int64, len(placements))
	}
	for r := 0; r < *rounds; r++ {
		for i, a := range list {
			for k := range placements {
				p := (k + r) % len(placements)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				run := &apps.Run{Bed: bed, App: a, Vmaxdp: exe, ServerOffload: placements[p].server, ClientOffload: placements[p].client,
					Duration: *d, Env: appEnv(a, strings.Fields(*env))}
				res, _, err := run.Do(ctx)
				if err != nil {
					if errors.Is(err, apps.ErrNotInstalled) {
						return err
					}
					fmt.Fprintf(out, "round %d %s %s: %v\n", r+1, a.Name, placements[p].name, err)
					continue
				}
				rates[i][p] = append(rates[i][p], res.Rate)
				lost[i][p] += res.Lost
			}
		}
		fmt.Fprintf(out, "round %d of %d done\n", r+1, *rounds)
	}
	fmt.Fprintf(out, "\n%-12s %-12s %12s", "application", "unit", "kernel")
	for _, p := range placements[1:] {
		fmt.Fprintf(out, " %22s", "vmaxdp "+p.name)
	}
	fmt.Fprintln(out)
	for i, a := range list {
		fmt.Fprintf(out, "%-12s %-12s %12.0f", a.Name, a.Unit, median(rates[i][0]))
		for p := 1; p < len(placements); p++ {
			var ratios []float64
			for r := range min(len(rates[i][p]), len(rates[i][0])) {
				if rates[i][0][r] > 0 {
					ratios = append(ratios, rates[i][p][r]/rates[i][0][r])
				}
			}
			fmt.Fprintf(out, " %12.0f (%5.2fx)", median(rates[i][p]), median(ratios))
		}
		fmt.Fprintln(out)
	}
	fmt.Fprintf(out, "\nlost (all rounds):")
	for i, a := range list {
		fmt.Fprintf(out, " %s", a.Name)
		for p := range placements {
			fmt.Fprintf(out, " %s=%d", placements[p].name, lost[i][p])
		}
		fmt.Fprint(out, ";")
	}
	fmt.Fprintln(out)
	return nil
}

// appEnv is the environment of a's vmaxdp sides: env, and for a TCP
// application VMAXDP_TCP=1 unless env sets VMAXDP_TCP, so that its cells
// measure TCP offload (without it vmaxdp only passes the sockets through
// to the kernel, and the ratios say nothing of TCP).
func appEnv(a *apps.App, env []string) []string {
	if !slices.Contains(apps.TCP, a) || slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "VMAXDP_TCP=") }) {
		return env
	}
	return append(env[:len(env):len(env)], "VMAXDP_TCP=1")
}

func appNames() string {
	var n []string
	for _, a := range append(apps.All[:len(apps.All):len(apps.All)], apps.TCP...) {
		n = append(n, a.Name)
	}
	return strings.Join(n, ", ")
}

// median of xs (0 when empty).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
