package engine

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/bench"
	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/internal/snapshot"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// newEngine brings up a bed and an engine, closed with the test.
func newEngine(tb testing.TB) (*testbed.Bed, *Engine) {
	tb.Helper()
	return testutil.Bed(tb, nil), engineFor(tb)
}

// engineFor starts an engine, closed with the test; set, when given,
// changes its parameters first.
func engineFor(tb testing.TB, set ...func(*params.Params)) *Engine {
	tb.Helper()
	p := params.Defaults()
	p.RxPoll = -1 // spin: the benchmarks measure the path, not a sleep
	p.SelectPoll = 0
	p.StatsDir = tb.TempDir()
	p.StatsFile = filepath.Join(p.StatsDir, "close.txt")
	for _, f := range set {
		f(p)
	}
	e, err := New(&Options{Params: p, Program: "engine.test", Stderr: io.Discard})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.CloseStacks() })
	return e
}

// socketB opens a UDP socket in side B's namespace and records it with e,
// as the preload library would; it is closed with the test.
func socketB(tb testing.TB, bed *testbed.Bed, e *Engine, nonblock bool) int {
	tb.Helper()
	typ := unix.SOCK_DGRAM | unix.SOCK_CLOEXEC
	if nonblock {
		typ |= unix.SOCK_NONBLOCK
	}
	var fd int
	err := bed.Do(testbed.B, func() (err error) {
		fd, err = unix.Socket(unix.AF_INET, typ, 0)
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	e.Socket(fd, nonblock)
	tb.Cleanup(func() {
		e.Close(fd)
		unix.Close(fd)
	})
	return fd
}

// settled is fd's state once the stacks being opened are open: the first
// socket on an interface is offloaded when its stack is (stackOrWait).
func settled(e *Engine, fd int) State {
	e.WaitOpens()
	return e.State(fd)
}

// offloaded brings up a bed and an engine with one UDP socket on side B
// bound to port and offloaded, as the preload library would: socket, the
// kernel's bind, then Bind.
func offloaded(tb testing.TB, port int, nonblock bool) (*testbed.Bed, *Engine, int) {
	tb.Helper()
	bed, e := newEngine(tb)
	fd := socketB(tb, bed, e, nonblock)
	testutil.SkipIfNotSupported(tb, bindB(bed, e, fd, port))
	if st := settled(e, fd); st != StateOffloaded {
		tb.Fatalf("Bind: state %d, reason %q", st, e.Reason(fd))
	}
	return bed, e, fd
}

// bindB binds fd to side B's address and port: the kernel's bind, then
// the engine's, as the preload library calls them.
func bindB(bed *testbed.Bed, e *Engine, fd, port int) error {
	return bed.Do(testbed.B, func() error {
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: bed.Addr(testbed.B).As4(), Port: port}); err != nil {
			return err
		}
		e.Bind(fd)
		return nil
	})
}

// bindWhileOpening binds fd, the first socket on its interface, which
// stays a candidate while its stack opens; a test of that window skips
// when the stack opened within Bind.
func bindWhileOpening(t *testing.T, bed *testbed.Bed, e *Engine, fd, port int) {
	t.Helper()
	if err := bindB(bed, e, fd, port); err != nil {
		t.Fatal(err)
	}
	if e.State(fd) != StateCandidate {
		t.Skipf("the stack opened within Bind (state %d): no window to test", e.State(fd))
	}
}

// TestCloseStacksDetaches: CloseStacks closes every stack, a UDP one as
// well as a TCP one: its steering program leaves the interface and its
// lock file goes. (Shutdown, which it calls first, used to forget the
// stacks without TCP, which then stayed attached.)
func TestCloseStacksDetaches(t *testing.T) {
	bed, e, _ := offloaded(t, 9401, false)
	st := e.openStacks()
	if len(st) != 1 {
		t.Fatalf("%d stacks open, want 1", len(st))
	}
	dir := st[0].Program().PinDir()
	if err := e.CloseStacks(); err != nil {
		t.Fatal(err)
	}
	if id := testutil.XDPProgram(t, bed, testbed.B); id != 0 {
		t.Fatalf("program id %d still attached to %s after CloseStacks", id, bed.Link(testbed.B))
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("pins left in %s after CloseStacks: %v", dir, err)
	}
	if _, err := os.Stat(filepath.Join("/run/vmaxdp", filepath.Base(dir)+".lock")); !os.IsNotExist(err) {
		t.Errorf("lock file left after CloseStacks: %v", err)
	}
}

func TestRecvAndDupClose(t *testing.T) {
	bed, e, fd := offloaded(t, 9400, false)
	if err := testutil.SendUDP(bed, 9400, 3, 64); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	for i := range 2 {
		if n, _, from, errno := e.Recv(fd, buf, 0, time.Time{}, nil, nil); errno != 0 || n != 64 || from.Addr() != bed.Addr(testbed.A) {
			t.Fatalf("datagram %d: %d bytes from %s, errno %v", i, n, from, errno)
		}
	}
	// dup, then close the original: the socket moves to the duplicate.
	dup, err := unix.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dup)
	if st := e.Dup(fd, dup); st != StateOffloaded {
		t.Fatalf("Dup: state %d", st)
	}
	e.Close(fd)
	if c := e.Conn(dup); c == nil || c.FD() != dup {
		t.Fatalf("after closing fd %d, its dup %d is not served on itself (conn %v)", fd, dup, c)
	}
	if n, _, _, errno := e.Recv(dup, buf, 0, time.Time{}, nil, nil); errno != 0 || n != 64 {
		t.Fatalf("third datagram on the dup: %d bytes, errno %v", n, errno)
	}
	if got := e.Conn(dup).Counters.RxOffloadPackets.Load(); got != 3 {
		t.Errorf("RxOffloadPackets after the move = %d, want 3: the socket's counters go with it", got)
	}
	e.Close(dup)
	if e.Conn(dup) != nil {
		t.Error("closing the last fd left the socket attached")
	}
}

// epollOf makes an epoll fd with fd in it for input, in the kernel and in
// the engine, as the preload library does, and the event it added.
func epollOf(tb testing.TB, e *Engine, fd int) (int, unix.EpollEvent) {
	tb.Helper()
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Close(epfd) })
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		tb.Fatal(err)
	}
	if e.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev) != StateEpoll {
		tb.Fatal("epoll set not the engine's")
	}
	return epfd, ev
}

// The benchmarks measure the engine's side of each call the preload
// library hands it (the C-to-Go crossing is not included); allocs/op must
// stay 0. They run on a real bed as root.

func BenchmarkRecvEmptyNonblocking(b *testing.B) {
	_, e, fd := offloaded(b, 9401, true)
	buf := make([]byte, 2048)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, _, errno := e.Recv(fd, buf, 0, time.Time{}, nil, nil); errno != unix.EAGAIN {
			b.Fatal(errno)
		}
	}
}

func BenchmarkPollEmpty(b *testing.B) {
	_, e, fd := offloaded(b, 9402, true)
	pfds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	b.ReportAllocs()
	for b.Loop() {
		if n, errno := e.Poll(MuxPoll, pfds, 0, nil, nil); n != 0 || errno != 0 {
			b.Fatal(n, errno)
		}
	}
}

func BenchmarkEpollWaitEmpty(b *testing.B) {
	_, e, fd := offloaded(b, 9403, true)
	epfd, _ := epollOf(b, e, fd)
	out := make([]unix.EpollEvent, 8)
	b.ReportAllocs()
	for b.Loop() {
		if n, errno := e.EpollWait(epfd, out, 0, nil, nil); n != 0 || errno != 0 {
			b.Fatal(n, errno)
		}
	}
}

