package engine

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/params"
)

// io_uring. A program that receives or sends through an io_uring ring
// reaches its sockets in the kernel, past the preload library: a UDP
// server whose recv went through the ring got nothing under vmaxdp, every
// datagram steered to the stack, where nothing asked for it. liburing
// makes its system calls itself, so neither io_uring_setup nor the ring's
// work passes through a function the library can wrap, and the ring's
// requests do not say which fds they name. So once the process has a ring
// (its mapping in /proc/self/maps), the kernel serves every socket: new
// ones stay there, and those offloaded go back. The mappings are looked
// at as a socket is decided (at most once every ringPoll), so a ring made
// first keeps every socket on the kernel from the start, and every
// ringPoll once a socket is offloaded, for a ring made after. A ring for
// files only costs the offload, never a datagram. Not seen: a ring made
// with IORING_SETUP_NO_MMAP, whose memory is the program's own.

// ringPoll is how often the watch looks at the process's mappings.
const ringPoll = 250 * time.Millisecond

const ioUringCause = "the process has an io_uring ring, whose socket calls vmaxdp cannot see: the kernel serves its sockets"

// ringWatch looks for a ring: at each decision to offload a socket (at
// most once every ringPoll), and every ringPoll once a socket is
// offloaded.
type ringWatch struct {
	start sync.Once
	seen  atomic.Bool
	last  atomic.Int64 // when the mappings were last looked at (unix ns), 0: never
	// mu guards the reads of the mappings: fd, /proc/self/maps opened
	// once and placed high (highfd), and buf, reused. An open at each
	// look took the application's lowest free fd for a moment, and a
	// thread of the application opening one then got the next number
	// (TestRunTCPCalls: accept gave fd 4 where the kernel gives 5).
	mu  sync.Mutex
	fd  int // 0: not opened yet; -1: could not be
	buf []byte
}

// hasRing says whether maps (/proc/self/maps) holds a ring's mapping.
func hasRing(maps []byte) bool { return bytes.Contains(maps, []byte("[io_uring]")) }

// ringsSeen says whether the process has a ring, looking at its mappings
// when the last look is older than ringPoll: a ring made before a socket
// keeps the socket on the kernel from its decision on. Its callers may
// hold a socket's lock: the sockets a ring found here sends back are
// handed over on a goroutine.
func (e *Engine) ringsSeen() bool {
	if e.rings.seen.Load() {
		return true
	}
	last, now := e.rings.last.Load(), time.Now().UnixNano()
	if last != 0 && now-last < int64(ringPoll) || !e.rings.last.CompareAndSwap(last, now) {
		return false
	}
	if e.lookForRing() {
		go e.ringSeen()
	}
	return e.rings.seen.Load()
}

// lookForRing reads the mappings and says whether it saw the ring first.
func (e *Engine) lookForRing() bool {
	w := &e.rings
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd == 0 {
		w.fd = -1
		fd, err := unix.Open("/proc/self/maps", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			e.Log.Printf(params.LevelWarning, "io_uring: open /proc/self/maps: %v: a ring the process makes will not be seen, and a socket it serves through one gets nothing", err)
			return false
		}
		w.fd = highfd.Move(fd)
	}
	if w.fd < 0 {
		return false
	}
	// A read from offset 0 makes the file anew.
	n := 0
	for {
		if n == len(w.buf) {
			w.buf = append(w.buf, make([]byte, max(len(w.buf), 16<<10))...)
		}
		k, err := unix.Pread(w.fd, w.buf[n:], int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil || k == 0 {
			break
		}
		n += k
	}
	return hasRing(w.buf[:n]) && w.seen.CompareAndSwap(false, true)
}

// watchRings starts the watch of an offloading process, once.
func (e *Engine) watchRings() {
	e.rings.start.Do(func() { go e.ringLoop() })
}

func (e *Engine) ringLoop() {
	t := time.NewTicker(ringPoll)
	defer t.Stop()
	for !e.rings.seen.Load() {
		e.rings.last.Store(time.Now().UnixNano())
		if e.lookForRing() {
			e.ringSeen()
			return
		}
		<-t.C
	}
}

// ringSeen hands every socket to the kernel (ioUringCause): UDP sockets at
// once, with what their queues held handed to their kernel sockets, TCP
// listeners through a handover, and netstack's connections to kernel
// sockets under the same fds where they can go (connToKernel): the
// application's fd of one names its mirror, from which a ring's read
// would take the engine's wake-up bytes. (A ring's read already pending
// on the mirror ends at the move, with 0: end of stream.)
func (e *Engine) ringSeen() {
	e.Log.Printf(params.LevelWarning, "%s (every socket, from now on; a ring for files only costs their offload)", ioUringCause)
	for fd := range e.fdsInUse() {
		if s := e.fds.Load(fd); s != nil && s.fd == fd {
			e.toOthers(s, ioUringCause)
		}
	}
	for fd := range e.fdsInUse() {
		if l := e.listeners.Load(fd); l != nil {
			e.handover(fd, l, ioUringCause)
		}
	}
	for t, fds := range e.namedConns() {
		e.connToKernel(t, fds, connMove{when: "though the process has an io_uring ring", other: "the ring", cause: ioUringCause, wait: inFlightWait})
	}
}
