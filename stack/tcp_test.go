package stack_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/testbed"
	"golang.org/x/sys/unix"
)

// echoTCP serves l until it closes: each connection gets back what it sends.
func echoTCP(l net.Listener) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return &wg
}

// listenTCP listens on laddr with the stack on side B of bed.
func listenTCP(t testing.TB, bed *testbed.Bed, st *stack.Stack, laddr netip.AddrPort) *stack.TCPListener {
	t.Helper()
	var l *stack.TCPListener
	if err := bed.Do(testbed.B, func() (err error) {
		l, err = st.ListenTCP(laddr)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return l
}

// dialFromA connects a kernel client of bed's side A to addr. The socket
// is made in A's namespace; its I/O may then run on any goroutine.
func dialFromA(bed *testbed.Bed, addr netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := bed.Do(testbed.A, func() (err error) {
		c, err = net.DialTimeout("tcp4", addr.String(), 5*time.Second)
		return err
	})
	return c, err
}

// acceptOne dials laddr from a kernel client of bed's side A and returns
// that client and what l accepted.
func acceptOne(t *testing.T, bed *testbed.Bed, l *stack.TCPListener, laddr netip.AddrPort) (client, accepted net.Conn) {
	t.Helper()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			ch <- c
		}
		close(ch)
	}()
	c, err := dialFromA(bed, laddr)
	if err != nil {
		t.Fatal(err)
	}
	s, ok := <-ch
	if !ok {
		t.Fatal("accept failed")
	}
	return c, s
}

// connectedPair is a kernel client of bed's side A connected to a
// listener of st on port, and what the listener accepted; all three close
// with t, and the client's calls fail after 20 s.
func connectedPair(t *testing.T, bed *testbed.Bed, st *stack.Stack, port uint16) (client, accepted net.Conn) {
	t.Helper()
	laddr := netip.AddrPortFrom(bed.Addr(testbed.B), port)
	l := listenTCP(t, bed, st, laddr)
	t.Cleanup(func() { l.Close() })
	c, s := acceptOne(t, bed, l, laddr)
	t.Cleanup(func() { c.Close(); s.Close() })
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return c, s
}

// engineEcho echoes what c receives as the engine serves a blocking
// receive and send: read; when there is nothing, drain the queues on this
// goroutine (Poll) and read again; then sleep until netstack says c is
// readable. It returns when the peer closes.
func engineEcho(c *stack.TCPConn) {
	ready := make(chan struct{}, 1)
	cancel := c.Notify(func(stack.TCPEvents) {
		select {
		case ready <- struct{}{}:
		default:
		}
	})
	defer cancel()
	buf := make([]byte, 64)
	polled := false
	for {
		n, err := c.ReadNonblock(buf, false)
		switch {
		case err == unix.EAGAIN && !polled:
			polled = true
			c.WaitPoint()
			c.Poll()
			continue
		case err == unix.EAGAIN:
			polled = false
			<-ready
			continue
		case err != nil || n == 0:
			return
		}
		polled = false
		for off := 0; off < n; {
			k, err := c.WriteNonblock([][]byte{buf[off:n]}, false)
			if err != nil && err != unix.EAGAIN {
				return
			}
			off += k
		}
	}
}

// TestTCPRoundTripAllocs checks that a request and its answer through
// netstack, served with the calls the engine uses (engineEcho), allocate
// nothing on our side: netstack pools its packets, and the link, its
// queueing discipline and the drain goroutine must not allocate either
// (four allocations a round trip before tcpQDisc and copyPacket).
func TestTCPRoundTripAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates: allocation counts are not the build's")
	}
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		c, s := connectedPair(t, bed, st, 7402)
		go engineEcho(s.(*stack.TCPConn))
		msg, buf := make([]byte, 64), make([]byte, 64)
		roundTrips := func(n int) {
			for i := range n {
				if _, err := c.Write(msg); err != nil {
					t.Fatalf("round trip %d: %v", i, err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					t.Fatalf("round trip %d: %v", i, err)
				}
			}
		}
		roundTrips(200) // netstack's pools and the timers fill
		const rounds = 2000
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		roundTrips(rounds)
		runtime.ReadMemStats(&after)
		// The whole process's count: stray allocations of the runtime and
		// the test framework stay far below one a round trip.
		if per := float64(after.Mallocs-before.Mallocs) / rounds; per > 0.5 {
			t.Errorf("%.2f allocations a round trip, want none", per)
		}
	})
}

// TestTCPGatherOneSegment: a send of several buffers (writev, sendmsg) is
// one send, as for the kernel: one segment when it fits (memcached's
// replies, a header, the value and "END" in one sendmsg, left as three
// segments, each acknowledged by the kernel peer), and a send of more
// buffers than one netstack Write takes arrives whole and in order.
func TestTCPGatherOneSegment(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		c, s := connectedPair(t, bed, st, 7403)
		sc := s.(*stack.TCPConn)
		send := func(bufs [][]byte) (segs uint64) {
			t.Helper()
			want := bytes.Join(bufs, nil)
			before := st.TCPCounters.TxSegments.Load()
			n, err := sc.WriteNonblock(bufs, false)
			for err == nil && n < len(want) {
				var k int
				k, err = sc.WriteNonblock([][]byte{want[n:]}, false)
				n += k
			}
			if err != nil {
				t.Fatalf("send of %d buffers: %v", len(bufs), err)
			}
			got := make([]byte, len(want))
			if _, err := io.ReadFull(c, got); err != nil {
				t.Fatalf("the kernel peer's read: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("the kernel peer read %q, want %q", got, want)
			}
			return st.TCPCounters.TxSegments.Load() - before
		}
		if segs := send([][]byte{[]byte("VALUE key 0 5\r\n"), []byte("hello"), {}, []byte("\r\nEND\r\n")}); segs != 1 {
			t.Errorf("a send of 4 buffers (31 bytes) left as %d segments, want 1", segs)
		}
		var many [][]byte
		for i := range 40 {
			many = append(many, []byte(fmt.Sprintf("<%02d>", i)))
		}
		if segs := send(many); segs > 3 {
			t.Errorf("a send of 40 buffers (160 bytes) left as %d segments, want at most 3 (16 buffers a write)", segs)
		}
	})
}

// TestTCPFragmentsNotSent: between the MTU coming down and netstack's
// segments shrinking, netstack's IP layer fragments its full segments,
// whose checksum it left to the link. With a backend that finishes
// checksums, no such fragment leaves (TxDropped): before, each fragment's
// checksum was finished as if it were a whole segment, into the data of
// those after the first, and a kernel reader took 1 MB altered (stalled,
// on the tuned bed). Once the segments shrink, the transfer completes
// intact.
func TestTCPFragmentsNotSent(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		c, s := connectedPair(t, bed, st, 7431)
		sc := s.(*stack.TCPConn)
		stack.HoldShrink(true)
		defer stack.HoldShrink(false)
		for _, side := range []testbed.Side{testbed.A, testbed.B} {
			mustRun(t, bed, side, "ip", "link", "set", bed.Link(side), "mtu", "1280")
		}
		eventually(t, "the stack sees MTU 1280", func() bool { return sc.Info().Advmss <= 1280-40 })
		dropped := st.TCPCounters.TxDropped.Load()
		data := make([]byte, 1<<20)
		for i := range data {
			data[i] = byte(i * 7)
		}
		go s.Write(data)
		got := make([]byte, len(data))
		c.SetReadDeadline(time.Now().Add(time.Second))
		n, _ := io.ReadFull(c, got)
		if !bytes.Equal(got[:n], data[:n]) {
			t.Fatalf("the first %d bytes arrived altered", n)
		}
		if be := st.Backends(); len(be) > 0 && be[0].TxChecksum() && st.TCPCounters.TxDropped.Load() == dropped {
			t.Errorf("no fragment was held back (TxDropped did not move); %d bytes arrived", n)
		}
		stack.HoldShrink(false)
		stack.ShrinkMSS(st)
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(c, got[n:]); err != nil {
			t.Fatalf("after %d bytes: %v", n, err)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("the data arrived altered")
		}
	})
}

// TestTCPMTUDown: the interface's MTU comes down under an established
// connection. netstack's segments shrink to fit (Stack.shrinkMSS), as the
// kernel's would: 1 MB then reaches the kernel reader intact with no IP
// fragment. Before, netstack kept the segment size of its handshake and
// its IP layer fragmented every full segment (about 700 reassemblies on
// the reader's side).
func TestTCPMTUDown(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		c, s := connectedPair(t, bed, st, 7430)
		sc := s.(*stack.TCPConn)
		for _, side := range []testbed.Side{testbed.A, testbed.B} {
			mustRun(t, bed, side, "ip", "link", "set", bed.Link(side), "mtu", "1280")
		}
		eventually(t, "netstack's segments fit MTU 1280", func() bool { return sc.Info().Snd_mss <= 1280-40 })
		reasm := testutil.SNMPStat(t, bed, testbed.A, "Ip", "ReasmReqds")
		data := make([]byte, 1<<20)
		for i := range data {
			data[i] = byte(i * 7)
		}
		go s.Write(data)
		got := make([]byte, len(data))
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("the data arrived altered")
		}
		if n := testutil.SNMPStat(t, bed, testbed.A, "Ip", "ReasmReqds") - reasm; n != 0 {
			t.Errorf("the reader's kernel reassembled %d fragmented packets: segments larger than the MTU", n)
		}
	})
}

