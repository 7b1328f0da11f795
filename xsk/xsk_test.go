package xsk_test

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// open binds an AF_XDP socket on side B of a fresh bed behind the steering
// program with one port rule.
func open(t *testing.T, port uint16) (*testbed.Bed, *xsk.Socket, *steer.Program) {
	bed := testutil.Bed(t, nil)
	var s *xsk.Socket
	var p *steer.Program
	err := bed.Do(testbed.B, func() error {
		var err error
		if p, err = steer.Attach(bed.Link(testbed.B), nil); err != nil {
			return err
		}
		if s, err = xsk.Open(bed.Link(testbed.B), 0, &xsk.Options{NoHugePages: true}); err != nil {
			return err
		}
		if err := p.RegisterQueue(0, s.FD()); err != nil {
			return err
		}
		_, err = p.AddRule(steer.Rule{Kind: steer.RulePort, Proto: unix.IPPROTO_UDP, Local: netip.AddrPortFrom(netip.Addr{}, port)})
		return err
	})
	if s != nil {
		t.Cleanup(func() { s.Close() })
	}
	if p != nil {
		t.Cleanup(func() { p.Close() })
	}
	testutil.SkipIfNotSupported(t, err)
	return bed, s, p
}

func sendUDP(t *testing.T, bed *testbed.Bed, port uint16, n int) {
	t.Helper()
	err := bed.Do(testbed.A, func() error {
		c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: bed.Addr(testbed.B).AsSlice(), Port: int(port)})
		if err != nil {
			return err
		}
		defer c.Close()
		for i := 0; i < n; i++ {
			if _, err := c.Write([]byte{byte(i), 1, 2, 3}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestReceiveSteered(t *testing.T) {
	bed, s, p := open(t, 7000)
	const n = 100
	sendUDP(t, bed, 7000, n)
	bufs := make([]backend.Buf, 64)
	got := 0
	deadline := time.Now().Add(5 * time.Second)
	for got < n && time.Now().Before(deadline) {
		k := s.Receive(bufs)
		for i := 0; i < k; i++ {
			f := bufs[i].Data
			if len(f) != 14+20+8+4 || f[14+20+8] != byte(got) {
				t.Fatalf("frame %d: len %d payload %v", got, len(f), f[14+20+8:])
			}
			got++
		}
		s.Release(bufs[:k])
		if k == 0 {
			unix.Poll([]unix.PollFd{{Fd: int32(s.FD()), Events: unix.POLLIN}}, 10)
		}
	}
	if got != n {
		t.Fatalf("received %d of %d", got, n)
	}
	pc, err := p.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if pc.Redirected != n {
		t.Errorf("redirected = %d, want %d (%+v)", pc.Redirected, n, pc)
	}
	st, err := s.Statistics()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("zero-copy=%v mode=%s stats=%+v counters rx=%d", s.ZeroCopy(), p.Mode(), st, s.Counters.RxPackets.Load())
}

func TestQueueBusy(t *testing.T) {
	bed, _, _ := open(t, 7001)
	err := bed.Do(testbed.B, func() error {
		s, err := xsk.Open(bed.Link(testbed.B), 0, &xsk.Options{NoHugePages: true})
		if err == nil {
			s.Close()
		}
		return err
	})
	if !errors.Is(err, xsk.ErrQueueBusy) {
		t.Fatalf("second bind: err = %v, want ErrQueueBusy", err)
	}
	t.Log(err)
}

// TestSocketsDiag: sock_diag reports the same XDP_STATISTICS as the owning
// socket, here for a queue whose frames are never given back, so that the
// kernel runs out of fill-ring buffers and drops.
func TestSocketsDiag(t *testing.T) {
	bed, s, _ := open(t, 7002)
	const n = 2300 // more than the 2048 frames primed on the fill ring
	sendUDP(t, bed, 7002, n)
	var diag []xsk.SocketDiag
	err := bed.Do(testbed.B, func() error {
		var err error
		diag, err = xsk.Sockets()
		return err
	})
	testutil.SkipIfNotSupported(t, err)
	if err != nil {
		t.Fatal(err)
	}
	own, err := s.Statistics()
	if err != nil {
		t.Fatal(err)
	}
	var found *xsk.SocketDiag
	for i := range diag {
		if diag[i].Ifindex == s.Ifindex() && diag[i].Queue == 0 {
			found = &diag[i]
		}
	}
	if found == nil {
		t.Fatalf("socket on ifindex %d queue 0 not in sock_diag: %+v", s.Ifindex(), diag)
	}
	if found.Stats != own {
		t.Errorf("sock_diag stats %+v, XDP_STATISTICS %+v", found.Stats, own)
	}
	if own.Rx_dropped == 0 || own.Rx_fill_ring_empty_descs+own.Rx_ring_full == 0 {
		t.Errorf("no drop counted after %d frames were held: %+v", n, own)
	}
	t.Logf("%+v", found)
}
