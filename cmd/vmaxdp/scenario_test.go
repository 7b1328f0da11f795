package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/record"
	"github.com/vmaxdp/vmaxdp/internal/recordtest"
	"github.com/vmaxdp/vmaxdp/internal/sockperf"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestScenarioSockperfFillRingStarved is issue 6's starved-queue scenario
// with the real application: nettrace records while unmodified sockperf
// serves a full-rate tp client under vmaxdp run with a tiny UMEM
// (VMAXDP_RX_BUFS=64) and a reader that sleeps at once (VMAXDP_RX_POLL=0).
// The fill ring runs dry between wakeups, the kernel fails the steering
// program's redirects with -ENOMEM, and the report's top finding is the
// starved queue, with the redirect errors and the queue's XDP_STATISTICS
// (from sockperf's own counters file) as evidence and VMAXDP_RX_BUFS as the
// fix.
func TestScenarioSockperfFillRingStarved(t *testing.T) {
	requireSockperf(t)
	vmaxdp := tools(t)
	b := testutil.Bed(t, nil)
	statsDir := t.TempDir()
	closeFile := filepath.Join(statsDir, "close.txt")
	srv := []string{"-i", b.Addr(testbed.B).String(), "-p", "11190"}
	var serverPID int
	run := &sockperf.Run{Bed: b, Vmaxdp: vmaxdp, ServerOffload: true, Server: srv,
		Client:   append([]string{"tp"}, append(srv, "-m", "64", "-t", "2")...),
		Env:      []string{"VMAXDP_RX_BUFS=64", "VMAXDP_RX_POLL=0", "VMAXDP_STATS_DIR=" + statsDir, "VMAXDP_STATS_FILE=" + closeFile},
		OnServer: func(pid int) { serverPID = pid },
		// The server still runs: its counters file shows the starved ring
		// before the recorder's last look at it.
		AfterClient: func(int, sockperf.Result) error {
			r, err := stats.Open(filepath.Join(statsDir, stats.FileName(serverPID)))
			if err != nil {
				return err
			}
			defer r.Close()
			if _, err := testutil.AwaitStats(r, 5*time.Second, func(s *stats.Snapshot) bool {
				return len(s.Queues) == 1 && s.Queues[0].Statistics.RxFillRingEmptyDescs > 0
			}); err != nil {
				return fmt.Errorf("the server's queue never ran out of fill-ring frames: %w", err)
			}
			time.Sleep(500 * time.Millisecond) // two snapshots
			return nil
		},
	}
	data := recordtest.While(t, &record.Options{StatsDir: statsDir, Probes: probes.Options{
		Probes: recordtest.Select(t, "drops,xdp"),
		Filter: probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B)},
	}}, func() error {
		_, _, err := run.Do(context.Background())
		return err
	})
	rep := recordtest.Report(t, data)
	if len(rep.Findings) == 0 {
		t.Fatal("no finding")
	}
	f := rep.Findings[0]
	if f.Rule != "xsk_fill_ring_empty" || f.Count == 0 {
		t.Fatalf("top finding %s (%d), want xsk_fill_ring_empty", f.Rule, f.Count)
	}
	evidence := strings.Join(f.Evidence, "\n")
	for _, want := range []string{"err=-12 on vmxb", "xsk rx_fill_ring_empty_descs +"} {
		if !strings.Contains(evidence, want) {
			t.Errorf("evidence lacks %q:\n%s", want, evidence)
		}
	}
	if !strings.Contains(f.Fix, "VMAXDP_RX_BUFS") {
		t.Errorf("fix %q does not name VMAXDP_RX_BUFS", f.Fix)
	}
	// The server's exit report says what its queue dropped: the frames
	// the kernel had no fill-ring buffer for (rx_dropped).
	closed, _ := os.ReadFile(closeFile)
	m := regexp.MustCompile(`(?m)^vmaxdp: \[` + b.Link(testbed.B) + `/q0\] Rx ring: (\d+) / (\d+) / (\d+) \[rx_ring_full/rx_dropped/rx_fill_ring_empty_descs\]$`).FindSubmatch(closed)
	if m == nil || string(m[2]) == "0" || string(m[3]) == "0" {
		t.Errorf("%s:\n%s\nwant the queue's line, with what it dropped", closeFile, closed)
	}
	for _, g := range rep.Findings[1:] {
		if g.Severity == "error" {
			t.Errorf("another error finding: %s %q", g.Rule, g.Title)
		}
	}
}