// TestTCPGRO: a kernel sender's stream of 4 MiB reaches a netstack
// reader intact, in fewer packets than segments: GRO merged runs of them
// (rx_merged), as the kernel's GRO merges the runs a NIC hands it. A
// request and its answer (one segment each, with PSH) merge with nothing.
func TestTCPGRO(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		c, s := connectedPair(t, bed, st, 7406)
		want := make([]byte, 4<<20)
		for i := range want {
			want[i] = byte(i * 7 / 13)
		}
		segs, merged := st.TCPCounters.RxSegments.Load(), st.TCPCounters.RxMerged.Load()
		errc := make(chan error, 1)
		go func() {
			_, err := c.Write(want)
			errc <- err
		}()
		s.SetReadDeadline(time.Now().Add(20 * time.Second))
		got := make([]byte, len(want))
		if _, err := io.ReadFull(s, got); err != nil {
			t.Fatalf("netstack's read: %v", err)
		}
		if err := <-errc; err != nil {
			t.Fatalf("the kernel's write: %v", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("netstack read other bytes than the kernel sent")
		}
		segs, merged = st.TCPCounters.RxSegments.Load()-segs, st.TCPCounters.RxMerged.Load()-merged
		t.Logf("4 MiB: %d segments, %d merged into the one before", segs, merged)
		if merged == 0 || merged >= segs {
			t.Errorf("4 MiB in %d segments: rx_merged %d, want some", segs, merged)
		}
		// Retransmissions of the stream's tail may still come (in make
		// test, 27 merged after it): the count starts once no segment
		// came for 100 ms.
		for n, deadline := st.TCPCounters.RxSegments.Load(), time.Now().Add(3*time.Second); time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			now := st.TCPCounters.RxSegments.Load()
			if now == n {
				break
			}
			n = now
		}
		merged = st.TCPCounters.RxMerged.Load()
		for i := range 20 {
			msg := []byte(fmt.Sprintf("request %d", i))
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(s, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("request %d: got %q, %v", i, got, err)
			}
		}
		if m := st.TCPCounters.RxMerged.Load() - merged; m != 0 {
			t.Errorf("20 requests, each read before the next: rx_merged %d, want 0", m)
		}
	})
}

// TestTCPDrainTakesOver: while a thread polls the queues for one
// connection, the drain goroutines leave the frames to it; once it stops,
// whether it says so (PollStop, as a receive about to sleep does) or just
// goes away, another connection that nobody polls gets its data (within
// the test's 2 s; the drains look every appPollCheck). The progress
// engine, which would drain the queues too, is off.
func TestTCPDrainTakesOver(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, &stack.Options{ProgressInterval: stack.ProgressNever})
		c1, s1 := connectedPair(t, bed, st, 7403)
		c2, s2 := connectedPair(t, bed, st, 7404)
		polled := s1.(*stack.TCPConn)
		msg, buf := []byte("request"), make([]byte, 64)
		pollFor := func() {
			polled.Polling()
			if _, err := c1.Write(msg); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(2 * time.Second); ; {
				polled.Polling()
				polled.Poll()
				if n, err := polled.ReadNonblock(buf, false); err == nil && n > 0 {
					return
				}
				if time.Now().After(deadline) {
					t.Fatal("the polling thread got nothing in 2 s")
				}
			}
		}
		other := func(how string) {
			if _, err := c2.Write(msg); err != nil {
				t.Fatal(err)
			}
			s2.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := io.ReadFull(s2, buf[:len(msg)]); err != nil {
				t.Fatalf("a connection nobody polls, after the polling thread %s: %v", how, err)
			}
		}
		drained, woken := st.TCPCounters.RxDrained.Load(), st.TCPCounters.DrainWakeups.Load()
		for range 20 {
			pollFor()
			other("went away")
			pollFor()
			polled.PollStop()
			other("said it stops")
		}
		if st.TCPCounters.RxDrained.Load() == drained || st.TCPCounters.DrainWakeups.Load() == woken {
			t.Errorf("rx_drained %d -> %d, drain_wakeups %d -> %d: the drains took the segments nobody polled for and do not count them",
				drained, st.TCPCounters.RxDrained.Load(), woken, st.TCPCounters.DrainWakeups.Load())
		}
	})
}

// TestDrainPollerIgnoresTransmit: the descriptor a drain goroutine waits
// on polls readable for a received frame, not for transmit completions.
// An AF_XDP socket in copy mode wakes its waiters at each completion;
// with the socket itself in Go's netpoller, which watches for writing
// too, a UDP sender with TCP offload on (iperf3 -u's client) woke it 8k
// times a second.
func TestDrainPollerIgnoresTransmit(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, &stack.Options{ProgressInterval: stack.ProgressNever})
		c, err := st.ListenUDP(netip.AddrPortFrom(bed.Addr(testbed.B), 7410))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		k := kernelConn(t, bed, netip.AddrPortFrom(bed.Addr(testbed.A), 7411).String())
		var pollers []func(time.Duration) (bool, error)
		for _, be := range st.Backends() {
			readable, closePoller, err := stack.Poller(be)
			if err != nil {
				t.Fatalf("%s: %v", be, err)
			}
			defer closePoller()
			pollers = append(pollers, readable)
		}
		anyReadable := func(wait time.Duration) bool {
			for _, readable := range pollers {
				r, err := readable(wait)
				if err != nil {
					t.Fatal(err)
				}
				if r {
					return true
				}
			}
			return false
		}
		if anyReadable(0) {
			t.Fatal("readable before any frame came")
		}
		msg := make([]byte, 64)
		const sent = 2000
		for range sent {
			if _, err := c.WriteToUDPAddrPort(msg, netip.AddrPortFrom(bed.Addr(testbed.A), 7411)); err != nil {
				t.Fatal(err)
			}
		}
		got := 0
		k.SetReadDeadline(time.Now().Add(time.Second))
		for ; got < sent; got++ {
			if _, _, err := k.ReadFrom(msg); err != nil {
				break
			}
		}
		if got == 0 {
			t.Fatal("the kernel receiver got none of the datagrams sent")
		}
		if anyReadable(50 * time.Millisecond) {
			t.Fatalf("readable after %d datagrams sent (%d received by the kernel) and none received: transmit completions wake the drain", sent, got)
		}
		if _, err := k.WriteTo(msg, net.UDPAddrFromAddrPort(netip.AddrPortFrom(bed.Addr(testbed.B), 7410))); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(2 * time.Second); !anyReadable(10 * time.Millisecond); {
			if time.Now().After(deadline) {
				t.Fatal("not readable 2 s after a datagram was sent to the stack")
			}
		}
		if _, _, _, err := c.RecvFrom(msg, 0, time.Now().Add(2*time.Second), nil, nil); err != nil {
			t.Fatalf("the datagram that made it readable: %v", err)
		}
	})
}

// TestUDPPollSaysSo: with TCP offload on, UDP receives and a
// multiplexer's polls of the queues say that an application thread polls
// them (notePoll), as a TCP receive does, so that the drain goroutines
// leave the frames to it; once it stops, they take them again. Without
// it, a program that receives UDP with TCP offload on (iperf3 -u's
// server) had the drains woken by Go's netpoller, on the other CPU, for
// the datagrams it was about to take itself: 0.66x-0.84x the kernel's
// rate against 1.03x-1.18x. Which of the two takes a frame is a race, so
// the test checks the word the drains go by.
func TestUDPPollSaysSo(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, &stack.Options{ProgressInterval: stack.ProgressNever})
		l := listenTCP(t, bed, st, netip.AddrPortFrom(bed.Addr(testbed.B), 7412)) // netstack and its drains
		defer l.Close()
		c, err := st.ListenUDP(netip.AddrPortFrom(bed.Addr(testbed.B), 7413))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b := make([]byte, 64)
		idle := func(after string) {
			t.Helper()
			time.Sleep(2 * stack.AppPollRecent)
			if stack.AppPolling(st) {
				t.Fatalf("an application thread polls %v after %s", 2*stack.AppPollRecent, after)
			}
		}
		idle("the stack opened")
		// Three tries, as a thread descheduled for appPollRecent between
		// its polls and the look polls no more.
		says := func(poll func()) bool {
			for range 3 {
				for range 16 {
					poll()
				}
				if stack.AppPolling(st) {
					return true
				}
			}
			return false
		}
		if !says(func() {
			if _, _, _, err := c.RecvFrom(b, stack.RecvNonblock, time.Time{}, nil, nil); !errors.Is(err, unix.EAGAIN) {
				t.Fatalf("a receive with nothing sent: %v", err)
			}
		}) {
			t.Error("16 non-blocking UDP receives in a row did not say that the thread polls")
		}
		idle("the receives")
		if !says(func() { st.Poll() }) {
			t.Error("16 polls of the queues in a row did not say that the thread polls")
		}
		idle("the polls")
	})
}

