package stack

import (
	"net/netip"

	"github.com/vmaxdp/vmaxdp/stack/header"
)

// A UDP send to a neighbour the kernel has not resolved yet does not wait
// for ARP in the caller's thread: its datagrams wait, built as frames,
// beside the kernel's ARP request, and leave when the kernel answers
// (afterHop), as the kernel queues a neighbour's first packets
// (unres_qlen) and returns from the send at once. A send that waited
// stalled a UDP server for a second per query from an address of its
// subnet that nobody holds.

// udpParkedBytesPerHop bounds the frame bytes that wait for one next hop;
// more are dropped and counted (TxNeighDrops), as the kernel drops beyond
// its queue (unresolved_discards). It is the kernel's default
// unres_qlen_bytes, which counts each buffer's whole size (a 100-byte
// datagram takes about 1 KiB): never fewer datagrams wait here than there.
const udpParkedBytesPerHop = 212992

// udpParkedHop is what waits for one next hop's ARP answer.
type udpParkedHop struct {
	src    netip.Addr // the route's source address, for sends that follow
	frames []parkedFrame
	bytes  int // of the frames
}

// parkedFrame is a datagram built whole but for its destination MAC, and
// the socket that sent it, whose counters it joins when it leaves.
type parkedFrame struct {
	c       *UDPConn
	frame   []byte
	payload int
}

// udpPending says whether datagrams to dst wait for its ARP answer, and
// the route's source address they have.
func (st *Stack) udpPending(dst netip.Addr) (netip.Addr, bool) {
	st.udpParkMu.Lock()
	defer st.udpParkMu.Unlock()
	p, ok := st.udpParked[dst]
	if !ok {
		return netip.Addr{}, false
	}
	return p.src, true
}

// park builds msgs, to to from from (zero: the socket's address), as frames
// that wait for to's next hop, whose route gives source address hopSrc.
// False when they cannot wait (maxHopWaits next hops are awaited
// already): the kernel socket sends them, and queues them on its own.
func (c *UDPConn) park(msgs [][]byte, to netip.AddrPort, from, hopSrc netip.Addr) bool {
	st := c.st
	f, maxPayload := c.fields(to, from, nextHop{src: hopSrc})
	frames := make([]parkedFrame, 0, len(msgs))
	for _, b := range msgs {
		if len(b) > maxPayload {
			// The kernel would send it, and queue it there: it cannot
			// keep its place among the parked ones.
			return false
		}
		frame := make([]byte, header.UDPHeadersLen+len(b))
		copy(frame[header.UDPHeadersLen:], b)
		f.ID = uint16(st.ipID.Add(1))
		header.BuildUDP(frame, &f, len(b))
		frames = append(frames, parkedFrame{c: c, frame: frame, payload: len(b)})
	}
	dst := to.Addr()
	st.udpParkMu.Lock()
	defer st.udpParkMu.Unlock()
	p, waiting := st.udpParked[dst]
	if !waiting {
		// Under udpParkMu: the answer may come before p is in the map.
		if !st.afterHop(dst, func(h nextHop, err error) { st.unparkUDP(dst, h, err) }) {
			return false
		}
		if st.udpParked == nil {
			st.udpParked = map[netip.Addr]*udpParkedHop{}
		}
		p = &udpParkedHop{src: hopSrc}
		st.udpParked[dst] = p
		st.udpParkedHops.Add(1)
	}
	for _, fr := range frames {
		if p.bytes+len(fr.frame) > udpParkedBytesPerHop {
			st.Counters.TxNeighDrops.Add(1)
			continue
		}
		p.bytes += len(fr.frame)
		p.frames = append(p.frames, fr)
	}
	return true
}

// unparkRounds bounds the rounds in which unparkUDP sends what was parked
// behind the frames it sent in the round before: sends that find dst still
// awaited park behind them, so that datagrams leave in the order sent.
const unparkRounds = 8

// unparkUDP sends the datagrams parked for dst, whose next hop is h, or
// drops and counts them when the kernel could not resolve it. The sends
// that follow go the way h says (a resolved hop is cached; an unresolved
// one sends through the kernel socket for a while, which reports its
// errors the kernel's way).
func (st *Stack) unparkUDP(dst netip.Addr, h nextHop, err error) {
	resolved := err == nil && !h.viaKernel
	for round := 1; ; round++ {
		st.udpParkMu.Lock()
		p := st.udpParked[dst]
		if p == nil {
			st.udpParkMu.Unlock()
			return
		}
		frames := p.frames
		p.frames, p.bytes = nil, 0
		last := !resolved || len(frames) == 0 || round == unparkRounds
		if last {
			delete(st.udpParked, dst)
			st.udpParkedHops.Add(-1)
		}
		st.udpParkMu.Unlock()
		for _, fr := range frames {
			if !resolved || !st.sendParked(fr, h.mac) {
				st.Counters.TxNeighDrops.Add(1)
			}
		}
		if last {
			return
		}
	}
}

// sendParked puts fr on its socket's queue with destination mac; false
// when the queue is closed or has no room for it.
func (st *Stack) sendParked(fr parkedFrame, mac header.MAC) bool {
	q := fr.c.txq
	q.txMu.Lock()
	if q.closed {
		q.txMu.Unlock()
		return false
	}
	got := 0
	for try := 0; try < 1000 && got == 0; try++ {
		got = q.be.Alloc(q.txBufs[:1])
	}
	if got == 0 {
		q.txMu.Unlock()
		fr.c.Counters.TxNoBufs.Add(1)
		return false
	}
	tb := &q.txBufs[0]
	tb.Data = tb.Data[:copy(tb.Data, fr.frame)]
	header.Ethernet(tb.Data).SetDst(mac)
	k, _ := st.transmit(q, q.txBufs[:1], 0) // k 0: the ring is full
	if err := st.unlockTx(q); err != nil {
		fr.c.Counters.TxErrors.Add(1) // the kick's: the frame is on the ring
	}
	if k == 0 {
		return false
	}
	fr.c.Counters.TxOffloadPackets.Add(1)
	fr.c.Counters.TxOffloadBytes.Add(uint64(fr.payload))
	return true
}
