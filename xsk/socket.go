package xsk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/backend"
	vbpf "github.com/vmaxdp/vmaxdp/bpf"
	"github.com/vmaxdp/vmaxdp/internal/highfd"
)

// ErrQueueBusy is returned when another AF_XDP socket is bound to the queue.
var ErrQueueBusy = errors.New("queue busy")

// ErrNotSupported is backend.ErrNotSupported: the kernel lacks AF_XDP.
var ErrNotSupported = backend.ErrNotSupported

// BindMode selects copy or zero-copy.
type BindMode int

const (
	// BindAuto lets the kernel pick zero-copy when the driver supports it.
	BindAuto BindMode = iota
	BindCopy
	BindZeroCopy
)

// Options configure a Socket. The zero value means defaults.
type Options struct {
	// FrameSize is the UMEM frame size: 2048 (default) or 4096.
	FrameSize uint32
	// NumFrames is the UMEM size in frames, a power of two (default 4096).
	NumFrames uint32
	// Mode chooses copy or zero-copy (default BindAuto).
	Mode BindMode
	// NoHugePages skips the attempt to back the UMEM with huge pages.
	NoHugePages bool
	// RxOnly opens the socket without a TX ring, for a queue the interface
	// runs for receiving only (Channels.Tx below the queue): Alloc then
	// finds no frame and Transmit fails.
	RxOnly bool
}

// rxHeadroom is what the kernel keeps in front of each received frame
// (XDP_PACKET_HEADROOM; the UMEM asks for no headroom of its own).
const rxHeadroom = 256

// RxFrameLen is the longest frame a socket with these options receives; a
// longer one fails the redirect to it, and the kernel drops it.
func (o *Options) RxFrameLen() uint32 {
	r, _ := o.withDefaults()
	return r.FrameSize - rxHeadroom
}

// TxFrameLen is the longest frame a socket with these options transmits.
func (o *Options) TxFrameLen() uint32 {
	r, _ := o.withDefaults()
	return r.FrameSize - txMetaLen
}

// txMetaLen is the room in front of each transmit frame for the kernel's
// struct xsk_tx_metadata (Documentation/networking/xsk-tx-metadata.rst):
// u64 flags, then u16 csum_start, u16 csum_offset and u64 launch_time.
// The room is kept whether or not the kernel takes metadata, so that frame
// lengths do not depend on the kernel.
const txMetaLen = 24

func (o *Options) withDefaults() (Options, error) {
	var r Options
	if o != nil {
		r = *o
	}
	if r.FrameSize == 0 {
		r.FrameSize = 2048
	}
	if r.NumFrames == 0 {
		r.NumFrames = 4096
	}
	if r.FrameSize != 2048 && r.FrameSize != 4096 {
		return r, fmt.Errorf("frame size %d: must be 2048 or 4096", r.FrameSize)
	}
	if r.NumFrames < 64 || r.NumFrames&(r.NumFrames-1) != 0 {
		return r, fmt.Errorf("frame count %d: must be a power of two, at least 64", r.NumFrames)
	}
	return r, nil
}

// Counters are the socket's own counters; XDP_STATISTICS is in Statistics.
type Counters struct {
	RxPackets   atomic.Uint64
	TxPackets   atomic.Uint64
	RxWakeups   atomic.Uint64 // recvfrom kicks for the fill ring
	TxWakeups   atomic.Uint64 // sendto kicks for the TX ring
	TxKickErrs  atomic.Uint64 // kicks answered with an error other than EAGAIN/EBUSY/ENOBUFS
	TxBacklog   atomic.Uint64 // transmits that left frames on the TX ring: the device stayed busy (see drainTx)
	TxDeferred  atomic.Uint64 // frames TransmitLater left on the TX ring for a later kick
	MaxRxBatch  atomic.Uint64 // largest batch drained from the RX ring
	TxNoBufs    atomic.Uint64 // Alloc calls that found the transmit pool empty
	FillNoSpace atomic.Uint64 // frames Release held back: the fill ring looked full
}

// Pools describes the UMEM's two halves, one per direction.
type Pools struct {
	RingSize uint32 // entries of each ring
	RxSize   uint32 // frames for receiving; free while on the fill ring
	RxFree   uint32
	TxSize   uint32 // frames for transmitting
	TxFree   uint32
}

// Statistics is the kernel's XDP_STATISTICS for the socket.
type Statistics = unix.XDPStatistics

// RingOccupancy is a snapshot of how many entries each ring holds.
type RingOccupancy struct {
	Rx, Tx, Fill, Completion uint32
}

