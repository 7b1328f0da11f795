package peernotify_test

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/peernotify"
	"github.com/vmaxdp/vmaxdp/internal/sockperf"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/testbed"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// inProcess returns a Notifier whose helper is Serve on a goroutine of
// the test, logging to log (which the test reads while it writes), and
// where Serve's result comes.
func inProcess(log *sockperf.SyncBuffer) (*peernotify.Notifier, chan error) {
	served := make(chan error, 1)
	spawn := func(path string, argv []string, fd int) (int, error) {
		helper, err := unix.Dup(fd)
		if err != nil {
			return 0, err
		}
		go func() { served <- peernotify.Serve(helper, os.Getpid(), log) }()
		return os.Getpid(), nil
	}
	return peernotify.New("/proc/self/exe", spawn), served
}

// TestServe runs the helper's whole path in one process, with no stack:
// a kernel connection from side A to side B whose B end vanishes without
// a word (closed in TCP_REPAIR mode, as a netstack connection vanishes
// with its process), and a steering rule for it on B that an AF_XDP
// socket no longer serves. Once the Notifier's socket ends, Serve
// releases the rule and sends A a SYN; A's challenge ACK reaches B's
// kernel, which resets the connection, and A's blocked read ends.
func TestServe(t *testing.T) {
	b := testutil.Bed(t, &testbed.Options{Plain: true})
	const port = 11240
	var (
		ln     net.Listener
		client net.Conn
	)
	if err := b.Do(testbed.B, func() (err error) {
		ln, err = net.Listen("tcp4", netip.AddrPortFrom(b.Addr(testbed.B), port).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := b.Do(testbed.A, func() (err error) {
		client, err = net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	rc, err := server.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	rc.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_REPAIR, 1) })
	if err != nil {
		t.Fatalf("TCP_REPAIR: %v", err)
	}
	server.Close() // silently: repair mode sends nothing

	var log sockperf.SyncBuffer
	n, served := inProcess(&log)
	err = b.Do(testbed.B, func() error {
		p, err := steer.Attach(b.Link(testbed.B), nil)
		if err != nil {
			return err
		}
		t.Cleanup(func() { p.Close() })
		local := client.RemoteAddr().(*net.TCPAddr).AddrPort()
		remote := client.LocalAddr().(*net.TCPAddr).AddrPort()
		if _, err := p.AddRule(steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_TCP, Local: local, Remote: remote}); err != nil {
			return err
		}
		return n.Watch(b.Link(testbed.B), p.ConnMap(), p.SYNMap())
	})
	if err != nil {
		t.Fatal(err)
	}
	n.Close()
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the process's end of its socket closed")
	}
	client.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.Copy(io.Discard, client); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("A's read: %v, want ECONNRESET", err)
	}
	if !strings.Contains(log.String(), "ended with 1 offloaded TCP connection(s) open") {
		t.Errorf("the helper's log: %q", log.String())
	}
}

// TestWatchWithoutHelper: no executable, no helper, said once.
func TestWatchWithoutHelper(t *testing.T) {
	n := peernotify.New("", nil)
	if err := n.Watch("eth0", nil, nil); !errors.Is(err, peernotify.ErrNoHelper) {
		t.Errorf("Watch: %v, want ErrNoHelper", err)
	}
}

// pipeEOF says whether r's writers are all closed, within d.
func pipeEOF(r int, d time.Duration) bool {
	pfd := []unix.PollFd{{Fd: int32(r), Events: unix.POLLIN}}
	if k, err := unix.Poll(pfd, int(d.Milliseconds())); err != nil || k == 0 {
		return false
	}
	var b [1]byte
	k, err := unix.Read(r, b[:])
	return k == 0 && err == nil
}

// TestHold: the helper holds a copy of each fd Hold hands it (a pipe's
// write end here, whose reader sees EOF only once every copy is closed).
// A release returns once the helper has closed its copy; at the process's
// end the helper kicks what it still holds (no AF_XDP socket here, which
// it says) and closes it.
func TestHold(t *testing.T) {
	log := heldCopies(t, (*peernotify.Notifier).Hold, "test/q0", "test/q1")
	if want := "0 datagram(s) on test/q1's TX ring that could not be sent: XDP_MMAP_OFFSETS: socket operation on non-socket"; !strings.Contains(log, want) {
		t.Errorf("helper's log:\n%s\nwant %q", log, want)
	}
}

// TestHoldLink: the helper holds a copy of each XDP link HoldLink hands
// it as Hold's sockets, and closes the one it holds when the process ends
// (its kernel then detaches the program), without treating it as a queue
// to kick.
func TestHoldLink(t *testing.T) {
	if log := heldCopies(t, (*peernotify.Notifier).HoldLink, "test0", "test1"); log != "" {
		t.Errorf("helper's log:\n%s\nwant nothing: a link is no queue", log)
	}
}

// heldCopies hands an in-process helper, with hold, the write ends of two
// pipes named released and held. It checks that the helper holds a copy
// of each, gives released's back on its release, and closes held's once
// the process's end is told, and returns the helper's log.
func heldCopies(t *testing.T, hold func(n *peernotify.Notifier, name string, fd int) (func(), error), released, held string) string {
	t.Helper()
	var log sockperf.SyncBuffer
	n, served := inProcess(&log)
	var rel, keep [2]int
	for _, p := range []*[2]int{&rel, &keep} {
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(p[0])
	}
	release, err := hold(n, released, rel[1])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold(n, held, keep[1]); err != nil {
		t.Fatal(err)
	}
	unix.Close(rel[1])
	unix.Close(keep[1])
	if pipeEOF(rel[0], 100*time.Millisecond) {
		t.Fatalf("%s's writer closed before its release: the helper holds no copy", released)
	}
	release()
	if !pipeEOF(rel[0], 0) {
		t.Errorf("%s's writer still open after its release returned", released)
	}
	if pipeEOF(keep[0], 100*time.Millisecond) {
		t.Fatalf("%s's writer closed while the process runs", held)
	}
	n.Close()
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	if !pipeEOF(keep[0], time.Second) {
		t.Errorf("%s's writer still open after the helper ended", held)
	}
	return log.String()
}
