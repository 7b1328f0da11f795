package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunJava: Java servers as they are usually written
// (testdata/java/Echo.java), a UDP echo on NIO (a DatagramChannel under a
// Selector) and a TCP one on java.net.ServerSocket with a thread a
// connection, under vmaxdp (VMAXDP_TCP=1) with kernel clients, both beds.
// With the JVM's defaults, where the namespace has IPv6 (the plain bed),
// they open AF_INET6 sockets that carry IPv4 as well: both are offloaded
// as AF_INET ones would be (they stayed on the kernel before, and nothing
// said so). With -Djava.net.preferIPv4Stack=true, or without IPv6 (the
// tuned bed), the JVM opens AF_INET sockets. Either way every echo comes
// back, and side B's kernel takes no segment, and no datagram but the
// first one or two, which may come before the socket's stack is open.
// A multicast receiver (a DatagramChannel that binds and joins at once)
// gets every datagram of its group through the stack once it is open.
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
							return echoUDP("udp4", raddr, 500)
						}
						return echoTCP("tcp4", raddr, 20, 20)
					})
					if err != nil {
						t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
					}
					moved := kernel() - before
					p.wantSaid(t, "offloaded on "+b.Link(testbed.B))
					if moved > 2 {
						t.Errorf("side B's kernel took %d of the echoes' packets: not offloaded", moved)
					}
				})
			}
		}
		// A multicast receiver that binds and joins at once, the first
		// socket of its interface: its group is steered once its stack is
		// open (it went through the kernel for good before), and every
		// datagram after that comes through the stack.
		for _, ipv4 := range []bool{false, true} {
			port++
			name := "mcast/default"
			if ipv4 {
				name = "mcast/preferIPv4Stack"
			}
			t.Run(name, func(t *testing.T) {
				const n = 500
				group := netip.MustParseAddr("239.18.0.31")
				argv := []string{vmaxdp, "run", "--", "java"}
				if ipv4 {
					argv = append(argv, "-Djava.net.preferIPv4Stack=true")
				}
				argv = append(argv, "-cp", classes, "Echo", "mcast", group.String(), strconv.Itoa(port), "20", b.Link(testbed.B), strconv.Itoa(n))
				p := startArgv(t, b, nil, argv...)
				// What comes while the stack opens goes through the kernel
				// socket, and is received all the same.
				if err := p.waitFor("group " + group.String() + " offloaded"); err != nil {
					t.Fatalf("%v\n%s", err, p.out.String())
				}
				before := testutil.UDPStat(t, b, testbed.B, "InDatagrams")
				err := b.Do(testbed.A, func() error {
					c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(group, uint16(port))))
					if err != nil {
						return err
					}
					defer c.Close()
					for range n {
						if _, err := c.Write(make([]byte, 100)); err != nil {
							return err
						}
						time.Sleep(200 * time.Microsecond) // within the receiver's rings
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := p.exited(); err != nil {
					t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
				}
				p.wantSaid(t, fmt.Sprintf("received %d", n))
				if moved := testutil.UDPStat(t, b, testbed.B, "InDatagrams") - before; moved > 2 {
					t.Errorf("side B's kernel took %d of the group's %d datagrams: not offloaded", moved, n)
				}
			})
		}
	})
}

