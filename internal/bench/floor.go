package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/internal/sockperf"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// FloorLine is one layer of Floor: its ping-pong (round trips a second,
// one message in flight) and one-way rate (messages a second the receiver
// got), 0 where the layer was not measured (Note says why).
type FloorLine struct {
	Layer    string
	PingPong float64
	OneWay   float64
	Note     string
}

// Floor layer names, from the floor up.
const (
	LayerRaw         = "raw AF_XDP (xsk + steering, no stack)"
	LayerStack       = "stack package, Go API"
	LayerSockperf    = "sockperf under vmaxdp run"
	LayerKernelSpin  = "kernel UDP, spinning (--nonblocked)"
	LayerKernelBlock = "kernel UDP, blocking"
)

// Floor runs the same workload (Options.Size bytes of UDP payload) at
// every layer of vmaxdp on bed, one after the other: raw AF_XDP sockets
// with the steering program and nothing above them (the floor: what
// AF_XDP can do on this machine), the stack package's Go API, sockperf (a
// C program calling recvfrom and sendto through the preload library)
// under vmaxdp run on both sides, and sockperf on the kernel's sockets,
// spinning and blocking. vmaxdp is the vmaxdp binary for the sockperf
// layers; without sockperf installed they are left out with a note.
func Floor(bed *testbed.Bed, vmaxdp string, opts *Options) ([]FloorLine, error) {
	o := opts.defaults()
	var lines []FloorLine
	raw := FloorLine{Layer: LayerRaw}
	var err error
	if raw.PingPong, err = rawPingPong(bed, o); err != nil {
		return nil, fmt.Errorf("floor, %s ping-pong: %w", LayerRaw, err)
	}
	if raw.OneWay, err = rawOneWay(bed, o); err != nil {
		return nil, fmt.Errorf("floor, %s one-way: %w", LayerRaw, err)
	}
	lines = append(lines, raw)
	st := FloorLine{Layer: LayerStack}
	if st.PingPong, err = stackPingPong(bed, o); err != nil {
		return nil, fmt.Errorf("floor, %s ping-pong: %w", LayerStack, err)
	}
	if st.OneWay, err = stackOneWay(bed, o); err != nil {
		return nil, fmt.Errorf("floor, %s one-way: %w", LayerStack, err)
	}
	lines = append(lines, st)
	for _, l := range []struct {
		name    string
		offload bool
		extra   []string
	}{
		{LayerSockperf, true, nil},
		{LayerKernelSpin, false, []string{"--nonblocked"}},
		{LayerKernelBlock, false, nil},
	} {
		line := FloorLine{Layer: l.name}
		line.PingPong, line.OneWay, err = sockperfLayer(bed, vmaxdp, o, l.offload, l.extra)
		switch {
		case errors.Is(err, sockperf.ErrNotInstalled):
			line.Note = err.Error()
		case err != nil:
			return nil, fmt.Errorf("floor, %s: %w", l.name, err)
		}
		lines = append(lines, line)
	}
	return lines, nil
}

// rawEnd is one side of the raw layer: the steering program with one
// rule (UDP to local), and an AF_XDP socket on queue 0; no stack.
type rawEnd struct {
	prog  *steer.Program
	sock  *xsk.Socket
	local netip.AddrPort
	mac   header.MAC
	tx    [64]backend.Buf
	frame []byte // what send sends (to one peer)
}

func openRaw(bed *testbed.Bed, s testbed.Side, port uint16) (*rawEnd, error) {
	e := &rawEnd{local: netip.AddrPortFrom(bed.Addr(s), port)}
	var err error
	if e.mac, err = linkMAC(bed, s); err != nil {
		return nil, err
	}
	err = bed.Do(s, func() error {
		var err error
		if e.prog, err = steer.Attach(bed.Link(s), nil); err != nil {
			return err
		}
		if e.sock, err = xsk.Open(bed.Link(s), 0, &xsk.Options{NoHugePages: true}); err != nil {
			return err
		}
		if err := e.prog.RegisterQueue(0, e.sock.FD()); err != nil {
			return err
		}
		_, err = e.prog.AddRule(steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: e.local})
		return err
	})
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("raw AF_XDP on %s: %w", bed.Link(s), err)
	}
	return e, nil
}

func (e *rawEnd) Close() {
	if e.sock != nil {
		e.sock.Close()
	}
	if e.prog != nil {
		e.prog.Close()
	}
}

