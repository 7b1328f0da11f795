package main

import (
	"context"
	"errors"
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
// of a server on Hub. Every request is answered, the log says the socket
// is offloaded, and side B's kernel delivered (nearly) none of it.
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
	}{
		{"server/from-A", testbed.B, testbed.A},
		{"server/from-Hub", testbed.B, testbed.Hub},
		{"client/to-Hub", testbed.Hub, testbed.B},
	}
	for _, a := range list {
		for _, c := range cases {
			t.Run(a.Name+"/"+c.name, func(t *testing.T) {
				tcp := a.Proto == "tcp"
				kernel := func() int {
					if tcp {
						return testutil.SNMPStat(t, b, testbed.B, "Tcp", "InSegs")
					}
					return testutil.UDPStat(t, b, testbed.B, "InDatagrams")
				}
				before := kernel()
				run := &apps.Run{Bed: b, App: a, Vmaxdp: vmaxdp, ServerSide: c.server, ClientSide: c.client,
					ServerOffload: c.server == testbed.B, ClientOffload: c.client == testbed.B,
					Duration: time.Second, Paced: !tcp, Env: []string{"VMAXDP_TCP=1", "VMAXDP_TRACELEVEL=4"}}
				res, srvLog, err := run.Do(context.Background())
				if errors.Is(err, apps.ErrNotInstalled) {
					t.Skip(err)
				}
				if err != nil {
					t.Fatalf("%v\nthe server's output and log:\n%s", err, tail(srvLog, 30))
				}
				moved := kernel() - before
				t.Logf("%.0f %s, sent %d, lost %d; side B's kernel took %d", res.Rate, a.Unit, res.Sent, res.Lost, moved)
				if res.Rate == 0 || res.Lost != 0 {
					t.Fatalf("%.0f %s, %d of %d lost:\n%s", res.Rate, a.Unit, res.Lost, res.Sent, tail(res.Output, 20))
				}
				log := srvLog
				if run.ClientOffload {
					log = res.Output
				}
				if !strings.Contains(log, "offloaded on "+b.Link(testbed.B)) {
					t.Errorf("side B's log says nothing of offload:\n%s", tail(log, 30))
				}
				// As TestRunApps and TestRunTCPApps allow: a UDP socket
				// is the kernel's until its stack opens; a TCP side that
				// exits leaves its peer's last segments to its kernel.
				limit := int(res.Sent) / 10
				if tcp {
					limit = 2000
				}
				if moved > limit {
					t.Errorf("side B's kernel took %d of the %s run's packets: not offloaded\n%s", moved, a.Name, tail(log, 30))
				}
			})
		}
	}
}