// exchange writes size bytes in chunks of chunk on c and reads them back.
func exchange(c net.Conn, size, chunk, seed int) error {
	c.SetDeadline(time.Now().Add(20 * time.Second))
	want := make([]byte, size)
	for i := range want {
		want[i] = byte(i*31 + seed)
	}
	errc := make(chan error, 1)
	go func() {
		for off := 0; off < size; off += chunk {
			if _, err := c.Write(want[off:min(size, off+chunk)]); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	got := make([]byte, size)
	if _, err := io.ReadFull(c, got); err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	if err := <-errc; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, want) {
		return errors.New("echo differs from what was sent")
	}
	return nil
}

// moveToKernel moves c to a kernel socket (ToKernel, in bed's side B),
// shows its fd to inspect (if not nil) as ToKernel made it (net.FileConn
// sets Go's keepalive), and returns it as a net.Conn that closes with t.
// The fd goes through its os.File, whose finalizer would otherwise close
// the number again once another socket of the test has it.
func moveToKernel(t *testing.T, bed *testbed.Bed, c *stack.TCPConn, inspect func(fd int)) net.Conn {
	t.Helper()
	var fd int
	if err := bed.Do(testbed.B, func() (err error) {
		fd, err = c.ToKernel()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if inspect != nil {
		inspect(fd)
	}
	f := os.NewFile(uintptr(fd), "moved to the kernel")
	defer f.Close()
	kc, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kc.Close() })
	return kc
}

// TestTCPToKernel: an established connection moves to a kernel socket
// (TCP_REPAIR) and goes on there, both ways, with the bytes netstack had
// received and nobody read, the peer none the wiser; one with bytes not
// yet acknowledged stays netstack's.
func TestTCPToKernel(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := bedStackOnBed(t, bed)
		c, s := connectedPair(t, bed, st, 7426)
		sc := s.(*stack.TCPConn)
		for i := range 3 { // a few round trips: sequence numbers move on, windows scale
			msg := bytes.Repeat([]byte{byte('a' + i)}, 3000)
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(s, got); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write(got); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("round trip %d: %v", i, err)
			}
		}
		unread := []byte("received by netstack, read from the kernel")
		if _, err := c.Write(unread); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(2 * time.Second); sc.Unread() < len(unread); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("netstack never had the unread bytes")
			}
		}
		// Options the server set on the connection go with it.
		for _, o := range [][3]int{{unix.IPPROTO_TCP, unix.TCP_NODELAY, 1}, {unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1}, {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 33}, {unix.IPPROTO_IP, unix.IP_TOS, 0x10}} {
			if err := sc.SetOption(o[0], o[1], o[2]); err != nil {
				t.Fatal(err)
			}
		}
		sc.SetLinger(true, 7)
		segs := testutil.SNMPStat(t, bed, testbed.B, "Tcp", "InSegs")
		kc := moveToKernel(t, bed, sc, func(fd int) {
			for _, o := range [][3]int{{unix.IPPROTO_TCP, unix.TCP_NODELAY, 1}, {unix.SOL_SOCKET, unix.SO_KEEPALIVE, 1}, {unix.IPPROTO_TCP, unix.TCP_KEEPIDLE, 33}, {unix.IPPROTO_IP, unix.IP_TOS, 0x10}} {
				if v, err := unix.GetsockoptInt(fd, o[0], o[1]); err != nil || v != o[2] {
					t.Errorf("the kernel socket's option %d/%d: %d, %v; want %d, as set on the connection", o[0], o[1], v, err, o[2])
				}
			}
			if l, err := unix.GetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER); err != nil || l.Onoff == 0 || l.Linger != 7 {
				t.Errorf("the kernel socket's SO_LINGER: %+v, %v; want on, 7 s", l, err)
			}
		})
		kc.SetDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, len(unread))
		if _, err := io.ReadFull(kc, got); err != nil || !bytes.Equal(got, unread) {
			t.Fatalf("the kernel socket read %q, %v; want what netstack held", got, err)
		}
		if a, b := kc.LocalAddr().String(), c.RemoteAddr().String(); a != b {
			t.Errorf("the kernel socket is %s, the peer talks to %s", a, b)
		}
		big := bytes.Repeat([]byte("to and fro "), 100_000) // more than the windows
		go kc.Write(big)
		back := make([]byte, len(big))
		if _, err := io.ReadFull(c, back); err != nil || !bytes.Equal(back, big) {
			t.Fatalf("the peer read %d bytes from the kernel socket, %v", len(back), err)
		}
		if _, err := c.Write(big); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(kc, back); err != nil || !bytes.Equal(back, big) {
			t.Fatalf("the kernel socket read the peer's 1.1 MB: %v", err)
		}
		if n := testutil.SNMPStat(t, bed, testbed.B, "Tcp", "InSegs") - segs; n == 0 {
			t.Error("the kernel took no segment: the connection did not move")
		}
		kc.Close()
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.Read(back); n != 0 || err != io.EOF {
			t.Errorf("the peer after the kernel socket's close: %d, %v; want EOF", n, err)
		}

		// A peer that sent its last words and its FIN (CLOSE-WAIT): the
		// kernel socket reads them, then the end of the stream, and its
		// answer reaches the peer.
		c3, s3 := connectedPair(t, bed, st, 7428)
		if _, err := c3.Write(unread); err != nil {
			t.Fatal(err)
		}
		if err := c3.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		sc3 := s3.(*stack.TCPConn)
		for deadline := time.Now().Add(2 * time.Second); sc3.StateName() != "CLOSE-WAIT"; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the connection is %s 2 s after the peer's FIN", sc3.StateName())
			}
		}
		kc3 := moveToKernel(t, bed, sc3, nil)
		kc3.SetDeadline(time.Now().Add(5 * time.Second))
		if all, err := io.ReadAll(kc3); err != nil || !bytes.Equal(all, unread) {
			t.Fatalf("the kernel socket in CLOSE-WAIT read %q, %v; want the last words, then the end", all, err)
		}
		if _, err := io.WriteString(kc3, "answer"); err != nil {
			t.Fatal(err)
		}
		kc3.Close()
		c3.SetReadDeadline(time.Now().Add(2 * time.Second))
		if all, err := io.ReadAll(c3); err != nil || string(all) != "answer" {
			t.Errorf("the peer got %q, %v from the kernel socket in CLOSE-WAIT; want the answer, then the end", all, err)
		}

		// A connection the stack dialled, whose local port a kernel
		// socket of the stack held: the kernel socket takes the port over.
		var kl net.Listener
		if err := bed.Do(testbed.A, func() (err error) {
			kl, err = net.Listen("tcp4", netip.AddrPortFrom(bed.Addr(testbed.A), 7429).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer kl.Close()
		echoTCP(kl)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var dc *stack.TCPConn
		if err := bed.Do(testbed.B, func() (err error) {
			dc, err = st.DialTCP(ctx, netip.AddrPortFrom(bed.Addr(testbed.A), 7429))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		kd := moveToKernel(t, bed, dc, nil)
		if err := exchange(kd, 1<<20, 64<<10, 7); err != nil {
			t.Errorf("a dialled connection on its kernel socket: %v", err)
		}
		kd.Close()

		// Unacknowledged bytes stay netstack's: a peer that reads nothing.
		// The connection goes on as it was, its unread bytes still there.
		c2, s2 := connectedPair(t, bed, st, 7427)
		if _, err := c2.Write(unread); err != nil {
			t.Fatal(err)
		}
		go s2.Write(big)
		time.Sleep(100 * time.Millisecond)
		if err := bed.Do(testbed.B, func() error {
			_, err := s2.(*stack.TCPConn).ToKernel()
			return err
		}); !errors.Is(err, stack.ErrUnsent) {
			t.Errorf("to the kernel with 1.1 MB unread by the peer: %v, want ErrUnsent", err)
		}
		s2.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := io.ReadFull(s2, got); err != nil || !bytes.Equal(got, unread) {
			t.Errorf("after a move that did not happen, the connection read %q, %v; want its unread bytes", got, err)
		}
	})
}

// TestTCPPushAtClose: what TCP_CORK holds back leaves with the FIN of a
// shutdown or a close, as the kernel sends it, not when netstack's cork
// timer (200 ms) fires: nginx (tcp_nopush) answered each HTTP/1.0
// request 200 ms late. Best of three tries, a loaded machine being slow
// at times; every try takes the timer's 200 ms when the FIN waits.
func TestTCPPushAtClose(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := bedStackOnBed(t, bed)
		laddr := netip.AddrPortFrom(bed.Addr(testbed.B), 7425)
		l := listenTCP(t, bed, st, laddr)
		defer l.Close()
		for _, how := range []string{"shutdown", "close"} {
			var took []time.Duration
			for len(took) < 3 {
				c, s := acceptOne(t, bed, l, laddr)
				sc := s.(*stack.TCPConn)
				if err := sc.SetOption(unix.IPPROTO_TCP, unix.TCP_CORK, 1); err != nil {
					t.Fatal(err)
				}
				msg := []byte("an answer shorter than a segment")
				start := time.Now()
				if _, err := sc.Write(msg); err != nil {
					t.Fatal(err)
				}
				if how == "shutdown" {
					if err := sc.Shutdown(unix.SHUT_WR); err != nil {
						t.Fatal(err)
					}
					if v, err := sc.Option(unix.IPPROTO_TCP, unix.TCP_CORK); err != nil || v != 1 {
						t.Errorf("TCP_CORK after shutdown: %d, %v; want 1 still, as the application set it", v, err)
					}
					// The endpoint stays uncorked: given the cork back,
					// netstack held what the peer's window had not let
					// go yet for good once its uncorking had disarmed
					// the cork timer (nginx's lingering close under
					// load, TestRunTCPNginx: 6 runs in 30).
					if stack.EndpointCorked(sc) {
						t.Error("the endpoint is corked again after the shutdown: what the window holds back would wait for a disarmed cork timer")
					}
					if err := sc.SetOption(unix.IPPROTO_TCP, unix.TCP_CORK, 0); err != nil {
						t.Fatal(err)
					}
					if v, err := sc.Option(unix.IPPROTO_TCP, unix.TCP_CORK); err != nil || v != 0 {
						t.Errorf("TCP_CORK set to 0 after shutdown: reads %d, %v", v, err)
					}
				} else {
					sc.Close()
				}
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				got, err := io.ReadAll(c)
				d := time.Since(start)
				c.Close()
				s.Close()
				if err != nil || !bytes.Equal(got, msg) {
					t.Fatalf("%s: the kernel reader got %q, %v", how, got, err)
				}
				if d < 150*time.Millisecond {
					break
				}
				took = append(took, d)
			}
			if len(took) == 3 {
				t.Errorf("%s with TCP_CORK on: the data and FIN took %v in three tries (netstack's cork timer is 200 ms)", how, took)
			}
		}
	})
}