// BenchmarkEpollWaitEmpty16 is an empty look of an event loop with 16
// offloaded sockets in its set, as memcaslap's 16 concurrent requests
// keep: each look polls the stack once and reads every member.
func BenchmarkEpollWaitEmpty16(b *testing.B) {
	bed, e, fd := offloaded(b, 9410, true)
	epfd, _ := epollOf(b, e, fd)
	for i := 1; i < 16; i++ {
		fd := socketB(b, bed, e, true)
		if err := bindB(bed, e, fd, 9410+i); err != nil {
			b.Fatal(err)
		}
		if st := settled(e, fd); st != StateOffloaded {
			b.Fatalf("Bind: state %d, reason %q", st, e.Reason(fd))
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			b.Fatal(err)
		}
		if e.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev) != StateEpoll {
			b.Fatal("epoll set not the engine's")
		}
	}
	out := make([]unix.EpollEvent, 16)
	b.ReportAllocs()
	for b.Loop() {
		if n, errno := e.EpollWait(epfd, out, 0, nil, nil); n != 0 || errno != 0 {
			b.Fatal(n, errno)
		}
	}
}

// BenchmarkEpollCtlMod changes an engine member's events, as an event
// loop does when it starts or stops watching for output (libuv, libevent).
func BenchmarkEpollCtlMod(b *testing.B) {
	_, e, fd := offloaded(b, 9407, true)
	epfd, ev := epollOf(b, e, fd)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		ev.Events = unix.EPOLLIN | uint32(i&1)*unix.EPOLLOUT
		if e.EpollCtl(epfd, unix.EPOLL_CTL_MOD, fd, &ev) != StateEpoll {
			b.Fatal("epoll set not the engine's")
		}
	}
}

// BenchmarkEpollWaitSleep: an epoll_wait that polls, then sleeps until
// its timeout (100 us), as a server's wait between sparse requests does.
func BenchmarkEpollWaitSleep(b *testing.B) {
	_, e, fd := offloaded(b, 9408, true)
	epfd, _ := epollOf(b, e, fd)
	out := make([]unix.EpollEvent, 8)
	b.ReportAllocs()
	for b.Loop() {
		if n, errno := e.EpollWait(epfd, out, 100*time.Microsecond, nil, nil); n != 0 || errno != 0 {
			b.Fatal(n, errno)
		}
	}
}

// TestMuxAllocs: an EPOLL_CTL_MOD of an engine member and an epoll_wait
// that sleeps allocate nothing (each made one and five before); the
// whole process's count, so a stray allocation of the runtime's may
// show: the bound is half an allocation a call.
func TestMuxAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates: allocation counts are not the build's")
	}
	_, e, fd := offloaded(t, 9409, true)
	epfd, ev := epollOf(t, e, fd)
	i := 0
	if n := testing.AllocsPerRun(1000, func() {
		i++
		ev.Events = unix.EPOLLIN | uint32(i&1)*unix.EPOLLOUT
		e.EpollCtl(epfd, unix.EPOLL_CTL_MOD, fd, &ev)
	}); n >= 0.5 {
		t.Errorf("EPOLL_CTL_MOD: %.2f allocations a call, want 0", n)
	}
	ev.Events = unix.EPOLLIN // nothing comes: every wait sleeps to its end
	e.EpollCtl(epfd, unix.EPOLL_CTL_MOD, fd, &ev)
	out := make([]unix.EpollEvent, 8)
	if n := testing.AllocsPerRun(200, func() {
		if n, errno := e.EpollWait(epfd, out, 100*time.Microsecond, nil, nil); n != 0 || errno != 0 {
			t.Fatalf("epoll_wait with nothing sent: %d events, errno %v", n, errno)
		}
	}); n >= 0.5 {
		t.Errorf("epoll_wait that sleeps 100 us: %.2f allocations a call, want 0", n)
	}
}

// BenchmarkRecv receives a flood of 64-byte datagrams through Poll then
// Recv, as an epoll or poll loop does.
func BenchmarkPollRecv(b *testing.B) {
	bed, e, fd := offloaded(b, 9404, true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bench.Flood(ctx, bed, &bench.Options{Port: 9404, Size: 64}) }()
	b.Cleanup(func() { cancel(); <-done })
	pfds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	buf := make([]byte, 2048)
	b.ReportAllocs()
	for b.Loop() {
		if _, errno := e.Poll(MuxPoll, pfds, -1, nil, nil); errno != 0 {
			b.Fatal(errno)
		}
		if _, _, _, errno := e.Recv(fd, buf, 0, time.Time{}, nil, nil); errno != 0 && errno != unix.EAGAIN {
			b.Fatal(errno)
		}
	}
}

func BenchmarkSend(b *testing.B) {
	bed, e, fd := offloaded(b, 9405, false)
	to := netip.AddrPortFrom(bed.Addr(testbed.A), 9)
	msg := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if _, errno := e.Send(fd, msg, to, SendCmsg{}, 0); errno != 0 {
			b.Fatal(errno)
		}
	}
}

// A connect on an offloaded socket re-steers it to its peer and keeps what
// it had queued, as the kernel keeps its receive queue.
func TestConnectKeepsQueue(t *testing.T) {
	bed, e, fd := offloaded(t, 9406, false)
	if err := testutil.SendUDP(bed, 9406, 2, 64); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	if _, _, _, errno := e.Recv(fd, buf, 0, time.Time{}, nil, nil); errno != 0 {
		t.Fatal(errno)
	}
	if n, ok := e.Conn(fd).Pending(); !ok || n != 64 {
		t.Fatalf("second datagram not queued before connect (%d, %v)", n, ok)
	}
	peer := &unix.SockaddrInet4{Addr: bed.Addr(testbed.A).As4(), Port: 9}
	if err := unix.Connect(fd, peer); err != nil {
		t.Fatal(err)
	}
	if e.Connect(fd); settled(e, fd) != StateOffloaded {
		t.Fatalf("Connect: state %d, reason %q", e.State(fd), e.Reason(fd))
	}
	if c := e.Conn(fd); c.RemoteAddr() == nil || c.RemoteAddr().String() != bed.Addr(testbed.A).String()+":9" {
		t.Fatalf("after connect the socket's peer is %v", c.RemoteAddr())
	}
	if n, _, _, errno := e.Recv(fd, buf, unix.MSG_DONTWAIT, time.Time{}, nil, nil); errno != 0 || n != 64 {
		t.Fatalf("datagram queued before connect: %d bytes, errno %v", n, errno)
	}
}

