// Package xsk opens AF_XDP sockets: one per (interface, queue), each with its
// own UMEM and its fill, completion, RX and TX rings, and implements
// backend.Backend over them.
//
// Why not github.com/asavie/xdp or gVisor's pkg/xdp: asavie/xdp neither
// honours need_wakeup (it kicks the kernel with a syscall on every transmit
// and poll, the dominant cost in copy mode) nor publishes ring indices with
// atomic stores, and it allocates a slice of descriptors per receive call;
// gVisor's pkg/xdp carries the gVisor dispatcher with it. The rings here are
// a few dozen lines over golang.org/x/sys/unix: atomic index loads and
// stores with cached copies, batched reservation, a wakeup syscall only when
// the kernel sets XDP_RING_NEED_WAKEUP, and no allocation per packet
// (BenchmarkRing* and the testbed benchmarks in stack/ show 0 allocs/op).
//
// The UMEM is split in two: half of the frames prime the fill ring before
// bind (so the first packets find buffers), half form the transmit pool.
// Frames are returned to the fill ring by Release and to the transmit pool
// when the completion ring reports them sent.
//
// A Socket is not safe for concurrent use; its owner serialises calls.
// Counters may be read at any time from any goroutine.
package xsk