// Socket is one AF_XDP socket bound to one queue of one interface.
type Socket struct {
	fd       int
	ifname   string
	ifindex  int
	queue    int
	zeroCopy bool
	huge     bool
	txCsum   bool // Transmit asks the kernel to complete checksums

	umem      []byte
	frameSize uint32
	frameMask uint64

	fill, comp, rx, tx   ring
	fillAddrs, compAddrs []uint64
	rxDescs, txDescs     []unix.XDPDesc
	txFree               []uint64      // stack of free transmit frame addresses
	txOutstanding        uint32        // frames on the TX or completion ring
	txFreeN              atomic.Uint32 // len(txFree), for Pools from other goroutines
	txSize               uint32        // the transmit half of the UMEM, in frames
	fillHeld             []uint64      // RX frames waiting for room on the fill ring
	Counters             Counters
}

var hugeOnce, txMetaOnce sync.Once

// busyWait bounds how long Open waits for a queue whose previous socket is
// still being released.
const busyWait = 250 * time.Millisecond

// Open creates an AF_XDP socket bound to queue of the interface ifname in
// the calling thread's network namespace.
func Open(ifname string, queue int, opts *Options) (_ *Socket, err error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("xsk %s/q%d: %w", ifname, queue, err)
	}
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("xsk %s/q%d: %w", ifname, queue, err)
	}
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EAFNOSUPPORT) {
			err = fmt.Errorf("%w: AF_XDP (%w)", ErrNotSupported, err)
		}
		return nil, fmt.Errorf("xsk %s/q%d: socket: %w", ifname, queue, err)
	}
	fd = highfd.Move(fd)
	s := &Socket{fd: fd, ifname: ifname, ifindex: ifi.Index, queue: queue, frameSize: o.FrameSize, frameMask: ^uint64(o.FrameSize - 1)}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	if err := s.setup(o); err != nil {
		return nil, fmt.Errorf("xsk %s: %w", s, err)
	}
	return s, nil
}

