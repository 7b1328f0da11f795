package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunJava: Java servers as they are usually written
// (testdata/java/Echo.java), a UDP echo on NIO (a DatagramChannel under a
// Selector) and a TCP one on java.net.ServerSocket with a thread a
// connection, under vmaxdp (VMAXDP_TCP=1) with kernel clients, both beds.
// With the JVM's defaults, where the namespace has IPv6 (the plain bed),
// they open AF_INET6 sockets that carry IPv4 as well, which vmaxdp leaves
// on the kernel: every echo comes back, and the log says why and what to
// do (it said nothing before, and nothing was offloaded). With
// -Djava.net.preferIPv4Stack=true, as the log advises, or without IPv6
// (the tuned bed), they open AF_INET sockets and are offloaded: every echo
// comes back, and side B's kernel takes no segment, and no datagram but
// the first one or two, which may come before the socket's stack is open.
func TestRunJava(t *testing.T) {
	testutil.RequireRoot(t)
	javac, err := exec.LookPath("javac")
	if err != nil {
		t.Skip("javac is not installed (make deps installs openjdk-17-jdk-headless)")
	}
	classes := t.TempDir()
	if out, err := exec.Command(javac, "-d", classes, "testdata/java/Echo.java").CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	vmaxdp := tools(t)
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		port := 11430
		for _, proto := range []string{"udp", "tcp"} {
			for _, ipv4 := range []bool{false, true} {
				port++
				name := proto + "/default"
				if ipv4 {
					name = proto + "/preferIPv4Stack"
				}
				t.Run(name, func(t *testing.T) {
					argv := []string{vmaxdp, "run", "--", "java"}
					if ipv4 {
						argv = append(argv, "-Djava.net.preferIPv4Stack=true")
					}
					argv = append(argv, "-cp", classes, "Echo", proto, b.Addr(testbed.B).String(), strconv.Itoa(port), "25")
					p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, argv...)
					if err := p.waitFor("ready\n"); err != nil {
						t.Fatalf("%v\n%s", err, p.out.String())
					}
					raddr := netip.AddrPortFrom(b.Addr(testbed.B), uint16(port)).String()
					kernel := func() int {
						if proto == "udp" {
							return testutil.UDPStat(t, b, testbed.B, "InDatagrams")
						}
						return testutil.SNMPStat(t, b, testbed.B, "Tcp", "InSegs")
					}
					before := kernel()
					err := b.Do(testbed.A, func() error {
						if proto == "udp" {
							return echoUDP(raddr, 500)
						}
						return echoTCP(raddr, 20, 20)
					})
					if err != nil {
						t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
					}
					moved := kernel() - before
					if ipv4 || !b.Plain {
						p.wantSaid(t, "offloaded on "+b.Link(testbed.B))
						if moved > 2 {
							t.Errorf("side B's kernel took %d of the echoes' packets: not offloaded", moved)
						}
						return
					}
					p.wantSaid(t, fmt.Sprintf("an IPv6 socket: %s offload serves AF_INET sockets, and this one carries IPv4 as well", map[string]string{"udp": "UDP", "tcp": "TCP"}[proto]),
						"-Djava.net.preferIPv4Stack=true")
					if moved == 0 {
						t.Errorf("side B's kernel took none of the echoes' packets: the log says they go through it")
					}
				})
			}
		}
	})
}

// echoUDP sends n datagrams to raddr, one after the other, each to be
// echoed within 2 s.
func echoUDP(raddr string, n int) error {
	c, err := net.Dial("udp4", raddr)
	if err != nil {
		return err
	}
	defer c.Close()
	got := make([]byte, 2048)
	for i := range n {
		msg := bytes.Repeat([]byte(fmt.Sprintf("datagram %d;", i)), 1+i%64)
		if _, err := c.Write(msg); err != nil {
			return fmt.Errorf("datagram %d: %w", i, err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		k, err := c.Read(got)
		if err != nil || !bytes.Equal(got[:k], msg) {
			return fmt.Errorf("datagram %d: echo %q, %v", i, got[:k], err)
		}
	}
	return nil
}

// echoTCP makes conns connections to raddr, one after the other, each
// sending rounds messages and reading each one's echo.
func echoTCP(raddr string, conns, rounds int) error {
	for i := range conns {
		c, err := net.DialTimeout("tcp4", raddr, 5*time.Second)
		if err != nil {
			return fmt.Errorf("connection %d: %w", i, err)
		}
		c.SetDeadline(time.Now().Add(5 * time.Second))
		for r := range rounds {
			msg := bytes.Repeat([]byte(fmt.Sprintf("connection %d message %d;", i, r)), 1+r*8)
			got := make([]byte, len(msg))
			if _, err := c.Write(msg); err != nil {
				c.Close()
				return fmt.Errorf("connection %d message %d: %w", i, r, err)
			}
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				c.Close()
				return fmt.Errorf("connection %d message %d: echo %q, %v", i, r, got, err)
			}
		}
		c.Close()
	}
	return nil
}
