package engine

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stack"
)

// Handoffs: the connections netstack completed on a listener that goes
// back to the kernel at a fork (handoverAtFork) and nobody accepted yet.
// The kernel's listener would hold them in its backlog for whichever
// process accepts first, the parent or a child; reset at Forked, they
// failed the first requests a prefork server took after its fork
// (TestRunTCPPrefork, once in four make test runs). They move to kernel
// sockets (TCP_REPAIR) queued on a Unix socket (SOCK_SEQPACKET: one
// connection a message, taken whole by one process) made before the
// fork, which the children inherit; an accept on the listener, in any of
// the processes, takes one from there before it asks the kernel (the
// preload library in a child, TakeHandoff in this process). The
// handshakes netstack had begun when the fork began complete within a
// round trip: the listener hands their connections on for handoverGrace
// before it closes.
//
// The queue does not make the listener readable: for each connection on
// it this process knocks (stack.NetstackListener.Knock), a connection
// from stack.KnockAddr to the kernel listener, which wakes a process
// waiting in accept, poll, select or epoll; its accept closes the knock
// and takes from the queue instead. Those left on the queue after
// handoverMax are closed, and the log says how many.

// Handoff is a ForkPage slot: one listener's queue of handed connections.
// The preload library's C half has the same layout (struct vmx_handoff).
type Handoff struct {
	// Inode is the listener's kernel socket (st_ino): an accept on an fd
	// that names it takes from the queue.
	Inode uint64
	// Chan is the queue's fd, the same number in every process, and
	// ChanInode its socket: a child checks the number still names it
	// (the child may have closed it, and the number name another file).
	ChanInode uint64
	Chan      int32
	// Left counts the connections on the queue; Open is 1 while this
	// process may queue more. Chan closes once both are 0.
	Left, Open int32
	_          int32
}

// maxHandoffs bounds the slots of a process's life: a listener hands
// off at its first fork only (it is the kernel's after it).
const maxHandoffs = 64

// handoff is this process's side of a Handoff slot.
type handoff struct {
	h    *Handoff
	send int // the queue's sending end, this process's alone
	// opts are the listener's options as the fork began, for the
	// connections: its fd may name another file by the time they come.
	opts         *listenerOptions
	handed, lost int // touched by Forking, then by closeHandoff alone
}

// openHandoff gives l, named by fds, a Handoff slot and moves to it the
// connections netstack holds for l. Caller holds e.fork.mu and has put l
// in handover: no new handshake begins in netstack (closeHandoff queues
// those under way as they complete). Without a slot, l's connections are
// reset when it closes, as before there were handoffs.
func (e *Engine) openHandoff(l *tcpListener, fds []int) {
	p := e.fork.page
	if p == nil {
		return
	}
	slot := atomic.LoadUint32(&p.Handoffs)
	fail := func(err error) {
		e.Log.Printf(params.LevelInfo, "fd %d: tcp listener %s: a queue for the connections netstack completes before fork: %v; they are reset", fds[0], l.nl.Addr(), err)
	}
	if slot >= maxHandoffs {
		fail(fmt.Errorf("all %d slots of the process used", maxHandoffs))
		return
	}
	var lst, cst unix.Stat_t
	if err := unix.Fstat(fds[0], &lst); err != nil {
		fail(err)
		return
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		fail(err)
		return
	}
	if err := unix.Fstat(pair[0], &cst); err != nil {
		unix.Close(pair[0])
		unix.Close(pair[1])
		fail(err)
		return
	}
	h := &p.Handoff[slot]
	h.Inode, h.ChanInode, h.Chan = lst.Ino, cst.Ino, int32(highfd.Move(pair[0]))
	atomic.StoreInt32(&h.Left, 0)
	atomic.StoreInt32(&h.Open, 1)
	atomic.StoreUint32(&p.Handoffs, slot+1)
	l.handoff = &handoff{h: h, send: highfd.Move(pair[1]), opts: l.options(fds[0])}
	if e.handOn(l, fds[0]); l.handoff.handed+l.handoff.lost > 0 {
		e.Log.Printf(params.LevelInfo, "fd %d: tcp listener %s: the connections netstack completed before fork (%d; %d lost) go to kernel sockets, for the first accepts on the listener in this process or a child", fds[0], l.nl.Addr(), l.handoff.handed, l.handoff.lost)
	}
}

// handOn moves the connections netstack holds for l to its queue, and
// says how many. Off Forking, the caller holds e.fork.gate for reading:
// a connection's kernel socket, while this process holds it, must not
// go to a child of fork too, which would keep it open for good.
func (e *Engine) handOn(l *tcpListener, fd int) (n int) {
	ho := l.handoff
	for {
		kfd, err := l.nl.AcceptToKernel(ho.opts.conn, l.v6)
		if err != nil && !errors.Is(err, stack.ErrNotMoved) {
			if !errors.Is(err, unix.EAGAIN) { // the stack closed: the process exits
				e.Log.Printf(params.LevelDebug, "fd %d: tcp listener %s: connections for the queue: %v", fd, l.nl.Addr(), err)
			}
			return
		}
		if err != nil {
			e.Log.Printf(params.LevelInfo, "fd %d: %v: reset", fd, err)
			ho.lost++
			continue
		}
		err = unix.Sendmsg(ho.send, []byte{0}, unix.UnixRights(kfd), nil, 0)
		unix.Close(kfd) // the queue holds it now, or the connection closes
		if err != nil {
			e.Log.Printf(params.LevelInfo, "fd %d: tcp listener %s: a connection onto the queue for accept: %v; closed", fd, l.nl.Addr(), err)
			ho.lost++
			continue
		}
		atomic.AddInt32(&ho.h.Left, 1)
		ho.handed++
		n++
	}
}

