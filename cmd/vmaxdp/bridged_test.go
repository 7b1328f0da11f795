package main

import (
	"context"
	"errors"
	"net/netip"
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
}
