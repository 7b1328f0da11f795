package main

import (
	"context"
	"errors"
	"net/netip"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/apps"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunBridged: vmaxdp in a container as docker's default network
// makes it (testbed.Options.Bridged): side B's veth is a port of a bridge
// in the host's namespace (Hub), beside side A's, and reaches Hub's own
// address, in another subnet, through the gateway on the bridge. Debian
// programs (dnsmasq under dnsperf, memcached's UDP protocol under
// memcaslap, redis-server under redis-benchmark with VMAXDP_TCP=1) run
// under vmaxdp in B, with kernel peers: a server with its client on A
// (a neighbour over the bridge) and on Hub (routed: its frames come from
// the gateway's MAC address, and the answers go back to it), and a client
// of a server on Hub; and a server on the host, on the bridge itself
// (generic XDP: a bridge has no native XDP), with its client on A: at the
// bridge's address, and for dnsmasq, bound to 0.0.0.0, at Hub's address
// on lo too, which its answers leave from (IP_PKTINFO: a source of
// another interface, which the kernel socket sends; they failed with
// EINVAL before, and every query went unanswered). Every
// request is answered, the log says the socket is offloaded, and the
// kernel of the offloaded side's namespace delivered (nearly) none of it.
// Last, iperf 2's multicast both ways over the bridge, as
// TestRunIperfMulticast has it over a veth.
var reTxOS = regexp.MustCompile(`Tx OS info: \d+ KB / (\d+) /`)

func TestRunBridged(t *testing.T) {
	testutil.RequireRoot(t)
	vmaxdp := tools(t)
	var list []*apps.App
	for _, name := range []string{"dnsmasq", "memcached", "redis"} {
		if a, ok := apps.ByName(name); ok {
			list = append(list, a)
		}
	}
	list = installed(t, list)
	b := testutil.Bed(t, &testbed.Options{Bridged: true})
	cases := []struct {
		name           string
		server, client testbed.Side
		offloaded      testbed.Side // the side under vmaxdp
		at             netip.Addr   // the server's address, if not its side's
		wildcard       bool         // only for a server bound to 0.0.0.0
	}{
		{"server/from-A", testbed.B, testbed.A, testbed.B, netip.Addr{}, false},
		{"server/from-Hub", testbed.B, testbed.Hub, testbed.B, netip.Addr{}, false},
		{"client/to-Hub", testbed.Hub, testbed.B, testbed.B, netip.Addr{}, false},
		{"host-server/from-A", testbed.Hub, testbed.A, testbed.Hub, testbed.Gateway, false},
		{"host-server-lo/from-A", testbed.Hub, testbed.A, testbed.Hub, b.Addr(testbed.Hub), true},
	}
	for _, a := range list {
		for _, c := range cases {
			if c.wildcard && a.Name != "dnsmasq" {
				continue
			}
			t.Run(a.Name+"/"+c.name, func(t *testing.T) {
				tcp := a.Proto == "tcp"
				kernel := func() int {
					if tcp {
						return testutil.SNMPStat(t, b, c.offloaded, "Tcp", "InSegs")
					}
					return testutil.UDPStat(t, b, c.offloaded, "InDatagrams")
				}
				before := kernel()
				sentBefore := testutil.UDPStat(t, b, c.offloaded, "OutDatagrams")
				run := &apps.Run{Bed: b, App: a, Vmaxdp: vmaxdp, ServerSide: c.server, ClientSide: c.client, ServerAddr: c.at,
					ServerOffload: c.server == c.offloaded, ClientOffload: c.client == c.offloaded,
					Duration: time.Second, Paced: !tcp, Env: []string{"VMAXDP_TCP=1", "VMAXDP_TRACELEVEL=4"}}
				res, srvLog, err := run.Do(context.Background())
				if errors.Is(err, apps.ErrNotInstalled) {
					t.Skip(err)
				}
				if err != nil {
					t.Fatalf("%v\nthe server's output and log:\n%s", err, tail(srvLog, 30))
				}
				moved := kernel() - before
				t.Logf("%.0f %s, sent %d, lost %d; the kernel took %d in the offloaded side's namespace", res.Rate, a.Unit, res.Sent, res.Lost, moved)
				if res.Rate == 0 || res.Lost != 0 {
					t.Fatalf("%.0f %s, %d of %d lost:\n%s", res.Rate, a.Unit, res.Lost, res.Sent, tail(res.Output, 20))
				}
				log := srvLog
				if run.ClientOffload {
					log = res.Output
				}
				if !strings.Contains(log, "offloaded on "+b.Link(c.offloaded)) {
					t.Errorf("the offloaded side's log says nothing of offload on %s:\n%s", b.Link(c.offloaded), tail(log, 30))
				}
				// As TestRunApps and TestRunTCPApps allow: a UDP socket
				// is the kernel's until its stack opens; a TCP side that
				// exits leaves its peer's last segments to its kernel.
				limit := int(res.Sent) / 10
				if tcp {
					limit = 2000
				}
				if moved > limit {
					t.Errorf("the kernel took %d of the %s run's packets in the offloaded side's namespace: not offloaded\n%s", moved, a.Name, tail(log, 30))
				}
				// Answers from lo's address leave through the kernel
				// socket, and the socket's counters say so (tx_os), as
				// many as the kernel sent.
				if c.wildcard {
					sent := testutil.UDPStat(t, b, c.offloaded, "OutDatagrams") - sentBefore
					var osTx int
					for _, m := range reTxOS.FindAllStringSubmatch(res.Reports, -1) {
						n, _ := strconv.Atoi(m[1])
						osTx += n
					}
					if osTx != sent || int64(sent) < res.Sent-res.Lost {
						t.Errorf("the kernel sent %d datagrams for %d answers; the sockets' counters say %d went through it\n%s", sent, res.Sent-res.Lost, osTx, res.Reports)
					}
				}
			})
		}
	}
	// Multicast over the bridge (IGMP snooping on, as the kernel makes a
	// bridge): iperf 2 receiving under vmaxdp from a sender on A, and
	// sending under vmaxdp to a receiver on A.
	if _, err := exec.LookPath("iperf"); err != nil {
		t.Log("multicast skipped: iperf (iperf 2) is not installed: make deps installs it")
		return
	}
	const group, port = "239.18.2.1", 11490
	t.Run("iperf-multicast/receiver", func(t *testing.T) {
		in := udpInDatagrams(t, b, testbed.B)
		srv := startArgv(t, b, nil, vmaxdp, "run", "--", "iperf", "-s", "-u", "-B", group, "-p", strconv.Itoa(port))
		if err := srv.waitFor("fd 3: offloaded on " + b.Link(testbed.B)); err != nil {
			t.Fatalf("%v\n%s", err, srv.out.String())
		}
		sent := iperfSend(t, b, testbed.A, nil, group, port, 200)
		if lost, total := iperfReport(t, srv.out.String, nil); lost != 0 || total != sent-1 {
			t.Errorf("the receiver under vmaxdp: %d lost of %d, %d sent\n%s", lost, total, sent, tail(srv.out.String(), 20))
		}
		if n := udpInDatagrams(t, b, testbed.B) - in; n > sent/20 {
			t.Errorf("side B's kernel delivered %d of %d datagrams: not offloaded", n, sent)
		}
	})
	t.Run("iperf-multicast/sender", func(t *testing.T) {
		remote := startIperfServer(t, b, testbed.A, group, port+1)
		out := testutil.UDPStat(t, b, testbed.B, "OutDatagrams")
		log := &strings.Builder{}
		sent := iperfSend(t, b, testbed.B, log, group, port+1, 200, vmaxdp, "run", "--")
		if !strings.Contains(log.String(), "fd 3: offloaded on "+b.Link(testbed.B)) {
			t.Fatalf("the sender's socket was not offloaded:\n%s", tail(log.String(), 20))
		}
		if lost, total := iperfReport(t, remote.out.String, nil); lost != 0 || total != sent-1 {
			t.Errorf("side A's kernel receiver: %d lost of %d, %d sent\n%s", lost, total, sent, tail(remote.out.String(), 10))
		}
		if n := testutil.UDPStat(t, b, testbed.B, "OutDatagrams") - out; n != 0 {
			t.Errorf("%d of %d datagrams left through side B's kernel", n, sent)
		}
	})
}
