package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunChrony: chrony, the NTP daemon Debian installs, under vmaxdp
// with a kernel peer, both ways round, and with both sides under vmaxdp,
// on the plain bed. Its server reads with recvmmsg and its software
// receive stamps (SO_TIMESTAMPING) and answers with sendmsg and
// IP_PKTINFO; its client opens a connected socket for each request and
// reads the transmit stamp of its request from the error queue. Each of
// three one-shot measurements (chronyd -Q) finds the two clocks, which
// are one, within 1 ms, and the kernel of a side under vmaxdp delivers
// none of the datagrams (each socket's stack opens at its first send,
// before the request leaves).
func TestRunChrony(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("chronyd"); err != nil {
		t.Skip("chronyd is not installed (make deps installs chrony)")
	}
	vmaxdp := tools(t)
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	for _, tc := range []struct {
		name                   string
		serverSide             testbed.Side
		serverUnder, clientRun bool
	}{
		{"server", testbed.B, true, false},
		{"client", testbed.A, false, true},
		{"both", testbed.B, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clientSide := testbed.A
			if tc.serverSide == testbed.A {
				clientSide = testbed.B
			}
			dir := t.TempDir()
			server := b.Addr(tc.serverSide).String()
			srvConf := writeConf(t, dir, "server.conf", "allow 198.18.0.0/15", "local stratum 8", "bindaddress "+server,
				"port 123", "cmdport 0", "pidfile "+filepath.Join(dir, "server.pid"))
			cliConf := writeConf(t, dir, "client.conf", "server "+server+" iburst minpoll -4 maxpoll -4", "port 0", "cmdport 0",
				"pidfile "+filepath.Join(dir, "client.pid"))
			argv := []string{"chronyd", "-d", "-x", "-u", "root", "-f", srvConf}
			if tc.serverUnder {
				argv = append([]string{vmaxdp, "run", "--"}, argv...)
			}
			srv := startOn(t, b, tc.serverSide, nil, argv...)
			if err := srv.waitFor("Running with root privileges"); err != nil {
				t.Fatalf("%v\n%s", err, srv.out.String())
			}
			if tc.serverUnder {
				srv.waitOffloaded(t)
			}
			srvBefore := testutil.UDPStat(t, b, tc.serverSide, "InDatagrams")
			cliBefore := testutil.UDPStat(t, b, clientSide, "InDatagrams")
			const runs = 3
			var offs []string
			for i := range runs {
				off, out, err := chronyQuery(b, clientSide, cliConf, tc.clientRun, vmaxdp)
				if err != nil {
					t.Fatalf("measurement %d: %v\n%s\nserver:\n%s", i, err, tail(out, 20), tail(srv.out.String(), 20))
				}
				offs = append(offs, fmt.Sprintf("%.1f us", off*1e6))
				if math.Abs(off) > 1e-3 {
					t.Errorf("measurement %d: clock off by %g s, want within 1 ms\n%s", i, off, tail(out, 20))
				}
				if tc.clientRun && !strings.Contains(out, "offloaded on "+b.Link(clientSide)) {
					t.Errorf("measurement %d: the client's socket was not offloaded:\n%s", i, tail(out, 20))
				}
			}
			srvMoved := testutil.UDPStat(t, b, tc.serverSide, "InDatagrams") - srvBefore
			cliMoved := testutil.UDPStat(t, b, clientSide, "InDatagrams") - cliBefore
			t.Logf("offsets %s; the server's kernel delivered %d datagrams, the client's %d", strings.Join(offs, ", "), srvMoved, cliMoved)
			if tc.serverUnder && srvMoved != 0 {
				t.Errorf("the server's kernel delivered %d UDP datagrams: not offloaded", srvMoved)
			}
			if tc.clientRun && cliMoved != 0 {
				t.Errorf("the client's kernel delivered %d UDP datagrams: not offloaded", cliMoved)
			}
			if tc.serverUnder {
				srv.wantSaid(t, "offloaded on "+b.Link(tc.serverSide))
			}
		})
	}
}

// writeConf writes lines to dir/name and returns its path.
func writeConf(t *testing.T, dir, name string, lines ...string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var reClockWrong = regexp.MustCompile(`System clock wrong by (-?[0-9.]+) seconds`)

// chronyQuery runs one measurement (chronyd -Q, which sets no clock) in
// side s, under vmaxdp when under is set, and returns the offset it found
// and what it printed.
func chronyQuery(b *testbed.Bed, s testbed.Side, conf string, under bool, vmaxdp string) (float64, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	argv := []string{"chronyd", "-Q", "-u", "root", "-f", conf}
	if under {
		argv = append([]string{vmaxdp, "run", "--"}, argv...)
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", b.NSName(s)}, argv...)...)
	cmd.Env = append(os.Environ(), "VMAXDP_TRACELEVEL=4")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, string(out), fmt.Errorf("chronyd -Q: %w", err)
	}
	m := reClockWrong.FindSubmatch(out)
	if m == nil {
		return 0, string(out), fmt.Errorf("chronyd -Q measured nothing")
	}
	off, err := strconv.ParseFloat(string(m[1]), 64)
	return off, string(out), err
}
