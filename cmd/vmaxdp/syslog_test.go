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
//
// Then a burst (loggen -r 10000, 20,000 messages, which it sends at about
// 13,000 a second in bursts) to a kernel collector and to one under
// vmaxdp: the one under vmaxdp logs at least as many. While a socket
// held at most the queue's 2,048 frames, it logged 13,059-15,745 against
// the kernel's 17,084-20,000; while the progress engine looked only every
// 10 ms, 18,302-20,000: the rest dropped at the queue's RX ring while
// syslog-ng's reader was busy with its workers.
func TestRunSyslogNG(t *testing.T) {
	testutil.RequireRoot(t)
	requirePrograms(t, "syslog-ng-core", "syslog-ng", "loggen")
	vmaxdp := tools(t)
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
				const messages = 6000
				r := runSyslogNG(t, b, vmaxdp, tc.rxUnder, tc.txUnder, messages, 2000)
				if r.logged != messages {
					t.Errorf("syslog-ng logged %d of %d messages\n%s", r.logged, messages, tail(r.collector.out.String(), 20))
				}
				if tc.rxUnder && r.kernelIn != 0 {
					t.Errorf("side B's kernel received %d UDP datagrams: the collector's socket was offloaded before the first", r.kernelIn)
				}
				if tc.txUnder {
					r.generator.wantSaid(t, "offloaded on "+b.Link(testbed.A)+" (udp_connect")
					if r.kernelOut > messages/2 {
						t.Errorf("side A's kernel sent %d of %d messages: loggen's sends were not offloaded", r.kernelOut, messages)
					}
				}
			})
		}
		t.Run("burst", func(t *testing.T) {
			const messages = 20000
			k := runSyslogNG(t, b, vmaxdp, false, false, messages, 10000)
			v := runSyslogNG(t, b, vmaxdp, true, false, messages, 10000)
			t.Logf("of a burst of %d messages the kernel's collector logged %d, vmaxdp's %d", messages, k.logged, v.logged)
			if v.logged < k.logged {
				t.Errorf("under vmaxdp syslog-ng logged %d of %d messages, on the kernel %d\n%s", v.logged, messages, k.logged, tail(v.collector.out.String(), 20))
			}
			if v.kernelIn != 0 {
				t.Errorf("side B's kernel received %d UDP datagrams under vmaxdp", v.kernelIn)
			}
		})
	})
}

// syslogRun is what one run of syslog-ng and loggen did.
type syslogRun struct {
	collector, generator *cProgram
	logged               int // lines in the collector's file
	kernelIn, kernelOut  int // side B's Udp InDatagrams and side A's OutDatagrams meanwhile
}

// runSyslogNG runs a syslog-ng collector on side B and loggen on side A,
// which sends messages of 200 bytes at loggen's rate, and waits until the
// collector has logged them all or its file stops growing.
func runSyslogNG(t *testing.T, b *testbed.Bed, vmaxdp string, rxUnder, txUnder bool, messages, rate int) syslogRun {
	t.Helper()
	const port = 5514
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
	if rxUnder {
		rx = append([]string{vmaxdp, "run", "--"}, rx...)
	}
	if txUnder {
		tx = append([]string{vmaxdp, "run", "--"}, tx...)
	}
	rxIn := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
	txOut := testutil.SNMPStat(t, b, testbed.A, "Udp", "OutDatagrams")
	var run syslogRun
	run.collector = startReceiver(t, b, 30*time.Second, rxUnder, netip.AddrPortFrom(b.Addr(testbed.B), port), netip.Addr{}, rx...)
	run.generator = startFor(t, b, testbed.A, 20*time.Second, nil, tx...)
	if err := run.generator.exited(); err != nil {
		t.Fatalf("loggen: %v\n%s", err, tail(run.generator.out.String(), 20))
	}
	grew := time.Now()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && time.Since(grew) < time.Second; time.Sleep(50 * time.Millisecond) {
		data, _ := os.ReadFile(out)
		n := bytes.Count(data, []byte("\n"))
		if n >= messages {
			run.logged = n
			break
		}
		if n > run.logged {
			run.logged, grew = n, time.Now()
		}
	}
	run.kernelIn = testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - rxIn
	run.kernelOut = testutil.SNMPStat(t, b, testbed.A, "Udp", "OutDatagrams") - txOut
	t.Logf("%d of %d messages logged; side B's kernel received %d, side A's sent %d", run.logged, messages, run.kernelIn, run.kernelOut)
	run.collector.stop()
	return run
}