// knock wakes n of the processes waiting to accept on l. The caller
// holds e.fork.gate for reading, as for handOn.
func (e *Engine) knock(l *tcpListener, fd, n int) {
	p := e.fork.page
	for range n {
		atomic.AddInt32(&p.Knocks, 1)
		if err := l.nl.Knock(); err != nil {
			atomic.AddInt32(&p.Knocks, -1)
			e.Log.Printf(params.LevelInfo, "fd %d: %v: a process waiting in poll, select or epoll takes the connections netstack completed as the process forked at its next accept", fd, err)
			return
		}
	}
}

// closeNetstackListener closes l's netstack listener once fd, its last
// name, went to the kernel or closed: at once, or after its handoff.
func (e *Engine) closeNetstackListener(fd int, l *tcpListener) {
	if l.handoff != nil {
		go e.closeHandoff(fd, l)
		return
	}
	l.nl.Close()
}

// closeHandoff ends the netstack listener l, once fd went to the kernel:
// for handoverGrace it still hands on the connections netstack completes
// (their handshakes began before the fork), then it closes; its queue's
// end here closes once every connection on it was accepted, or after
// handoverMax, closing those still on it.
func (e *Engine) closeHandoff(fd int, l *tcpListener) {
	ho := l.handoff
	start := time.Now()
	came := make(chan struct{}, 1)
	cancel := l.nl.Notify(func() {
		select {
		case came <- struct{}{}:
		default:
		}
	})
	grace := time.NewTimer(handoverGrace)
	before, lostBefore := ho.handed, ho.lost
	// queue hands on what netstack completed, and knocks for it and for
	// n more.
	queue := func(n int) {
		e.fork.gate.RLock()
		defer e.fork.gate.RUnlock()
		e.knock(l, fd, n+e.handOn(l, fd))
	}
	queue(ho.handed) // those Forking queued too: a child may wait in epoll
	for done := false; !done; {
		select {
		case <-came:
		case <-grace.C:
			done = true
		}
		queue(0)
	}
	cancel()
	l.nl.Close()
	highfd.Close(ho.send)
	atomic.StoreInt32(&ho.h.Open, 0)
	if n, lost := ho.handed-before, ho.lost-lostBefore; n+lost > 0 {
		e.Log.Printf(params.LevelInfo, "fd %d: tcp listener %s: the connections netstack completed as the process forked (%d; %d lost) went to kernel sockets, for the first accepts on the listener in this process or a child", fd, l.nl.Addr(), n, lost)
	}
	for atomic.LoadInt32(&ho.h.Left) > 0 && time.Since(start) < handoverMax && !e.fork.stop.Load() {
		time.Sleep(100 * time.Millisecond)
	}
	e.fork.mu.Lock()
	defer e.fork.mu.Unlock()
	closed := 0
	for atomic.LoadInt32(&ho.h.Left) > 0 {
		nfd, err := takeFD(int(ho.h.Chan), 0)
		if err != nil {
			break
		}
		unix.Close(nfd)
		atomic.AddInt32(&ho.h.Left, -1)
		closed++
	}
	atomic.StoreInt32(&ho.h.Left, 0)
	highfd.Close(int(ho.h.Chan))
	if closed > 0 {
		e.Log.Printf(params.LevelInfo, "fd %d: tcp listener %s: connections netstack completed as the process forked and nobody accepted within %v: %d, closed", fd, l.nl.Addr(), handoverMax, closed)
	}
}

// TakeHandoff serves an accept on fd, a kernel listener, in this
// process: a connection handed off at fork comes first (flags as
// accept4's). ErrPassOS: none for fd; the kernel's accept goes on.
func (e *Engine) TakeHandoff(fd, flags int) (int, unix.Errno) {
	p := e.ForkPage()
	if p == nil {
		return -1, ErrPassOS
	}
	e.fork.mu.Lock()
	defer e.fork.mu.Unlock()
	var st unix.Stat_t
	for i := range min(atomic.LoadUint32(&p.Handoffs), maxHandoffs) {
		h := &p.Handoff[i]
		if atomic.LoadInt32(&h.Left) <= 0 {
			continue
		}
		if st.Ino == 0 {
			if err := unix.Fstat(fd, &st); err != nil {
				return -1, ErrPassOS
			}
		}
		if st.Ino != h.Inode {
			continue
		}
		nfd, err := takeFD(int(h.Chan), flags)
		if err != nil {
			continue // the children took them meanwhile
		}
		atomic.AddInt32(&h.Left, -1)
		return nfd, 0
	}
	return -1, ErrPassOS
}

// takeFD takes one connection off a handoff queue, with accept4's flags.
func takeFD(ch, flags int) (int, error) {
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(4))
	mflags := unix.MSG_DONTWAIT
	if flags&unix.SOCK_CLOEXEC != 0 {
		mflags |= unix.MSG_CMSG_CLOEXEC
	}
	_, oobn, _, _, err := unix.Recvmsg(ch, b[:], oob, mflags)
	if err != nil {
		return -1, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return -1, fmt.Errorf("handoff queue %d: no connection in the message: %w", ch, unix.EBADMSG)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return -1, fmt.Errorf("handoff queue %d: no connection in the message: %w", ch, unix.EBADMSG)
	}
	if err := unix.SetNonblock(fds[0], flags&unix.SOCK_NONBLOCK != 0); err != nil {
		unix.Close(fds[0])
		return -1, err
	}
	return fds[0], nil
}