// send puts one frame of size payload bytes to peer on the TX ring and
// kicks it; false when no frame was free.
func (e *rawEnd) send(peer *rawEnd, size int, later bool) (bool, error) {
	var b [1]backend.Buf
	if e.sock.Alloc(b[:]) == 0 {
		return false, nil
	}
	if e.frame == nil {
		// Built once: every frame of a run is the same one.
		f := &header.UDPFields{DstMAC: peer.mac, SrcMAC: e.mac, Src: e.local, Dst: peer.local, TTL: 64}
		e.frame = make([]byte, header.UDPHeadersLen+size)
		header.BuildUDP(e.frame, f, size)
	}
	b[0].Data = b[0].Data[:copy(b[0].Data[:cap(b[0].Data)], e.frame)]
	if later {
		_, err := e.sock.TransmitLater(b[:])
		return true, err
	}
	_, err := e.sock.Transmit(b[:])
	return true, err
}

// echo sends every frame it received back to its source, swapping the
// addresses in a transmit frame; it returns how many.
func (e *rawEnd) echo(rx []backend.Buf) (int, error) {
	n := e.sock.Receive(rx[:min(len(rx), len(e.tx))])
	if n == 0 {
		return 0, nil
	}
	tx := e.tx[:n]
	got := e.sock.Alloc(tx)
	for i := range got {
		in := rx[i].Data
		out := tx[i].Data[:len(in)]
		copy(out, in)
		eth := header.Ethernet(out)
		eth.SetDst(header.Ethernet(in).Src())
		eth.SetSrc(e.mac)
		ip := out[header.EthernetLen:]
		copy(ip[12:16], in[header.EthernetLen+16:header.EthernetLen+20])
		copy(ip[16:20], in[header.EthernetLen+12:header.EthernetLen+16])
		u := header.UDP(out[header.UDPChecksumStart:])
		in4 := header.UDP(in[header.UDPChecksumStart:])
		u.SetSrcPort(in4.DstPort())
		u.SetDstPort(in4.SrcPort())
		tx[i].Data = out
	}
	e.sock.Release(rx[:n])
	if got == 0 {
		return 0, nil
	}
	_, err := e.sock.Transmit(tx[:got])
	return got, err
}

