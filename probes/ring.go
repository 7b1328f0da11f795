package probes

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Ring reads the collectors' BPF ring buffer in batches, handing each
// sample to the caller in place and publishing the consumer position once
// per batch.
//
// Written here rather than taken from cilium/ebpf's ringbuf.Reader, which
// loads the producer position and stores the consumer position around
// every record and copies each one out: the BPF side reads the consumer
// position on every reservation, so its cache line crossed between the
// CPUs twice per event, and a profile of `nettrace record` under sockperf
// tp put 42% of the recorder's CPU in that reader (bench/nettrace.sh has
// the rates before and after).
//
// A Ring is not safe for concurrent use.
type Ring struct {
	cons     []byte // the consumer page (read-write)
	prodData []byte // the producer page, then the data pages mapped twice
	data     []byte
	mask     uint64
	publish  uint64 // bytes consumed between two stores of the position
	epfd     int
	events   [1]unix.EpollEvent
}

// Ring buffer record header bits (kernel/bpf/ringbuf.c).
const (
	ringBusy    = 1 << 31
	ringDiscard = 1 << 30
	ringHdrSize = 8
)

// ErrRingCorrupt is returned when the ring buffer's positions or headers
// are inconsistent.
var ErrRingCorrupt = errors.New("ring buffer corrupt")

func newRing(m *ebpf.Map) (_ *Ring, err error) {
	size := int(m.MaxEntries())
	page := os.Getpagesize()
	if size <= 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("ring buffer size %d: not a power of two", size)
	}
	// Positions are published every 1/16 of the ring, so that a long batch
	// does not keep the BPF side out of space it has been given back.
	r := &Ring{mask: uint64(size - 1), publish: uint64(size / 16), epfd: -1}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	if r.cons, err = unix.Mmap(m.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("mmap ring buffer consumer page: %w", err)
	}
	if r.prodData, err = unix.Mmap(m.FD(), int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED); err != nil {
		return nil, fmt.Errorf("mmap ring buffer data: %w", err)
	}
	r.data = r.prodData[page:]
	if r.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("ring buffer epoll: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(m.FD())}
	if err := unix.EpollCtl(r.epfd, unix.EPOLL_CTL_ADD, m.FD(), &ev); err != nil {
		return nil, fmt.Errorf("ring buffer epoll: %w", err)
	}
	return r, nil
}

func (r *Ring) consPos() *uint64 { return (*uint64)(unsafe.Pointer(&r.cons[0])) }
func (r *Ring) prodPos() *uint64 { return (*uint64)(unsafe.Pointer(&r.prodData[0])) }

// Batch calls fn with each committed sample, oldest first, then gives
// their space back to the kernel in one store. A sample is valid only
// during its call. It returns how many samples it passed; it stops at the
// first sample not yet committed, and at fn's first error.
func (r *Ring) Batch(fn func(sample []byte) error) (int, error) {
	cons := atomic.LoadUint64(r.consPos())
	prod := atomic.LoadUint64(r.prodPos())
	published := cons
	n := 0
	var err error
	for cons < prod {
		// The length is loaded atomically: its busy bit is cleared by the
		// kernel's xchg after the sample is written.
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[cons&r.mask])))
		if hdr&ringBusy != 0 {
			break
		}
		l := uint64(hdr &^ (ringBusy | ringDiscard))
		next := cons + ringHdrSize + (l+7)&^7
		if next > prod || l > r.mask {
			err = fmt.Errorf("%w: a %d-byte sample at %d runs past the producer at %d", ErrRingCorrupt, l, cons, prod)
			break
		}
		if hdr&ringDiscard == 0 {
			start := (cons + ringHdrSize) & r.mask
			if err = fn(r.data[start : start+l]); err != nil {
				break
			}
			n++
		}
		cons = next
		if cons-published >= r.publish {
			atomic.StoreUint64(r.consPos(), cons)
			published = cons
		}
	}
	atomic.StoreUint64(r.consPos(), cons)
	return n, err
}

// Wait blocks until the kernel signals data or the deadline passes. The
// BPF side wakes the reader only once enough is waiting, so callers also
// look on a timer.
func (r *Ring) Wait(deadline time.Time) error {
	ms := int(time.Until(deadline) / time.Millisecond)
	if ms < 0 {
		ms = 0
	}
	for {
		_, err := unix.EpollWait(r.epfd, r.events[:], ms)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("ring buffer wait: %w", err)
		}
		return nil
	}
}

// Close unmaps the ring.
func (r *Ring) Close() error {
	var errs []error
	if r.epfd >= 0 {
		errs = append(errs, unix.Close(r.epfd))
		r.epfd = -1
	}
	for _, b := range [][]byte{r.prodData, r.cons} {
		if b != nil {
			errs = append(errs, unix.Munmap(b))
		}
	}
	r.prodData, r.cons, r.data = nil, nil, nil
	return errors.Join(errs...)
}
