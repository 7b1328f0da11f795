package main

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunSyslogNG: syslog-ng, a log collector, receiving syslog over UDP
// from loggen, its own load generator, at 2,000 messages a second: the
// collector, the generator or both under vmaxdp, the other on the
// kernel. syslog-ng reads on its ivykis event loop (epoll) with threaded
// workers and asks for a 4 MB receive buffer; loggen connects its socket
// and sends from a thread of its own. Every message is written to the
// collector's file; an offloaded collector's kernel takes no datagram;
// an offloaded generator's kernel sends only the burst loggen opens with,
// before its stack has opened.
func TestRunSyslogNG(t *testing.T) {
	testutil.RequireRoot(t)
	requirePrograms(t, "syslog-ng-core", "syslog-ng", "loggen")
	vmaxdp := tools(t)
	const messages, rate, port = 6000, 2000, 5514
	testutil.EachBedParallel(t, nil, func(t *testing.T, b *testbed.Bed) {
		for _, tc := range []struct {
			name             string
			rxUnder, txUnder bool
		}{
			{"collector", true, false},
			{"generator", false, true},
			{"both", true, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dir := t.TempDir()
				srv := b.Addr(testbed.B).String()
				out := filepath.Join(dir, "messages.log")
				conf := filepath.Join(dir, "syslog-ng.conf")
				err := os.WriteFile(conf, []byte(fmt.Sprintf(`@version: current
options { threaded(yes); stats-freq(0); };
source s_net { network(ip("%s") port(%d) transport("udp") so-rcvbuf(4194304)); };
destination d_file { file("%s"); };
log { source(s_net); destination(d_file); };
`, srv, port, out)), 0o644)
				if err != nil {
					t.Fatal(err)
				}
				rx := []string{"syslog-ng", "-F", "--no-caps", "-f", conf, "-c", filepath.Join(dir, "ctl"), "-p", filepath.Join(dir, "pid"),
					"-R", filepath.Join(dir, "persist")}
				tx := []string{"loggen", "-D", "-r", strconv.Itoa(rate), "-n", strconv.Itoa(messages), "-s", "200", srv, strconv.Itoa(port)}
				if tc.rxUnder {
					rx = append([]string{vmaxdp, "run", "--"}, rx...)
				}
				if tc.txUnder {
					tx = append([]string{vmaxdp, "run", "--"}, tx...)
				}
				rxIn := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
				txOut := testutil.SNMPStat(t, b, testbed.A, "Udp", "OutDatagrams")
				r := startReceiver(t, b, 30*time.Second, tc.rxUnder, netip.AddrPortFrom(b.Addr(testbed.B), port), netip.Addr{}, rx...)
				s := startFor(t, b, testbed.A, 20*time.Second, nil, tx...)
				if err := s.exited(); err != nil {
					t.Fatalf("loggen: %v\n%s", err, tail(s.out.String(), 20))
				}
				logged := 0
				for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
					data, _ := os.ReadFile(out)
					if logged = bytes.Count(data, []byte("\n")); logged >= messages {
						break
					}
				}
				in := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - rxIn
				sent := testutil.SNMPStat(t, b, testbed.A, "Udp", "OutDatagrams") - txOut
				t.Logf("%d of %d messages logged; side B's kernel received %d, side A's sent %d", logged, messages, in, sent)
				if logged != messages {
					t.Errorf("syslog-ng logged %d of %d messages\n%s", logged, messages, tail(r.out.String(), 20))
				}
				if tc.rxUnder && in != 0 {
					t.Errorf("side B's kernel received %d UDP datagrams: the collector's socket was offloaded before the first", in)
				}
				if tc.txUnder {
					s.wantSaid(t, "offloaded on "+b.Link(testbed.A)+" (udp_connect")
					if sent > messages/2 {
						t.Errorf("side A's kernel sent %d of %d messages: loggen's sends were not offloaded", sent, messages)
					}
				}
			})
		}
	})
}
