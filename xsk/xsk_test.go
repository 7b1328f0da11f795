package xsk_test

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

// open binds an AF_XDP socket on side B of bed (nil: a fresh tuned one)
// behind the steering program with one port rule.
func open(t *testing.T, bed *testbed.Bed, port uint16) (*testbed.Bed, *xsk.Socket, *steer.Program) {
	if bed == nil {
		bed = testutil.Bed(t, nil)
	}
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
	bed, s, p := open(t, nil, 7000)
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
	bed, _, _ := open(t, nil, 7001)
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
	bed, s, _ := open(t, nil, 7002)
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

// TestTxChecksum: a frame sent with Buf.CsumStart leaves with a checksum
// the kernel completed. On the tuned bed (the veth's TX checksum offload
// off) the bytes on the wire carry the full checksum; on the plain one the
// frame reaches the peer as the kernel's own UDP does, with the partial
// sum, and the peer's kernel accepts it. Either way a kernel socket
// receives every datagram and counts no checksum error.
func TestTxChecksum(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		var s *xsk.Socket
		err := bed.Do(testbed.B, func() error {
			var err error
			s, err = xsk.Open(bed.Link(testbed.B), 0, &xsk.Options{NoHugePages: true, Mode: xsk.BindCopy})
			return err
		})
		testutil.SkipIfNotSupported(t, err)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if !s.TxChecksum() {
			t.Skip("no AF_XDP TX metadata in this kernel (Linux 6.11 and later)")
		}
		const port = 7003
		var rx *net.UDPConn
		var pkt int
		err = bed.Do(testbed.A, func() error {
			var err error
			if rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: bed.Addr(testbed.A).AsSlice(), Port: port}); err != nil {
				return err
			}
			ifi, err := net.InterfaceByName(bed.Link(testbed.A))
			if err != nil {
				return err
			}
			proto := int(htons(unix.ETH_P_IP))
			if pkt, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
				return err
			}
			return unix.Bind(pkt, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifi.Index})
		})
		if rx != nil {
			defer rx.Close()
		}
		if pkt > 0 {
			defer unix.Close(pkt)
		}
		if err != nil {
			t.Fatal(err)
		}
		csumErrs := testutil.UDPStat(t, bed, testbed.A, "InCsumErrors")
		srcMAC, dstMAC := macs(t, bed)
		const n = 20
		for i := range n {
			bufs := make([]backend.Buf, 1)
			if s.Alloc(bufs) != 1 {
				t.Fatal("no transmit frame")
			}
			b := &bufs[0]
			payload := make([]byte, 100+i*61)
			for j := range payload {
				payload[j] = byte(i + j)
			}
			copy(b.Data[header.UDPHeadersLen:], payload)
			f := header.UDPFields{DstMAC: dstMAC, SrcMAC: srcMAC, TTL: 64, ID: uint16(i), PartialChecksum: true,
				Src: netip.AddrPortFrom(bed.Addr(testbed.B), 7004), Dst: netip.AddrPortFrom(bed.Addr(testbed.A), port)}
			b.Data = b.Data[:header.BuildUDP(b.Data, &f, len(payload))]
			b.CsumStart, b.CsumOffset = header.UDPChecksumStart, header.UDPChecksumOffset
			if k, err := s.Transmit(bufs); k != 1 || err != nil {
				t.Fatalf("transmit %d: %d, %v", i, k, err)
			}
		}
		buf := make([]byte, 2048)
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		for i := range n {
			k, err := rx.Read(buf)
			if err != nil {
				t.Fatalf("kernel socket got %d of %d datagrams: %v", i, n, err)
			}
			if k != 100+i*61 || buf[k-1] != byte(i+k-1) {
				t.Fatalf("datagram %d: %d bytes, last %d", i, k, buf[k-1])
			}
		}
		if d := testutil.UDPStat(t, bed, testbed.A, "InCsumErrors") - csumErrs; d != 0 {
			t.Errorf("the peer's kernel counted %d checksum errors", d)
		}
		// What crossed the link, seen by the peer's packet socket.
		seen := 0
		for seen < n {
			k, _, err := unix.Recvfrom(pkt, buf, unix.MSG_DONTWAIT)
			if err != nil {
				t.Fatalf("packet socket saw %d of %d frames: %v", seen, n, err)
			}
			var p header.Packet
			r := header.Parse(buf[:k], &p)
			if r == header.NotUDP || (r == header.Ok && p.UDP.DstPort() != port) {
				continue
			}
			want := header.Ok
			if bed.Plain {
				want = header.PartialUDPChecksum
			}
			if r != want {
				t.Fatalf("frame %d: %v, want %v", seen, r, want)
			}
			seen++
		}
	})
}

