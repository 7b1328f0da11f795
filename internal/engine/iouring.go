package engine

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/params"
)

// io_uring. A program that receives or sends through an io_uring ring
// reaches its sockets in the kernel, past the preload library: a UDP
// server whose recv went through the ring got nothing under vmaxdp, every
// datagram steered to the stack, where nothing asked for it. liburing
// makes its system calls itself, so neither io_uring_setup nor the ring's
// work passes through a function the library can wrap, and the ring's
// requests do not say which fds they name. So once the process has a ring
// (its mapping in /proc/self/maps, looked at every ringPoll from the
// first offload on), the kernel serves every socket: those offloaded go
// back, and new ones stay. A ring for files only costs the offload, never
// a datagram. Not seen: a ring made with IORING_SETUP_NO_MMAP, whose
// memory is the program's own.

// ringPoll is how often the watch looks at the process's mappings.
const ringPoll = 250 * time.Millisecond

const ioUringCause = "the process has an io_uring ring, whose socket calls vmaxdp cannot see: the kernel serves its sockets"

// ringWatch looks for a ring once a socket is offloaded.
type ringWatch struct {
	start sync.Once
	seen  atomic.Bool
}

// hasRing says whether maps (/proc/self/maps) holds a ring's mapping.
func hasRing(maps []byte) bool { return bytes.Contains(maps, []byte("[io_uring]")) }

// watchRings starts the watch, once.
func (e *Engine) watchRings() {
	e.rings.start.Do(func() { go e.ringLoop() })
}

func (e *Engine) ringLoop() {
	t := time.NewTicker(ringPoll)
	defer t.Stop()
	for {
		maps, err := os.ReadFile("/proc/self/maps")
		if err != nil {
			e.Log.Printf(params.LevelWarning, "io_uring: %v: a ring the process makes will not be seen, and a socket it serves through one gets nothing", err)
			return
		}
		if hasRing(maps) {
			e.ringSeen()
			return
		}
		<-t.C
	}
}

// ringSeen hands every socket to the kernel (ioUringCause): UDP sockets at
// once, with what their queues held dropped and counted in the log, and
// TCP listeners through a handover; netstack's connections go on.
func (e *Engine) ringSeen() {
	e.rings.seen.Store(true)
	e.Log.Printf(params.LevelWarning, "%s (every socket, from now on; a ring for files only costs their offload)", ioUringCause)
	for fd := range e.fds {
		s := e.fds[fd].Load()
		if s == nil || s.fd != fd {
			continue
		}
		s.mu.Lock()
		switch s.state {
		case StateCandidate:
			e.notOffloaded(s, fmt.Sprintf("fd %d", fd), ioUringCause)
		case StateOffloaded:
			c := s.conn.Load()
			s.kernel.Store(true)
			c.Unsteer()
			if n, _ := c.QueueLen(); n > 0 {
				e.Log.Printf(params.LevelWarning, "fd %d: the %d datagrams it had queued before the ring was seen are dropped: the ring reads the kernel socket", fd, n)
			}
			s.drainCause = ioUringCause
			e.fallBack(s, c)
		}
		s.mu.Unlock()
	}
	for fd := range e.listeners {
		if l := e.listeners[fd].Load(); l != nil {
			e.handover(fd, l, ioUringCause)
		}
	}
}