// TestPollSleepSignals: a poll that sleeps takes the application's signal
// mask (ppoll, pselect), and the Go runtime's preemption signal (SIGURG)
// does not end it with an EINTR the application never caused.
func TestPollSleepSignals(t *testing.T) {
	_, e, fd := offloaded(t, 9408, true)
	pfds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	var mask unix.Sigset_t
	if n, errno := e.Poll(MuxPoll, pfds, 20*time.Millisecond, &mask, nil); n != 0 || errno != 0 {
		t.Fatalf("ppoll with a signal mask, nothing ready: %d, errno %v; want a timeout", n, errno)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	go func() {
		for range 5 {
			time.Sleep(20 * time.Millisecond)
			unix.Tgkill(os.Getpid(), tid, unix.SIGURG)
		}
	}()
	start := time.Now()
	if n, errno := e.Poll(MuxPoll, pfds, 200*time.Millisecond, nil, nil); n != 0 || errno != 0 {
		t.Fatalf("poll under SIGURG: %d, errno %v after %v; want a timeout", n, errno, time.Since(start))
	}
	if d := time.Since(start); d < 190*time.Millisecond {
		t.Errorf("poll of 200 ms returned after %v", d)
	}
}

// TestEpollEdgeTriggered: an EPOLLET member is reported once per arrival
// (and once after EPOLL_CTL_ADD/MOD), not while its datagrams stay queued;
// a level-triggered member is reported as long as they do.
func TestEpollEdgeTriggered(t *testing.T) {
	bed, e, fd := offloaded(t, 9410, true)
	epoll := func(events uint32) int {
		epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(epfd) })
		ev := unix.EpollEvent{Events: events, Fd: int32(fd)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			t.Fatal(err)
		}
		if e.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev) != StateEpoll {
			t.Fatal("epoll set not the engine's")
		}
		return epfd
	}
	et, lt := epoll(unix.EPOLLIN|unix.EPOLLET), epoll(unix.EPOLLIN)
	out := make([]unix.EpollEvent, 4)
	wait := func(what string, epfd int, timeout time.Duration, want int) {
		t.Helper()
		start := time.Now()
		n, errno := e.EpollWait(epfd, out, timeout, nil, nil)
		if errno != 0 || n != want {
			t.Fatalf("%s: %d events, errno %v; want %d", what, n, errno, want)
		}
		if want == 1 && (out[0].Events != unix.EPOLLIN || out[0].Fd != int32(fd)) {
			t.Fatalf("%s: event %#x on fd %d", what, out[0].Events, out[0].Fd)
		}
		if want == 0 && time.Since(start) < timeout*9/10 {
			t.Fatalf("%s: returned after %v of a %v timeout", what, time.Since(start), timeout)
		}
	}
	wait("ET, nothing arrived, after ADD", et, 0, 0)
	for i := range 2 {
		if err := testutil.SendUDP(bed, 9410, 1, 64); err != nil {
			t.Fatal(err)
		}
		wait(fmt.Sprintf("ET, datagram %d arrives", i+1), et, time.Second, 1)
		wait("ET, it stays queued", et, 50*time.Millisecond, 0)
		wait("LT, it stays queued", lt, 0, 1)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(fd)}
	e.EpollCtl(et, unix.EPOLL_CTL_MOD, fd, &ev)
	wait("ET after MOD, datagrams queued", et, 0, 1)
	buf := make([]byte, 2048)
	for range 2 {
		if _, _, _, errno := e.Recv(fd, buf, 0, time.Time{}, nil, nil); errno != 0 {
			t.Fatal(errno)
		}
	}
	wait("LT, drained", lt, 0, 0)
}

// TestEpollNested: an epoll fd nested in another's set, made before its
// socket joins it (an event loop embedded in another's), makes the sets
// above it the engine's once it has an offloaded socket, reports the
// socket's datagrams to them and to poll, and leaves them once closed.
func TestEpollNested(t *testing.T) {
	bed, e, fd := offloaded(t, 9411, true)
	var mu sync.Mutex
	told := map[int]State{}
	e.onState = func(fd int, s State) { mu.Lock(); told[fd] = s; mu.Unlock() }
	stateOf := func(fd int) State { mu.Lock(); defer mu.Unlock(); return told[fd] }
	epoll := func() int {
		epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(epfd) })
		return epfd
	}
	nest := func(outer, inner int, data int32) {
		t.Helper()
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: data}
		if err := unix.EpollCtl(outer, unix.EPOLL_CTL_ADD, inner, &ev); err != nil {
			t.Fatal(err)
		}
		if st := e.EpollNest(outer, unix.EPOLL_CTL_ADD, inner, &ev); st != StateOS {
			t.Fatalf("a set holding an empty one: state %d, want the kernel's", st)
		}
	}
	in, outer, top := epoll(), epoll(), epoll()
	nest(outer, in, 7)
	nest(top, outer, 8)
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: 43}
	if err := unix.EpollCtl(in, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		t.Fatal(err)
	}
	if e.EpollCtl(in, unix.EPOLL_CTL_ADD, fd, &ev) != StateEpoll || stateOf(outer) != StateEpoll || stateOf(top) != StateEpoll {
		t.Fatalf("after the socket joined: the sets above it told %d and %d, want the engine's", stateOf(outer), stateOf(top))
	}
	if err := testutil.SendUDP(bed, 9411, 1, 64); err != nil {
		t.Fatal(err)
	}
	out := make([]unix.EpollEvent, 4)
	if n, errno := e.EpollWait(top, out, time.Second, nil, nil); n != 1 || errno != 0 || out[0].Fd != 8 {
		t.Fatalf("top set: %d events (%+v), errno %v; want the middle set's", n, out[:max(n, 0)], errno)
	}
	if n, errno := e.EpollWait(outer, out, 0, nil, nil); n != 1 || errno != 0 || out[0].Fd != 7 {
		t.Fatalf("middle set: %d events (%+v), errno %v; want the nested set's", n, out[:max(n, 0)], errno)
	}
	pfds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}}
	if n, errno := e.Poll(MuxPoll, pfds, 0, nil, nil); n != 1 || errno != 0 || pfds[0].Revents != unix.POLLIN {
		t.Fatalf("poll on the nested set: %d, revents %#x, errno %v", n, pfds[0].Revents, errno)
	}
	e.Close(in)
	if stateOf(outer) != StateOS || stateOf(top) != StateOS {
		t.Fatalf("after the nested set closed: told %d and %d, want the kernel's", stateOf(outer), stateOf(top))
	}
	if n, errno := e.EpollWait(outer, out, 0, nil, nil); errno != ErrPassOS && (n != 0 || errno != 0) {
		t.Fatalf("middle set after the nested one closed: %d events, errno %v", n, errno)
	}
}