// TestTCPDeferAccept: a netstack listener whose kernel half has
// TCP_DEFER_ACCEPT, set before listen or (SetDeferAccept, as the engine
// passes it on) after, gives out a connection only once its first data
// came, as the kernel's listener does (nginx's "deferred" sets it after
// listen); without, at the handshake.
func TestTCPDeferAccept(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := bedStackOnBed(t, bed)
		for i, how := range []string{"unset", "before listen", "after listen"} {
			deferred := how != "unset"
			laddr := netip.AddrPortFrom(bed.Addr(testbed.B), uint16(7420+i))
			var kfd int
			var nl *stack.NetstackListener
			if err := bed.Do(testbed.B, func() (err error) {
				if kfd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
					return err
				}
				unix.SetsockoptInt(kfd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
				if err := unix.Bind(kfd, &unix.SockaddrInet4{Port: int(laddr.Port()), Addr: laddr.Addr().As4()}); err != nil {
					return err
				}
				if err := unix.Listen(kfd, 8); err != nil {
					return err
				}
				if how == "before listen" {
					if err := unix.SetsockoptInt(kfd, unix.IPPROTO_TCP, unix.TCP_DEFER_ACCEPT, 1); err != nil {
						return err
					}
				}
				nl, err = st.ListenNetstack(laddr, kfd)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer unix.Close(kfd)
			defer nl.Close()
			if how == "after listen" {
				nl.SetDeferAccept(1)
			}
			c, err := dialFromA(bed, laddr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			time.Sleep(300 * time.Millisecond)
			switch pending := nl.Pending(); {
			case deferred && pending:
				t.Fatalf("TCP_DEFER_ACCEPT %s: a connection is given out to accept before its first data", how)
			case !deferred && !pending:
				t.Fatal("no connection to accept 300 ms after its handshake")
			}
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
			var a *stack.TCPConn
			for deadline := time.Now().Add(2 * time.Second); a == nil; time.Sleep(5 * time.Millisecond) {
				if a, err = nl.Accept(); err != nil && !errors.Is(err, unix.EAGAIN) {
					t.Fatal(err)
				}
				if a == nil && time.Now().After(deadline) {
					t.Fatalf("TCP_DEFER_ACCEPT %s: nothing to accept 2 s after the first data", how)
				}
			}
			a.SetReadDeadline(time.Now().Add(2 * time.Second))
			b := make([]byte, 1)
			if _, err := io.ReadFull(a, b); err != nil || b[0] != 'x' {
				t.Fatalf("TCP_DEFER_ACCEPT %s: the accepted connection read %q, %v", how, b, err)
			}
			a.Close()
		}
	})
}

// TestTCPListenKernelClients: a listener on the stack serves kernel-stack
// clients of the peer namespace through netstack, with the kernel's TCP
// on the stack's side untouched, and clients of its own namespace (over
// loopback) through its kernel socket; once closed, connecting is
// refused as by the kernel.
func TestTCPListenKernelClients(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		bed, st := bedStackOnBed(t, bed)
		laddr := netip.AddrPortFrom(bed.Addr(testbed.B), 7100)
		l := listenTCP(t, bed, st, laddr)
		served := echoTCP(l)
		inSegs := testutil.SNMPStat(t, bed, testbed.B, "Tcp", "InSegs")
		csumErrs := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "InCsumErrors")

		const conns = 8
		errs := make(chan error, conns)
		err := bed.Do(testbed.A, func() error {
			for i := range conns {
				c, err := net.DialTimeout("tcp4", laddr.String(), 5*time.Second)
				if err != nil {
					return err
				}
				go func() {
					defer c.Close()
					size, chunk := 14*1000, 14 // small messages
					if i%2 == 1 {
						size, chunk = 1<<20, 64<<10 // 64 KB writes
					}
					errs <- exchange(c, size, chunk, i)
				}()
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		for range conns {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if d := testutil.SNMPStat(t, bed, testbed.B, "Tcp", "InSegs") - inSegs; d != 0 {
			t.Errorf("the kernel's TCP on the stack's side took %d segments: not offloaded", d)
		}
		if d := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "InCsumErrors") - csumErrs; d != 0 {
			t.Errorf("the clients' kernel counted %d TCP checksum errors in what netstack sent", d)
		}
		if st.TCPCounters.RxSegments.Load() == 0 || st.TCPCounters.TxSegments.Load() == 0 {
			t.Errorf("netstack saw no segments: rx %d tx %d", st.TCPCounters.RxSegments.Load(), st.TCPCounters.TxSegments.Load())
		}
		if bed.Plain && st.Counters.RxPartialChecksum.Load() == 0 {
			t.Error("plain bed: no partial checksum counted, though the kernel client's link offloads them")
		}

		// Loopback: the kernel socket's share.
		if err := bed.Do(testbed.B, func() error {
			c, err := net.DialTimeout("tcp4", laddr.String(), 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			return exchange(c, 4096, 100, 99)
		}); err != nil {
			t.Fatalf("loopback client: %v", err)
		}

		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		served.Wait()
		err = bed.Do(testbed.A, func() error {
			c, err := net.DialTimeout("tcp4", laddr.String(), 5*time.Second)
			if err == nil {
				c.Close()
				return errors.New("connected to a closed listener")
			}
			if !errors.Is(err, unix.ECONNREFUSED) {
				return fmt.Errorf("connect after close: %w, want connection refused", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("netstack segments rx %d tx %d, tx dropped %d, partial checksums %d",
			st.TCPCounters.RxSegments.Load(), st.TCPCounters.TxSegments.Load(), st.TCPCounters.TxDropped.Load(), st.Counters.RxPartialChecksum.Load())
	})
}

// awaitRules waits until the stack's steering program holds n rules.
func awaitRules(t *testing.T, st *stack.Stack, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for st.Program().RuleCount() != n && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if got := st.Program().RuleCount(); got != n {
		t.Fatalf("%d steering rules, want %d: %v", got, n, st.Program().Rules())
	}
}

// TestTCPDialKernelServer: a connection the stack opens to a kernel-stack
// server carries data both ways through netstack, with the kernel's TCP
// on the stack's side untouched; its rule and port go once it is closed;
// a port nobody listens on refuses, as from the kernel.
func TestTCPDialKernelServer(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		bed, st := bedStackOnBed(t, bed)
		var kl net.Listener
		if err := bed.Do(testbed.A, func() (err error) {
			kl, err = net.Listen("tcp4", netip.AddrPortFrom(bed.Addr(testbed.A), 7200).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		served := echoTCP(kl)
		rules := st.Program().RuleCount()
		inSegs := testutil.SNMPStat(t, bed, testbed.B, "Tcp", "InSegs")
		outSegs := testutil.SNMPStat(t, bed, testbed.B, "Tcp", "OutSegs")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for i, sz := range []struct{ size, chunk int }{{14 * 500, 14}, {1 << 20, 64 << 10}} {
			var c *stack.TCPConn
			if err := bed.Do(testbed.B, func() (err error) {
				c, err = st.DialTCP(ctx, netip.AddrPortFrom(bed.Addr(testbed.A), 7200))
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if v, err := c.Option(unix.IPPROTO_TCP, unix.TCP_NODELAY); v != 1 || err != nil {
				t.Errorf("TCP_NODELAY of a dialled connection: %d, %v; want 1, as Go's net sets it", v, err)
			}
			if err := exchange(c, sz.size, sz.chunk, i); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if d := testutil.SNMPStat(t, bed, testbed.B, "Tcp", "InSegs") - inSegs; d != 0 {
			t.Errorf("the kernel's TCP on the stack's side took %d segments: not offloaded", d)
		}
		if d := testutil.SNMPStat(t, bed, testbed.B, "Tcp", "OutSegs") - outSegs; d != 0 {
			t.Errorf("the kernel's TCP on the stack's side sent %d segments: not offloaded", d)
		}
		// The stack closed first: its side waits in TIME_WAIT, as the
		// kernel's would, with the rule in place.
		if got := st.Program().RuleCount(); got != rules+2 {
			t.Errorf("%d rules after close, want %d (two connections in TIME_WAIT)", got, rules+2)
		}
		err := bed.Do(testbed.B, func() error {
			_, err := st.DialTCP(ctx, netip.AddrPortFrom(bed.Addr(testbed.A), 7201))
			return err
		})
		if !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("dial to a closed port: %v, want connection refused", err)
		}
		kl.Close()
		served.Wait()
	})
}

// TestTCPDialUnresolved: a connect to a host of the subnet nobody holds
// returns at once, as the kernel's does (its SYN waits for ARP in the
// link), and fails with EHOSTUNREACH once the kernel gives up on the
// neighbour (three requests, 100 ms apart here): netstack hears of it as
// the kernel's sockets do, by an ICMP host unreachable.
func TestTCPDialUnresolved(t *testing.T) {
	bed, st := bedStack(t, nil)
	testutil.ARPRetrans(t, bed, testbed.B, 100*time.Millisecond)
	a := bed.Addr(testbed.A).As4()
	a[3] = 99
	to := netip.AddrPortFrom(netip.AddrFrom4(a), 7202)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	var took time.Duration
	err := bed.Do(testbed.B, func() error {
		kfd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		c, err := st.ConnectTCP(kfd, to)
		took = time.Since(start)
		if err != nil {
			unix.Close(kfd)
			return err
		}
		c.Close()
		_, err = st.DialTCP(ctx, to)
		return err
	})
	if took > 200*time.Millisecond {
		t.Errorf("ConnectTCP took %v: it waited for ARP", took)
	}
	if !errors.Is(err, unix.EHOSTUNREACH) {
		t.Errorf("dial %s: %v, want EHOSTUNREACH", to, err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the dial failed after %v, where the kernel gives up after 300 ms", d)
	}
	if n := st.Counters.NeighUnresolved.Load(); n == 0 {
		t.Errorf("NeighUnresolved is 0")
	}
}

// TestTCPConnsOutliveListener: accepted connections keep working after
// their listener closes, and a stream of connect, exchange and close
// (the client closing first) leaves no rule, goroutine or kernel socket
// behind.
func TestTCPConnsOutliveListener(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		laddr := netip.AddrPortFrom(bed.Addr(testbed.B), 7300)
		l := listenTCP(t, bed, st, laddr)
		rules := st.Program().RuleCount()
		c, s := acceptOne(t, bed, l, laddr)
		if _, off := s.(*stack.TCPConn); !off {
			t.Fatalf("accepted %T, want an offloaded *stack.TCPConn", s)
		}
		l.Close()
		copied := make(chan struct{})
		go func() {
			io.Copy(s, s)
			s.Close() // after the client's FIN: no TIME_WAIT on this side
			close(copied)
		}()
		if err := exchange(c, 100000, 1000, 7); err != nil {
			t.Fatalf("after the listener closed: %v", err)
		}
		c.Close()
		<-copied
		awaitRules(t, st, rules-1)

		// A stream of short connections.
		l = listenTCP(t, bed, st, laddr)
		defer l.Close()
		served := echoTCP(l)
		goroutines := runtime.NumGoroutine()
		const cycles = 300
		err := bed.Do(testbed.A, func() error {
			for i := range cycles {
				c, err := net.DialTimeout("tcp4", laddr.String(), 5*time.Second)
				if err != nil {
					return fmt.Errorf("cycle %d: %w", i, err)
				}
				err = exchange(c, 64, 64, i)
				c.Close()
				if err != nil {
					return fmt.Errorf("cycle %d: %w", i, err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		awaitRules(t, st, rules)
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > goroutines+2 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > goroutines+2 {
			t.Errorf("%d goroutines after %d connections, %d before", n, cycles, goroutines)
		}
		l.Close()
		served.Wait()
	})
}

// TestTCPChannelsGrow: netstack's traffic keeps flowing when the stack
// takes on a queue that ethtool -L adds while a listener runs.
func TestTCPChannelsGrow(t *testing.T) {
	bed, st := bedStackOn(t, &testbed.Options{Plain: true}, nil)
	laddr := netip.AddrPortFrom(bed.Addr(testbed.B), 7500)
	l := listenTCP(t, bed, st, laddr)
	served := echoTCP(l)
	dial := func(seed int) {
		t.Helper()
		if err := bed.Do(testbed.A, func() error {
			c, err := net.DialTimeout("tcp4", laddr.String(), 5*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			return exchange(c, 10000, 100, seed)
		}); err != nil {
			t.Fatal(err)
		}
	}
	dial(1)
	mustRun(t, bed, testbed.B, "ethtool", "-L", bed.Link(testbed.B), "rx", "2")
	eventually(t, "the stack serves the second queue", func() bool { return len(st.Backends()) == 2 })
	time.Sleep(300 * time.Millisecond) // past a tick of the drains' watcher
	for i := range 8 {
		dial(2 + i)
	}
	if n := st.TCPCounters.DrainErrors.Load(); n != 0 {
		t.Errorf("%d queues without a drain", n)
	}
	l.Close()
	served.Wait()
}

// TestTCPAcksCarried: the acknowledgement of a request rides on its
// answer, as the kernel's delayed ACK does: a kernel client's request and
// netstack's answer cost the client's kernel one segment, not a bare ACK
// and the answer. A request nobody answers is still acknowledged, once
// the hold is over, whatever another connection sends meanwhile: the
// client's kernel sends nothing again.
func TestTCPAcksCarried(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		// The longest hold (VMAXDP_TX_KICK_DELAY 1 ms): the default's
		// 20 us would let the bulk transfer's ACKs go on their timer
		// anyway, whatever the rule it checks.
		_, st := stackOn(t, bed, &stack.Options{TxKickDelay: time.Millisecond})
		c, s := connectedPair(t, bed, st, 7400)
		s.SetDeadline(time.Now().Add(20 * time.Second))

		// Answered requests.
		const rounds = 300
		served := make(chan error, 1)
		go func() {
			b := make([]byte, 16)
			for range rounds {
				if _, err := io.ReadFull(s, b); err != nil {
					served <- err
					return
				}
				if _, err := s.Write(b); err != nil {
					served <- err
					return
				}
			}
			served <- nil
		}()
		outBefore := s.(*stack.TCPConn).Info().Segs_out
		segs, got := askEach(t, bed, st, c, rounds, served)
		out := int(s.(*stack.TCPConn).Info().Segs_out - outBefore)
		t.Logf("%d requests: the client's kernel took %d segments; %d acknowledgements rode on answers; TCP_INFO says %d segments out", rounds, segs, got, out)
		// An answer later than the hold lets its ACK go alone: a loaded
		// machine may delay some.
		if segs > rounds*3/2 || got < rounds/2 {
			t.Errorf("%d requests cost the client's kernel %d segments, %d acknowledgements carried: want about one segment a request", rounds, segs, got)
		}
		// TCP_INFO (and vmaxdp stats) count the segments that left, not
		// the ACKs carried: netstack counted those sent too (600 for
		// 300 requests). A segment still on the transmit ring, its kick
		// deferred, is counted here and not yet there.
		if out < segs || out > segs+3 {
			t.Errorf("TCP_INFO's segments out grew by %d, the client's kernel took %d: want them equal", out, segs)
		}

		// A bulk transfer: a bare ACK that acknowledges a full segment
		// more than the one held leaves at once in its place, as the
		// kernel acknowledges every second full segment; held, every
		// ACK would wait and then leave (one a segment).
		const bulk = 4 << 20
		drained := make(chan error, 1)
		go func() {
			_, err := io.CopyN(io.Discard, s, bulk)
			drained <- err
		}()
		inSegs := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "InSegs")
		outSegs := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "OutSegs")
		delayed := st.TCPCounters.AcksDelayed.Load()
		if _, err := c.Write(make([]byte, bulk)); err != nil {
			t.Fatal(err)
		}
		if err := <-drained; err != nil {
			t.Fatal(err)
		}
		acks := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "InSegs") - inSegs
		data := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "OutSegs") - outSegs
		waited := st.TCPCounters.AcksDelayed.Load() - delayed
		t.Logf("%d bytes in %d segments: %d acknowledgements, %d of them after their hold", bulk, data, acks, waited)
		// Measured before GRO: 2-4 of 24-54 waited with the rule, every
		// one without. With GRO netstack acknowledges a merged packet
		// at a time: 1-5 of 16-26 acknowledgements waited (3 runs, both
		// beds); under the race detector 2-15 of 33-44 (5), and 22 of 43 in
		// make test's race pass, where a drain that found one merged
		// packet met the next only after the hold; 48 of 60 in another
		// (2026-11-26), while three runs alone passed. Without the rule
		// every one still waits (57 of 57).
		if acks > data*3/4 || int(waited)*4 > acks*3 {
			timingError(t, "%d segments of a bulk transfer got %d acknowledgements, %d after their hold: want at most one for two, most not held to the end", data, acks, waited)
		}

		// A request nobody answers, while another connection's answers
		// leave: they carry their own connection's ACKs, never this one's.
		c2, s2 := connectedPair(t, bed, st, 7401)
		s2.SetDeadline(time.Now().Add(20 * time.Second))
		const others = 5
		go func() {
			b := make([]byte, 16)
			for range others {
				if _, err := io.ReadFull(s2, b); err != nil {
					return
				}
				if _, err := s2.Write(b); err != nil {
					return
				}
			}
		}()
		retrans := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "RetransSegs")
		if _, err := c.Write([]byte("unanswered")); err != nil {
			t.Fatal(err)
		}
		ask(t, c2, others)
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		unacked := -1
		for deadline := time.Now().Add(150 * time.Millisecond); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			raw.Control(func(fd uintptr) { unacked, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) })
			if unacked == 0 {
				break
			}
		}
		if unacked != 0 {
			t.Errorf("an unanswered request is unacknowledged after 150 ms (the kernel's first retransmission comes at 200 ms): %d bytes", unacked)
		}
		if d := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "RetransSegs") - retrans; d != 0 {
			t.Errorf("the client's kernel sent %d segments again", d)
		}
	})
}

// TestTCPPollerInline: an epoll set's poller processes the segments of
// its connections on the polling goroutine, an event loop's requests over
// two connections; once they are removed, none. A poller is alone while
// no other of its stack is open.
func TestTCPPollerInline(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		var clients []net.Conn
		var conns []*stack.TCPConn
		for port := uint16(7402); port < 7404; port++ {
			c, s := connectedPair(t, bed, st, port)
			clients = append(clients, c)
			conns = append(conns, s.(*stack.TCPConn))
		}
		p := st.NewTCPPoller()
		for _, c := range conns {
			p.Add(c)
		}
		if !p.Alone() {
			t.Error("the stack's only poller is not alone")
		}
		other := st.NewTCPPoller()
		if p.Alone() || other.Alone() {
			t.Error("two pollers of one stack say they are alone")
		}
		other.Close()
		other.Close()
		if !p.Alone() {
			t.Error("the other poller closed (twice), the first is not alone")
		}
		t.Cleanup(p.Close)
		const rounds = 100
		// loop serves rounds requests on each connection as an event loop:
		// poll, then read what each has.
		loop := func() error {
			runtime.LockOSThread() // as the application's thread is
			defer runtime.UnlockOSThread()
			b := make([]byte, 16)
			got := make([]int, len(conns))
			served := 0
			for deadline := time.Now().Add(10 * time.Second); served < rounds*len(conns); {
				if time.Now().After(deadline) {
					return fmt.Errorf("%d of %d requests served in 10 s", served, rounds*len(conns))
				}
				p.Poll()
				for i, c := range conns {
					n, err := c.ReadNonblock(b[got[i]:], false)
					if err != nil {
						if errors.Is(err, unix.EAGAIN) {
							continue
						}
						return fmt.Errorf("connection %d: %w", i, err)
					}
					if got[i] += n; got[i] == len(b) {
						got[i] = 0
						served++
						if _, err := c.WriteNonblock([][]byte{b}, false); err != nil {
							return fmt.Errorf("connection %d: answer: %w", i, err)
						}
					}
				}
			}
			p.PollStop()
			return nil
		}
		ask := func() {
			t.Helper()
			errs := make(chan error, 1)
			go func() { errs <- loop() }()
			b := make([]byte, 16)
			for r := range rounds {
				for i, c := range clients {
					binary.BigEndian.PutUint64(b, uint64(r))
					if _, err := c.Write(b); err != nil {
						t.Fatalf("connection %d request %d: %v", i, r, err)
					}
					if _, err := io.ReadFull(c, b); err != nil {
						t.Fatalf("connection %d answer %d: %v", i, r, err)
					}
				}
			}
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		inline := st.TCPCounters.RxInline.Load()
		ask()
		n := st.TCPCounters.RxInline.Load() - inline
		t.Logf("%d requests: %d segments processed on the polling goroutine", rounds*len(conns), n)
		if n == 0 {
			t.Errorf("%d requests, none processed on the polling goroutine", rounds*len(conns))
		}
		for i, c := range conns {
			if left := p.Remove(c); left != (i < len(conns)-1) {
				t.Errorf("Remove of connection %d of %d says connections are left: %v", i, len(conns), left)
			}
		}
		inline = st.TCPCounters.RxInline.Load()
		ask()
		if n := st.TCPCounters.RxInline.Load() - inline; n != 0 {
			t.Errorf("%d segments of connections removed from the poller were processed on its goroutine", n)
		}
	})
}

// ask makes rounds requests of 16 bytes on c and reads each one's answer.
func ask(t *testing.T, c net.Conn, rounds int) {
	t.Helper()
	b := make([]byte, 16)
	for i := range rounds {
		if _, err := c.Write(b); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if _, err := io.ReadFull(c, b); err != nil {
			t.Fatalf("answer %d: %v", i, err)
		}
	}
}

// askEach makes rounds requests of 16 bytes on c, a kernel client on side
// A, reading each one's answer, then waits for the server's verdict; it
// returns the segments the client's kernel took meanwhile and the
// acknowledgements st's link did not send, answers carrying them.
func askEach(t *testing.T, bed *testbed.Bed, st *stack.Stack, c net.Conn, rounds int, served <-chan error) (segs int, carried uint64) {
	t.Helper()
	inSegs := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "InSegs")
	before := st.TCPCounters.AcksCarried.Load()
	ask(t, c, rounds)
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	return testutil.SNMPStat(t, bed, testbed.A, "Tcp", "InSegs") - inSegs, st.TCPCounters.AcksCarried.Load() - before
}

// sentByNetstack is netstack's count of the segments it sent: built and
// handed to the link, which drops the held ACKs an answer carries.
func sentByNetstack(t *testing.T, st *stack.Stack) uint64 {
	t.Helper()
	n, ok := st.Netstack()
	if !ok {
		t.Fatal("the stack has no netstack")
	}
	return n.SegmentsSent
}

// offCPU is the wall-clock time less the calling thread's CPU time: for
// a thread that never blocks, the time the scheduler kept it off the CPU.
// (The kernel here keeps no run delay in /proc/thread-self/schedstat, and
// an involuntary switch count counts the few microseconds of each wakeup
// of netstack's goroutines.)
func offCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(monotime()) - time.Duration(ts.Nano())
}

// monotime reads CLOCK_MONOTONIC in nanoseconds.
func monotime() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// holdMiss says how a run of TestTCPPollerHoldsAcks misses its bar, or
// "": each request the loop served without being preempted costs the
// client's kernel one segment, the answer that carries its ACK, in three
// of four; a preempted request may cost two.
func holdMiss(rounds, preempted, segs int, carried uint64) string {
	held := rounds - preempted
	if segs-rounds > preempted+held/4 || int(carried) < held*3/4 {
		return fmt.Sprintf("%d requests (%d preempted) cost the client's kernel %d segments, %d acknowledgements carried: want one segment a request", rounds, preempted, segs, carried)
	}
	return ""
}

// timingError fails t for an outcome that depends on how long the steps
// take, which the race detector's build only logs (raceEnabled).
func timingError(t *testing.T, format string, args ...any) {
	t.Helper()
	if raceEnabled {
		t.Logf("race detector's build, not a failure: "+format, args...)
		return
	}
	t.Errorf(format, args...)
}

// TestTCPPollerHoldsAcks: an event loop's acknowledgements wait for its
// answers however long it works on a request, as long as it does not
// wait again (TCPPoller.Wait: the engine's epoll_wait), and the drains
// leave it the frames that come while it works: each of a kernel
// client's requests costs its kernel one segment, the answer that
// carries the ACK. Before, the drains took the frames of a loop that
// polls once a wait, and a hold ended after the kick delay (20 us): a
// quarter of these answers, 100 us of work after their request, came
// after a bare ACK. A request left unanswered still has its ACK once the
// loop stops to sleep.
func TestTCPPollerHoldsAcks(t *testing.T) {
	const holdAttempts = 3
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		c, s := connectedPair(t, bed, st, 7404)
		sc := s.(*stack.TCPConn)
		p := st.NewTCPPoller()
		p.Add(sc)
		t.Cleanup(p.Close)
		const rounds = 200
		const work, idle = 100 * time.Microsecond, 50 * time.Microsecond
		busy := func(d time.Duration) {
			for end := time.Now().Add(d); time.Now().Before(end); {
			}
		}
		// serve answers n requests as an event loop does: poll, read,
		// work, answer; it reads the last without answering, and stops
		// to sleep. A writer loop answers once its next wait, which asks
		// for EPOLLOUT on the connection, says it may (redis-benchmark's
		// requests). It counts in preempted the requests during which the
		// scheduler kept its thread off the CPU for more than half of
		// appPollRecent (200 us): a hold need not outlast that.
		var preempted int
		serve := func(n int, answerLast, writer bool) error {
			runtime.LockOSThread() // as the application's thread is
			defer runtime.UnlockOSThread()
			defer p.PollStop()
			preempted = 0
			b := make([]byte, 16)
			for i := range n {
				off := offCPU()
				got := 0
				for deadline := time.Now().Add(5 * time.Second); got < len(b); {
					if time.Now().After(deadline) {
						return fmt.Errorf("request %d: %d of %d bytes in 5 s", i, got, len(b))
					}
					// A wait that polls once; when it gives nothing, the
					// loop is busy for a while (other connections): it
					// does not spin on its polls.
					p.Wait(nil)
					p.Poll()
					k, err := sc.ReadNonblock(b[got:], false)
					if err != nil && !errors.Is(err, unix.EAGAIN) {
						return fmt.Errorf("request %d: %w", i, err)
					}
					if got += k; k == 0 {
						busy(idle)
					}
				}
				if i == n-1 && !answerLast {
					return nil
				}
				busy(work)
				if writer {
					p.Wait([]*stack.TCPConn{sc})
					p.Poll()
				}
				if _, err := sc.WriteNonblock([][]byte{b}, false); err != nil {
					return fmt.Errorf("answer %d: %w", i, err)
				}
				if offCPU()-off > 100*time.Microsecond {
					preempted++
				}
			}
			return nil
		}
		// A loaded machine may hold the loop past appPollRecent or
		// maxHoldDelay now and then. Measured idle: 190-200 carried and
		// processed by the loop (144-151 carried and 78 processed
		// without Wait's mark and hold); beside two other packages'
		// tests: 151-200, and 145 once in CI. So a run that misses the
		// bar is measured again, up to holdAttempts times; without the
		// hold every run misses it. Under the race detector a wait takes
		// longer than appPollRecent, and the drains take over.
		//
		// The bar counts only the requests the loop worked on without
		// being preempted: CI once measured 117-136 of 200 processed by
		// the loop in three runs in a row, beside cmd/vmaxdp's tests.
		served := make(chan error, 1)
		// measure runs a measurement that misses the bar again, up to
		// holdAttempts times; one where the loop was preempted during
		// more than half the requests says little either way.
		measure := func(what string, run func() (miss string)) {
			measured := false
			var miss string
			for range holdAttempts {
				if miss = run(); preempted <= rounds/2 {
					measured = true
				}
				if miss == "" {
					return
				}
			}
			if !measured {
				t.Logf("%s: not measured: the loop was preempted during more than half the requests of each of %d runs", what, holdAttempts)
				return
			}
			timingError(t, "%s, in each of %d runs; the last: %s", what, holdAttempts, miss)
		}
		measure("an event loop", func() string {
			go func() { served <- serve(rounds, true, false) }()
			inline := st.TCPCounters.RxInline.Load()
			built := sentByNetstack(t, st)
			c.SetDeadline(time.Now().Add(20 * time.Second))
			segs, got := askEach(t, bed, st, c, rounds, served)
			in := st.TCPCounters.RxInline.Load() - inline
			built = sentByNetstack(t, st) - built
			t.Logf("%d requests answered %v after each: the client's kernel took %d segments; %d acknowledgements rode on answers; %d requests processed by the loop; netstack built %d segments; the loop was preempted during %d",
				rounds, work, segs, got, in, built, preempted)
			if miss := holdMiss(rounds, preempted, segs, got); miss != "" {
				return miss
			}
			if int(in) < (rounds-preempted)*3/4 {
				return fmt.Sprintf("the loop processed %d of %d requests (%d preempted): the drains took the rest while it worked", in, rounds, preempted)
			}
			// What the loop processed left its ACK owed (tcpinline.go):
			// netstack built the answers, not an ACK each to be dropped
			// as well (two segments a request before).
			if extra := int(built) - rounds; extra > rounds-int(in)+preempted {
				return fmt.Sprintf("netstack built %d segments for %d answers, %d requests processed by the loop: an ACK each that the answers carried", built, rounds, in)
			}
			return ""
		})
		// A writer loop: the wait before each answer keeps its ACK held.
		// Measured: 200 of 200 carried; 0 when every wait released them.
		measure("a writer loop", func() string {
			go func() { served <- serve(rounds, true, true) }()
			segs, got := askEach(t, bed, st, c, rounds, served)
			t.Logf("writer loop: %d requests: the client's kernel took %d segments; %d acknowledgements rode on answers; the loop was preempted during %d", rounds, segs, got, preempted)
			return holdMiss(rounds, preempted, segs, got)
		})

		retrans := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "RetransSegs")
		inSegs := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "InSegs")
		go func() { served <- serve(1, false, false) }()
		if _, err := c.Write(make([]byte, 16)); err != nil {
			t.Fatal(err)
		}
		if err := <-served; err != nil {
			t.Fatal(err)
		}
		acked := false
		for deadline := time.Now().Add(time.Second); !acked && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			acked = testutil.SNMPStat(t, bed, testbed.A, "Tcp", "InSegs") > inSegs
		}
		if !acked {
			t.Error("a request read and left unanswered got no acknowledgement within 1 s of the loop's sleep")
		}
		if n := testutil.SNMPStat(t, bed, testbed.A, "Tcp", "RetransSegs") - retrans; n != 0 {
			t.Errorf("the client sent the unanswered request %d more times", n)
		}
	})
}

