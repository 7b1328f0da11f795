package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/vmaxdp/vmaxdp/internal/bench"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
)

// TestBenchFloor runs `vmaxdp bench floor` briefly: every layer, from raw
// AF_XDP to the kernel's sockets, prints a round trip and a one-way rate
// (sockperf's layers a note instead when sockperf is missing). Rates are
// not asserted: the machine is shared and noisy.
func TestBenchFloor(t *testing.T) {
	testutil.RequireRoot(t)
	out, err := exec.Command(tools(t), "bench", "floor", "-duration", "1s", "-rounds", "1").CombinedOutput()
	if err != nil {
		t.Fatalf("vmaxdp bench floor: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	for _, layer := range []string{bench.LayerRaw, bench.LayerStack, bench.LayerSockperf, bench.LayerKernelSpin, bench.LayerKernelBlock} {
		var line string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(strings.TrimSpace(l), layer) {
				line = l
			}
		}
		switch f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), layer)); {
		case line == "":
			t.Errorf("no line for %q", layer)
		case strings.Contains(line, "sockperf not installed"):
			t.Logf("%s: %s", layer, line)
		case len(f) < 7 || f[0] == "0.00" || f[4] == "0":
			t.Errorf("%q measured nothing: %q", layer, line)
		}
	}
}