func (s *Socket) setup(o Options) error {
	size := int(o.FrameSize) * int(o.NumFrames)
	var err error
	if !o.NoHugePages {
		s.umem, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE|unix.MAP_HUGETLB)
		s.huge = err == nil
	}
	if !s.huge {
		if !o.NoHugePages {
			hugeOnce.Do(func() {
				slog.Info("xsk: UMEM on regular pages: no huge pages to be had (reserve some with vm.nr_hugepages)", "err", err)
			})
		}
		s.umem, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("mmap UMEM of %d bytes: %w", size, err)
		}
		// Transparent huge pages where the kernel gives them: 4 KB pages
		// were 2,048 faults for 8 MB, 4.5-5 ms of every stack's open,
		// against 1-1.5 in 2 MB pages. Populated at once (a kernel without
		// MADV_POPULATE_WRITE faults them in at the registration below).
		unix.Madvise(s.umem, unix.MADV_HUGEPAGE)
		unix.Madvise(s.umem, unix.MADV_POPULATE_WRITE)
	}
	// TX metadata (Linux 6.11 and later) lets copy mode hand frames to the
	// device as CHECKSUM_PARTIAL, as the kernel's own UDP does: the device
	// or the kernel completes the checksum, and a receiver on this host
	// need not verify it. An older kernel refuses the flag: checksums are
	// then computed by the caller.
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&s.umem[0]))), Len: uint64(size), Size: o.FrameSize,
		Flags: unix.XDP_UMEM_TX_METADATA_LEN, Tx_metadata_len: txMetaLen}
	err = setsockoptRaw(s.fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg))
	txMeta := err == nil
	if errors.Is(err, unix.EINVAL) {
		txMetaOnce.Do(func() {
			slog.Info("xsk: the kernel takes no AF_XDP TX metadata (Linux 6.11 and later): transmit checksums are computed in user space", "err", err)
		})
		reg.Flags, reg.Tx_metadata_len = 0, 0
		err = setsockoptRaw(s.fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg))
	}
	if err != nil {
		return fmt.Errorf("register UMEM: %w", err)
	}
	// Each ring holds all frames of its half, so Release and Transmit
	// never find their ring full.
	half := o.NumFrames / 2
	rings := []struct{ opt, n int }{
		{unix.XDP_UMEM_FILL_RING, int(half)}, {unix.XDP_UMEM_COMPLETION_RING, int(half)},
		{unix.XDP_RX_RING, int(half)}, {unix.XDP_TX_RING, int(half)},
	}
	if o.RxOnly {
		rings = rings[:3]
	}
	for _, r := range rings {
		if err := setsockoptInt(s.fd, r.opt, r.n); err != nil {
			return fmt.Errorf("size ring %d: %w", r.opt, err)
		}
	}
	var off unix.XDPMmapOffsets
	if err := getsockoptRaw(s.fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return fmt.Errorf("get mmap offsets: %w", err)
	}
	if s.fill, err = mapRing(s.fd, off.Fr, unix.XDP_UMEM_PGOFF_FILL_RING, half, 8); err != nil {
		return fmt.Errorf("map fill ring: %w", err)
	}
	if s.comp, err = mapRing(s.fd, off.Cr, unix.XDP_UMEM_PGOFF_COMPLETION_RING, half, 8); err != nil {
		return fmt.Errorf("map completion ring: %w", err)
	}
	if s.rx, err = mapRing(s.fd, off.Rx, unix.XDP_PGOFF_RX_RING, half, unsafe.Sizeof(unix.XDPDesc{})); err != nil {
		return fmt.Errorf("map RX ring: %w", err)
	}
	if !o.RxOnly {
		if s.tx, err = mapRing(s.fd, off.Tx, unix.XDP_PGOFF_TX_RING, half, unsafe.Sizeof(unix.XDPDesc{})); err != nil {
			return fmt.Errorf("map TX ring: %w", err)
		}
		s.txDescs = descRing(&s.tx, off.Tx)
	}
	s.fillAddrs, s.compAddrs = addrRing(&s.fill, off.Fr), addrRing(&s.comp, off.Cr)
	s.rxDescs = descRing(&s.rx, off.Rx)
	// Producer rings start with all slots free.
	s.fill.cachedCons, s.tx.cachedCons = half, half

	// Prime the fill ring before bind: the first packet must find a buffer.
	n := s.fill.reserve(half)
	for i := uint32(0); i < n; i++ {
		s.fillAddrs[(s.fill.cachedProd+i)&s.fill.mask] = uint64(i) * uint64(o.FrameSize)
	}
	s.fill.submit(n)
	s.fillHeld = make([]uint64, 0, half)
	s.txSize = o.NumFrames - half
	if o.RxOnly {
		s.txSize = 0
	}
	s.txFree = make([]uint64, 0, s.txSize)
	for i := half; i < half+s.txSize; i++ {
		s.txFree = append(s.txFree, uint64(i)*uint64(o.FrameSize))
	}
	s.txFreeN.Store(uint32(len(s.txFree)))

	sa := &unix.SockaddrXDP{Flags: unix.XDP_USE_NEED_WAKEUP, Ifindex: uint32(s.ifindex), QueueID: uint32(s.queue)}
	switch o.Mode {
	case BindCopy:
		sa.Flags |= unix.XDP_COPY
	case BindZeroCopy:
		sa.Flags |= unix.XDP_ZEROCOPY
	}
	// A socket just closed on this queue keeps it bound until the kernel
	// drops its last reference after an RCU grace period (20-30 ms seen
	// here): wait for that before calling the queue busy.
	err = unix.Bind(s.fd, sa)
	for deadline := time.Now().Add(busyWait); errors.Is(err, unix.EBUSY) && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
		err = unix.Bind(s.fd, sa)
	}
	if err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("bind: %w: %s", ErrQueueBusy, busyOwner(s.ifindex, s.queue))
		}
		if errors.Is(err, unix.EOPNOTSUPP) && o.Mode == BindZeroCopy {
			return fmt.Errorf("bind zero-copy: %w: driver has no zero-copy AF_XDP (%w)", ErrNotSupported, err)
		}
		return fmt.Errorf("bind: %w", err)
	}
	var opts uint32
	if err := getsockoptRaw(s.fd, unix.XDP_OPTIONS, unsafe.Pointer(&opts), 4); err == nil {
		s.zeroCopy = opts&unix.XDP_OPTIONS_ZEROCOPY != 0
	}
	// In copy mode the kernel builds an skb from the metadata, and the
	// skb path completes the checksum whatever the device offers. In
	// zero-copy mode the driver would have to (xsk_tx_metadata_ops), and
	// one that does not would send the partial sum: compute it here.
	s.txCsum = txMeta && !s.zeroCopy && !o.RxOnly
	return nil
}

// String names the queue: "veth0/q0".
func (s *Socket) String() string { return fmt.Sprintf("%s/q%d", s.ifname, s.queue) }