// TestMulticastLoopback: with IP_MULTICAST_LOOP on (VMAXDP_TX_MC_LOOPBACK's
// default) the multicast an offloaded socket sends to a group with a
// member on this host goes through the kernel, so that member gets it as
// well as the one across the wire; once the host has no member, and with
// loop off, the engine sends it, and only the wire sees it.
func TestMulticastLoopback(t *testing.T) {
	bed, e, fd := offloaded(t, 9420, false)
	group := netip.MustParseAddr("224.18.0.9")
	listen := func(side testbed.Side) *net.UDPConn {
		var c *net.UDPConn
		err := bed.Do(side, func() error {
			ifi, err := net.InterfaceByName(bed.Link(side))
			if err != nil {
				return err
			}
			c, err = net.ListenMulticastUDP("udp4", ifi, net.UDPAddrFromAddrPort(netip.AddrPortFrom(group, 9421)))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	local, remote := listen(testbed.B), listen(testbed.A)
	got := func(c *net.UDPConn, want int, what string) {
		t.Helper()
		buf := make([]byte, 2048)
		n := 0
		for {
			c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
			if _, err := c.Read(buf); err != nil {
				break
			}
			n++
		}
		if want >= 0 && n != want {
			t.Errorf("%s got %d datagrams, want %d", what, n, want)
		}
	}
	c := e.Conn(fd)
	sendOne := func() {
		t.Helper()
		if _, errno := e.Send(fd, make([]byte, 64), netip.AddrPortFrom(group, 9421), SendCmsg{}, 0); errno != 0 {
			t.Fatal(errno)
		}
	}
	send := func() {
		t.Helper()
		for range 5 {
			sendOne()
		}
	}
	// until sends one at a time, at most 2 s, until counter moves: the
	// stack learns of a membership change from a netlink event.
	until := func(counter *atomic.Uint64, what string) int {
		t.Helper()
		was := counter.Load()
		for n := 1; n <= 200; n++ {
			sendOne()
			if counter.Load() != was {
				return n
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("%s: the path did not change in 200 sends over 2 s", what)
		return 0
	}
	// The stack may learn of the member only after the first sends.
	until(&c.Counters.TxOSPackets, "a member here")
	got(remote, -1, "") // drain
	kern := c.Counters.TxOSPackets.Load()
	send()
	got(local, 6, "loop on, a member here: the receiver on this host")
	got(remote, 5, "loop on, a member here: the receiver across the wire")
	if n := c.Counters.TxOSPackets.Load() - kern; n != 5 {
		t.Errorf("loop on, a member here: %d datagrams through the kernel, want 5", n)
	}

	local.Close()
	kern, off := c.Counters.TxOSPackets.Load(), c.Counters.TxOffloadPackets.Load()
	probes := until(&c.Counters.TxOffloadPackets, "the member here left")
	send()
	got(remote, probes+5, "loop on, no member here: the receiver across the wire")
	if n := c.Counters.TxOffloadPackets.Load() - off; n != 6 {
		t.Errorf("loop on, no member here: %d datagrams offloaded, want 6", n)
	}
	if n := c.Counters.TxOSPackets.Load() - kern; n != uint64(probes-1) {
		t.Errorf("loop on, no member here: %d datagrams through the kernel, want the %d probes before the change", n, probes-1)
	}

	local = listen(testbed.B)
	until(&c.Counters.TxOSPackets, "a member here joined")
	got(remote, -1, "") // drain
	send()
	got(local, 6, "loop on, a member joined: the receiver on this host")
	got(remote, 5, "loop on, a member joined: the receiver across the wire")

	e.SetMulticastLoop(fd, false)
	off = c.Counters.TxOffloadPackets.Load()
	send()
	got(local, 0, "loop off: the receiver on this host")
	got(remote, 5, "loop off: the receiver across the wire")
	if n := c.Counters.TxOffloadPackets.Load() - off; n != 5 {
		t.Errorf("loop off: %d datagrams offloaded, want 5", n)
	}
	kern = c.Counters.TxOSPackets.Load()
	e.SetMulticastIf(fd, netip.MustParseAddr("127.0.0.1"), 0)
	send()
	if n := c.Counters.TxOSPackets.Load() - kern; n != 5 {
		t.Errorf("IP_MULTICAST_IF lo: %d datagrams through the kernel, want 5", n)
	}
}

// TestCloseUnderReceive: a receive blocked on a dup carries on when the
// original fd closes (the socket moves under it), and a receive blocked on
// the closing fd itself ends with EBADF before Close returns.
func TestCloseUnderReceive(t *testing.T) {
	bed, e, fd := offloaded(t, 9410, false)
	dup, err := unix.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dup)
	e.Dup(fd, dup)
	type result struct {
		n     int
		errno unix.Errno
	}
	recvAsync := func(fd int) chan result {
		got := make(chan result, 1)
		go func() {
			n, _, _, errno := e.Recv(fd, make([]byte, 2048), 0, time.Now().Add(10*time.Second), nil, nil)
			got <- result{n, errno}
		}()
		time.Sleep(20 * time.Millisecond) // into its wait
		return got
	}
	onDup := recvAsync(dup)
	e.Close(fd)
	unix.Close(fd)
	if err := testutil.SendUDP(bed, 9410, 1, 64); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-onDup:
		if r.errno != 0 || r.n != 64 {
			t.Fatalf("receive on dup %d across the close of fd %d: %d bytes, errno %v", dup, fd, r.n, r.errno)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("receive on the dup never returned")
	}
	onClosing := recvAsync(dup)
	e.Close(dup)
	select {
	case r := <-onClosing:
		if r.errno != unix.EBADF {
			t.Fatalf("receive on fd %d closed under it: errno %v, want EBADF", dup, r.errno)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a receive on a closed fd never returned")
	}
}

// TestCloseCandidate: a socket not yet decided follows its dup when the
// original fd closes (the first send offloads the dup, not the closed fd),
// and a receive from the kernel on a closing fd has ended when Close
// returns, so the fd can be closed and reused under none.
func TestCloseCandidate(t *testing.T) {
	bed, e := newEngine(t)
	fd := socketB(t, bed, e, false)
	got := make(chan unix.Errno, 1)
	go func() {
		_, _, _, errno := e.Recv(fd, make([]byte, 64), 0, time.Now().Add(10*time.Second), nil, nil)
		got <- errno
	}()
	time.Sleep(20 * time.Millisecond) // into its wait
	s := e.get(fd)
	dup, err := unix.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dup)
	e.Dup(fd, dup)
	e.Close(fd)
	s.mu.Lock()
	reads := slices.Clone(s.kernelReads)
	s.mu.Unlock()
	if slices.Contains(reads, fd) {
		t.Fatalf("Close(%d) returned while a receive still reads it (%v)", fd, reads)
	}
	unix.Close(fd)
	select {
	case errno := <-got:
		if errno != unix.EBADF {
			t.Fatalf("receive on fd %d closed under it: errno %v, want EBADF", fd, errno)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a receive on a closed fd never returned")
	}
	to := netip.AddrPortFrom(bed.Addr(testbed.A), 9)
	err = bed.Do(testbed.B, func() error {
		if e.PrepareSend(dup, to); settled(e, dup) != StateOffloaded {
			t.Fatalf("first send on dup %d: state %d, reason %q", dup, e.State(dup), e.Reason(dup))
		}
		return nil
	})
	testutil.SkipIfNotSupported(t, err)
	if c := e.Conn(dup); c == nil || c.FD() != dup {
		t.Fatalf("the first send offloaded %v, want the socket on fd %d", c, dup)
	}
	if _, errno := e.Send(dup, make([]byte, 64), to, SendCmsg{}, 0); errno != 0 {
		t.Fatalf("send on the offloaded dup: %v", errno)
	}
}

// TestEpollWaitWhileDecided: an epoll_wait that sleeps while its socket
// is a candidate, the goroutine opening the stack adopting it between the
// wait's two looks at it, wakes for the socket's first datagram. Before,
// the wait slept on its kernel socket alone (unbound with two threads
// answered nothing on one of them, one run in twenty).
func TestEpollWaitWhileDecided(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) { epollWaitWhileDecided(t, bed) })
}

func epollWaitWhileDecided(t *testing.T, bed *testbed.Bed) {
	const port = 9410
	e := engineFor(t)
	fd := socketB(t, bed, e, true)
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(epfd)
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		t.Fatal(err)
	}
	if e.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev) != StateEpoll {
		t.Fatal("epoll set not the engine's")
	}
	var between atomic.Bool
	testHookWatch = func(w int) {
		if w == fd && e.State(fd) == StateCandidate && !between.Swap(true) {
			settled(e, fd) // the decision, between the looks
		}
	}
	defer func() { testHookWatch = func(int) {} }()
	bindWhileOpening(t, bed, e, fd, port)
	got := make(chan int, 1)
	go func() {
		n, _ := e.EpollWait(epfd, make([]unix.EpollEvent, 4), 5*time.Second, nil, nil)
		got <- n
	}()
	if st := settled(e, fd); st != StateOffloaded {
		t.Fatalf("state %d, reason %q", st, e.Reason(fd))
	}
	time.Sleep(20 * time.Millisecond) // into its sleep
	if !between.Load() {
		t.Skip("the wait looked at the socket only once it was offloaded: no window to test")
	}
	err = bed.Do(testbed.A, func() error {
		c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(bed.Addr(testbed.B), port)))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("decided"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	if n := <-got; n != 1 || time.Since(sent) > time.Second {
		t.Fatalf("epoll_wait returned %d events %v after the datagram, want its 1 at once: it slept on the kernel socket alone", n, time.Since(sent).Round(time.Millisecond))
	}
}

// TestBurstWhileStackOpens: a burst from a kernel-stack sender (on the
// plain bed with partial checksums) that comes while a socket's stack
// opens is queued by its kernel socket; none of it is lost to the
// kernel socket's default receive buffer (208 KiB: some 90 datagrams of
// 1400 bytes), and the socket's own size is back once it is offloaded.
func TestBurstWhileStackOpens(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) { burstWhileStackOpens(t, bed) })
}

