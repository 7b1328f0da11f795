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
//   - a Python UDP echo on an inherited socket: the socket stays on the
//     kernel, the log says why, and every datagram is echoed.
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
		p.wantSaid(t, "fd 3: inherited TCP listener "+laddr)
	})
	t.Run("udp", func(t *testing.T) {
		const port, datagrams = 11242, 10
		laddr := netip.AddrPortFrom(b.Addr(testbed.B), port).String()
		echo := `import socket
s = socket.socket(fileno=3)
while True:
    d, a = s.recvfrom(2048)
    s.sendto(d, a)
`
		p := startArgv(t, b, nil, activate, "--datagram", "-l", laddr, tools(t), "run", "--", "python3", "-c", echo)
		if err := p.waitFor("Listening on"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		err := b.Do(testbed.A, func() error {
			c, err := net.Dial("udp4", laddr)
			if err != nil {
				return err
			}
			defer c.Close()
			buf := make([]byte, 64)
			for i := range datagrams {
				msg := fmt.Sprintf("datagram %d", i)
				c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.WriteString(c, msg); err != nil {
					return err
				}
				n, err := c.Read(buf)
				if err != nil || string(buf[:n]) != msg {
					return fmt.Errorf("%s: echo %q, %v", msg, buf[:n], err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
		p.wantSaid(t, "fd 3: not offloaded: inherited UDP socket "+laddr+": the process started with it")
	})
}