// FD is the socket's descriptor: register it in an XSKMAP, or poll it.
func (s *Socket) FD() int { return s.fd }

// Ifindex and Queue identify what the socket is bound to.
func (s *Socket) Ifindex() int { return s.ifindex }
func (s *Socket) Queue() int   { return s.queue }

// RxOnly reports whether the socket has no TX ring (Options.RxOnly).
func (s *Socket) RxOnly() bool { return s.txDescs == nil }

// ZeroCopy reports whether the kernel granted zero-copy mode.
func (s *Socket) ZeroCopy() bool { return s.zeroCopy }

// TxChecksum implements backend.Backend: the kernel completes the
// checksums Transmit is asked for (copy mode with TX metadata).
func (s *Socket) TxChecksum() bool { return s.txCsum }

// HugePages reports whether the UMEM is backed by huge pages.
func (s *Socket) HugePages() bool { return s.huge }

// Receive implements backend.Backend.
func (s *Socket) Receive(bufs []backend.Buf) int {
	n := s.rx.peek(uint32(len(bufs)))
	if n == 0 {
		s.refill()
		if s.fill.needWakeup() {
			s.Counters.RxWakeups.Add(1)
			kickRx(s.fd)
		}
		return 0
	}
	cons := s.rx.cachedCons
	for i := uint32(0); i < n; i++ {
		d := &s.rxDescs[(cons+i)&s.rx.mask]
		bufs[i] = backend.Buf{Data: s.umem[d.Addr : d.Addr+uint64(d.Len) : d.Addr+uint64(d.Len)], ID: d.Addr}
	}
	s.rx.release(n)
	s.Counters.RxPackets.Add(uint64(n))
	if uint64(n) > s.Counters.MaxRxBatch.Load() {
		s.Counters.MaxRxBatch.Store(uint64(n))
	}
	return int(n)
}

// RxWaiting implements backend.RxWaiter: the frames on the RX ring that
// Receive has yet to take.
func (s *Socket) RxWaiting() int { return int(atomic.LoadUint32(s.rx.producer) - s.rx.cachedCons) }

// Arrival implements backend.ArrivalStamper: the steering program's
// arrival stamp (steer.Program.StampArrivals) in the metadata just before the
// frame, which copy mode copies with it.
func (s *Socket) Arrival(b backend.Buf) (monoNs int64, ok bool) {
	if b.ID < vbpf.ArrivalMetaLen || b.ID > uint64(len(s.umem)) {
		return 0, false
	}
	m := s.umem[b.ID-vbpf.ArrivalMetaLen : b.ID]
	if binary.NativeEndian.Uint32(m[8:]) != vbpf.ArrivalMagic {
		return 0, false
	}
	return int64(binary.NativeEndian.Uint64(m[0:])), true
}

// Release implements backend.Backend: frames go back on the fill ring.
// The fill ring has a slot for every RX frame, but the kernel publishes
// its consumer index lazily (copy mode takes frames before it says so), so
// the ring can look full for a moment: frames that do not fit wait in
// fillHeld for the next Release or Receive, and are counted in FillNoSpace.
func (s *Socket) Release(bufs []backend.Buf) {
	s.refill()
	n := s.fill.reserve(uint32(len(bufs)))
	prod := s.fill.cachedProd
	for i := uint32(0); i < n; i++ {
		s.fillAddrs[(prod+i)&s.fill.mask] = bufs[i].ID & s.frameMask
	}
	s.fill.submit(n)
	for _, b := range bufs[n:] {
		s.fillHeld = append(s.fillHeld, b.ID&s.frameMask)
	}
	s.Counters.FillNoSpace.Add(uint64(len(bufs) - int(n)))
	if s.fill.needWakeup() {
		s.Counters.RxWakeups.Add(1)
		kickRx(s.fd)
	}
}

// refill puts the frames held back by Release on the fill ring.
func (s *Socket) refill() {
	if len(s.fillHeld) == 0 {
		return
	}
	n := s.fill.reserve(uint32(len(s.fillHeld)))
	prod := s.fill.cachedProd
	for i := uint32(0); i < n; i++ {
		s.fillAddrs[(prod+i)&s.fill.mask] = s.fillHeld[i]
	}
	s.fill.submit(n)
	s.fillHeld = s.fillHeld[:copy(s.fillHeld, s.fillHeld[n:])]
}

