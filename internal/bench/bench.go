// Package bench runs vmaxdp and the kernel side by side on one test bed and
// reports both rates and their ratio. `vmaxdp bench` and the testbed
// benchmarks of package stack use it; it must never send anywhere but
// between the two ends of its bed, and every loop in it is bounded in time.
package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// Options configure a run. The zero value means defaults.
type Options struct {
	Duration time.Duration // per measurement (default 2 s)
	Size     int           // UDP payload bytes (default 64)
	Port     uint16        // UDP port on side B (default 7777)
}

func (o *Options) defaults() Options {
	var r Options
	if o != nil {
		r = *o
	}
	if r.Duration == 0 {
		r.Duration = 2 * time.Second
	}
	if r.Size == 0 {
		r.Size = 64
	}
	if r.Port == 0 {
		r.Port = 7777
	}
	return r
}

// Result is one measurement of both sides.
type Result struct {
	Name   string
	Unit   string
	Kernel float64
	Vmaxdp float64
	Note   string // more figures of the same run
}

// Ratio is vmaxdp's rate over the kernel's.
func (r Result) Ratio() float64 {
	if r.Kernel == 0 {
		return 0
	}
	return r.Vmaxdp / r.Kernel
}

func (r Result) String() string {
	line := fmt.Sprintf("%-8s kernel %12.0f %s   vmaxdp %12.0f %s   ratio %5.2fx", r.Name, r.Kernel, r.Unit, r.Vmaxdp, r.Unit, r.Ratio())
	if r.Note != "" {
		line += "\n         " + r.Note
	}
	return line
}

func openStack(bed *testbed.Bed, s testbed.Side) (*stack.Stack, error) {
	var st *stack.Stack
	err := bed.Do(s, func() (err error) {
		st, err = stack.Open(bed.Link(s), &stack.Options{XSK: &xsk.Options{NoHugePages: true}, RxPoll: stack.RxPollForever})
		return err
	})
	return st, err
}

func kernelSocket(bed *testbed.Bed, s testbed.Side, port uint16) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := bed.Do(s, func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(bed.Addr(s), port)))
		return err
	})
	if err == nil {
		c.SetReadBuffer(4 << 20)
		c.SetWriteBuffer(4 << 20)
	}
	return c, err
}

