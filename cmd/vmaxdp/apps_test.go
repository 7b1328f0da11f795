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

// TestRunApps: unmodified programs from Debian that were not written with
// vmaxdp in mind (knot, unbound, dnsmasq and nsd driven by dnsperf, iperf3
// with 64 and 1400 B datagrams, memcached's UDP protocol driven by
// memcaslap), with vmaxdp under the server, the client and both, against
// the kernel on the other side, on a plain bed (as `ip link add` makes it)
// and on a tuned one. Every run must lose nothing (the load is paced where
// the generator can be, so that the kernel loses nothing either); an
// offloaded side must say so in its log and the kernel must have delivered
// (nearly) nothing in its namespace, so a silent fall-back fails; nsd,
// which forks its servers after opening its sockets, must be served by
// the kernel and say why.
func TestRunApps(t *testing.T) {
	testutil.RequireRoot(t)
	vmaxdp := tools(t)
	var list []*apps.App
	for _, a := range apps.All {
		if miss := a.Missing(); miss != "" {
			t.Logf("%s skipped: not installed: %s", a.Name, miss)
			continue
		}
		list = append(list, a)
	}
	if len(list) == 0 {
		t.Skip("none of the applications is installed (make deps installs them)")
	}
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		for _, a := range list {
			for _, p := range placements[1:] {
				t.Run(a.Name+"/"+p.name, func(t *testing.T) { runApp(t, vmaxdp, b, a, p) })
			}
		}
	})
}

func runApp(t *testing.T, vmaxdp string, b *testbed.Bed, a *apps.App, p placement) {
	before := [2]int{udpInDatagrams(t, b, testbed.A), udpInDatagrams(t, b, testbed.B)}
	run := &apps.Run{Bed: b, App: a, Vmaxdp: vmaxdp, ServerOffload: p.server, ClientOffload: p.client,
		Duration: time.Second, Paced: true, Env: []string{"VMAXDP_TRACELEVEL=4"}}
	res, srvLog, err := run.Do(context.Background())
	if errors.Is(err, apps.ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	kernel := [2]int{udpInDatagrams(t, b, testbed.A) - before[0], udpInDatagrams(t, b, testbed.B) - before[1]}
	t.Logf("%.0f %s, sent %d, lost %d; the kernel delivered %d datagrams on the client's side, %d on the server's", res.Rate, a.Unit, res.Sent, res.Lost, kernel[0], kernel[1])
	if res.Sent == 0 || res.Rate == 0 {
		t.Fatalf("no load went through:\n%s", res.Output)
	}
	if res.Lost != 0 {
		t.Errorf("%d of %d lost", res.Lost, res.Sent)
	}
	// The client's side receives the answers, the server's the requests
	// (iperf3: the datagrams; its control connection is TCP).
	if p.server {
		switch {
		case a.Forks:
			if !strings.Contains(srvLog, "shared with a child process after fork") {
				t.Errorf("%s forks after opening its sockets: the log must say why they stay on the kernel:\n%s", a.Name, tail(srvLog, 30))
			}
		case !strings.Contains(srvLog, "offloaded on "+b.Link(testbed.B)):
			t.Errorf("the server's log says nothing of offload:\n%s", tail(srvLog, 30))
		case kernel[1] > int(res.Sent)/10:
			// A socket is served by the kernel until its stack has
			// opened (tens of milliseconds, more while the client opens
			// its own): iperf3 opens its UDP socket once the test
			// begins. A silent fall-back would be all of them.
			t.Errorf("the kernel delivered %d datagrams in the server's namespace for %d sent: not offloaded", kernel[1], res.Sent)
		}
	}
	if p.client {
		if !strings.Contains(res.Output, "offloaded on "+b.Link(testbed.A)) {
			t.Errorf("the client's log says nothing of offload:\n%s", tail(res.Output, 30))
		}
		// The client's socket is decided at its first send.
		if !a.OneWay && kernel[0] > int(res.Sent)/10 {
			t.Errorf("the kernel delivered %d datagrams in the client's namespace for %d sent: not offloaded", kernel[0], res.Sent)
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