// TestTCPPollInline: a receive that polls its connection (TCPConn.Poll,
// as the engine's polling receive does) drains the rings itself, and
// netstack processes the connection's segments on its goroutine
// (tcpinline.go): a kernel client's requests are answered, and counted in
// RxInline; their ACKs are owed, not built; each went straight to its
// connection (RxDirect).
func TestTCPPollInline(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		c, s := connectedPair(t, bed, st, 7401)
		sc := s.(*stack.TCPConn)

		const rounds = 200
		served := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // as the application's thread is
			b := make([]byte, 16)
			for i := range rounds {
				got := 0
				for deadline := time.Now().Add(5 * time.Second); got < len(b); {
					sc.Poll()
					n, err := sc.ReadNonblock(b[got:], false)
					switch {
					case err == nil && n == 0:
						served <- fmt.Errorf("request %d: end of stream", i)
						return
					case err != nil && !errors.Is(err, unix.EAGAIN):
						served <- fmt.Errorf("request %d: %w", i, err)
						return
					case time.Now().After(deadline):
						served <- fmt.Errorf("request %d: nothing in 5 s", i)
						return
					}
					got += n
				}
				if _, err := sc.WriteNonblock([][]byte{b}, false); err != nil {
					served <- fmt.Errorf("answer %d: %w", i, err)
					return
				}
			}
			served <- nil
		}()
		inline, direct := st.TCPCounters.RxInline.Load(), st.TCPCounters.RxDirect.Load()
		built := sentByNetstack(t, st)
		b := make([]byte, 16)
		for i := range rounds {
			binary.BigEndian.PutUint64(b, uint64(i))
			if _, err := c.Write(b); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			if _, err := io.ReadFull(c, b); err != nil {
				t.Fatalf("answer %d: %v", i, err)
			}
			if got := binary.BigEndian.Uint64(b); got != uint64(i) {
				t.Fatalf("answer %d: got %d", i, got)
			}
		}
		if err := <-served; err != nil {
			t.Fatal(err)
		}
		// The queue's drain goroutine, woken by Go's netpoller, races the
		// poll for each segment: it took 1-2 of 200 on an idle machine,
		// 168 under make test's load. Some must be the poll's.
		n := st.TCPCounters.RxInline.Load() - inline
		built = sentByNetstack(t, st) - built
		t.Logf("%d requests: %d segments processed on the polling goroutine; netstack built %d segments", rounds, n, built)
		if n == 0 {
			t.Errorf("%d requests, none processed on the polling goroutine", rounds)
		}
		// What the poll processed left its ACK owed, which the answer
		// carried (tcpinline.go): netstack built the answers, not an ACK
		// each as well (measured: 1-5 more than the requests the drain
		// processed, whose ACKs are built and held; 400 for 200 requests
		// when every ACK is built).
		if extra := int(built) - rounds; extra > rounds-int(n)+8 {
			t.Errorf("netstack built %d segments for %d answers, %d requests processed by the poll: an ACK each that the answers carried", built, rounds, n)
		}
		// Each request went straight to the connection's endpoint, past
		// netstack's IP layer and demuxer (deliverDirect), polled or not.
		if d := st.TCPCounters.RxDirect.Load() - direct; d < rounds {
			t.Errorf("%d requests, %d packets handed straight to their connection: want every one", rounds, d)
		}
	})
}

