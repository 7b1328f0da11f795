package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunSNMP: net-snmp's agent, snmpd, walked by snmpbulkwalk, as a
// network's management station walks its devices: request and response,
// one at a time, each a GETBULK of 10. snmpd binds its UDP socket with
// IP_PKTINFO and answers from its select loop; for the host's software
// table it runs dpkg-query through popen, whose children inherit the
// socket (snmpd does not set close-on-exec) and leave it to the parent.
// The agent, the walker or both under vmaxdp, the other on the kernel:
// the walk reaches the end of the agent's tree and returns the location
// the agent was given, an offloaded agent's kernel receives no request
// and an offloaded walker's kernel none of the responses but those
// before its stack opened.
func TestRunSNMP(t *testing.T) {
	testutil.RequireRoot(t)
	requirePrograms(t, "snmpd snmp", "snmpd", "snmpbulkwalk", "snmpget")
	vmaxdp := tools(t)
	testutil.EachBedParallel(t, nil, func(t *testing.T, b *testbed.Bed) {
		for _, tc := range []struct {
			name          string
			agent, walker bool
		}{
			{"agent", true, false},
			{"walker", false, true},
			{"both", true, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir := t.TempDir()
				conf := filepath.Join(dir, "snmpd.conf")
				if err := os.WriteFile(conf, []byte("rocommunity public 198.18.0.0/15\nsysLocation vmaxdp test bed\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				laddr := netip.AddrPortFrom(b.Addr(testbed.B), 161)
				agent := []string{"snmpd", "-f", "-Lo", "-C", "-c", conf, "-p", filepath.Join(dir, "pid"), "udp:" + laddr.String()}
				walk := []string{"snmpbulkwalk", "-v2c", "-c", "public", "-Cr10", "-On", laddr.Addr().String(), ".1"}
				get := []string{"snmpget", "-v2c", "-c", "public", "-On", laddr.Addr().String(), ".1.3.6.1.2.1.1.6.0"}
				if tc.agent {
					agent = append([]string{vmaxdp, "run", "--"}, agent...)
				}
				if tc.walker {
					walk = append([]string{vmaxdp, "run", "--"}, walk...)
					get = append([]string{vmaxdp, "run", "--"}, get...)
				}
				agentIn := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
				walkerIn := testutil.SNMPStat(t, b, testbed.A, "Udp", "InDatagrams")
				a := startReceiver(t, b, 60*time.Second, tc.agent, laddr, netip.Addr{}, agent...)
				start := time.Now()
				w := startFor(t, b, testbed.A, 30*time.Second, nil, walk...)
				if err := w.exited(); err != nil {
					t.Fatalf("snmpbulkwalk: %v\n%s\nsnmpd:\n%s", err, tail(w.out.String(), 15), tail(a.out.String(), 15))
				}
				took := time.Since(start)
				out := w.out.String()
				oids := strings.Count(out, "\n.1.")
				if !strings.Contains(out, "No more variables left in this MIB View") || oids < 1000 {
					t.Errorf("the walk stopped before the end of the agent's tree after %d objects\n%s", oids, tail(out, 15))
				}
				if !strings.Contains(out, `.1.3.6.1.2.1.1.6.0 = STRING: "vmaxdp test bed"`) {
					t.Errorf("the walk did not return the agent's sysLocation\n%s", tail(out, 15))
				}
				g := startFor(t, b, testbed.A, 30*time.Second, nil, get...)
				if err := g.exited(); err != nil || !strings.Contains(g.out.String(), `STRING: "vmaxdp test bed"`) {
					t.Errorf("snmpget of sysLocation: %v\n%s", err, tail(g.out.String(), 10))
				}
				kernelB := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - agentIn
				kernelA := testutil.SNMPStat(t, b, testbed.A, "Udp", "InDatagrams") - walkerIn
				t.Logf("%d objects in %v; side B's kernel received %d UDP datagrams, side A's %d", oids, took.Round(time.Millisecond), kernelB, kernelA)
				if tc.agent && kernelB != 0 {
					t.Errorf("side B's kernel received %d UDP datagrams: the agent's socket was not offloaded", kernelB)
				}
				if want := oids / 10; tc.walker && kernelA > want/2 {
					t.Errorf("side A's kernel received %d of about %d responses: the walker's socket was not offloaded", kernelA, want)
				}
				a.stop()
			})
		}
	})
}