func burstWhileStackOpens(t *testing.T, bed *testbed.Bed) {
	const port, n, size = 9410, 600, 1400
	e := engineFor(t)
	fd := socketB(t, bed, e, false)
	own, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil {
		t.Fatal(err)
	}
	if err := testutil.Resolve(bed, testbed.A); err != nil {
		t.Fatal(err)
	}
	bindWhileOpening(t, bed, e, fd, port)
	if held := e.HeldRcvBuf(fd); held != own {
		t.Errorf("while the stack opens, the application's SO_RCVBUF (getsockopt) = %d, want its own %d", held, own)
	}
	// The burst, unpaced but for a breath every 50 datagrams (the
	// receiving veth's backlog holds 1000 before XDP is attached).
	err = bed.Do(testbed.A, func() error {
		c, err := net.ListenUDP("udp4", nil)
		if err != nil {
			return err
		}
		defer c.Close()
		to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(bed.Addr(testbed.B), port))
		msg := make([]byte, size)
		for i := range n {
			if _, err := c.WriteToUDP(msg, to); err != nil {
				return err
			}
			if i%50 == 49 {
				time.Sleep(100 * time.Microsecond)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := settled(e, fd); st != StateOffloaded {
		t.Fatalf("state %d, reason %q", st, e.Reason(fd))
	}
	if got, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF); got != own {
		t.Errorf("SO_RCVBUF once offloaded = %d, want the socket's own %d", got, own)
	}
	buf := make([]byte, 2048)
	got := 0
	for got < n {
		m, _, _, errno := e.Recv(fd, buf, 0, time.Now().Add(time.Second), nil, nil)
		if errno != 0 || m != size {
			break
		}
		got++
	}
	if got != n {
		t.Errorf("received %d of the %d datagrams sent while the stack opened", got, n)
	}

	// Each is counted once: through the kernel socket before the offload
	// (Rx OS), or offloaded.
	c := e.Conn(fd).Counters
	if os, off := c.RxOSPackets.Load(), c.RxOffloadPackets.Load(); os+off != n {
		t.Errorf("counted %d through the kernel and %d offloaded, want %d in all", os, off, n)
	}
	if t.Failed() {
		logDrops(t, bed, e.Conn(fd))
	}
}

// logDrops logs where a test's lost datagrams may have gone: the
// socket's and stack's drop counters, the AF_XDP sockets' statistics and
// the kernel's UDP counters on the receiving side.
func logDrops(t *testing.T, bed *testbed.Bed, c *stack.UDPConn) {
	t.Helper()
	t.Logf("socket: rx queue drops %d, rx eagain %d", c.Counters.RxQueueDrops.Load(), c.Counters.RxEagain.Load())
	st := c.Stack()
	t.Logf("stack: rx frames %d, no socket %d", st.Counters.RxFrames.Load(), st.Counters.RxNoSocket.Load())
	for r := range st.Counters.RxDropped {
		if v := st.Counters.RxDropped[r].Load(); v > 0 {
			t.Logf("stack: dropped %s: %d", header.Result(r), v)
		}
	}
	for _, be := range st.Backends() {
		if x, ok := be.(*xsk.Socket); ok {
			s, err := x.Statistics()
			t.Logf("%s: %+v %v", x, s, err)
		}
	}
	for _, k := range []string{"InDatagrams", "RcvbufErrors", "InErrors", "NoPorts"} {
		t.Logf("kernel Udp%s on side B: %d", k, testutil.UDPStat(t, bed, testbed.B, k))
	}
	// The veth pair's own counters (its drops while a program attaches,
	// the frames that left A), which no counter above sees: the
	// recorder's snapshot of the bed's namespaces.
	nss, err := snapshot.Namespaces()
	if err != nil {
		t.Logf("namespaces: %v", err)
		return
	}
	defer func() {
		for i := range nss {
			nss[i].Close()
		}
	}()
	bedNS := map[uint32]bool{}
	for _, ns := range nss {
		bedNS[ns.Inode] = ns.Name == bed.NSName(testbed.A) || ns.Name == bed.NSName(testbed.B)
	}
	cs, _ := snapshot.Take(0, nss, "")
	for _, c := range cs {
		if !bedNS[c.Netns] || (c.Source != "netdev" && c.Source != "ethtool") {
			continue
		}
		for k, v := range c.Values {
			if v > 0 && (strings.Contains(k, "drop") || strings.Contains(k, "err") || strings.Contains(k, "full") || strings.Contains(k, "packets")) {
				t.Logf("%s %s: %s %d", c.Device, c.Source, k, v)
			}
		}
	}
}

// TestKernelDropsCounted: what a socket's kernel socket drops while the
// kernel serves it (a full receive buffer) shows in its stats record.
func TestKernelDropsCounted(t *testing.T) {
	const port = 9411
	bed, e := newEngine(t)
	fd := socketB(t, bed, e, false)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096)
	err := bed.Do(testbed.B, func() error {
		// Loopback: the kernel serves it.
		if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port}); err != nil {
			return err
		}
		e.Bind(fd)
		// Decided first: while a socket waits for a stack its kernel
		// receive buffer is raised (holdKernelQueue).
		if st := settled(e, fd); st != StateKernel {
			t.Fatalf("bound to loopback: state %d, want the kernel's", st)
		}
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port})
		if err != nil {
			return err
		}
		defer c.Close()
		for range 100 {
			c.Write(make([]byte, 1400))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var rec stats.Socket
	e.socketRecord(e.get(fd), &rec)
	if rec.KernelDrops == 0 {
		t.Errorf("100 datagrams of 1400 bytes into a 4 KiB receive buffer: kernel_drops = 0 (state %s)", rec.State)
	}
}

