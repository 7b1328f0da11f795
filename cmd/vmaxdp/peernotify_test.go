package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/peernotify"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// peerGone bounds how long a peer may wait to learn that a process
// under vmaxdp is gone; the kernel tells it at once.
const peerGone = 3 * time.Second

// waitEnd reads c until it ends and says how, or fails after peerGone.
func waitEnd(c net.Conn) error {
	c.SetReadDeadline(time.Now().Add(peerGone))
	_, err := io.Copy(io.Discard, c)
	switch {
	case err == nil:
		return nil // EOF: a FIN
	case errors.Is(err, syscall.ECONNRESET):
		return nil
	}
	return fmt.Errorf("the connection did not end within %v: %w", peerGone, err)
}

// TestRunTCPPeerNotify: a process under vmaxdp (VMAXDP_TCP=1) that ends
// without closing its offloaded connections (SIGKILL, _exit, an exec that
// drops them) leaves no kernel socket to close them, and a kernel peer
// blocked in a read waited for ever. The helper (vmaxdp notify-peers)
// now gets each peer a reset: every read below ends within 3 s, and the
// log names the connections. A clean exit (redis' SIGTERM) closes them
// itself, and the helper says nothing. redis-server as server, Python as
// client, kernel peers, on the plain bed (as `ip link add` makes it).
func TestRunTCPPeerNotify(t *testing.T) {
	b := pythonBed(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		t.Run("redis-"+sig.String(), func(t *testing.T) {
			const port = 11230
			p := startRedis(t, b, port, nil)
			raddr := netip.AddrPortFrom(b.Addr(testbed.B), port).String()
			var conns []net.Conn
			err := b.Do(testbed.A, func() error {
				for i := 0; i < 2; i++ {
					c, err := net.DialTimeout("tcp4", raddr, 5*time.Second)
					if err != nil {
						return err
					}
					t.Cleanup(func() { c.Close() })
					if err := redisPing(c, 5*time.Second); err != nil {
						return err
					}
					conns = append(conns, c)
				}
				// One blocked in the server too: BLPOP waits for a list.
				_, err := conns[1].Write([]byte("BLPOP vmaxdp-none 0\r\n"))
				return err
			})
			if err != nil {
				t.Fatalf("%v\n%s", err, tail(p.out.String(), 30))
			}
			p.wantSaid(t, "offloaded on "+b.Link(testbed.B)+" (tcp_server")
			time.Sleep(100 * time.Millisecond) // BLPOP reached the server
			if err := syscall.Kill(p.pid, sig); err != nil {
				t.Fatal(err)
			}
			for i, c := range conns {
				if err := waitEnd(c); err != nil {
					t.Errorf("client %d after %v: %v\n%s", i, sig, err, tail(p.out.String(), 20))
				}
			}
			p.exited()
			said := strings.Contains(p.out.String(), "offloaded TCP connection(s) open")
			if sig == syscall.SIGKILL && !said {
				t.Errorf("the helper did not say which peers it told:\n%s", tail(p.out.String(), 20))
			}
			if sig == syscall.SIGTERM && said {
				t.Errorf("redis closed its connections, but the helper told their peers:\n%s", tail(p.out.String(), 20))
			}
		})
	}
	// A server killed with connections it has not accepted yet: netstack
	// held them, with no rule of their own (the listener's rule brought
	// their segments), and the helper finds them by their SYNs.
	t.Run("python-unaccepted", func(t *testing.T) {
		const port, queued = 11233, 3
		script := `import socket, sys, time
s = socket.socket()
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(8)
sys.stdout.write("listening\n"); sys.stdout.flush()
time.sleep(30)
`
		p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, tools(t), "run", "--", "python3", "-c", script, b.Addr(testbed.B).String(), strconv.Itoa(port))
		if err := p.waitFor("offloaded on " + b.Link(testbed.B) + " (tcp_server"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		var conns []net.Conn
		err := b.Do(testbed.A, func() error {
			for range queued {
				c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(b.Addr(testbed.B), port).String(), 5*time.Second)
				if err != nil {
					return err
				}
				t.Cleanup(func() { c.Close() })
				if _, err := c.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
					return err
				}
				conns = append(conns, c)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 30))
		}
		time.Sleep(100 * time.Millisecond) // the requests reached netstack
		if err := syscall.Kill(p.pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for i, c := range conns {
			if err := waitEnd(c); err != nil {
				t.Errorf("connection %d, never accepted: %v\n%s", i, err, tail(p.out.String(), 20))
			}
		}
		p.exited()
		p.wantSaid(t, fmt.Sprintf("ended with %d offloaded TCP connection(s) open", queued))
	})
	// A client ends without closing its connection: _exit, or an exec
	// that closes it (Python's sockets are close-on-exec) while the
	// process lives on as another program.
	for _, how := range []string{"_exit", "exec"} {
		t.Run("python-"+strings.TrimPrefix(how, "_"), func(t *testing.T) {
			const port = 11231
			ln := listenTCPA(t, b, port)
			script := `import os, socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.sendall(b"hi")
s.recv(2)
sys.stdout.write("connected\n"); sys.stdout.flush()
if sys.argv[3] == "exec":
    os.execv("/bin/sleep", ["sleep", "6"])
os._exit(0)
`
			p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, tools(t), "run", "--", "python3", "-c", script,
				b.Addr(testbed.A).String(), strconv.Itoa(port), how)
			ln.(*net.TCPListener).SetDeadline(time.Now().Add(10 * time.Second))
			c, err := ln.Accept()
			if err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			defer c.Close()
			var hi [2]byte
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.ReadFull(c, hi[:]); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			if _, err := c.Write([]byte("ok")); err != nil {
				t.Fatal(err)
			}
			if err := p.waitFor("connected\n"); err != nil {
				t.Fatalf("%v\n%s", err, p.out.String())
			}
			if err := waitEnd(c); err != nil {
				t.Errorf("after %s: %v\n%s", how, err, p.out.String())
			}
			if how == "exec" && p.gone() != "" {
				t.Errorf("sleep ended before the peer learnt: the test proves nothing")
			}
			if err := p.waitFor("ended with 1 offloaded TCP connection(s) open"); err != nil {
				t.Errorf("the helper did not say which peer it told: %v\n%s", err, p.out.String())
			}
			p.wantSaid(t, "offloaded on "+b.Link(testbed.B)+" (tcp_client")
		})
	}
}

