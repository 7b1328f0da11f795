package main

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunInherited: programs that start with their sockets made for
// them, by systemd's socket activation (systemd-socket-activate, as
// systemd starts a service on its first connection or datagram), on a
// plain bed with kernel clients.
//   - lighttpd (Debian's, socket activation on): its inherited listener is
//     offloaded. The connection that started it, waiting in the kernel's
//     accept queue as the rule came, is the kernel's to its end (its
//     request is sent after the program started); the later ones are
//     netstack's, and the kernel's PassiveOpens counts the first one only.
//     Before, the listener stayed on the kernel without a word.
//   - a Python UDP echo on a socket-activated socket: offloaded, every
//     datagram echoed, and side B's kernel delivered at most the one that
//     started it. Before, the socket stayed on the kernel without a word.
//   - a Python program that makes a UDP socket, turns IP_PKTINFO on, binds
//     it and execs a program under vmaxdp that serves it with recvmsg,
//     with LISTEN_PID and LISTEN_FDS set as systemd sets them: the
//     offloaded socket's datagrams carry IP_PKTINFO, read back off the
//     kernel socket as the socket is taken on. Without them (a socket a
//     fork and exec left open, which the parent may serve too) it stays
//     the kernel's, and the log says why.
func TestRunInherited(t *testing.T) {
	b := pythonBed(t)
	activate, err := exec.LookPath("systemd-socket-activate")
	if err != nil {
		t.Skip("systemd-socket-activate is not installed (Debian's systemd)")
	}
	t.Run("lighttpd", func(t *testing.T) {
		lighttpd, err := exec.LookPath("lighttpd")
		if err != nil {
			t.Skip("lighttpd is not installed (make deps installs it)")
		}
		const port, requests = 11241, 20
		const page = "served by lighttpd under vmaxdp\n"
		dir := t.TempDir()
		conf := filepath.Join(dir, "lighttpd.conf")
		if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(conf, []byte(fmt.Sprintf(`server.document-root = %q
server.bind = %q
server.port = %d
server.systemd-socket-activation = "enable"
server.errorlog = %q
`, dir, b.Addr(testbed.B), port, filepath.Join(dir, "error.log"))), 0o644); err != nil {
			t.Fatal(err)
		}
		laddr := netip.AddrPortFrom(b.Addr(testbed.B), port).String()
		opens := testutil.SNMPStat(t, b, testbed.B, "Tcp", "PassiveOpens")
		// systemd-socket-activate passes on only the environment -E names.
		p := startArgv(t, b, nil, activate, "-E", "VMAXDP_TCP=1", "-E", "VMAXDP_TRACELEVEL=4", "-l", laddr, tools(t), "run", "--", lighttpd, "-D", "-f", conf)
		if err := p.waitFor("Listening on"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		get := func(c net.Conn) error {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(c, "GET /index.html HTTP/1.0\r\n\r\n"); err != nil {
				return err
			}
			reply, err := io.ReadAll(c)
			if err != nil || !strings.HasPrefix(string(reply), "HTTP/1.0 200") || !strings.HasSuffix(string(reply), page) {
				return fmt.Errorf("reply %q, %v", reply, err)
			}
			return nil
		}
		err = b.Do(testbed.A, func() error {
			first, err := net.DialTimeout("tcp4", laddr, 2*time.Second)
			if err != nil {
				return err
			}
			defer first.Close()
			if err := p.waitFor("fd 3: offloaded on"); err != nil {
				return err
			}
			if err := get(first); err != nil {
				return fmt.Errorf("the connection that started the program: %w", err)
			}
			for i := range requests {
				c, err := net.DialTimeout("tcp4", laddr, 2*time.Second)
				if err != nil {
					return fmt.Errorf("connection %d: %w", i, err)
				}
				err = get(c)
				c.Close()
				if err != nil {
					return fmt.Errorf("connection %d: %w", i, err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
		if n := testutil.SNMPStat(t, b, testbed.B, "Tcp", "PassiveOpens") - opens; n != 1 {
			t.Errorf("the kernel accepted %d connections, want 1 (the one that started the program; the %d after it offloaded)", n, requests)
		}
		p.wantSaid(t, "fd 3: TCP listener "+laddr+" from socket activation")
	})
	// echo sends datagrams to laddr from side A and checks that each
	// comes back as want makes it.
	echo := func(t *testing.T, p *cProgram, laddr string, want func(msg string) string) {
		t.Helper()
		err := b.Do(testbed.A, func() error {
			c, err := net.Dial("udp4", laddr)
			if err != nil {
				return err
			}
			defer c.Close()
			buf := make([]byte, 128)
			for i := range 10 {
				msg := fmt.Sprintf("datagram %d", i)
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.WriteString(c, msg); err != nil {
					return err
				}
				n, err := c.Read(buf)
				if err != nil || string(buf[:n]) != want(msg) {
					return fmt.Errorf("%s: echo %q, %v; want %q", msg, buf[:n], err, want(msg))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
	}
	t.Run("udp", func(t *testing.T) {
		const port = 11242
		laddr := netip.AddrPortFrom(b.Addr(testbed.B), port).String()
		script := `import socket
s = socket.socket(fileno=3)
while True:
    d, a = s.recvfrom(2048)
    s.sendto(d, a)
`
		p := startArgv(t, b, nil, activate, "-E", "VMAXDP_TRACELEVEL=4", "--datagram", "-l", laddr, tools(t), "run", "--", "python3", "-c", script)
		if err := p.waitFor("Listening on"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		in := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
		echo(t, p, laddr, func(msg string) string { return msg })
		if n := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - in; n > 1 {
			t.Errorf("side B's kernel delivered %d of the 10 datagrams, want at most the one that started the program", n)
		}
		p.wantSaid(t, "fd 3: UDP socket "+laddr+" from socket activation", "fd 3: offloaded on "+b.Link(testbed.B))
	})
	// A program that makes the socket and execs the server, as systemd
	// does (LISTEN_PID, LISTEN_FDS), and then as a fork and exec leaves
	// a parent's socket open, which stays on the kernel.
	for _, activated := range []bool{true, false} {
		name := "udp-exec"
		if !activated {
			name += "-not-activated"
		}
		t.Run(name, func(t *testing.T) {
			port := 11243
			if !activated {
				port++
			}
			laddr := netip.AddrPortFrom(b.Addr(testbed.B), uint16(port)).String()
			serve := `import socket, sys
s = socket.socket(fileno=3)
sys.stdout.write("serving\n"); sys.stdout.flush()
while True:
    d, anc, _, a = s.recvmsg(2048, 256)
    s.sendto(d + b" pktinfo %d" % sum(1 for l, t, _ in anc if (l, t) == (0, 8)), a)
`
			parent := `import os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IP, 8, 1)  # IP_PKTINFO
s.bind((sys.argv[1], int(sys.argv[2])))
if s.fileno() != 3:
    os.dup2(s.fileno(), 3)
os.set_inheritable(3, True)
if sys.argv[5] == "activated":
    os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS="1")
os.execv(sys.argv[3], [sys.argv[3], "run", "--", "python3", "-c", sys.argv[4]])
`
			how := "activated"
			if !activated {
				how = "left open"
			}
			p := startArgv(t, b, nil, "python3", "-c", parent, b.Addr(testbed.B).String(), fmt.Sprint(port), tools(t), serve, how)
			// The stack opens after the socket is taken on, as after a bind.
			want := "fd 3: offloaded on " + b.Link(testbed.B)
			if !activated {
				want = "fd 3: not offloaded: inherited UDP socket " + laddr + ": the process started with it, not from socket activation"
			}
			if err := p.waitFor(want); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			if err := p.waitFor("serving\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			in := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
			echo(t, p, laddr, func(msg string) string { return msg + " pktinfo 1" })
			n := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - in
			if activated && n > 0 {
				t.Errorf("side B's kernel delivered %d of the 10 datagrams: not offloaded", n)
			}
			if !activated && n < 10 {
				t.Errorf("side B's kernel delivered %d of the 10 datagrams, want all: the socket is the kernel's", n)
			}
		})
	}
}
