package main

import (
	"net/netip"
	"os/exec"
	"strconv"
	"testing"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunNode: Node.js programs as they are usually written
// (testdata/node/echo.js), on libuv's event loop, under vmaxdp
// (VMAXDP_TCP=1) with kernel peers on side A, on the plain bed:
//   - udp4, udp6 (a dual-stack socket on ::) and tcp echo servers: every
//     echo comes back, and side B's kernel takes no segment, and no
//     datagram but the first one or two, which may come before the
//     socket's stack is open;
//   - cluster: two workers that share the primary's socket, passed to
//     them (SCM_RIGHTS): the kernel serves it, and says why;
//   - client: a dgram client of a kernel echo server: every echo comes
//     back, through the stack.
func TestRunNode(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not installed (make deps installs nodejs)")
	}
	vmaxdp := tools(t)
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	const script = "testdata/node/echo.js"
	port := 11480
	for _, kind := range []string{"udp4", "udp6", "tcp"} {
		port++
		t.Run(kind, func(t *testing.T) {
			addr := b.Addr(testbed.B).String()
			if kind == "udp6" {
				addr = "::"
			}
			p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, vmaxdp, "run", "--", "node", script, kind, addr, strconv.Itoa(port), "20")
			if err := p.waitFor("ready\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			raddr := netip.AddrPortFrom(b.Addr(testbed.B), uint16(port)).String()
			kernel := func() int {
				if kind == "tcp" {
					return testutil.SNMPStat(t, b, testbed.B, "Tcp", "InSegs")
				}
				return testutil.UDPStat(t, b, testbed.B, "InDatagrams")
			}
			before := kernel()
			err := b.Do(testbed.A, func() error {
				if kind == "tcp" {
					return echoTCP("tcp4", raddr, 20, 20)
				}
				return echoUDP("udp4", raddr, 500)
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
			}
			p.wantSaid(t, "offloaded on "+b.Link(testbed.B))
			if moved := kernel() - before; moved > 2 {
				t.Errorf("side B's kernel took %d of the echoes' packets: not offloaded", moved)
			}
		})
	}
	t.Run("cluster", func(t *testing.T) {
		port++
		p := startArgv(t, b, nil, vmaxdp, "run", "--", "node", script, "cluster", b.Addr(testbed.B).String(), strconv.Itoa(port), "20", "2")
		// Each worker's; the log may write between them (a worker's stack
		// cleaning the program a killed subtest left).
		if err := p.waitForN("ready\n", 2); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		err := b.Do(testbed.A, func() error {
			return echoUDP("udp4", netip.AddrPortFrom(b.Addr(testbed.B), uint16(port)).String(), 200)
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
		p.wantSaid(t, "passed to another process (SCM_RIGHTS)")
	})
	t.Run("client", func(t *testing.T) {
		port++
		const count = 1000
		var stop func()
		if err := b.Do(testbed.A, func() (err error) {
			stop, err = kernelEcho("udp", netip.AddrPortFrom(b.Addr(testbed.A), uint16(port)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		before := testutil.UDPStat(t, b, testbed.B, "InDatagrams")
		p := startArgv(t, b, nil, vmaxdp, "run", "--", "node", script, "client", b.Addr(testbed.A).String(), strconv.Itoa(port), strconv.Itoa(count))
		if err := p.exited(); err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
		p.wantSaid(t, "echoed "+strconv.Itoa(count)+"\n", "offloaded on "+b.Link(testbed.B))
		if moved := testutil.UDPStat(t, b, testbed.B, "InDatagrams") - before; moved > 2 {
			t.Errorf("side B's kernel took %d of the %d echoes: not offloaded", moved, count)
		}
	})
}