// TestEpollSmallMaxevents: with maxevents 1 and two members ready
// (level-triggered, so both stay ready), successive waits report both:
// a scan that always began with the same member starved the other.
func TestEpollSmallMaxevents(t *testing.T) {
	bed, e, fd := offloaded(t, 9412, true)
	fd2 := socketB(t, bed, e, true)
	err := bed.Do(testbed.B, func() error {
		if err := unix.Bind(fd2, &unix.SockaddrInet4{Addr: bed.Addr(testbed.B).As4(), Port: 9413}); err != nil {
			return err
		}
		e.Bind(fd2)
		if st := settled(e, fd2); st != StateOffloaded {
			t.Fatalf("second socket: state %d, reason %q", st, e.Reason(fd2))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(epfd)
	for _, f := range []int{fd, fd2} {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(f)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, f, &ev); err != nil {
			t.Fatal(err)
		}
		e.EpollCtl(epfd, unix.EPOLL_CTL_ADD, f, &ev)
	}
	for _, port := range []int{9412, 9413} {
		if err := testutil.SendUDP(bed, port, 1, 64); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[int32]bool{}
	out := make([]unix.EpollEvent, 1)
	for range 4 {
		if n, errno := e.EpollWait(epfd, out, time.Second, nil, nil); errno != 0 || n != 1 {
			t.Fatalf("epoll_wait: %d events, errno %v", n, errno)
		}
		seen[out[0].Fd] = true
	}
	if !seen[int32(fd)] || !seen[int32(fd2)] {
		t.Errorf("four waits of maxevents 1 reported %v: both members are ready", seen)
	}
}

// TestForeignCmsgOptions: a socket that asks for ancillary data vmaxdp
// does not make goes to the kernel, which makes it: offloaded, it is no
// longer steered and says why; a candidate is decided for the kernel. An
// AF_INET6 socket's IPv6 options are among them (the kernel makes
// IPV6_PKTINFO for its IPv4 datagrams too).
func TestForeignCmsgOptions(t *testing.T) {
	bed, e, fd := offloaded(t, 9420, false)
	e.SetCmsgOption(fd, unix.IPPROTO_IP, unix.IP_PKTINFO, true)
	if st := e.State(fd); st != StateOffloaded {
		t.Fatalf("IP_PKTINFO, which vmaxdp makes: state %d, reason %q", st, e.Reason(fd))
	}
	e.SetCmsgOption(fd, unix.IPPROTO_IP, unix.IP_RECVOPTS, true)
	if st := e.State(fd); st != StateKernel || !strings.Contains(e.Reason(fd), "IP_RECVOPTS") {
		t.Errorf("IP_RECVOPTS: state %d, reason %q; want the kernel's, said", st, e.Reason(fd))
	}
	// UDP_GRO is served: the stack's datagrams come one by one, and what
	// the kernel socket coalesced comes with its segment size
	// (TestRunUDPGRO).
	_, e2, fd2 := offloaded(t, 9419, false)
	e2.SetCmsgOption(fd2, unix.IPPROTO_UDP, unix.UDP_GRO, true)
	if st := e2.State(fd2); st != StateOffloaded || e2.Cmsg(fd2)&CmsgUDPGRO == 0 {
		t.Errorf("UDP_GRO: state %d, reason %q, ancillary data %#x; want offloaded, UDP_GRO's", st, e2.Reason(fd2), e2.Cmsg(fd2))
	}

	var fd6 int
	err := bed.Do(testbed.B, func() (err error) {
		fd6, err = unix.Socket(unix.AF_INET6, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close(fd6); unix.Close(fd6) })
	e.Socket(fd6, false)
	e.SetCmsgOption(fd6, unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, true)
	if st := e.State(fd6); st != StateKernel || !strings.Contains(e.Reason(fd6), "IPV6_RECVPKTINFO") {
		t.Errorf("an AF_INET6 candidate with IPV6_RECVPKTINFO: state %d, reason %q; want the kernel's, said", st, e.Reason(fd6))
	}
}

// TestTimestamping: SO_TIMESTAMPING with software receive stamps keeps a
// socket offloaded and turns SCM_TIMESTAMPING on, in the layout it was set
// with; transmit or hardware stamps send it to the kernel, said.
func TestTimestamping(t *testing.T) {
	bed, e, fd := offloaded(t, 9421, false)
	const rx = unix.SOF_TIMESTAMPING_RX_SOFTWARE | unix.SOF_TIMESTAMPING_SOFTWARE
	for _, c := range []struct {
		flags     int
		newLayout bool
		want      Cmsg
	}{
		{rx, false, CmsgTimestamping},
		{rx | unix.SOF_TIMESTAMPING_OPT_ID | unix.SOF_TIMESTAMPING_OPT_TSONLY, true, CmsgTimestampingNew},
		{unix.SOF_TIMESTAMPING_SOFTWARE | optRxFilter, false, 0}, // reports nothing the socket generates
		{0, false, 0},
	} {
		e.SetTimestamping(fd, c.flags, c.newLayout)
		if got := e.Cmsg(fd) & (CmsgTimestamping | CmsgTimestampingNew); got != c.want || e.State(fd) != StateOffloaded {
			t.Errorf("flags %#x: ancillary data %#x, state %d (%q); want %#x, offloaded", c.flags, got, e.State(fd), e.Reason(fd), c.want)
		}
	}
	// Software transmit stamps without the packet: each send queues one,
	// with its key, and reading it allocates nothing.
	e.SetTimestamping(fd, rx|unix.SOF_TIMESTAMPING_TX_SOFTWARE|unix.SOF_TIMESTAMPING_OPT_TSONLY|unix.SOF_TIMESTAMPING_OPT_ID, false)
	if st := e.State(fd); st != StateOffloaded {
		t.Fatalf("with software transmit stamps: state %d (%q), want offloaded", st, e.Reason(fd))
	}
	to, msg, ctl := netip.AddrPortFrom(bed.Addr(testbed.A), 9), make([]byte, 64), make([]byte, 256)
	if _, ok := e.RecvErrQueue(fd, nil, ctl); ok || e.TxStampPending(fd) {
		t.Fatal("a stamp before any send")
	}
	sends := 0
	allocs := testing.AllocsPerRun(100, func() {
		if _, errno := e.Send(fd, msg, to, SendCmsg{}, 0); errno != 0 {
			t.Fatal(errno)
		}
		if !e.TxStampPending(fd) {
			t.Fatal("no stamp pending after a send")
		}
		m, ok := e.RecvErrQueue(fd, nil, ctl)
		// SCM_TIMESTAMPING (16 + 48), then IP_RECVERR (16 + 32) with the key
		if !ok || m.CtlCut || m.Ctl != 112 || m.Full != 0 || binary.NativeEndian.Uint32(ctl[64+16+12:]) != uint32(sends) {
			t.Fatalf("stamp %d: %+v, ok %v, key %d", sends, m, ok, binary.NativeEndian.Uint32(ctl[64+16+12:]))
		}
		sends++
	})
	if allocs >= 0.5 && !raceEnabled {
		t.Errorf("a send and its stamp: %.2f allocations, want 0", allocs)
	}
	// Unread, the queue keeps txStampsMax stamps and drops the rest.
	for range txStampsMax + 10 {
		if _, errno := e.Send(fd, msg, to, SendCmsg{}, 0); errno != 0 {
			t.Fatal(errno)
		}
	}
	kept := 0
	for ; ; kept++ {
		if _, ok := e.RecvErrQueue(fd, nil, ctl); !ok {
			break
		}
	}
	var rec stats.Socket
	e.socketRecord(e.get(fd), &rec)
	if dropped := rec.Counters.TxStampDrops; kept != txStampsMax || dropped != 10 {
		t.Errorf("%d sends unread: %d stamps kept, %d dropped (vmaxdp stats' tx_stamp_drops); want %d and 10", txStampsMax+10, kept, dropped, txStampsMax)
	}
	_, e2, fd2 := offloaded(t, 9422, false)
	e2.SetTimestamping(fd2, rx|unix.SOF_TIMESTAMPING_TX_HARDWARE, false)
	if st, why := e2.State(fd2), "hardware or scheduler timestamps (flags 0x1)"; st != StateKernel || !strings.Contains(e2.Reason(fd2), why) {
		t.Errorf("hardware transmit stamps: state %d, reason %q; want the kernel's, saying %q", st, e2.Reason(fd2), why)
	}
}

// TestTimestampingLooped: software transmit stamps without
// SOF_TIMESTAMPING_OPT_TSONLY (chrony's) come with the frame as it left,
// cut to the buffer and MSG_TRUNC'd as the kernel's, and with
// SOF_TIMESTAMPING_OPT_CMSG with the IP ancillary data the socket asked
// for and the packet's source as offender, in the kernel's order
// (SCM_TIMESTAMPING, IP_PKTINFO, IP_RECVERR; 144 bytes, as strace shows
// chrony's); SO_SELECT_ERR_QUEUE adds EPOLLPRI. Once the queue's slots
// hold buffers, a send and its stamp allocate nothing.
func TestTimestampingLooped(t *testing.T) {
	bed, e, fd := offloaded(t, 9423, false)
	e.SetCmsgOption(fd, unix.IPPROTO_IP, unix.IP_PKTINFO, true)
	e.SetTimestamping(fd, unix.SOF_TIMESTAMPING_TX_SOFTWARE|unix.SOF_TIMESTAMPING_RX_SOFTWARE|unix.SOF_TIMESTAMPING_SOFTWARE|unix.SOF_TIMESTAMPING_OPT_CMSG, false)
	if st := e.State(fd); st != StateOffloaded {
		t.Fatalf("state %d (%q), want offloaded", st, e.Reason(fd))
	}
	if !e.SetIntOption(fd, unix.SOL_SOCKET, unix.SO_SELECT_ERR_QUEUE, 1) {
		t.Fatal("SO_SELECT_ERR_QUEUE not followed")
	}
	to := netip.AddrPortFrom(bed.Addr(testbed.A), 123)
	msg, frame, ctl := make([]byte, 48), make([]byte, 1500), make([]byte, 256)
	msg[0] = 0x23
	if _, errno := e.Send(fd, msg, to, SendCmsg{}, 0); errno != 0 {
		t.Fatal(errno)
	}
	if ev := e.get(fd).errQueueEvents(); ev != unix.EPOLLERR|unix.EPOLLPRI {
		t.Errorf("a stamp waits with SO_SELECT_ERR_QUEUE: events %#x, want EPOLLERR|EPOLLPRI", ev)
	}
	m, ok := e.RecvErrQueue(fd, frame, ctl)
	const frameLen = header.UDPHeadersLen + 48
	if !ok || m.N != frameLen || m.Full != frameLen || m.Ctl != 144 || m.CtlCut {
		t.Fatalf("the stamp: %+v, ok %v; want the %d-byte frame and 144 bytes of ancillary data", m, ok, frameLen)
	}
	ip := header.IPv4(frame[header.EthernetLen:])
	if ip.Dst() != to.Addr() || header.UDP(ip[header.IPv4MinLen:]).DstPort() != 123 || frame[header.UDPHeadersLen] != 0x23 {
		t.Errorf("the looped frame % x: not the datagram sent to %v", frame[:m.N], to)
	}
	cms, err := unix.ParseSocketControlMessage(ctl[:m.Ctl])
	if err != nil || len(cms) != 3 {
		t.Fatalf("%d control messages, %v; want 3", len(cms), err)
	}
	want := [][2]int32{{unix.SOL_SOCKET, unix.SO_TIMESTAMPING_OLD}, {unix.IPPROTO_IP, unix.IP_PKTINFO}, {unix.IPPROTO_IP, unix.IP_RECVERR}}
	for i, c := range cms {
		if [2]int32{c.Header.Level, c.Header.Type} != want[i] {
			t.Errorf("control message %d: level %d type %d, want %v", i, c.Header.Level, c.Header.Type, want[i])
		}
	}
	pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&cms[1].Data[0]))
	src := e.Conn(fd).LocalAddrPort().Addr().As4()
	if int(pi.Ifindex) != e.Conn(fd).Stack().Ifindex() || pi.Spec_dst != src || pi.Addr != to.Addr().As4() {
		t.Errorf("IP_PKTINFO %+v: want ifindex %d, spec_dst %v, addr %v", *pi, e.Conn(fd).Stack().Ifindex(), src, to.Addr())
	}
	if off := cms[2].Data[16:24]; binary.NativeEndian.Uint16(off) != unix.AF_INET || [4]byte(off[4:8]) != src {
		t.Errorf("offender % x: want AF_INET %v", off, src)
	}
	// A buffer shorter than the frame: cut, MSG_TRUNC.
	if _, errno := e.Send(fd, msg, to, SendCmsg{}, 0); errno != 0 {
		t.Fatal(errno)
	}
	if m, ok := e.RecvErrQueue(fd, frame[:10], ctl); !ok || m.N != 10 || m.Full != frameLen {
		t.Errorf("a 10-byte buffer: %+v, ok %v; want 10 of %d", m, ok, frameLen)
	}
	for range txStampsMax {
		e.Send(fd, msg, to, SendCmsg{}, 0)
		e.RecvErrQueue(fd, frame, ctl)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, errno := e.Send(fd, msg, to, SendCmsg{}, 0); errno != 0 {
			t.Fatal(errno)
		}
		if m, ok := e.RecvErrQueue(fd, frame, ctl); !ok || m.N != frameLen {
			t.Fatalf("%+v, ok %v", m, ok)
		}
	})
	if allocs >= 0.5 && !raceEnabled {
		t.Errorf("a send and its looped stamp: %.2f allocations, want 0", allocs)
	}
}

// TestPutCmsgsAllocs: every kind of ancillary data is written without
// an allocation (recvmsg's per-datagram path), SCM_TIMESTAMPING's 48
// bytes in the kernel's layout, UDP_GRO's segment size after the stamps
// and before the IP level's, where udp_recvmsg puts it.
func TestPutCmsgsAllocs(t *testing.T) {
	meta := &stack.RecvMeta{Dst: netip.MustParseAddrPort("198.18.0.2:53"), SpecDst: netip.MustParseAddr("198.18.0.2"),
		Ifindex: 2, TOS: 0x10, TTL: 64, Stamp: 1_700_000_000_123_456_789, GROSize: 1200}
	all := CmsgPktinfo | CmsgTOS | CmsgTTL | CmsgOrigDstAddr | CmsgTimestampNS | CmsgTimestamping | CmsgUDPGRO
	b := make([]byte, 512)
	var used int
	if n := testing.AllocsPerRun(100, func() { used, _ = PutCmsgs(b, all, meta) }); n != 0 {
		t.Errorf("PutCmsgs: %.0f allocations a call, want 0", n)
	}
	msgs, err := unix.ParseSocketControlMessage(b[:used])
	if err != nil || len(msgs) != 7 {
		t.Fatalf("%d control messages, %v; want 7", len(msgs), err)
	}
	ts := msgs[1]
	if ts.Header.Type != unix.SO_TIMESTAMPING_OLD || len(ts.Data) != 48 {
		t.Fatalf("second message: type %d, %d bytes; want SO_TIMESTAMPING, 48", ts.Header.Type, len(ts.Data))
	}
	if gro := msgs[2]; gro.Header.Level != unix.IPPROTO_UDP || gro.Header.Type != unix.UDP_GRO || len(gro.Data) != 4 || binary.NativeEndian.Uint32(gro.Data) != 1200 {
		t.Errorf("third message: level %d, type %d, data %x; want UDP_GRO, 1200", gro.Header.Level, gro.Header.Type, gro.Data)
	}
	if n, _ := PutCmsgs(b, CmsgUDPGRO, &stack.RecvMeta{}); n != 0 {
		t.Errorf("a datagram nothing was coalesced into got %d bytes of UDP_GRO message, want none (as the kernel's)", n)
	}
	var want [48]byte
	binary.NativeEndian.PutUint64(want[0:], 1_700_000_000)
	binary.NativeEndian.PutUint64(want[8:], 123_456_789)
	if !bytes.Equal(ts.Data, want[:]) {
		t.Errorf("SCM_TIMESTAMPING data %x, want %x", ts.Data, want)
	}
}

// TestJoinWhileOpening: a socket that binds and joins a group at once, as
// the first socket of its interface, joins while its stack opens: the
// group is steered once the stack is, and a sender on side A reaches it
// through the stack. It was left to the kernel for good.
func TestJoinWhileOpening(t *testing.T) {
	bed, e := newEngine(t)
	fd := socketB(t, bed, e, false)
	bindWhileOpening(t, bed, e, fd, 9430)
	group := netip.MustParseAddr("239.18.0.30")
	ifindex := 0
	if err := bed.Do(testbed.B, func() error {
		ifi, err := net.InterfaceByName(bed.Link(testbed.B))
		if err == nil {
			ifindex = ifi.Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// As the preload library calls it: the engine's join, and the
	// kernel's when the engine passes.
	switch _, errno := e.Membership(fd, true, group, netip.IPv4Unspecified(), ifindex); errno {
	case 0:
	case ErrPassOS:
		if err := unix.SetsockoptIPMreqn(fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifindex)}); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("join %s while the stack opens: %v", group, errno)
	}
	if st := settled(e, fd); st != StateOffloaded {
		t.Fatalf("state %d, reason %q", st, e.Reason(fd))
	}
	var sender *net.UDPConn
	err := bed.Do(testbed.A, func() (err error) {
		sender, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(group, 9430)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	const n = 20
	for range n {
		if _, err := sender.Write(make([]byte, 64)); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 2048)
	for i := range n {
		if _, _, _, errno := e.Recv(fd, buf, 0, time.Now().Add(2*time.Second), nil, nil); errno != 0 {
			t.Fatalf("datagram %d of %d: %v", i, n, errno)
		}
	}
	if got := e.Conn(fd).Counters.RxOffloadPackets.Load(); got != n {
		t.Errorf("%d of the group's %d datagrams came through the stack, want all", got, n)
	}
}

// firstSendWhileOpening sends one datagram from fd, unbound, to side A's
// port as the preload library does (Send, and the kernel socket when it
// passes): fd's stack begins to open at that send, which must not wait
// for it. A test of that window skips when the stack opened before the
// state could be read.
func firstSendWhileOpening(t *testing.T, bed *testbed.Bed, e *Engine, fd, port int, msg []byte) {
	t.Helper()
	to := netip.AddrPortFrom(bed.Addr(testbed.A), uint16(port))
	err := bed.Do(testbed.B, func() error {
		n, errno := e.Send(fd, msg, to, SendCmsg{}, 0)
		switch {
		case errno == 0:
			return fmt.Errorf("first send offloaded (%d bytes): it waited for its stack to open", n)
		case errno != ErrPassOS:
			return fmt.Errorf("first send: %v", errno)
		}
		if err := unix.Sendto(fd, msg, 0, &unix.SockaddrInet4{Addr: to.Addr().As4(), Port: port}); err != nil {
			return err
		}
		e.SentOS(fd, 1, len(msg))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := e.State(fd); st != StateCandidate {
		t.Skipf("the stack opened right after the first send (state %d): no window to test", st)
	}
}

// readA reads one datagram from c, sent by side B of bed, within 3 s:
// the kernel sends the first datagram of a bed, and its ARP may have to
// ask twice (1 s apart). A failure says what the kernels counted and
// what side B knows of side A's address, so it tells a loss from a wait.
func readA(t *testing.T, bed *testbed.Bed, c *net.UDPConn, want []byte) {
	t.Helper()
	start := time.Now()
	c.SetReadDeadline(start.Add(3 * time.Second))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil || !bytes.Equal(buf[:n], want) {
		var neigh string
		bed.Do(testbed.B, func() error {
			out, _ := exec.Command("ip", "neigh", "show", bed.Addr(testbed.A).String()).CombinedOutput()
			neigh = strings.TrimSpace(string(out))
			return nil
		})
		t.Fatalf("side A read %q, %v after %v; want %q (side B: Udp OutDatagrams %d, neighbour %q; side A: Udp InDatagrams %d, RcvbufErrors %d, InErrors %d)",
			buf[:n], err, time.Since(start).Round(time.Millisecond), want,
			testutil.UDPStat(t, bed, testbed.B, "OutDatagrams"), neigh,
			testutil.UDPStat(t, bed, testbed.A, "InDatagrams"), testutil.UDPStat(t, bed, testbed.A, "RcvbufErrors"), testutil.UDPStat(t, bed, testbed.A, "InErrors"))
	}
}

// TestFirstSendWhileOpening: a client's first send does not wait for its
// stack to open (a short-lived client paid the 30-50 ms in full, at each
// start): its kernel socket sends it, counted in the socket's tx_os once
// offloaded, and the sends after the opening leave through the stack,
// the kernel's Udp OutDatagrams moving for the first alone.
func TestFirstSendWhileOpening(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		const port = 9415
		e := engineFor(t)
		fd := socketB(t, bed, e, false)
		a := testutil.ListenUDP(t, bed, testbed.A, port)
		out := testutil.UDPStat(t, bed, testbed.B, "OutDatagrams")
		firstSendWhileOpening(t, bed, e, fd, port, []byte("first"))
		readA(t, bed, a, []byte("first"))
		if st := settled(e, fd); st != StateOffloaded {
			t.Fatalf("once its stack opened: state %d, reason %q", st, e.Reason(fd))
		}
		to := netip.AddrPortFrom(bed.Addr(testbed.A), port)
		if n, errno := e.Send(fd, []byte("second"), to, SendCmsg{}, 0); errno != 0 || n != 6 {
			t.Fatalf("second send: %d bytes, errno %v", n, errno)
		}
		e.Conn(fd).FlushSends()
		readA(t, bed, a, []byte("second"))
		c := e.Conn(fd)
		if p, b := c.Counters.TxOSPackets.Load(), c.Counters.TxOSBytes.Load(); p != 1 || b != 5 {
			t.Errorf("tx_os %d datagrams, %d bytes; want the first send's 1 and 5", p, b)
		}
		if p := c.Counters.TxOffloadPackets.Load(); p != 1 {
			t.Errorf("tx_offload %d datagrams, want the second send's 1", p)
		}
		if moved := testutil.UDPStat(t, bed, testbed.B, "OutDatagrams") - out; moved != 1 {
			t.Errorf("side B's kernel sent %d datagrams, want the first alone", moved)
		}
	})
}

// TestShutdownWhileOpening: a process that exits while a stack it began
// to open is still opening (a short-lived client, whose first send no
// longer waits) leaves nothing behind: no program on the interface, no
// pins, which would have kept the program attached after the process for
// as long as their mount namespace lived. Its socket stays on the kernel.
func TestShutdownWhileOpening(t *testing.T) {
	const port = 9416
	bed, e := newEngine(t)
	fd := socketB(t, bed, e, false)
	a := testutil.ListenUDP(t, bed, testbed.A, port)
	firstSendWhileOpening(t, bed, e, fd, port, []byte("only"))
	e.Shutdown()
	e.WaitOpens()
	readA(t, bed, a, []byte("only"))
	if st := e.State(fd); st != StateCandidate {
		t.Errorf("state %d after Shutdown, want a candidate that its kernel socket serves (reason %q)", st, e.Reason(fd))
	}
	if id := testutil.XDPProgram(t, bed, testbed.B); id != 0 {
		t.Errorf("program id %d attached to %s after Shutdown", id, bed.Link(testbed.B))
	}
	var ns unix.Stat_t
	if err := bed.Do(testbed.B, func() error { return unix.Stat("/proc/thread-self/ns/net", &ns) }); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(steer.DefaultPinDir, steer.PinDirName(uint32(ns.Ino), testutil.Ifindex(t, bed, testbed.B)))
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("pins left in %s after Shutdown: %v", dir, err)
	}
}

// TestFirstSendWait: with VMAXDP_FIRST_SEND_WAIT, the first send waits
// for its stack and leaves through it, the kernel sending nothing.
func TestFirstSendWait(t *testing.T) {
	const port = 9417
	bed := testutil.Bed(t, nil)
	e := engineFor(t, func(p *params.Params) { p.FirstSendWait = 5000 })
	fd := socketB(t, bed, e, false)
	a := testutil.ListenUDP(t, bed, testbed.A, port)
	// A stack that does not know its next hop yet sends through the kernel.
	if err := testutil.Resolve(bed, testbed.B); err != nil {
		t.Fatal(err)
	}
	out := testutil.UDPStat(t, bed, testbed.B, "OutDatagrams")
	to := netip.AddrPortFrom(bed.Addr(testbed.A), port)
	err := bed.Do(testbed.B, func() error {
		if n, errno := e.Send(fd, []byte("waited"), to, SendCmsg{}, 0); errno != 0 || n != 6 {
			return fmt.Errorf("first send: %d bytes, errno %v (state %d, reason %q): it did not wait for its stack", n, errno, e.State(fd), e.Reason(fd))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	e.Conn(fd).FlushSends()
	readA(t, bed, a, []byte("waited"))
	if moved := testutil.UDPStat(t, bed, testbed.B, "OutDatagrams") - out; moved != 0 {
		t.Errorf("side B's kernel sent %d datagrams, want none", moved)
	}
}