// Flood sends frames from side A to B:port through an AF_XDP socket of its
// own, as fast as the bed takes them, until ctx ends.
func Flood(ctx context.Context, bed *testbed.Bed, opts *Options) error {
	o := opts.defaults()
	var s *xsk.Socket
	var dst header.MAC
	err := bed.Do(testbed.A, func() (err error) {
		if s, err = xsk.Open(bed.Link(testbed.A), 0, &xsk.Options{NoHugePages: true}); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer s.Close()
	src, err := linkMAC(bed, testbed.A)
	if err != nil {
		return err
	}
	if dst, err = linkMAC(bed, testbed.B); err != nil {
		return err
	}
	f := header.UDPFields{DstMAC: dst, SrcMAC: src, Src: netip.AddrPortFrom(bed.Addr(testbed.A), 9), Dst: netip.AddrPortFrom(bed.Addr(testbed.B), o.Port), TTL: 64}
	bufs := make([]backend.Buf, 64)
	for ctx.Err() == nil {
		n := s.Alloc(bufs)
		for i := 0; i < n; i++ {
			bufs[i].Data = bufs[i].Data[:header.BuildUDP(bufs[i].Data, &f, o.Size)]
		}
		if n > 0 {
			if _, err := s.Transmit(bufs[:n]); err != nil {
				return err
			}
		}
	}
	return nil
}

func linkMAC(bed *testbed.Bed, s testbed.Side) (header.MAC, error) {
	h, err := netlink.NewHandleAt(bed.NS(s))
	if err != nil {
		return header.MAC{}, err
	}
	defer h.Close()
	l, err := netnsutil.LinkByName(h, bed.Link(s))
	if err != nil {
		return header.MAC{}, err
	}
	return header.MAC(l.Attrs().HardwareAddr), nil
}

func linkStats(bed *testbed.Bed, s testbed.Side) (*netlink.LinkStatistics, error) {
	h, err := netlink.NewHandleAt(bed.NS(s))
	if err != nil {
		return nil, err
	}
	defer h.Close()
	l, err := netnsutil.LinkByName(h, bed.Link(s))
	if err != nil {
		return nil, err
	}
	return l.Attrs().Statistics, nil
}

// measure runs work, with load (if non-nil) beside it, for a quarter of d
// to warm up and then d, and returns work's count per second over d.
func measure(d time.Duration, load func(ctx context.Context) error, work func(ctx context.Context, count *atomic.Uint64) error) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var loadErr error
	if load != nil {
		wg.Add(1)
		go func() { defer wg.Done(); loadErr = load(ctx) }()
	}
	var count atomic.Uint64
	workCtx, wcancel := context.WithCancel(ctx)
	var workErr error
	wg.Add(1)
	go func() { defer wg.Done(); workErr = work(workCtx, &count) }()
	time.Sleep(d / 4) // warm-up: ARP, caches
	c0, t0 := count.Load(), time.Now()
	time.Sleep(d)
	c1, t1 := count.Load(), time.Now()
	wcancel()
	cancel()
	wg.Wait()
	if err := errors.Join(loadErr, workErr); err != nil && !errors.Is(err, context.Canceled) {
		return 0, err
	}
	return float64(c1-c0) / t1.Sub(t0).Seconds(), nil
}

// readLoop reads until ctx ends, waking every 50 ms to look at ctx.
func readLoop(ctx context.Context, count *atomic.Uint64, read func([]byte) error, setDeadline func(time.Time) error) error {
	buf := make([]byte, 2048)
	for ctx.Err() == nil {
		setDeadline(time.Now().Add(50 * time.Millisecond))
		for i := 0; i < 4096; i++ {
			if err := read(buf); err != nil {
				if isTimeout(err) {
					break
				}
				return err
			}
			count.Add(1)
		}
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// RxDrop: one flood from side A; side B receives and discards with a kernel
// UDP socket, then with a vmaxdp socket.
func RxDrop(bed *testbed.Bed, opts *Options) (Result, error) {
	o := opts.defaults()
	r := Result{Name: "rxdrop", Unit: "pps"}
	load := func(ctx context.Context) error { return Flood(ctx, bed, &o) }
	var err error
	offered := offeredRate(bed)
	if r.Kernel, err = kernelRxDrop(bed, o); err != nil {
		return r, fmt.Errorf("rxdrop kernel: %w", err)
	}
	offK := offered()
	st, err := openStack(bed, testbed.B)
	if err != nil {
		return r, err
	}
	defer st.Close()
	vc, err := st.ListenUDP(netip.AddrPortFrom(bed.Addr(testbed.B), o.Port))
	if err != nil {
		return r, err
	}
	offered = offeredRate(bed)
	r.Vmaxdp, err = measure(o.Duration, load, func(ctx context.Context, n *atomic.Uint64) error {
		return readLoop(ctx, n, func(b []byte) error { _, _, err := vc.ReadFromUDPAddrPort(b); return err }, vc.SetReadDeadline)
	})
	if err != nil {
		return r, fmt.Errorf("rxdrop vmaxdp: %w", err)
	}
	r.Note = fmt.Sprintf("offered by the generator (side A tx_packets, whole run): kernel run %.0f pps, vmaxdp run %.0f pps", offK, offered())
	return r, nil
}

// offeredRate starts counting what side A transmits; the returned function
// gives the rate since then.
func offeredRate(bed *testbed.Bed) func() float64 {
	s0, err := linkStats(bed, testbed.A)
	t0 := time.Now()
	return func() float64 {
		s1, err1 := linkStats(bed, testbed.A)
		if err != nil || err1 != nil {
			return 0
		}
		return float64(s1.TxPackets-s0.TxPackets) / time.Since(t0).Seconds()
	}
}

// kernelRxDrop is the rate a kernel UDP socket on side B receives a flood.
func kernelRxDrop(bed *testbed.Bed, o Options) (float64, error) {
	kc, err := kernelSocket(bed, testbed.B, o.Port)
	if err != nil {
		return 0, err
	}
	defer kc.Close()
	return measure(o.Duration, func(ctx context.Context) error { return Flood(ctx, bed, &o) }, func(ctx context.Context, n *atomic.Uint64) error {
		return readLoop(ctx, n, func(b []byte) error { _, _, err := kc.ReadFromUDPAddrPort(b); return err }, kc.SetReadDeadline)
	})
}

// TxOnly: side B sends as fast as it can to a port on side A nobody reads;
// the rate is what side A's interface counts as received, for both.
func TxOnly(bed *testbed.Bed, opts *Options) (Result, error) {
	o := opts.defaults()
	r := Result{Name: "txonly", Unit: "pps"}
	dst := netip.AddrPortFrom(bed.Addr(testbed.A), o.Port)
	msg := make([]byte, o.Size)
	batch := make([][]byte, 32)
	for i := range batch {
		batch[i] = msg
	}
	rxOnA := func(ctx context.Context, n *atomic.Uint64, send func() error) error {
		s0, err := linkStats(bed, testbed.A)
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() {
			for ctx.Err() == nil {
				if err := send(); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case err := <-done:
				return err
			case <-t.C:
				if s, err := linkStats(bed, testbed.A); err == nil {
					n.Store(s.RxPackets - s0.RxPackets)
				}
			}
		}
	}
	kc, err := kernelSocket(bed, testbed.B, 0)
	if err != nil {
		return r, err
	}
	ua := net.UDPAddrFromAddrPort(dst)
	r.Kernel, err = measure(o.Duration, nil, func(ctx context.Context, n *atomic.Uint64) error {
		return rxOnA(ctx, n, func() error {
			_, err := kc.WriteToUDP(msg, ua)
			if errors.Is(err, unix.ENOBUFS) {
				return nil
			}
			return err
		})
	})
	kc.Close()
	if err != nil {
		return r, fmt.Errorf("txonly kernel: %w", err)
	}
	st, err := openStack(bed, testbed.B)
	if err != nil {
		return r, err
	}
	defer st.Close()
	vc, err := st.ListenUDP(netip.AddrPortFrom(bed.Addr(testbed.B), 0))
	if err != nil {
		return r, err
	}
	r.Vmaxdp, err = measure(o.Duration, nil, func(ctx context.Context, n *atomic.Uint64) error {
		return rxOnA(ctx, n, func() error {
			_, err := vc.WriteBatchToUDPAddrPort(batch, dst)
			if errors.Is(err, unix.ENOBUFS) {
				return nil
			}
			return err
		})
	})
	if err != nil {
		return r, fmt.Errorf("txonly vmaxdp: %w", err)
	}
	return r, nil
}

// Echo: side A sends a request and waits for the reply, one at a time;
// side B echoes. Kernel sockets on both sides, then vmaxdp on both sides.
func Echo(bed *testbed.Bed, opts *Options) (Result, error) {
	o := opts.defaults()
	r := Result{Name: "echo", Unit: "req/s"}
	ks, err := kernelSocket(bed, testbed.B, o.Port)
	if err != nil {
		return r, err
	}
	kc, err := kernelSocket(bed, testbed.A, 0)
	if err != nil {
		ks.Close()
		return r, err
	}
	r.Kernel, err = echo(bed, o, ks, kc, false)
	ks.Close()
	kc.Close()
	if err != nil {
		return r, fmt.Errorf("echo kernel: %w", err)
	}
	sb, err := openStack(bed, testbed.B)
	if err != nil {
		return r, err
	}
	defer sb.Close()
	sa, err := openStack(bed, testbed.A)
	if err != nil {
		return r, err
	}
	defer sa.Close()
	vs, err := sb.ListenUDP(netip.AddrPortFrom(bed.Addr(testbed.B), o.Port))
	if err != nil {
		return r, err
	}
	vc, err := sa.ListenUDP(netip.AddrPortFrom(bed.Addr(testbed.A), 0))
	if err != nil {
		return r, err
	}
	r.Vmaxdp, err = echo(bed, o, vs, vc, true)
	if err != nil {
		return r, fmt.Errorf("echo vmaxdp: %w", err)
	}
	return r, nil
}

// echoConn is a UDP socket of the kernel's or of a stack's.
type echoConn interface {
	ReadFromUDPAddrPort([]byte) (int, netip.AddrPort, error)
	WriteToUDPAddrPort([]byte, netip.AddrPort) (int, error)
	SetReadDeadline(time.Time) error
}

// echo measures round trips a second: client (side A) sends a request
// and waits for its answer, server (side B) echoes. With spinning, each
// side runs on a thread of its own, as the raw layer's and a C program's
// spinning threads do: a stack's spinning receives on goroutines free to
// move took 5.3-5.7 us a round trip against 4.7-5.0 us locked (3
// interleaved runs). A kernel socket's blocking reads park in Go's
// netpoller, where a locked goroutine would cost a thread hand-off.
func echo(bed *testbed.Bed, o Options, server, client echoConn, spinning bool) (float64, error) {
	msg := make([]byte, o.Size)
	dst := netip.AddrPortFrom(bed.Addr(testbed.B), o.Port)
	run := loop
	if spinning {
		run = spin
	}
	return measure(o.Duration, func(ctx context.Context) error {
		buf := make([]byte, 2048)
		return run(ctx, func() error {
			server.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			n, from, err := server.ReadFromUDPAddrPort(buf)
			switch {
			case isTimeout(err):
				return nil
			case err != nil:
				return err
			}
			_, err = server.WriteToUDPAddrPort(buf[:n], from)
			return err
		})
	}, func(ctx context.Context, count *atomic.Uint64) error {
		buf := make([]byte, 2048)
		return run(ctx, func() error {
			if _, err := client.WriteToUDPAddrPort(msg, dst); err != nil {
				return err
			}
			client.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			if _, _, err := client.ReadFromUDPAddrPort(buf); err != nil {
				if isTimeout(err) {
					return nil // a lost request is resent, not counted
				}
				return err
			}
			count.Add(1)
			return nil
		})
	})
}