// macs reads side B's and side A's MAC addresses.
func macs(t *testing.T, bed *testbed.Bed) (b, a header.MAC) {
	t.Helper()
	for side, m := range map[testbed.Side]*header.MAC{testbed.A: &a, testbed.B: &b} {
		if err := bed.Do(side, func() error {
			ifi, err := net.InterfaceByName(bed.Link(side))
			if err == nil {
				copy(m[:], ifi.HardwareAddr)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	return b, a
}

// TestUnsent: a frame that a kick could not send (its interface is down)
// stays on the TX ring and Unsent, and the first Flush after the link
// comes back sends it. The stack's kick timer relies on this to send
// what a busy or failing device left (stack: noteUnsent).
func TestUnsent(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, s, _ := open(t, bed, 7005)
		const port = 9305
		var rx *net.UDPConn
		if err := bed.Do(testbed.A, func() error {
			var err error
			rx, err = net.ListenUDP("udp4", &net.UDPAddr{IP: bed.Addr(testbed.A).AsSlice(), Port: port})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer rx.Close()
		srcMAC, dstMAC := macs(t, bed)
		link := func(state string) error {
			return exec.Command("ip", "-n", bed.NSName(testbed.B), "link", "set", bed.Link(testbed.B), state).Run()
		}
		if err := link("down"); err != nil {
			t.Fatal(err)
		}
		defer link("up")

		bufs := make([]backend.Buf, 1)
		if s.Alloc(bufs) != 1 {
			t.Fatal("no transmit frame")
		}
		payload := []byte("unsent")
		copy(bufs[0].Data[header.UDPHeadersLen:], payload)
		f := header.UDPFields{DstMAC: dstMAC, SrcMAC: srcMAC, TTL: 64,
			Src: netip.AddrPortFrom(bed.Addr(testbed.B), 7005), Dst: netip.AddrPortFrom(bed.Addr(testbed.A), port)}
		bufs[0].Data = bufs[0].Data[:header.BuildUDP(bufs[0].Data, &f, len(payload))]
		if k, err := s.Transmit(bufs); k != 1 || !errors.Is(err, unix.ENETDOWN) {
			t.Fatalf("transmit with the link down: %d, %v; want 1, ENETDOWN", k, err)
		}
		if !s.Unsent() {
			t.Fatal("a frame the kick could not send is not Unsent")
		}
		if err := link("up"); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(2 * time.Second); s.Unsent(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("still Unsent 2 s after the link came up: %v", s.Flush())
			}
			s.Flush()
		}
		buf := make([]byte, 64)
		rx.SetReadDeadline(time.Now().Add(2 * time.Second))
		if n, err := rx.Read(buf); err != nil || string(buf[:n]) != string(payload) {
			t.Fatalf("kernel socket got %q, %v; want %q", buf[:n], err, payload)
		}
	})
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// TestFlushBesideSends: a Flush on one goroutine while another queues
// frames without pause (Enqueue) drains what the ring held when it began
// and returns: it neither kicks for as long as the other sends nor takes
// a deep ring for a busy device (backend.ErrBusy: nothing taken for
// txDrainWait, 1 ms).
func TestFlushBesideSends(t *testing.T) {
	testutil.EachBed(t, nil, func(t *testing.T, bed *testbed.Bed) {
		_, s, _ := open(t, bed, 7006)
		srcMAC, dstMAC := macs(t, bed)
		f := header.UDPFields{DstMAC: dstMAC, SrcMAC: srcMAC, TTL: 64,
			Src: netip.AddrPortFrom(bed.Addr(testbed.B), 7006), Dst: netip.AddrPortFrom(bed.Addr(testbed.A), 9306)}
		stop := make(chan struct{})
		sent := make(chan int)
		go func() {
			bufs := make([]backend.Buf, 1)
			n := 0
			for {
				select {
				case <-stop:
					sent <- n
					return
				default:
				}
				if s.Alloc(bufs) != 1 {
					continue // all in flight: Alloc kicks and reaps
				}
				bufs[0].Data = bufs[0].Data[:header.BuildUDP(bufs[0].Data, &f, 18)]
				if k, err := s.Enqueue(bufs); k == 1 && err == nil {
					n++
				}
			}
		}()
		var busy, slow int
		deadline := time.Now().Add(200 * time.Millisecond)
		for time.Now().Before(deadline) {
			start := time.Now()
			err := s.Flush()
			if errors.Is(err, backend.ErrBusy) {
				busy++
			} else if err != nil {
				t.Errorf("flush: %v", err)
			}
			if time.Since(start) >= 50*time.Millisecond {
				slow++
			}
		}
		close(stop)
		n := <-sent
		s.Flush()
		t.Logf("%d frames queued beside the flushes; %d flushes said busy, %d took 50 ms or more", n, busy, slow)
		if busy > 0 {
			t.Errorf("%d flushes said the device was busy while another goroutine queued (%d frames): it took frames all along", busy, n)
		}
		if slow > 0 {
			t.Errorf("%d flushes took 50 ms or more while another goroutine queued: a flush must drain what the ring held when it began, not what comes after", slow)
		}
	})
}

// A UMEM on regular pages asks for transparent huge pages where the
// kernel has them (madvise or always): its mapping is THP-eligible, so
// the open faults in 2 MB pages rather than 2,048 small ones.
func TestUMEMTransparentHugePages(t *testing.T) {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || strings.Contains(string(mode), "[never]") {
		t.Skipf("transparent huge pages are off here (%q, %v)", mode, err)
	}
	_, s, _ := open(t, nil, 9)
	if s.HugePages() {
		t.Skip("the UMEM is on reserved huge pages")
	}
	bufs := make([]backend.Buf, 1)
	if s.Alloc(bufs) != 1 {
		t.Fatal("no TX buffer")
	}
	addr := uint64(uintptr(unsafe.Pointer(&bufs[0].Data[:1][0])))
	s.Release(bufs)
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	var in bool
	for _, line := range strings.Split(string(smaps), "\n") {
		var lo, hi uint64
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 {
			in = lo <= addr && addr < hi
			continue
		}
		if in && strings.HasPrefix(line, "THPeligible:") {
			if strings.TrimSpace(strings.TrimPrefix(line, "THPeligible:")) != "1" {
				t.Errorf("the UMEM's mapping: %s, want THPeligible: 1", line)
			}
			return
		}
	}
	t.Errorf("no mapping of /proc/self/smaps holds the UMEM at %#x", addr)
}