// TestExitLeavesDetachToHelper: a process with an open stack hands its
// helper a copy of the steering program's XDP link, so that its end does
// not wait for the kernel's detach (two RCU grace periods on a veth, 15-20
// ms that every such exit took before its parent saw it end). With the
// helper stopped, the program is still attached once the process is
// reaped; once the helper goes on, it detaches it and ends. A Python UDP
// receiver that exits on SIGTERM, on the plain bed. (A killed process's
// program stays pinned, and the pins go with the mount namespace, which
// the helper shares: only a clean exit, which unpins, ever took the
// detach.)
func TestExitLeavesDetachToHelper(t *testing.T) {
	b := pythonBed(t)
	script := `import signal, socket, sys, time
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 11240))
time.sleep(30)
`
	p := startArgv(t, b, nil, tools(t), "run", "--", "python3", "-c", script, b.Addr(testbed.B).String())
	if err := p.waitFor("offloaded on " + b.Link(testbed.B)); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	helper := helperOf(t, p.pid)
	if err := syscall.Kill(helper, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(helper, syscall.SIGCONT) })
	prog := testutil.XDPProgram(t, b, testbed.B)
	if err := syscall.Kill(p.pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Ended, reaped or not: the stopped helper holds the program's
	// stderr, where it reports, and the program's Wait waits for it.
	for deadline := time.Now().Add(5 * time.Second); !ended(p.pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the program did not end on SIGTERM\n%s", tail(p.out.String(), 20))
		}
	}
	if id := testutil.XDPProgram(t, b, testbed.B); id == 0 || id != prog {
		t.Errorf("with its helper stopped, the process's end detached its program (id %d; now %d): the exit took the detach", prog, id)
	}
	if err := syscall.Kill(helper, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if err := p.exited(); err != nil {
		t.Errorf("the program: %v\n%s", err, tail(p.out.String(), 20))
	}
	for deadline := time.Now().Add(5 * time.Second); testutil.XDPProgram(t, b, testbed.B) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the helper (pid %d) did not detach the program within 5 s", helper)
		}
	}
}

// ended says whether process pid has exited: reaped, or a zombie.
func ended(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// helperOf is the pid of the helper (vmaxdp notify-peers) of process pid.
func helperOf(t *testing.T, pid int) int {
	t.Helper()
	want := fmt.Sprintf("\x00%s\x00-pid\x00%d\x00", peernotify.Command, pid)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, d := range dirs {
			if cmd, err := os.ReadFile(d); err == nil && strings.Contains(string(cmd), want) {
				h, _ := strconv.Atoi(filepath.Base(filepath.Dir(d)))
				return h
			}
		}
	}
	t.Fatalf("no helper of process %d", pid)
	return 0
}