// echoUDP sends n datagrams to raddr over network ("udp4", "udp6"), one
// after the other, each to be echoed within 2 s.
func echoUDP(network, raddr string, n int) error {
	c, err := net.Dial(network, raddr)
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

// echoTCP makes conns connections to raddr over network ("tcp4",
// "tcp6"), one after the other, each sending rounds messages and reading
// each one's echo.
func echoTCP(network, raddr string, conns, rounds int) error {
	for i := range conns {
		c, err := net.DialTimeout(network, raddr, 5*time.Second)
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

// TestRunDualStack: a Python echo server on one AF_INET6 socket that
// carries IPv4 as well (testdata/dualstack.py: IPV6_V6ONLY off, bound to
// ::), UDP and TCP (VMAXDP_TCP=1), under vmaxdp; kernel clients on side A
// over IPv4 and over IPv6 (link-local), on the plain bed (the tuned one
// has no IPv6). Its IPv4 is offloaded: every echo comes back, and side B's
// kernel takes no TCP segment, and no datagram but the first one or two,
// which may come before the socket's stack is open. recvfrom and accept
// give the source IPv4-mapped, and an accepted connection is an AF_INET6
// socket with mapped names, as the kernel's are. Its IPv6 is the kernel's:
// every echo comes back, and the source has its scope, the interface's
// index, as the kernel gives it. A member of an IPv4 group on such a
// socket gets the group's datagrams through the stack.
func TestRunDualStack(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	waitDAD(t, b)
	var ll netip.Addr
	var index int
	err := b.Do(testbed.B, func() error {
		ifc, err := net.InterfaceByName(b.Link(testbed.B))
		if err != nil {
			return err
		}
		index = ifc.Index
		addrs, err := ifc.Addrs()
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().IsLinkLocalUnicast() {
				ll = p.Addr()
			}
		}
		return nil
	})
	if err != nil || !ll.IsValid() {
		t.Fatalf("side B's link-local address: %v (found %v)", err, ll)
	}
	for i, proto := range []string{"udp", "tcp"} {
		t.Run(proto, func(t *testing.T) {
			port := 11440 + i
			p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, tools(t), "run", "--", "python3", "testdata/dualstack.py", proto, strconv.Itoa(port), "25")
			if err := p.waitFor("ready\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			kernel := func() int {
				if proto == "udp" {
					return testutil.UDPStat(t, b, testbed.B, "InDatagrams")
				}
				return testutil.SNMPStat(t, b, testbed.B, "Tcp", "InSegs")
			}
			v4, v6 := netip.AddrPortFrom(b.Addr(testbed.B), uint16(port)).String(), netip.AddrPortFrom(ll.WithZone(b.Link(testbed.A)), uint16(port)).String()
			const n = 200
			before := kernel()
			err := b.Do(testbed.A, func() error {
				if proto == "udp" {
					return echoUDP("udp4", v4, n)
				}
				return echoTCP("tcp4", v4, n/10, 10)
			})
			if err != nil {
				t.Fatalf("over IPv4: %v\n%s", err, tail(p.out.String(), 20))
			}
			if moved := kernel() - before; moved > 2 || proto == "tcp" && moved != 0 {
				t.Errorf("side B's kernel took %d of the IPv4 packets: not offloaded", moved)
			}
			err = b.Do(testbed.A, func() error {
				if proto == "udp" {
					return echoUDP("udp6", v6, n)
				}
				return echoTCP("tcp6", v6, n/10, 10)
			})
			if err != nil {
				t.Fatalf("over IPv6: %v\n%s", err, tail(p.out.String(), 20))
			}
			mapped := fmt.Sprintf("from mapped ('::ffff:%s', ", b.Addr(testbed.A))
			if proto == "tcp" {
				// family 10 and SO_DOMAIN 10: AF_INET6.
				mapped = fmt.Sprintf(", 0, 0) 10 10 ('::ffff:%s', %d, 0, 0) ('::ffff:%s', ", b.Addr(testbed.B), port, b.Addr(testbed.A))
			}
			// The output comes through a pipe, which a goroutine copies.
			p.waitFor(fmt.Sprintf(", 0, %d)", index))
			p.wantSaid(t, "offloaded on "+b.Link(testbed.B), mapped, "from ipv6 ('fe80::", fmt.Sprintf(", 0, %d)", index))
		})
	}
	// A member of an IPv4 group on the same kind of socket
	// (IP_ADD_MEMBERSHIP, as a dual-stack socket may): every datagram
	// sent to the group from side A comes, with its source mapped, and
	// side B's kernel delivers none of them.
	t.Run("group", func(t *testing.T) {
		const port, n = 11445, 200
		group := netip.MustParseAddr("239.1.2.45")
		p := startArgv(t, b, nil, tools(t), "run", "--", "python3", "testdata/dualstack.py", "group", group.String(), b.Addr(testbed.B).String(),
			strconv.Itoa(port), strconv.Itoa(n), "20")
		if err := p.waitFor("ready\n"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		p.waitOffloaded(t)
		before := testutil.UDPStat(t, b, testbed.B, "InDatagrams")
		err := b.Do(testbed.A, func() error {
			c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(testbed.A), 0)))
			if err != nil {
				return err
			}
			defer c.Close()
			raw, err := c.SyscallConn()
			if err != nil {
				return err
			}
			var serr error
			if err := raw.Control(func(fd uintptr) {
				serr = unix.SetsockoptInet4Addr(int(fd), unix.IPPROTO_IP, unix.IP_MULTICAST_IF, b.Addr(testbed.A).As4())
			}); err != nil {
				return err
			}
			if serr != nil {
				return serr
			}
			for i := range n {
				if _, err := c.WriteToUDPAddrPort([]byte(fmt.Sprint(i)), netip.AddrPortFrom(group, port)); err != nil {
					return err
				}
				if i%50 == 49 {
					time.Sleep(time.Millisecond) // integrity, not rate
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.waitFor(fmt.Sprintf("got %d of %d from ::ffff:%s\n", n, n, b.Addr(testbed.A))); err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
		if moved := testutil.UDPStat(t, b, testbed.B, "InDatagrams") - before; moved != 0 {
			t.Errorf("side B's kernel delivered %d of the group's datagrams: not offloaded", moved)
		}
		p.wantSaid(t, "group "+group.String()+" offloaded")
	})
	// Python's ForkingTCPServer on the same kind of socket: the
	// connection accepted and not used yet goes to a kernel socket for the
	// child (TCP_REPAIR), an AF_INET6 one with mapped names as the
	// kernel's accept made it (it was AF_INET before).
	t.Run("forking", func(t *testing.T) {
		const port = 11444
		p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, tools(t), "run", "--", "python3", "testdata/dualstack.py", "forking", strconv.Itoa(port), "25")
		if err := p.waitFor("ready\n"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		var answer string
		err := b.Do(testbed.A, func() error {
			c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(b.Addr(testbed.B), port).String(), 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write([]byte("hello\n")); err != nil {
				return err
			}
			got, err := io.ReadAll(c)
			answer = string(got)
			return err
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
		if want := fmt.Sprintf("hello ('::ffff:%s', ", b.Addr(testbed.A)); !strings.HasPrefix(answer, want) {
			t.Errorf("the child answered %q, want it to begin %q (its getpeername as the kernel's)", answer, want)
		}
		p.wantSaid(t, "handed to a kernel socket before fork (TCP_REPAIR)")
	})
	// A client's unbound AF_INET6 socket, sending to or connecting to a
	// mapped address of side A's kernel echo server, offloaded: the UDP
	// one is bound by vmaxdp to :: (bound as AF_INET before, which failed,
	// and left on the kernel); the TCP one connects through netstack, an
	// AF_INET6 socket with mapped names (left on the kernel before).
	// Side B knows side A's address first: the datagrams a client sends
	// while the kernel resolves it go through the kernel socket.
	if err := testutil.Resolve(b, testbed.B); err != nil {
		t.Fatal(err)
	}
	for i, proto := range []string{"udp", "tcp"} {
		t.Run(proto+"-client", func(t *testing.T) {
			port, n := 11442+i, 200
			raddr := netip.AddrPortFrom(b.Addr(testbed.A), uint16(port))
			var stop func()
			err := b.Do(testbed.A, func() error {
				var err error
				stop, err = kernelEcho(proto, raddr)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			out := func() int {
				if proto == "udp" {
					return testutil.UDPStat(t, b, testbed.B, "OutDatagrams")
				}
				return testutil.SNMPStat(t, b, testbed.B, "Tcp", "OutSegs")
			}
			before := out()
			p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, tools(t), "run", "--", "python3", "testdata/dualstack.py", "client", proto, b.Addr(testbed.A).String(), strconv.Itoa(port), strconv.Itoa(n))
			if err := p.exited(); err != nil {
				t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
			}
			p.wantSaid(t, "offloaded on "+b.Link(testbed.B), fmt.Sprintf("echoed %d of %d", n, n))
			if proto == "tcp" {
				p.wantSaid(t, fmt.Sprintf("connected 10 10 ::ffff:%s ('::ffff:%s', %d, 0, 0)", b.Addr(testbed.B), b.Addr(testbed.A), port))
			}
			if moved := out() - before; moved != 0 {
				t.Errorf("side B's kernel sent %d packets of the client's: not offloaded", moved)
			}
		})
	}
}

// udp6In reads Udp6InDatagrams of /proc/net/snmp6 in side s's namespace.
func udp6In(t *testing.T, b *testbed.Bed, s testbed.Side) int {
	t.Helper()
	n := -1
	err := b.Do(s, func() error {
		data, err := os.ReadFile("/proc/thread-self/net/snmp6")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == "Udp6InDatagrams" {
				n, err = strconv.Atoi(f[1])
				return err
			}
		}
		return fmt.Errorf("no Udp6InDatagrams in snmp6")
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitDAD waits up to 5 s for both sides' link-local addresses to be
// usable: a new interface's stays tentative for duplicate address
// detection, a second or so, and a socket cannot use it until then.
func waitDAD(t *testing.T, b *testbed.Bed) {
	t.Helper()
	for _, side := range []testbed.Side{testbed.A, testbed.B} {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			var out []byte
			err := b.Do(side, func() (err error) {
				out, err = exec.Command("ip", "-6", "addr", "show", "dev", b.Link(side), "scope", "link").Output()
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(out, []byte("inet6")) && !bytes.Contains(out, []byte("tentative")) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's link-local address still tentative after 5 s:\n%s", b.Link(side), out)
			}
		}
	}
}

// kernelEcho serves an echo on the kernel's socket at addr, over proto
// ("udp", "tcp"), in the calling thread's namespace, until stop.
func kernelEcho(proto string, addr netip.AddrPort) (stop func(), err error) {
	if proto == "udp" {
		c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		if err != nil {
			return nil, err
		}
		go func() {
			buf := make([]byte, 2048)
			for {
				k, from, err := c.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				c.WriteToUDPAddrPort(buf[:k], from)
			}
		}()
		return func() { c.Close() }, nil
	}
	l, err := net.Listen("tcp4", addr.String())
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return func() { l.Close() }, nil
}
