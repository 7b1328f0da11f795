package main

import (
	"bytes"
	"crypto/rand"
	"fmt"
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
				lost, total := iperfReport(t, srv.out.String, nil)
				if lost != 0 || total != sent-1 {
					t.Errorf("the receiver under vmaxdp: %d lost of %d, %d sent\n%s", lost, total, sent, tail(srv.out.String(), 20))
				}
				// iperf's server connects its socket to the sender at the
				// first datagram, and the socket's rules are set again
				// (UDPConn.Reopen): what comes in those milliseconds
				// reaches it through its kernel socket (2 to 22 datagrams
				// in six 1 s runs at 20 Mbit/s), and is read in order.
				if m := regexp.MustCompile(`(\d+) datagrams received out-of-order`).FindStringSubmatch(srv.out.String()); m != nil {
					t.Errorf("the receiver under vmaxdp: %s datagrams out of order\n%s", m[1], tail(srv.out.String(), 20))
				}
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
					kernA := testutil.NetCounters(t, b, testbed.A)
					log := &strings.Builder{}
					sent := iperfSend(t, b, testbed.B, log, group, port, size, vmaxdp, "run", "--")
					if !strings.Contains(log.String(), "fd 3: offloaded on "+b.Link(testbed.B)) {
						t.Fatalf("the sender's socket was not offloaded:\n%s", tail(log.String(), 20))
					}
					servers := []*iperfServer{remote}
					if member {
						servers = append(servers, local)
					}
					// Once a receiver never reported (make test, 1 run in
					// 4): where its datagrams went, for the next time.
					more := func() string {
						return fmt.Sprintf("\nside A's kernel: %s\nthe sender under vmaxdp:\n%s",
							testutil.CountersMoved(kernA, testutil.NetCounters(t, b, testbed.A), "Udp"), tail(log.String(), 15))
					}
					for _, s := range servers {
						if lost, total := iperfReport(t, s.out.String, more); lost != 0 || total != sent-1 {
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
	p := startOn(t, b, side, nil, "iperf", "-s", "-u", "-B", group, "-p", strconv.Itoa(port))
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
// returns its lost and total datagrams. Should none come, the failure
// says what more says (nil: nothing).
func iperfReport(t *testing.T, out func() string, more func() string) (lost, total int) {
	t.Helper()
	// The whole run's line starts at 0.0000 and counts lost/total.
	re := regexp.MustCompile(`0\.0000-\S+ sec .* (\d+)/(\d+) \(`)
	deadline := time.Now().Add(10 * time.Second)
	for re.FindStringSubmatch(out()) == nil {
		if time.Now().After(deadline) {
			var also string
			if more != nil {
				also = more()
			}
			t.Fatalf("the receiver never reported:\n%s%s", tail(out(), 20), also)
		}
		time.Sleep(20 * time.Millisecond)
	}
	m := re.FindStringSubmatch(out())
	lost, _ = strconv.Atoi(m[1])
	total, _ = strconv.Atoi(m[2])
	return lost, total
}

// TestRunUdpcast: Debian's udpcast moves a file from udp-sender to
// udp-receiver, with vmaxdp under the sender, the receiver or both and the
// kernel's stack on the other side, on both beds: multicast data
// (--nopointopoint) and, with both under vmaxdp, point-to-point. The file
// arrives intact, both programs exit (udp-sender cancels its return
// channel's thread, which waits in recvfrom: it hung in pthread_join
// under vmaxdp), and the offloaded side's kernel moves next to no UDP
// (its one broadcast socket stays there, with that reason).
func TestRunUdpcast(t *testing.T) {
	testutil.RequireRoot(t)
	for _, prog := range []string{"udp-sender", "udp-receiver"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("%s is not installed: make deps installs udpcast", prog)
		}
	}
	vmaxdp := tools(t)
	in := filepath.Join(t.TempDir(), "in")
	data := make([]byte, 4<<20)
	rand.Read(data)
	if err := os.WriteFile(in, data, 0o644); err != nil {
		t.Fatal(err)
	}
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		cases := []struct {
			name             string
			sender, receiver bool
			p2p              bool
		}{
			{"sender", true, false, false},
			{"receiver", false, true, false},
			{"both", true, true, false},
			{"both/pointopoint", true, true, true},
		}
		for i, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				port := 11310 + 2*i // udpcast takes port and port+1
				out := filepath.Join(t.TempDir(), "out")
				wrap := func(on bool, side testbed.Side, argv ...string) *exec.Cmd {
					full := []string{"timeout", "-s", "KILL", "30", "ip", "netns", "exec", b.NSName(side)}
					if on {
						full = append(full, vmaxdp, "run", "--")
					}
					cmd := exec.Command(full[0], append(full[1:], argv...)...)
					cmd.Env = append(os.Environ(), "VMAXDP_TRACELEVEL=4")
					return cmd
				}
				recvIn := udpInDatagrams(t, b, testbed.B)
				sendOut := testutil.UDPStat(t, b, testbed.A, "OutDatagrams")
				rcv := wrap(c.receiver, testbed.B, "udp-receiver", "--interface", b.Link(testbed.B), "--portbase", strconv.Itoa(port), "--file", out, "--nokbd")
				var rcvLog strings.Builder
				rcv.Stdout, rcv.Stderr = &rcvLog, &rcvLog
				if err := rcv.Start(); err != nil {
					t.Fatal(err)
				}
				args := []string{"udp-sender", "--interface", b.Link(testbed.A), "--portbase", strconv.Itoa(port), "--file", in, "--min-receivers", "1", "--nokbd"}
				if !c.p2p {
					args = append(args, "--nopointopoint")
				}
				snd := wrap(c.sender, testbed.A, args...)
				start := time.Now()
				sndLog, sndErr := snd.CombinedOutput()
				rcvErr := rcv.Wait()
				if sndErr != nil || rcvErr != nil {
					t.Fatalf("udp-sender: %v after %v\n%s\nudp-receiver: %v\n%s", sndErr, time.Since(start).Round(time.Millisecond),
						tail(strings.ReplaceAll(string(sndLog), "\r", "\n"), 15), rcvErr, tail(strings.ReplaceAll(rcvLog.String(), "\r", "\n"), 15))
				}
				got, err := os.ReadFile(out)
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("the file arrived altered or not at all (%d of %d bytes): %v", len(got), len(data), err)
				}
				for _, s := range []struct {
					on      bool
					log     string
					side    testbed.Side
					kernel  int
					counter string
				}{
					{c.sender, string(sndLog), testbed.A, testutil.UDPStat(t, b, testbed.A, "OutDatagrams") - sendOut, "OutDatagrams"},
					{c.receiver, rcvLog.String(), testbed.B, udpInDatagrams(t, b, testbed.B) - recvIn, "InDatagrams"},
				} {
					if !s.on {
						continue
					}
					if !strings.Contains(s.log, "offloaded on "+b.Link(s.side)) {
						t.Errorf("side %s: no socket offloaded:\n%s", s.side, tail(s.log, 20))
					}
					if s.kernel > 10 {
						t.Errorf("side %s's kernel: Udp %s moved by %d: not offloaded", s.side, s.counter, s.kernel)
					}
				}
			})
		}
	})
}
