package stack

import (
	"math/bits"
	"slices"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/stack/header"
)

// A queue's frames are few (VMAXDP_RX_BUFS / 2, 2,048 by default) where a
// kernel socket's buffer is bytes: 8 MB holds some 6,500 small datagrams.
// A reader that falls behind must not hold every frame, for then the fill
// ring runs dry and the interface queue drops for every socket on it
// (rx_fill_ring_empty_descs). So once sockets hold half of a queue's
// frames, the stack copies what arrives next into buffers of its own and
// gives the frame back at once: the socket's SO_RCVBUF, not the UMEM,
// bounds its backlog, as with the kernel. The copies cost a memcpy only
// while a reader is behind.

// maxCopyBytes bounds the bytes of all copies of one stack, as udp_mem
// bounds the kernel's: beyond it, a copy is dropped and counted in its
// receiver's RxQueueDrops, as a full queue is. Each socket's own share is
// its SO_RCVBUF (UDPConn.SetRxBytesLimit).
const maxCopyBytes = 64 << 20

// copyClasses are the sizes of copy buffers, powers of two from 256 bytes
// up to one that holds any IPv4 frame, so that a small datagram does not
// take a frame's 2,048 bytes.
const (
	copyMinShift = 8
	copyClasses  = 18 - copyMinShift
)

// copyPool is the stack's copy buffers, free ones by size class. Guarded
// by the stack's rxMu.
type copyPool struct {
	free  [copyClasses][][]byte
	bytes int // allocated, in use or free
}

// copyClass is the class of the buffers that hold n bytes.
func copyClass(n int) int {
	if n <= 1<<copyMinShift {
		return 0
	}
	return bits.Len(uint(n-1)) - copyMinShift
}

// get is a buffer of at least n bytes, or nil when the pool is at
// maxCopyBytes.
func (p *copyPool) get(n int) []byte {
	k := copyClass(n)
	if f := p.free[k]; len(f) > 0 {
		b := f[len(f)-1]
		p.free[k] = f[:len(f)-1]
		return b
	}
	size := 1 << (k + copyMinShift)
	if p.bytes+size > maxCopyBytes {
		return nil
	}
	p.bytes += size
	return make([]byte, size)
}

// put takes back a buffer get gave.
func (p *copyPool) put(b []byte) {
	k := copyClass(cap(b))
	p.free[k] = append(p.free[k], b[:cap(b)])
}

// spillAt is how many of a queue's frames sockets may hold before the
// stack copies what arrives: half its receive frames, so that the other
// half stays on the fill ring for the next burst.
func (st *Stack) spillAt() int { return st.rxFrames() / 8 }

// framesLowLocked says whether q's frames run low: those sockets hold and
// those waiting on its RX ring leave less than a quarter of its receive
// frames on the fill ring. A reader that takes a datagram at a time polls
// the rings only when its socket's queue is empty, a batch at a time, so
// a burst waits on the RX ring, not in the socket's queue, and the fill
// ring runs dry with the socket's queue at 64 (syslog-ng behind loggen).
// Then the poll drains on: what it spills frees the frames. Caller holds
// rxMu.
func (st *Stack) framesLowLocked(q *queue) bool {
	w, ok := q.be.(backend.RxWaiter)
	return ok && q.lent+w.RxWaiting() > st.rxFrames()*3/4
}

// behindLocked says whether more than an eighth of q's receive frames
// wait on its RX ring: a reader that polls is not keeping up (the
// progress engine's look). Caller holds rxMu.
func (st *Stack) behindLocked(q *queue) bool {
	w, ok := q.be.(backend.RxWaiter)
	return ok && w.RxWaiting() > st.rxFrames()/8
}

// lowCheckEvery: a receive that finds its socket's queue full enough not
// to poll still looks, every lowCheckEvery-th time, whether the queues'
// frames run low, and drains them if so. The kernel queues a burst while
// its reader works through the last; here only polls do, and a reader
// with a backlog does not poll. A look reads the RX rings' producer
// indices, cache lines the kernel writes: not at every receive.
const lowCheckEvery = 16

// anyFramesLowLocked says whether any queue's frames run low. Caller
// holds rxMu.
func (st *Stack) anyFramesLowLocked() bool {
	return slices.ContainsFunc(st.queueList(), st.framesLowLocked)
}

// deliverLocked queues b, a frame of q, for c: the frame itself while q
// has frames to spare, else a copy (see spillAt). Caller holds rxMu.
func (st *Stack) deliverLocked(c *UDPConn, q *queue, b backend.Buf, p *header.Packet) {
	if q.lent <= st.spillAt() {
		c.enqueueLocked(q, b, p)
		return
	}
	st.Counters.RxSpilled.Add(1)
	st.enqueueCopyLocked(c, q, b, p)
	st.releaseLocked(q, b)
}

// enqueueCopyLocked queues a copy of b, a frame of q, for c: for the
// second and later receivers of a multicast group, or when q's frames run
// low. Caller holds rxMu.
func (st *Stack) enqueueCopyLocked(c *UDPConn, q *queue, b backend.Buf, p *header.Packet) {
	buf := st.copies.get(len(b.Data))
	if buf == nil {
		c.Counters.RxQueueDrops.Add(1)
		c.Counters.RxQueueDropBytes.Add(uint64(len(p.Payload)))
		return
	}
	d := buf[:copy(buf, b.Data)]
	cp := backend.Buf{Data: d}
	var pc header.Packet
	pc.Eth = header.Ethernet(rebase(b.Data, d, p.Eth))
	pc.IP = header.IPv4(rebase(b.Data, d, p.IP))
	pc.UDP = header.UDP(rebase(b.Data, d, p.UDP))
	pc.Payload = rebase(b.Data, d, p.Payload)
	c.queueLocked(st.copyQ, cp, &pc, q, b)
}

// rebase is the view of to that view is of from.
func rebase(from, to, view []byte) []byte {
	off := cap(from) - cap(view)
	return to[off : off+len(view)]
}
