package stack_test

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// txCounters sums the queues' transmit counters.
func txCounters(st *stack.Stack) (packets, wakeups, deferred uint64) {
	for _, be := range st.Backends() {
		c := &be.(*xsk.Socket).Counters
		packets += c.TxPackets.Load()
		wakeups += c.TxWakeups.Load()
		deferred += c.TxDeferred.Load()
	}
	return
}

// TestTxKickDelay: with coalesced kicks, the datagram a send left on the
// ring leaves within the delay though nothing of the stack runs after it,
// and a burst arrives whole with fewer kicks than datagrams.
func TestTxKickDelay(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		// No progress engine: its polls would count as waits between
		// the sends.
		_, st := stackOn(t, bed, &stack.Options{TxKickDelay: 200 * time.Microsecond, ProgressInterval: stack.ProgressNever})
		a := kernelConn(t, bed, "198.18.0.1:9300")
		resolved(t, bed)
		c, err := st.DialUDP(netip.AddrPort{}, netip.MustParseAddrPort("198.18.0.1:9300"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		buf := make([]byte, 2048)

		// Two sends and nothing after them: the first leaves at once,
		// the timer kicks the second.
		for _, m := range []string{"first", "second"} {
			if _, err := c.Write([]byte(m)); err != nil {
				t.Fatal(err)
			}
		}
		began := time.Now()
		for _, m := range []string{"first", "second"} {
			a.SetReadDeadline(began.Add(2 * time.Second))
			if n, _, err := a.ReadFromUDPAddrPort(buf); err != nil || string(buf[:n]) != m {
				t.Fatalf("got %q, %v; want %q", buf[:n], err, m)
			}
		}
		if d := time.Since(began); d > 100*time.Millisecond {
			t.Errorf("the second datagram took %v with a 200 us delay", d)
		}
		if _, _, deferred := txCounters(st); deferred != 1 {
			t.Errorf("%d datagrams deferred, want 1 (the second)", deferred)
		}

		// Burst: all of it, in fewer kicks.
		const n = 1000
		_, wakeups0, _ := txCounters(st)
		for i := range n {
			if _, err := c.Write(payload(i, 64)); err != nil {
				t.Fatal(err)
			}
		}
		for i := range n {
			a.SetReadDeadline(time.Now().Add(2 * time.Second))
			k, _, err := a.ReadFromUDPAddrPort(buf)
			if err != nil || string(buf[:k]) != string(payload(i, 64)) {
				t.Fatalf("burst datagram %d of %d: %v", i, n, err)
			}
		}
		if _, wakeups, _ := txCounters(st); wakeups-wakeups0 > n/4 {
			t.Errorf("%d kicks for %d datagrams: not coalesced", wakeups-wakeups0, n)
		}
	})
}

// TestTxKickBeforeReceive: a send followed by a receive on the same
// socket leaves at once, with a delay of a whole second.
func TestTxKickBeforeReceive(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		// Spinning: a sleep in poll(2) on an AF_XDP socket would send its
		// TX ring itself (copy mode), and hide a receive that does not.
		_, st := stackOn(t, bed, &stack.Options{TxKickDelay: time.Second, RxPoll: stack.RxPollForever})
		a := kernelConn(t, bed, "198.18.0.1:9301")
		c, err := st.DialUDP(netip.AddrPort{}, netip.MustParseAddrPort("198.18.0.1:9301"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		go func() {
			buf := make([]byte, 2048)
			for range 20 {
				a.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, from, err := a.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				a.WriteToUDPAddrPort(buf[:n], from)
			}
		}()
		buf := make([]byte, 2048)
		began := time.Now()
		for i := range 20 {
			if _, err := c.Write(payload(i, 32)); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			if err != nil || string(buf[:n]) != string(payload(i, 32)) {
				t.Fatalf("exchange %d: %v", i, err)
			}
		}
		if d := time.Since(began); d > 500*time.Millisecond {
			t.Errorf("20 exchanges took %v: requests waited for the 1 s kick delay", d)
		}
	})
}

// TestConcurrentSendsKicked: senders on several goroutines share a queue
// whose kicks run outside its transmit lock, one at a time; a send that
// finds a kick under way leaves its frames to it, and it kicks again. No
// frame may stay on the ring: each sender keeps a window of 32 datagrams
// in flight to a kernel receiver and waits for it to drain, so one left
// behind stalls its sender, and the last ones have no send after them.
// (The hand-over's window is a few instructions wide: TestKickLatch checks
// it step by step.)
func TestConcurrentSendsKicked(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		// Kicks at once (no coalescing delay): only the kicks' hand-over
		// can send the frames.
		_, st := stackOn(t, bed, &stack.Options{TxKickDelay: stack.TxKickNever, ProgressInterval: stack.ProgressNever})
		k := kernelConn(t, bed, "198.18.0.1:9106")
		const senders, each, window = 4, 2000, 32
		var got [senders]atomic.Int64
		go func() {
			buf := make([]byte, 64)
			for {
				n, err := k.Read(buf)
				if err != nil {
					return
				}
				if n == 8 && buf[0] < senders {
					got[buf[0]].Add(1)
				}
			}
		}()
		errs := make(chan error, senders)
		for s := range senders {
			go func() {
				c, err := st.DialUDP(netip.AddrPort{}, netip.MustParseAddrPort("198.18.0.1:9106"))
				if err != nil {
					errs <- err
					return
				}
				send := func() error {
					msg := make([]byte, 8)
					msg[0] = byte(s)
					for i := range each {
						binary.BigEndian.PutUint32(msg[4:], uint32(i))
						if _, err := c.Write(msg); err != nil {
							return fmt.Errorf("sender %d, datagram %d: %w", s, i, err)
						}
						for deadline := time.Now().Add(time.Second); int64(i+1)-got[s].Load() >= window; time.Sleep(20 * time.Microsecond) {
							if time.Now().After(deadline) {
								return fmt.Errorf("sender %d: %d of its first %d datagrams arrived in 1 s: frames left on the TX ring", s, got[s].Load(), i+1)
							}
						}
					}
					return nil
				}
				err = send()
				// Closed before the sender reports: the test's cleanup
				// closes the stack once every sender reported.
				c.Close()
				errs <- err
			}()
		}
		for range senders {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		for deadline := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
			done := 0
			for s := range senders {
				if got[s].Load() == each {
					done++
				}
			}
			if done == senders {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("datagrams that arrived per sender: %d, %d, %d, %d of %d: frames left on the TX ring", got[0].Load(), got[1].Load(), got[2].Load(), got[3].Load(), each)
			}
		}
	})
}
