package stack_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/bench"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
	"golang.org/x/sys/unix"
)

// The benchmarks run on a real test bed; allocs/op covers every goroutine,
// the traffic generator included. `make bench` runs them with -benchmem.

// flooded opens a spinning socket on side B with a flood of 64-byte
// datagrams arriving from side A until the benchmark ends.
func flooded(b *testing.B) *stack.UDPConn {
	bed, st := bedStack(b, &stack.Options{RxPoll: stack.RxPollForever})
	c, err := st.ListenUDP(netip.MustParseAddrPort("198.18.0.2:7777"))
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bench.Flood(ctx, bed, &bench.Options{Port: 7777, Size: 64}) }()
	b.Cleanup(func() { cancel(); <-done })
	c.SetReadDeadline(time.Now().Add(time.Minute))
	return c
}

func BenchmarkReceive(b *testing.B) {
	c := flooded(b)
	buf := make([]byte, 2048)
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkReceiveZeroCopy(b *testing.B) {
	c := flooded(b)
	var d stack.Datagram
	b.ReportAllocs()
	for b.Loop() {
		if err := c.RecvZeroCopy(&d); err != nil {
			b.Fatal(err)
		}
		d.Release()
	}
}

func BenchmarkSend(b *testing.B) {
	bed, st := bedStack(b, nil)
	kernelConn(b, bed, "198.18.0.1:7778") // exists, never read: the kernel drops what overflows
	c, err := st.DialUDP(netip.AddrPort{}, netip.MustParseAddrPort("198.18.0.1:7778"))
	if err != nil {
		b.Fatal(err)
	}
	msg := make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSendGather sends a 64-byte datagram in four pieces, as a
// server's sendmsg does with a header and a value.
func BenchmarkSendGather(b *testing.B) {
	bed, st := bedStack(b, nil)
	kernelConn(b, bed, "198.18.0.1:7778")
	c, err := st.ListenUDP(netip.AddrPort{})
	if err != nil {
		b.Fatal(err)
	}
	vec := [][]byte{make([]byte, 8), make([]byte, 24), make([]byte, 27), make([]byte, 5)}
	dst := netip.MustParseAddrPort("198.18.0.1:7778")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.WriteVecFromTo(vec, netip.Addr{}, dst); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSendSegmented sends 32 datagrams of 1,200 bytes in one send
// with a UDP_SEGMENT message, as a QUIC server sends (WriteMsg; the
// stack cuts it). The kernel receiver drops what its buffer cannot hold:
// this times the send.
func BenchmarkSendSegmented(b *testing.B) {
	bed, st := bedStack(b, nil)
	kernelConn(b, bed, "198.18.0.1:7778")
	c, err := st.ListenUDP(netip.AddrPort{})
	if err != nil {
		b.Fatal(err)
	}
	vec := [][]byte{make([]byte, 32*1200)}
	m := stack.SendMeta{Segment: 1200, SegmentSet: true}
	dst := netip.MustParseAddrPort("198.18.0.1:7778")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.WriteMsg(vec, m, dst, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSendBatch32(b *testing.B) {
	bed, st := bedStack(b, nil)
	kernelConn(b, bed, "198.18.0.1:7778")
	c, err := st.ListenUDP(netip.AddrPort{})
	if err != nil {
		b.Fatal(err)
	}
	msgs := make([][]byte, 32)
	for i := range msgs {
		msgs[i] = make([]byte, 64)
	}
	dst := netip.MustParseAddrPort("198.18.0.1:7778")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.WriteBatchToUDPAddrPort(msgs, dst); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEcho is one request and its reply between two vmaxdp stacks,
// one in each namespace of the bed.
func BenchmarkEcho(b *testing.B) {
	bed, sb := bedStack(b, &stack.Options{RxPoll: stack.RxPollForever})
	var sa *stack.Stack
	err := bed.Do(testbed.A, func() (err error) {
		sa, err = stack.Open(bed.Link(testbed.A), &stack.Options{RxPoll: stack.RxPollForever, XSK: &xsk.Options{NoHugePages: true}})
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sa.Close()
	srv, err := sb.ListenUDP(netip.MustParseAddrPort("198.18.0.2:7779"))
	if err != nil {
		b.Fatal(err)
	}
	cli, err := sa.DialUDP(netip.AddrPort{}, netip.MustParseAddrPort("198.18.0.2:7779"))
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			srv.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	defer srv.Close()
	msg, buf := make([]byte, 64), make([]byte, 2048)
	cli.SetReadDeadline(time.Now().Add(time.Minute))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cli.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := cli.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// tcpPair connects a kernel client on side A to a server on side B,
// served by the kernel or by netstack on the stack (any server but
// "kernel"), and returns the
// client's and the server's ends.
func tcpPair(b *testing.B, server string, port uint16) (*stack.Stack, net.Conn, net.Conn) {
	bed, st := bedStack(b, nil)
	laddr := netip.AddrPortFrom(bed.Addr(testbed.B), port)
	var l net.Listener
	err := bed.Do(testbed.B, func() (err error) {
		if server == "kernel" {
			l, err = net.Listen("tcp4", laddr.String())
		} else {
			l, err = st.ListenTCP(laddr)
		}
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	c, err := dialFromA(bed, laddr)
	if err != nil {
		b.Fatal(err)
	}
	c.(*net.TCPConn).SetNoDelay(true)
	s := <-accepted
	if s == nil {
		b.Fatal("accept failed")
	}
	b.Cleanup(func() { c.Close(); s.Close() })
	return st, c, s
}

// BenchmarkTCPPingPong is a 64-byte request and its reply over one TCP
// connection from a kernel client on side A to a server on side B,
// served by the kernel and by netstack on the stack, in one run. The
// netstack server echoes through gonet's net.Conn (the Go API; its
// allocations are gonet's: a waiter entry and buffers a call) and through
// the calls the engine serves an application with (engine: what
// vmaxdp run does, which allocates nothing a round trip).
func BenchmarkTCPPingPong(b *testing.B) {
	for _, server := range []string{"kernel", "netstack", "engine"} {
		b.Run(server, func(b *testing.B) {
			st, c, s := tcpPair(b, server, 7400)
			if server == "engine" {
				go engineEcho(s.(*stack.TCPConn))
			} else {
				go io.Copy(s, s)
			}
			msg, buf := make([]byte, 64), make([]byte, 64)
			rx, tx := st.TCPCounters.RxSegments.Load(), st.TCPCounters.TxSegments.Load()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					b.Fatal(err)
				}
			}
			// Segments each way per exchange: more than one means acks
			// of their own, which the kernel delays to ride on a reply.
			b.ReportMetric(float64(st.TCPCounters.RxSegments.Load()-rx)/float64(b.N), "rx_segs/op")
			b.ReportMetric(float64(st.TCPCounters.TxSegments.Load()-tx)/float64(b.N), "tx_segs/op")
		})
	}
}

// readAll reads n bytes off r on a goroutine of its own, and sends on
// the channel it returns how that ended.
func readAll(r io.Reader, n int) <-chan error {
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 64<<10)
		var err error
		for total := 0; total < n && err == nil; {
			var k int
			k, err = r.Read(buf)
			total += k
		}
		done <- err
	}()
	return done
}

// BenchmarkTCPStream is one 64-byte write of a kernel client (TCP_NODELAY)
// to a server that reads all, per op: the small-message rate one way.
func BenchmarkTCPStream(b *testing.B) {
	for _, server := range []string{"kernel", "netstack"} {
		b.Run(server, func(b *testing.B) {
			_, c, s := tcpPair(b, server, 7401)
			n := b.N
			done := readAll(s, 64*n)
			msg := make([]byte, 64)
			b.ReportAllocs()
			b.ResetTimer()
			for range n {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkTCPSendStream is one 64-byte write per op from a server on
// side B to a kernel client that reads all: the kernel's socket (write),
// and netstack's through the calls the engine serves an application
// with (WriteNonblock, EAGAIN waited out as the engine waits), whose
// writes that follow each other are coalesced (coalesce.go). tx_segs/op
// is the segments a write.
func BenchmarkTCPSendStream(b *testing.B) {
	for _, server := range []string{"kernel", "netstack"} {
		b.Run(server, func(b *testing.B) {
			st, c, s := tcpPair(b, server, 7406)
			n := b.N
			done := readAll(c, 64*n)
			msg := make([]byte, 64)
			write := func() error { _, err := s.Write(msg); return err }
			if sc, ok := s.(*stack.TCPConn); ok {
				bufs := [][]byte{msg}
				ready := make(chan struct{}, 1)
				cancel := sc.Notify(func(stack.TCPEvents) {
					select {
					case ready <- struct{}{}:
					default:
					}
				})
				defer cancel()
				write = func() error {
					for {
						n, err := sc.WriteNonblock(bufs, false)
						if err != unix.EAGAIN {
							if err == nil && n != len(msg) {
								return fmt.Errorf("a write of %d bytes took %d", len(msg), n)
							}
							return err
						}
						sc.WaitPoint()
						<-ready
					}
				}
			}
			tx := st.TCPCounters.TxSegments.Load()
			b.ReportAllocs()
			b.ResetTimer()
			for range n {
				if err := write(); err != nil {
					b.Fatal(err)
				}
			}
			if sc, ok := s.(*stack.TCPConn); ok {
				sc.WaitPoint()
			}
			if err := <-done; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(st.TCPCounters.TxSegments.Load()-tx)/float64(b.N), "tx_segs/op")
		})
	}
}