// TestTCPOwedSettledBesideInline: an event loop that polls several
// connections and never answers nor waits again leaves their ACKs owed,
// and owedTimer settles them, each 1 ms, while the loop's own polls hold
// endpoints for inline processing; neither waits for the other for good,
// and every byte the kernel clients send arrives. The settles once ran
// under the lock the loop takes to owe (a lock-order deadlock).
func TestTCPOwedSettledBesideInline(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		// Writes far apart enough that a poll finds a segment or two of a
		// connection, processed inline, for about a second.
		const conns, each = 4, 250_000 // each a multiple of the writes (100 bytes)
		p := st.NewTCPPoller()
		t.Cleanup(p.Close)
		clients := make([]net.Conn, conns)
		servers := make([]*stack.TCPConn, conns)
		for i := range conns {
			c, s := connectedPair(t, bed, st, uint16(7410+i))
			clients[i], servers[i] = c, s.(*stack.TCPConn)
			p.Add(servers[i])
		}
		sent := make(chan error, conns)
		for _, c := range clients {
			go func() {
				b := make([]byte, 100)
				var err error
				for n := 0; n < each && err == nil; n += len(b) {
					_, err = c.Write(b)
					time.Sleep(50 * time.Microsecond)
				}
				sent <- err
			}()
		}
		settled := st.TCPCounters.AcksDelayed.Load() + st.TCPCounters.AcksCarried.Load()
		inline := st.TCPCounters.RxInline.Load()
		runtime.LockOSThread() // as the application's thread is
		defer runtime.UnlockOSThread()
		got := make([]int, conns)
		b := make([]byte, 4096)
		for deadline := time.Now().Add(30 * time.Second); ; {
			p.Poll()
			total := 0
			for i, s := range servers {
				n, err := s.ReadNonblock(b, false)
				if err != nil && !errors.Is(err, unix.EAGAIN) {
					t.Fatalf("connection %d: %v", i, err)
				}
				got[i] += n
				total += got[i]
			}
			if total == conns*each {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("got %v of %d bytes each in 30 s", got, each)
			}
		}
		p.PollStop()
		for range conns {
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
		}
		n := st.TCPCounters.AcksDelayed.Load() + st.TCPCounters.AcksCarried.Load() - settled
		t.Logf("%d connections, %d bytes each: %d owed or held ACKs settled, %d segments processed inline", conns, each, n, st.TCPCounters.RxInline.Load()-inline)
		if n == 0 {
			t.Error("no ACK was settled: the loop owed none")
		}
	})
}

