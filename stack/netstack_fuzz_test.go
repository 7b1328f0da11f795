package stack_test

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// FuzzNetstack hands netstack, through the stack's receive path, TCP
// segments the fuzzer writes (flags, options, data offset, window,
// payload, any length) for a listener on the stack and for a connection
// a kernel client holds to it, from the client's address or from one
// nobody holds, with the checksum made right (so that the segment reaches
// netstack) or as written (so that the parser's check is fuzzed too).
// Nothing may panic, and once the run is over the listener still serves
// a new connection. (The held one may not survive: a reset or data whose
// sequence number falls in its window is the fuzzer's to send, as it is
// an attacker's on the path.)
func FuzzNetstack(f *testing.F) {
	// A bed as `ip link add` makes it: netstack's answers leave with TX
	// checksum offload on.
	bed, st := bedStackOn(f, &testbed.Options{Plain: true}, nil)
	const port = 7790
	laddr := netip.AddrPortFrom(bed.Addr(testbed.B), port)
	l := listenTCP(f, bed, st, laddr)
	wg := echoTCP(l)
	f.Cleanup(func() { l.Close(); wg.Wait() })
	held, err := dialFromA(bed, laddr)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { held.Close() })
	heldPort := uint16(held.LocalAddr().(*net.TCPAddr).Port)
	before := st.TCPCounters.RxSegments.Load()
	var delivered atomic.Int64 // frames with a checksum made right, in this process
	f.Cleanup(func() {
		// Those reach netstack: a fuzzer that never got past the parser
		// would test nothing. (With -fuzz, the inputs run in worker
		// processes, each with a bed of its own, and this process's
		// stack sees none.)
		if n := st.TCPCounters.RxSegments.Load() - before; delivered.Load() > 0 && n == 0 {
			f.Errorf("%d frames with a right checksum, none reached netstack", delivered.Load())
		}
		c, err := dialFromA(bed, laddr)
		if err != nil {
			f.Errorf("a connection after the run: %v", err)
			return
		}
		defer c.Close()
		if err := exchange(c, 1000, 100, 2); err != nil {
			f.Errorf("a connection after the run: %v", err)
		}
	})

	seg := func(flags byte, dataOff byte, opts []byte, payload string) []byte {
		s := make([]byte, 20+len(opts)+len(payload))
		s[12], s[13] = dataOff<<4, flags
		binary.BigEndian.PutUint16(s[14:], 65535)
		copy(s[20:], opts)
		copy(s[20+len(opts):], payload)
		return s
	}
	const syn, ack, fin, rst, psh = 0x02, 0x10, 0x01, 0x04, 0x08
	mss := []byte{2, 4, 0x05, 0xb4, 1, 3, 3, 7, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0}
	for _, s := range [][]byte{
		seg(syn, 10, mss, ""),
		seg(syn, 5, nil, ""),
		seg(ack|psh, 5, nil, "hello"),
		seg(ack|fin, 5, nil, ""),
		seg(rst, 5, nil, ""),
		seg(syn|fin|rst|psh|ack|0xc0, 15, make([]byte, 40), "x"),
		seg(ack, 2, nil, "short data offset"),
		seg(syn, 8, []byte{2, 4, 0, 0, 3, 3, 14, 0, 0, 0, 0, 0}, ""),
		seg(ack, 7, []byte{5, 10, 0, 0, 0, 1, 0, 0, 0, 2}, "sack"),
		{0, 1, 2},
	} {
		f.Add(s, true, uint8(0), true)
		f.Add(s, false, uint8(9), false)
	}
	f.Fuzz(func(t *testing.T, s []byte, fixChecksum bool, srcHost uint8, toHeld bool) {
		if len(s) > 1400 {
			s = s[:1400]
		}
		src := bed.Addr(testbed.A)
		if srcHost > 2 {
			// A host of the bed's subnet nobody holds: netstack's answers
			// wait for ARP, then are dropped and counted.
			a := src.As4()
			a[3] = srcHost
			src = netip.AddrFrom4(a)
		}
		frame := make([]byte, header.EthernetLen+header.IPv4MinLen+len(s))
		eth := header.Ethernet(frame)
		eth.SetType(header.EtherTypeIPv4)
		ip := header.IPv4(frame[header.EthernetLen:])
		ip.Encode(header.IPv4Fields{TotalLen: uint16(header.IPv4MinLen + len(s)), TTL: 64, Protocol: header.ProtocolTCP, Src: src, Dst: laddr.Addr()})
		tcp := frame[header.EthernetLen+header.IPv4MinLen:]
		copy(tcp, s)
		if len(tcp) >= 4 {
			binary.BigEndian.PutUint16(tcp[2:], port)
			if toHeld && src == bed.Addr(testbed.A) {
				binary.BigEndian.PutUint16(tcp[0:], heldPort)
			}
		}
		if fixChecksum && len(tcp) >= 18 {
			tcp[16], tcp[17] = 0, 0
			binary.BigEndian.PutUint16(tcp[16:], ^header.Fold(header.Sum(tcp, header.PseudoSum(src, laddr.Addr(), header.ProtocolTCP, len(tcp)))))
		}
		if stack.DeliverFrame(st, frame) && fixChecksum && len(tcp) >= 20 && int(tcp[12]>>4)*4 >= 20 && int(tcp[12]>>4)*4 <= len(tcp) {
			delivered.Add(1)
		}
	})
}