// openRawPair opens the raw layer on both sides: side B's on o.Port,
// side A's on the next port.
func openRawPair(bed *testbed.Bed, o Options) (a, b *rawEnd, err error) {
	if a, err = openRaw(bed, testbed.A, o.Port+1); err != nil {
		return nil, nil, err
	}
	if b, err = openRaw(bed, testbed.B, o.Port); err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// openStackPair opens a stack on each side.
func openStackPair(bed *testbed.Bed) (a, b *stack.Stack, err error) {
	if b, err = openStack(bed, testbed.B); err != nil {
		return nil, nil, err
	}
	if a, err = openStack(bed, testbed.A); err != nil {
		b.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// loop runs fn until ctx ends or fn fails.
func loop(ctx context.Context, fn func() error) error {
	for ctx.Err() == nil {
		if err := fn(); err != nil {
			return err
		}
	}
	return nil
}

// spin is loop on a thread of its own.
func spin(ctx context.Context, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	return loop(ctx, fn)
}

// rawPingPong: side A sends one frame and spins until side B's echo comes
// back, then sends the next; both spin on their rings.
func rawPingPong(bed *testbed.Bed, o Options) (float64, error) {
	a, b, err := openRawPair(bed, o)
	if err != nil {
		return 0, err
	}
	defer a.Close()
	defer b.Close()
	rxB := make([]backend.Buf, 64)
	rxA := make([]backend.Buf, 64)
	return measure(o.Duration, func(ctx context.Context) error {
		return spin(ctx, func() error { _, err := b.echo(rxB); return err })
	}, func(ctx context.Context, count *atomic.Uint64) error {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for ctx.Err() == nil {
			if ok, err := a.send(b, o.Size, false); err != nil || !ok {
				if err != nil {
					return err
				}
				continue
			}
			// A lost frame is sent again after 100 ms, not counted.
			for deadline := time.Now().Add(100 * time.Millisecond); ctx.Err() == nil && time.Now().Before(deadline); {
				if n := a.sock.Receive(rxA); n > 0 {
					a.sock.Release(rxA[:n])
					count.Add(1)
					break
				}
			}
		}
		return nil
	})
}

// rawOneWay: side A sends batches of 64 frames as fast as its TX ring
// takes them; side B counts what it receives.
func rawOneWay(bed *testbed.Bed, o Options) (float64, error) {
	a, b, err := openRawPair(bed, o)
	if err != nil {
		return 0, err
	}
	defer a.Close()
	defer b.Close()
	rx := make([]backend.Buf, 64)
	return measure(o.Duration, func(ctx context.Context) error {
		return spin(ctx, func() error {
			for range 64 {
				if ok, err := a.send(b, o.Size, true); err != nil || !ok {
					break
				}
			}
			// A busy device keeps the frames for the next kick
			// (backend.ErrBusy): side B's receiving thread shares the
			// machine's two cores with this one.
			if err := a.sock.Flush(); err != nil && !errors.Is(err, backend.ErrBusy) && !errors.Is(err, unix.ENOBUFS) && !errors.Is(err, unix.EAGAIN) {
				return err
			}
			return nil
		})
	}, func(ctx context.Context, count *atomic.Uint64) error {
		return spin(ctx, func() error {
			if n := b.sock.Receive(rx); n > 0 {
				b.sock.Release(rx[:n])
				count.Add(uint64(n))
			}
			return nil
		})
	})
}

// stackPingPong is Echo's vmaxdp half: a stack on each side, side B
// echoing.
func stackPingPong(bed *testbed.Bed, o Options) (float64, error) {
	sa, sb, err := openStackPair(bed)
	if err != nil {
		return 0, err
	}
	defer sa.Close()
	defer sb.Close()
	vs, err := sb.ListenUDP(netip.AddrPortFrom(bed.Addr(testbed.B), o.Port))
	if err != nil {
		return 0, err
	}
	vc, err := sa.ListenUDP(netip.AddrPortFrom(bed.Addr(testbed.A), 0))
	if err != nil {
		return 0, err
	}
	return echo(bed, o, vs, vc, true)
}

// stackOneWay: side A's stack sends batches of 32; side B's receives.
func stackOneWay(bed *testbed.Bed, o Options) (float64, error) {
	sa, sb, err := openStackPair(bed)
	if err != nil {
		return 0, err
	}
	defer sa.Close()
	defer sb.Close()
	dst := netip.AddrPortFrom(bed.Addr(testbed.B), o.Port)
	vs, err := sb.ListenUDP(dst)
	if err != nil {
		return 0, err
	}
	vc, err := sa.ListenUDP(netip.AddrPortFrom(bed.Addr(testbed.A), 0))
	if err != nil {
		return 0, err
	}
	msg := make([]byte, o.Size)
	batch := make([][]byte, 32)
	for i := range batch {
		batch[i] = msg
	}
	return measure(o.Duration, func(ctx context.Context) error {
		return spin(ctx, func() error {
			_, err := vc.WriteBatchToUDPAddrPort(batch, dst)
			if errors.Is(err, unix.ENOBUFS) {
				return nil
			}
			return err
		})
	}, func(ctx context.Context, n *atomic.Uint64) error {
		return readLoop(ctx, n, func(b []byte) error { _, _, err := vs.ReadFromUDPAddrPort(b); return err }, vs.SetReadDeadline)
	})
}

// sockperfLayer runs sockperf pp and tp, both sides under vmaxdp run
// (offload) or on the kernel, with extra arguments on both sides.
func sockperfLayer(bed *testbed.Bed, vmaxdp string, o Options, offload bool, extra []string) (pp, oneWay float64, err error) {
	secs := strconv.Itoa(max(1, int(o.Duration/time.Second)))
	server := append([]string{"-i", bed.Addr(testbed.B).String(), "-p", strconv.Itoa(int(o.Port))}, extra...)
	for _, mode := range []string{"pp", "tp"} {
		run := sockperf.Run{Bed: bed, Vmaxdp: vmaxdp, ServerOffload: offload, ClientOffload: offload, Server: server,
			Client: append([]string{mode, "-i", bed.Addr(testbed.B).String(), "-p", strconv.Itoa(int(o.Port)), "-m", strconv.Itoa(max(14, o.Size)), "-t", secs}, extra...)}
		res, _, err := run.Do(context.Background())
		if err != nil {
			return 0, 0, fmt.Errorf("sockperf %s: %w", mode, err)
		}
		if mode == "pp" {
			if res.Latency > 0 {
				pp = 1e6 / (2 * res.Latency) // sockperf's latency is half the round trip
			}
			continue
		}
		oneWay = float64(res.ServerReceived) / float64(max(1, int(o.Duration/time.Second)))
	}
	return pp, oneWay, nil
}