// reap moves frames the kernel has sent back to the transmit pool.
func (s *Socket) reap() {
	n := s.comp.peek(s.comp.size)
	if n == 0 {
		return
	}
	cons := s.comp.cachedCons
	for i := uint32(0); i < n; i++ {
		s.txFree = append(s.txFree, s.compAddrs[(cons+i)&s.comp.mask]&s.frameMask)
	}
	s.comp.release(n)
	s.txOutstanding -= n
	s.txFreeN.Store(uint32(len(s.txFree)))
}

// Alloc implements backend.Backend.
func (s *Socket) Alloc(bufs []backend.Buf) int {
	if len(s.txFree) < len(bufs) {
		s.reap()
		if len(s.txFree) == 0 && s.txOutstanding > 0 {
			// Copy mode sends only inside sendto: kick, then look again.
			s.kick()
			s.reap()
		}
	}
	n := min(len(bufs), len(s.txFree))
	if n == 0 {
		s.Counters.TxNoBufs.Add(1)
		return 0
	}
	for i := 0; i < n; i++ {
		a := s.txFree[len(s.txFree)-1-i]
		end := a + uint64(s.frameSize)
		bufs[i] = backend.Buf{Data: s.umem[a+txMetaLen : end : end], ID: a + txMetaLen}
	}
	s.txFree = s.txFree[:len(s.txFree)-n]
	s.txFreeN.Store(uint32(len(s.txFree)))
	return n
}

// Transmit implements backend.Backend. A device that stays busy keeps
// frames queued (Unsent), which is no error of Transmit's.
func (s *Socket) Transmit(bufs []backend.Buf) (int, error) {
	n, err := s.enqueue(bufs)
	if err != nil {
		return 0, err
	}
	if err := s.drainTx(); err != nil && !errors.Is(err, backend.ErrBusy) {
		return n, fmt.Errorf("xsk %s: transmit: %w", s, err)
	}
	return n, nil
}

// txKickBatch is the most frames copy mode sends in one kick
// (TX_BATCH_SIZE in net/xdp/xsk.c): TransmitLater kicks once the ring
// holds that many, since waiting longer saves no system call.
const txKickBatch = 32

// TransmitLater implements backend.Backend: the frames go on the TX
// ring, and the kick waits for a full batch, a Transmit or a Flush.
func (s *Socket) TransmitLater(bufs []backend.Buf) (int, error) {
	n, err := s.enqueue(bufs)
	if err != nil {
		return 0, err
	}
	if s.tx.occupancy() >= txKickBatch {
		if err := s.drainTx(); err != nil && !errors.Is(err, backend.ErrBusy) {
			return n, fmt.Errorf("xsk %s: transmit: %w", s, err)
		}
		return n, nil
	}
	s.Counters.TxDeferred.Add(uint64(n))
	return n, nil
}

// Enqueue implements backend.Backend.
func (s *Socket) Enqueue(bufs []backend.Buf) (int, error) { return s.enqueue(bufs) }

// Flush implements backend.Backend. An empty ring needs no kick: the
// kernel took the frames already (in copy mode a poll(2) on the socket
// sends its TX ring too). It reads only the rings' shared indices and
// flags, so it may run beside enqueue and reap on another thread: the
// ring has one producer, and the kernel is its consumer.
func (s *Socket) Flush() error {
	if s.tx.occupancy() == 0 {
		return nil
	}
	if err := s.drainTx(); err != nil {
		return fmt.Errorf("xsk %s: transmit: %w", s, err)
	}
	return nil
}

// Unsent implements backend.Backend: frames on the TX ring that the
// kernel takes only at a kick. Read from the ring, so that it holds
// whoever kicked last.
func (s *Socket) Unsent() bool {
	return s.txDescs != nil && s.tx.needWakeup() && s.tx.occupancy() > 0
}

// enqueue puts the frames on the TX ring.
func (s *Socket) enqueue(bufs []backend.Buf) (int, error) {
	if s.txDescs == nil {
		return 0, fmt.Errorf("xsk %s: transmit: %w: receive-only queue", s, unix.EOPNOTSUPP)
	}
	n := s.tx.reserve(uint32(len(bufs)))
	prod := s.tx.cachedProd
	for i := uint32(0); i < n; i++ {
		b := &bufs[i]
		d := unix.XDPDesc{Addr: b.ID, Len: uint32(len(b.Data))}
		if b.CsumStart != 0 && s.txCsum {
			s.putCsumMeta(b)
			d.Options = unix.XDP_TX_METADATA
		}
		s.txDescs[(prod+i)&s.tx.mask] = d
	}
	s.tx.submit(n)
	s.txOutstanding += n
	s.Counters.TxPackets.Add(uint64(n))
	return int(n), nil
}

