package xsk

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is the user-space view of one of the four AF_XDP rings mapped from
// the kernel. The kernel and user space each own one index: the producer
// publishes entries with a store after writing them, the consumer publishes
// freed slots with a store after reading them. Go's atomic loads and stores
// are sequentially consistent, which covers the acquire/release pairs the
// kernel's ring protocol (include/uapi/linux/if_xdp.h) requires. The cached
// copies of the other side's index spare an atomic load per entry.
type ring struct {
	producer *uint32
	consumer *uint32
	flags    *uint32
	mask     uint32
	size     uint32
	// cachedProd/cachedCons: our own index, and the last value read of the
	// other side's (plus size, for producer rings: the free-slot limit).
	cachedProd uint32
	cachedCons uint32
	mem        []byte
}

func mapRing(fd int, off unix.XDPRingOffset, pgoff int64, size uint32, entry uintptr) (ring, error) {
	length := int(off.Desc + uint64(size)*uint64(entry))
	mem, err := unix.Mmap(fd, pgoff, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return ring{}, err
	}
	base := unsafe.Pointer(&mem[0])
	return ring{
		producer: (*uint32)(unsafe.Add(base, off.Producer)),
		consumer: (*uint32)(unsafe.Add(base, off.Consumer)),
		flags:    (*uint32)(unsafe.Add(base, off.Flags)),
		mask:     size - 1,
		size:     size,
		mem:      mem,
	}, nil
}

func (r *ring) unmap() {
	if r.mem != nil {
		unix.Munmap(r.mem)
		r.mem = nil
	}
}

func (r *ring) needWakeup() bool {
	return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0
}

// reserve returns how many of n slots a producer ring can take now.
func (r *ring) reserve(n uint32) uint32 {
	free := r.cachedCons - r.cachedProd
	if free < n {
		r.cachedCons = atomic.LoadUint32(r.consumer) + r.size
		free = r.cachedCons - r.cachedProd
	}
	return min(free, n)
}

// submit publishes n entries written after reserve.
func (r *ring) submit(n uint32) {
	r.cachedProd += n
	atomic.StoreUint32(r.producer, r.cachedProd)
}

// peek returns how many of n entries a consumer ring holds now.
func (r *ring) peek(n uint32) uint32 {
	avail := r.cachedProd - r.cachedCons
	if avail < n {
		r.cachedProd = atomic.LoadUint32(r.producer)
		avail = r.cachedProd - r.cachedCons
	}
	return min(avail, n)
}

// release gives n consumed entries back to the producer.
func (r *ring) release(n uint32) {
	r.cachedCons += n
	atomic.StoreUint32(r.consumer, r.cachedCons)
}

// produced is the producer index as the other side sees it.
func (r *ring) produced() uint32 { return atomic.LoadUint32(r.producer) }

// consumed is the consumer index as the other side sees it.
func (r *ring) consumed() uint32 { return atomic.LoadUint32(r.consumer) }

// pending says whether the consumer has yet to pass the producer index
// end (produced's).
func (r *ring) pending(end uint32) bool {
	return int32(end-atomic.LoadUint32(r.consumer)) > 0
}

// occupancy is the number of entries between the two indices, for stats.
func (r *ring) occupancy() uint32 {
	if r.mem == nil {
		return 0 // a ring the socket does not have (Options.RxOnly)
	}
	return atomic.LoadUint32(r.producer) - atomic.LoadUint32(r.consumer)
}

func addrRing(r *ring, off unix.XDPRingOffset) []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(&r.mem[off.Desc])), r.size)
}

func descRing(r *ring, off unix.XDPRingOffset) []unix.XDPDesc {
	return unsafe.Slice((*unix.XDPDesc)(unsafe.Pointer(&r.mem[off.Desc])), r.size)
}