// TestTCPSetHoldsAcks: a connection in an epoll set that is not its
// stack's only one (TCPPoller.Alone false: a worker of memcached's, each
// with its set) is acknowledged by its answer, which the set's thread
// writes after the kick delay (20 us) and before maxHoldDelay. The drain
// goroutine processes its segments itself (rx_inline), leaving the ACK
// owed, not built: one segment built a request (two before, the ACK held
// and dropped when the answer carried it; before that, four of five of
// memcached's ACKs left on their own at the kick delay). The set's next
// wait lets go the ACK of a request its thread read and did not answer,
// at once, and keeps that of one it has not read yet.
func TestTCPSetHoldsAcks(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		c, s := connectedPair(t, bed, st, 7406)
		sc := s.(*stack.TCPConn)
		p, other := st.NewTCPPoller(), st.NewTCPPoller()
		t.Cleanup(p.Close)
		t.Cleanup(other.Close)
		p.Add(sc)
		if p.Alone() {
			t.Fatal("a poller beside another is alone")
		}
		b := make([]byte, 16)
		// read reads a request on the server.
		read := func(i int) {
			t.Helper()
			got := 0
			for deadline := time.Now().Add(5 * time.Second); got < len(b); runtime.Gosched() {
				if time.Now().After(deadline) {
					t.Fatalf("request %d: %d of %d bytes in 5 s", i, got, len(b))
				}
				k, err := sc.ReadNonblock(b[got:], false)
				if err != nil && !errors.Is(err, unix.EAGAIN) {
					t.Fatalf("request %d: %v", i, err)
				}
				got += k
			}
		}
		// request sends one from the client and reads it on the server.
		request := func(i int) {
			t.Helper()
			if _, err := c.Write(b); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			read(i)
		}
		const rounds = 50
		carried, delayed := st.TCPCounters.AcksCarried.Load(), st.TCPCounters.AcksDelayed.Load()
		inline, built := st.TCPCounters.RxInline.Load(), sentByNetstack(t, st)
		for i := range rounds {
			request(i)
			for end := time.Now().Add(200 * time.Microsecond); time.Now().Before(end); {
				// the worker's work; a sleep this short lasts a
				// millisecond or more (Go's netpoller waits in ms)
			}
			if _, err := sc.WriteNonblock([][]byte{b}, false); err != nil {
				t.Fatalf("answer %d: %v", i, err)
			}
			if _, err := io.ReadFull(c, b); err != nil {
				t.Fatalf("answer %d: %v", i, err)
			}
			p.Wait(nil)
		}
		carried, delayed = st.TCPCounters.AcksCarried.Load()-carried, st.TCPCounters.AcksDelayed.Load()-delayed
		inline, built = st.TCPCounters.RxInline.Load()-inline, sentByNetstack(t, st)-built
		t.Logf("%d requests answered 200 us after they came: %d ACKs carried, %d left on their own; %d processed by the drain, %d segments built",
			rounds, carried, delayed, inline, built)
		// A round whose thread the machine held off for a millisecond
		// lets its ACK go at maxHoldDelay.
		if carried < rounds*4/5 {
			t.Errorf("%d of %d ACKs carried by the answers, want %d or more", carried, rounds, rounds*4/5)
		}
		if inline < rounds*4/5 || built > rounds*6/5 {
			t.Errorf("%d requests: %d processed by the drain goroutine (want %d or more), %d segments built (want %d at most)", rounds, inline, rounds*4/5, built, rounds*6/5)
		}

		// Unread: the wait keeps its ACK. Read: the wait lets it go.
		delayed = st.TCPCounters.AcksDelayed.Load()
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(5 * time.Second); sc.Events()&stack.TCPReadable == 0; runtime.Gosched() {
			if time.Now().After(deadline) {
				t.Fatal("the request did not come in 5 s")
			}
		}
		p.Wait(nil)
		kept := st.TCPCounters.AcksDelayed.Load() - delayed
		read(rounds)
		p.Wait(nil)
		released := st.TCPCounters.AcksDelayed.Load() - delayed
		if kept != 0 || released != 1 {
			t.Errorf("ACKs let go by the set's waits: %d before the request was read (want 0), %d after (want 1)", kept, released)
		}
	})
}