// putCsumMeta writes the struct xsk_tx_metadata in front of b's frame
// that asks for its checksum (native byte order, as the kernel reads it).
func (s *Socket) putCsumMeta(b *backend.Buf) {
	m := (*[txMetaLen]byte)(s.umem[b.ID-txMetaLen : b.ID])
	*(*uint64)(unsafe.Pointer(&m[0])) = unix.XDP_TXMD_FLAGS_CHECKSUM
	*(*uint16)(unsafe.Pointer(&m[8])) = b.CsumStart
	*(*uint16)(unsafe.Pointer(&m[10])) = b.CsumOffset
	*(*uint64)(unsafe.Pointer(&m[16])) = 0
}

// txDrainWait bounds how long Transmit kicks a TX ring the kernel takes
// nothing from: a device that stays busy longer (a veth peer that does
// not drain) keeps the rest for the next kick, counted in TxBacklog.
const txDrainWait = time.Millisecond

// drainTx kicks until the kernel has taken every descriptor the TX ring
// held when it began. In copy mode the kernel sends only inside a kick,
// at most 32 frames a kick, and leaves the rest when the device is busy
// (a veth peer's ring full): with one kick per Transmit, a batch of 64
// left 32 on the ring until the next send, and the last batch's for
// good. What a device that takes nothing for txDrainWait
// (backend.ErrBusy), or a failed kick, leaves is Unsent, for the owner's
// next Flush.
//
// What a sender on another thread queues meanwhile is its own to kick
// (the stack's kick latch hands it to this one's next Flush): draining
// until the ring was empty kept one thread kicking for as long as another
// sent, and a deep ring (2048 frames, 64 kicks) outlasted a deadline on
// the whole drain, which took it for a busy device.
func (s *Socket) drainTx() error {
	end := s.tx.produced()
	took := s.tx.consumed()
	var deadline time.Time
	for {
		if err := s.kick(); err != nil {
			return err
		}
		if !s.tx.pending(end) || !s.tx.needWakeup() {
			return nil
		}
		if c := s.tx.consumed(); c != took {
			took, deadline = c, time.Time{} // the device takes frames
			continue
		}
		switch now := time.Now(); {
		case deadline.IsZero():
			deadline = now.Add(txDrainWait)
		case now.After(deadline):
			s.Counters.TxBacklog.Add(1)
			return backend.ErrBusy
		}
	}
}

func (s *Socket) kick() error {
	if !s.tx.needWakeup() {
		return nil
	}
	s.Counters.TxWakeups.Add(1)
	switch e := kickTx(s.fd); e {
	case 0, unix.EAGAIN, unix.EBUSY, unix.ENOBUFS:
		// Transient: the descriptors stay queued for the next kick.
		return nil
	default:
		s.Counters.TxKickErrs.Add(1)
		return e
	}
}

// Statistics reads the kernel's XDP_STATISTICS for the socket.
func (s *Socket) Statistics() (Statistics, error) {
	var st Statistics
	if err := getsockoptRaw(s.fd, unix.XDP_STATISTICS, unsafe.Pointer(&st), unsafe.Sizeof(st)); err != nil {
		return st, fmt.Errorf("xsk %s: XDP_STATISTICS: %w", s, err)
	}
	return st, nil
}

// Occupancy reads how full each ring is.
func (s *Socket) Occupancy() RingOccupancy {
	return RingOccupancy{Rx: s.rx.occupancy(), Tx: s.tx.occupancy(), Fill: s.fill.occupancy(), Completion: s.comp.occupancy()}
}

// Pools reads the buffer pools' sizes and free frames.
func (s *Socket) Pools() Pools {
	return Pools{RingSize: s.fill.size, RxSize: s.fill.size, RxFree: s.fill.occupancy(),
		TxSize: s.txSize, TxFree: s.txFreeN.Load()}
}

// Close unmaps the rings and UMEM and closes the socket.
func (s *Socket) Close() error {
	for _, r := range []*ring{&s.fill, &s.comp, &s.rx, &s.tx} {
		r.unmap()
	}
	var err error
	if s.fd >= 0 {
		err = highfd.Close(s.fd)
		s.fd = -1
	}
	if s.umem != nil {
		unix.Munmap(s.umem)
		s.umem = nil
	}
	return err
}

var (
	_ backend.Backend        = (*Socket)(nil)
	_ backend.ArrivalStamper = (*Socket)(nil)
)
