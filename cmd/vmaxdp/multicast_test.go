package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/sockperf"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunIperfMulticast: iperf 2 (Debian's `iperf`, not written with
// vmaxdp in mind) sends and receives multicast, vmaxdp under one side and
// the kernel's stack on the other, both ways round, 64 and 1400 bytes.
//   - receiver under vmaxdp: every datagram arrives, and none through side
//     B's kernel;
//   - sender under vmaxdp, no member of the group on its host: every
//     datagram reaches side A, and none leaves through side B's kernel
//     (IP_MULTICAST_LOOP is on, as by default, and no one here needs the
//     kernel's loopback copy);
//   - the same with a kernel receiver of the group beside the sender: that
//     receiver gets every datagram too, through the kernel, and the log
//     says why.
func TestRunIperfMulticast(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("iperf"); err != nil {
		t.Skip("iperf (iperf 2) is not installed: make deps installs it")
	}
	vmaxdp := tools(t)
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		port := 11300
		for _, size := range []int{64, 1400} {
			group := fmt.Sprintf("239.18.1.%d", size%250)
			t.Run(fmt.Sprintf("%dB/receiver", size), func(t *testing.T) {
				port++
				in := udpInDatagrams(t, b, testbed.B)
				srv := startArgv(t, b, nil, vmaxdp, "run", "--", "iperf", "-s", "-u", "-B", group, "-p", strconv.Itoa(port))
				if err := srv.waitFor("fd 3: offloaded on " + b.Link(testbed.B)); err != nil {
					t.Fatalf("%v\n%s", err, srv.out.String())
				}
				sent := iperfSend(t, b, testbed.A, nil, group, port, size)
				lost, total := iperfReport(t, srv.out.String)
				if lost != 0 || total != sent-1 {
					t.Errorf("the receiver under vmaxdp: %d lost of %d, %d sent\n%s", lost, total, sent, tail(srv.out.String(), 20))
				}
				// iperf's server connects its socket to the sender at the
				// first datagram, and the socket's rules are set again
				// (UDPConn.Reopen): what comes in those milliseconds
				// reaches it through its kernel socket (2-22 of 1,876 or
				// 40,962 by hand).
				if n := udpInDatagrams(t, b, testbed.B) - in; n > sent/20 {
					t.Errorf("side B's kernel delivered %d of %d datagrams: not offloaded", n, sent)
				}
			})
			for _, member := range []bool{false, true} {
				name := fmt.Sprintf("%dB/sender", size)
				if member {
					name += "/member-here"
				}
				t.Run(name, func(t *testing.T) {
					port++
					remote := startIperfServer(t, b, testbed.A, group, port)
					var local *iperfServer
					if member {
						local = startIperfServer(t, b, testbed.B, group, port)
					}
					out := testutil.UDPStat(t, b, testbed.B, "OutDatagrams")
					log := &strings.Builder{}
					sent := iperfSend(t, b, testbed.B, log, group, port, size, vmaxdp, "run", "--")
					if !strings.Contains(log.String(), "fd 3: offloaded on "+b.Link(testbed.B)) {
						t.Fatalf("the sender's socket was not offloaded:\n%s", tail(log.String(), 20))
					}
					servers := []*iperfServer{remote}
					if member {
						servers = append(servers, local)
					}
					for _, s := range servers {
						if lost, total := iperfReport(t, s.out.String); lost != 0 || total != sent-1 {
							t.Errorf("%s's kernel receiver: %d lost of %d, %d sent\n%s", s.side, lost, total, sent, tail(s.out.String(), 10))
						}
					}
					kernel := testutil.UDPStat(t, b, testbed.B, "OutDatagrams") - out
					said := strings.Contains(log.String(), "multicast to "+group+" goes through the kernel while a socket of this host is a member")
					switch {
					case !member && kernel != 0:
						t.Errorf("no member on side B: %d of %d datagrams left through side B's kernel", kernel, sent)
					case member && kernel != sent-1:
						t.Errorf("a member on side B: %d of %d datagrams left through side B's kernel, which gives the member its copy", kernel, sent)
					case member != said:
						t.Errorf("a member on side B %v, the log says why %v:\n%s", member, said, tail(log.String(), 20))
					}
				})
			}
		}
	})
}

// iperfServer is a kernel iperf 2 receiver of a multicast group.
type iperfServer struct {
	side testbed.Side
	*cProgram
}

// startIperfServer starts a kernel iperf 2 receiver of group on side.
func startIperfServer(t *testing.T, b *testbed.Bed, side testbed.Side, group string, port int) *iperfServer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", b.NSName(side), "iperf", "-s", "-u", "-B", group, "-p", strconv.Itoa(port))
	p := &cProgram{out: &sockperf.SyncBuffer{}, done: make(chan error, 1)}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() { cancel(); <-p.done })
	if err := p.waitFor("Joining multicast group"); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	return &iperfServer{side: side, cProgram: p}
}

// iperfSend sends to group:port from side for 1 s, 2,000 datagrams a
// second, with iperf 2 (after the words of wrap, such as vmaxdp run --),
// its output
// also into log when not nil; it returns what iperf says it sent, which
// counts one more than the datagrams it sends (and its receiver counts).
func iperfSend(t *testing.T, b *testbed.Bed, side testbed.Side, log *strings.Builder, group string, port, size int, wrap ...string) int {
	t.Helper()
	argv := append([]string{"timeout", "20", "ip", "netns", "exec", b.NSName(side)}, wrap...)
	argv = append(argv, "iperf", "-c", group, "-p", strconv.Itoa(port), "-u", "-b", "2000pps", "-l", strconv.Itoa(size), "-t", "1", "-T", "1")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(cmd.Environ(), "VMAXDP_TRACELEVEL=4")
	out, err := cmd.CombinedOutput()
	if log != nil {
		log.Write(out)
	}
	m := regexp.MustCompile(`Sent (\d+) datagrams`).FindSubmatch(out)
	if err != nil || m == nil {
		t.Fatalf("iperf -c %s: %v\n%s", group, err, tail(string(out), 20))
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// iperfReport waits for an iperf 2 receiver's report of the whole run and
// returns its lost and total datagrams.
func iperfReport(t *testing.T, out func() string) (lost, total int) {
	t.Helper()
	// The whole run's line starts at 0.0000 and counts lost/total.
	re := regexp.MustCompile(`0\.0000-\S+ sec .* (\d+)/(\d+) \(`)
	deadline := time.Now().Add(10 * time.Second)
	for re.FindStringSubmatch(out()) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("the receiver never reported:\n%s", tail(out(), 20))
		}
		time.Sleep(20 * time.Millisecond)
	}
	m := re.FindStringSubmatch(out())
	lost, _ = strconv.Atoi(m[1])
	total, _ = strconv.Atoi(m[2])
	return lost, total
}