// numbered is the i-th message of a coalescing test: 64 bytes that say
// their number.
func numbered(i int) []byte {
	b := bytes.Repeat([]byte{'.'}, 64)
	copy(b, fmt.Sprintf("message %06d", i))
	return b
}

// TestTCPCoalescedWrites: small writes of a connection that follow each
// other with no wait point between them go to netstack together
// (coalesce.go): 400 writes of 64 bytes leave as a few segments, not
// 400, and the kernel peer reads every byte in order. The first write
// after a wait point leaves at once, so a request-response exchange
// waits for nothing; a write shutdown sends what is coalesced before its
// FIN. The kick delay is an hour: only the writes and wait points send.
func TestTCPCoalescedWrites(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, &stack.Options{TxKickDelay: time.Hour})
		c, s := connectedPair(t, bed, st, 7404)
		sc := s.(*stack.TCPConn)
		write := func(i int) {
			t.Helper()
			if n, err := sc.WriteNonblock([][]byte{numbered(i)}, false); n != 64 || err != nil {
				t.Fatalf("write %d: %d, %v", i, n, err)
			}
		}
		const writes = 400
		sc.WaitPoint()
		before := st.TCPCounters.TxSegments.Load()
		for i := range writes {
			write(i)
		}
		sc.WaitPoint()
		segs := st.TCPCounters.TxSegments.Load() - before
		got := make([]byte, writes*64)
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("the kernel peer's read: %v", err)
		}
		for i := range writes {
			if m := got[i*64 : i*64+64]; !bytes.Equal(m, numbered(i)) {
				t.Fatalf("the kernel peer's message %d is %q, want %q", i, m, numbered(i))
			}
		}
		if segs > 40 {
			t.Errorf("%d writes of 64 bytes with no wait point left as %d segments, want at most 40", writes, segs)
		}
		// Counted from here, a segment is the next write's: under load the
		// peer's last ACK can come after a probe timer's retransmission
		// (make test counted one), so the burst must be acknowledged first.
		for deadline := time.Now().Add(5 * time.Second); sc.Unacked() != 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d bytes of the burst not acknowledged in 5 s", sc.Unacked())
			}
		}
		sc.WaitPoint()
		before = st.TCPCounters.TxSegments.Load()
		write(writes)
		if n := st.TCPCounters.TxSegments.Load() - before; n != 1 {
			t.Errorf("the write after a wait point left as %d segments at once, want 1", n)
		}
		write(writes + 1)
		if n := st.TCPCounters.TxSegments.Load() - before; n != 1 {
			t.Errorf("the write that followed it without a wait: %d segments at once, want it coalesced", n-1)
		}
		if err := sc.Shutdown(unix.SHUT_WR); err != nil {
			t.Fatal(err)
		}
		sc.WaitPoint() // the kick
		rest, err := io.ReadAll(c)
		if want := append(numbered(writes), numbered(writes+1)...); err != nil || !bytes.Equal(rest, want) {
			t.Errorf("after the shutdown the peer read %q, %v; want the two writes, then the end", rest, err)
		}
	})
}

// TestTCPCoalescedFull: with netstack's send buffer full (the kernel peer
// reads nothing, its window closed), coalesced writes netstack has no
// room for stay coalesced and the writes after them get EAGAIN, as the
// kernel's would; once the peer reads, every byte of every write that
// returned success arrives in order, and a close made while some were
// left sends them before its FIN.
func TestTCPCoalescedFull(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, st := stackOn(t, bed, nil)
		c, s := connectedPair(t, bed, st, 7405)
		sc := s.(*stack.TCPConn)
		if err := sc.SetOption(unix.SOL_SOCKET, unix.SO_SNDBUF, 8192); err != nil {
			t.Fatal(err)
		}
		written := 0
		deadline := time.Now().Add(10 * time.Second)
		for eagains := 0; eagains < 50 && time.Now().Before(deadline); {
			n, err := sc.WriteNonblock([][]byte{numbered(written)}, false)
			switch {
			case err == unix.EAGAIN:
				eagains++
				time.Sleep(time.Millisecond) // the peer's window stays closed
				continue
			case err != nil || n != 64:
				t.Fatalf("write %d: %d, %v", written, n, err)
			}
			written++
			if written > 1<<20 {
				t.Fatal("a million writes and netstack never refused one: the peer's window never closed")
			}
		}
		if err := sc.Close(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("the kernel peer's read: %v (%d bytes)", err, len(got))
		}
		if len(got) != written*64 {
			t.Fatalf("the peer read %d bytes, want %d (%d writes)", len(got), written*64, written)
		}
		for i := range written {
			if m := got[i*64 : i*64+64]; !bytes.Equal(m, numbered(i)) {
				t.Fatalf("the peer's message %d is %q, want %q", i, m, numbered(i))
			}
		}
	})
}
