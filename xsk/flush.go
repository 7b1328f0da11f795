package xsk

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// finalKicks bounds FlushTx's kicks: in copy mode each sends up to 32
// frames and says EAGAIN while more wait, or EBUSY for a busy device.
const finalKicks = 256

// FlushTx is the last kick of an AF_XDP socket whose owner is gone: the
// helper that outlives a process holds a copy of each of its sockets
// (package peernotify), and a send may have left frames on the TX ring
// for a coalesced kick that never came. It has the kernel send them and
// says how many went and how many are left, from the ring's own indices.
// A socket with no TX ring (served receive-only) has nothing to send.
func FlushTx(fd int) (sent, left uint32, err error) {
	var off unix.XDPMmapOffsets
	if err := getsockoptRaw(fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return 0, 0, fmt.Errorf("XDP_MMAP_OFFSETS: %w", err)
	}
	// The indices only: they come before the descriptors.
	mem, err := unix.Mmap(fd, unix.XDP_PGOFF_TX_RING, int(off.Tx.Desc), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, nil // no TX ring
	}
	defer unix.Munmap(mem)
	base := unsafe.Pointer(&mem[0])
	prod, cons := (*uint32)(unsafe.Add(base, off.Tx.Producer)), (*uint32)(unsafe.Add(base, off.Tx.Consumer))
	first := atomic.LoadUint32(cons)
	for range finalKicks {
		if atomic.LoadUint32(cons) == atomic.LoadUint32(prod) {
			break
		}
		if err = unix.Sendto(fd, nil, unix.MSG_DONTWAIT, nil); err != nil && err != unix.EAGAIN && err != unix.EBUSY {
			break
		}
		err = nil
	}
	last := atomic.LoadUint32(cons)
	return last - first, atomic.LoadUint32(prod) - last, err
}
