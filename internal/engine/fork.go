package engine

import (
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stack"
)

// What fork() does to the sockets the engine serves. The child never runs
// the engine (its Go runtime has no threads), so it uses every socket it
// inherits through the kernel:
//   - before the fork (Forking), connections accepted or connected and not
//     used yet move to kernel sockets under the same fds, for the child
//     that will likely serve them;
//   - after it (Forked), the listeners and UDP sockets go back to the
//     kernel, which serves them to both processes, except those this
//     process's event loop serves (kept): a child that never touches
//     them (redis' BGSAVE, dnsmasq's child for a TCP query, a helper
//     process) leaves them offloaded. A child that does use one, or execs
//     a program that inherits it, claims it through a page both processes
//     share (ForkPage), and this process hands it to the kernel before the
//     child's call goes on.
//   - connections in use stay this process's, and may be claimed: a
//     child that uses one (a CGI server's child that makes it its
//     standard output and execs the script) gets it as a kernel socket
//     the connection moves to then (claimedConn). One that cannot move
//     (an epoll set's member, a thread of this process asleep on it) is
//     refused, and the child's calls on it fail with ENOTCONN.

// Forking runs before fork(), in the forking thread. A connection the
// process accepted or connected and has not used yet (no read, no write)
// is likely the child's, as in a server that accepts and forks a child
// to serve each connection (sshd, socat's fork, Python's
// ForkingTCPServer, inetd's way): it moves to a kernel socket
// (stack.TCPConn.ToKernel) under the same fd, which the child then
// shares. Connections in use stay this process's (a child of redis'
// BGSAVE never touches them), and a child may claim them. Then it
// chooses the listeners and UDP sockets kept offloaded across the fork
// (keepAtFork), before the child can claim one.
func (e *Engine) Forking() {
	e.fork.gate.Lock()
	e.fork.gated.Store(true)
	moved := map[uint16]bool{} // local ports of the connections moved
	for t, named := range e.namedConns() {
		if t.used.Load() {
			continue
		}
		local, _ := t.c.Addrs()
		if e.connToKernel(t, named, atFork) {
			moved[local.Port()] = true
		}
	}
	e.keepAtFork(moved)
	e.handoverAtFork()
}

// namedConns are netstack's connections, each with the fds that name it.
func (e *Engine) namedConns() map[*tcpConn][]int {
	named := map[*tcpConn][]int{}
	for fd := range e.fdsInUse() {
		if t := e.conns.Load(fd); t != nil {
			named[t] = append(named[t], fd)
		}
	}
	return named
}

// handoverAtFork puts in handover the listeners that go to the kernel at
// Forked (not kept): their new connections go to the kernel's listener
// from now on, which the children share. Left to Forked, a connection
// whose SYN came while the process forked was netstack's, and reset as
// Forked closed its listener: the first request after a prefork
// server's fork failed, refused or reset, in 4 runs of 8 of
// TestRunTCPPrefork beside make test. The connections netstack completed
// before wait for an accept on kernel sockets (openHandoff).
func (e *Engine) handoverAtFork() {
	e.fork.mu.Lock()
	defer e.fork.mu.Unlock()
	e.fork.closing = map[*tcpListener]bool{}
	for fd := range e.fdsInUse() {
		l := e.listeners.Load(fd)
		if l == nil || e.fork.atFork[fd] == any(l) || l.nl.InHandover() {
			continue
		}
		if started, err := l.nl.Handover(); started && err == nil {
			l.forking.Store(true)
			e.fork.closing[l] = true
		}
	}
	for l := range e.fork.closing {
		var fds []int
		for fd := range e.fdsInUse() {
			if e.listeners.Load(fd) == l {
				fds = append(fds, fd)
			}
		}
		e.openHandoff(l, fds)
	}
}

// connToKernel moves t, named by fds, to a kernel socket under the same
// fds, for another process to share (at fork, or passed with SCM_RIGHTS:
// move says which), and says whether it did. One in an epoll set stays:
// the set's registration of the mirror would go with it. (A thread
// waiting to read it has used it: its wait is on the mirror.)
func (e *Engine) connToKernel(t *tcpConn, fds []int, move connMove) bool {
	local, remote := t.c.Addrs()
	t.mu.Lock()
	sets := t.sets
	t.mu.Unlock()
	if sets > 0 {
		e.Log.Printf(params.LevelInfo, "fd %d: tcp connection %s>%s stays this process's %s: it is in an epoll set; %s cannot use it", fds[0], local, remote, move.when, move.other)
		return false
	}
	kfd, err := t.c.ToKernel()
	// Bytes in flight stay netstack's: their ACK comes within a round
	// trip (a delayed one: 40 ms from a Linux peer).
	for deadline := time.Now().Add(move.wait); errors.Is(err, stack.ErrUnsent) && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
		kfd, err = t.c.ToKernel()
	}
	if err != nil {
		e.Log.Printf(params.LevelInfo, "fd %d: %v: it stays this process's %s, and %s cannot use it", fds[0], err, move.when, move.other)
		return false
	}
	defer unix.Close(kfd)
	// What lives in the open file description, shared by every fd naming
	// it: O_NONBLOCK, and the timeouts the mirror kept.
	if t.nonblock.Load() {
		unix.SetNonblock(kfd, true)
	}
	for _, o := range []int{unix.SO_RCVTIMEO, unix.SO_SNDTIMEO} {
		if tv, err := unix.GetsockoptTimeval(fds[0], unix.SOL_SOCKET, o); err == nil {
			unix.SetsockoptTimeval(kfd, unix.SOL_SOCKET, o, tv)
		}
	}
	for _, fd := range fds {
		flags := 0
		if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && fl&unix.FD_CLOEXEC != 0 {
			flags = unix.O_CLOEXEC
		}
		if err := unix.Dup3(kfd, fd, flags); err != nil {
			e.Log.Printf(params.LevelError, "fd %d: tcp connection %s>%s: in place of its mirror: %v; the connection is lost", fd, local, remote, err)
		}
		e.conns.Store(fd, nil)
		e.onState(fd, StateKernel)
		e.noteStream(fd, func(n *kernelStream) { n.reason = move.cause })
	}
	if move.give != nil {
		move.give(kfd)
	}
	e.logLost(fds[0], t)
	t.end()
	e.Log.Printf(params.LevelInfo, "fd %d: tcp connection %s>%s: %s", fds[0], local, remote, move.cause)
	return true
}

// connMove is the occasion of a connToKernel: when, for the log of a
// connection that stays; who else would use it; the cause of one moved;
// and how long to wait for the ACK of bytes in flight.
type connMove struct {
	when, other, cause string
	wait               time.Duration
	// give, if set, gets the kernel socket before the mirror ends: a
	// forked child's claim sends it to the child (claimedConn).
	give func(kfd int)
}

// inFlightWait bounds the wait of a move for the ACK of what the
// application wrote just before (connMove.wait).
const inFlightWait = 250 * time.Millisecond

// atFork is Forking's connMove: its connections are unused, nothing is
// in flight.
var atFork = connMove{when: "at fork", other: "a child", cause: "handed to a kernel socket before fork (TCP_REPAIR), unused until then: the child may serve it"}

// forkedCause is why a socket shared with a forked child stays on the
// kernel.
const forkedCause = "shared with a child process after fork: the child cannot use this process's engine, so the kernel serves the socket to both (open the socket after fork, or exec in the child, to offload it)"

// Forked hands every socket the process now shares with a child of fork()
// back to the kernel, but those kept (keepAtFork): steered to this
// process, a datagram or connection would never reach a child that reads
// or accepts on the socket (a server that forks its workers after opening
// its sockets, as nsd and prefork servers do). A socket's datagrams
// already queued go to its kernel socket, where either process finds
// them (toOthers). netstack's connections not yet accepted on
// a listener go to kernel sockets for the first accepts in any of the
// processes (openHandoff; without a slot for them, they are reset, as a
// closed listener's are); a listener in handover (going to the kernel
// already) keeps them for this process's accepts. Candidates are decided
// for the kernel at once.
func (e *Engine) Forked() {
	if e.fork.gated.Swap(false) {
		e.fork.gate.Unlock()
	}
	if e.announced.Load() && !e.fork.told.Swap(true) {
		// tftpd-hpa, nsd and inetd's way serve each request or share of
		// the load in a child, whose traffic the kernel serves: the log
		// must say why, as the child cannot. A process with no IP socket
		// yet (a shell, a wrapper) says nothing, as it wrote no banner.
		e.Log.Printf(params.LevelInfo, "fork: a child of this process (forked, not exec'd) uses the sockets it opens through the kernel: vmaxdp serves this process, its threads and the programs its children exec")
	}
	e.fork.mu.Lock()
	kept, closing := e.fork.atFork, e.fork.closing
	e.fork.mu.Unlock()
	for fd := range e.fdsInUse() {
		if l := e.listeners.Load(fd); l != nil && kept[fd] != any(l) && (!l.nl.InHandover() || closing[l]) {
			e.listenerToKernel(fd, l, forkedCause)
		}
	}
	seen := map[*Socket]bool{}
	for fd := range e.fdsInUse() {
		s := e.fds.Load(fd)
		if s == nil || seen[s] || kept[fd] == any(s) {
			continue
		}
		seen[s] = true
		e.toOthers(s, forkedCause)
	}
}

// ForkPage is the memory a process under vmaxdp shares with its children
// of fork (MAP_SHARED), so that a child can claim a socket this process
// kept offloaded across the fork. The preload library's C half has the
// same layout (struct vmx_fork_page), checked where it is compiled.
type ForkPage struct {
	// Seq counts the children's claims: the engine sleeps on it (a futex
	// shared between the processes) between them.
	Seq uint32
	// EnginePID is this process: a child stops waiting for an answer
	// once it is gone.
	EnginePID int32
	// Handoffs counts the slots of Handoff ever used (handoff.go): 0
	// spares an accept the look.
	Handoffs uint32
	// Knocks counts the knocks on listeners (handoff.go) no accept has
	// taken yet: 0 spares an accept the look at its connection's peer.
	Knocks  int32
	Handoff [maxHandoffs]Handoff
	// FD says, per fd: 0, not kept (the kernel's already); forkKept,
	// kept, and a child may claim it; > 0, the pid of the child that
	// claimed it, which waits (futex) for the engine to set 0.
	FD [MaxFD]int32
}

// forkKept marks a ForkPage.FD slot that a child may claim.
const forkKept = -1

// forkState is what the engine keeps of its forks.
type forkState struct {
	told atomic.Bool // the first fork was logged
	mu   sync.Mutex
	page *ForkPage
	// kept maps each fd kept offloaded at the last fork, and not claimed
	// yet, to its *tcpListener or *Socket; a claim acts on that socket
	// only while the fd still names it. atFork is kept as the fork began,
	// for Forked, which leaves the claimed ones to claimed: a child may
	// claim before the parent returns from fork.
	kept, atFork map[int]any
	// closing are the listeners Forking put in handover, to go to the
	// kernel at Forked.
	closing map[*tcpListener]bool
	// serving: serveClaims runs; stop ends it (Shutdown).
	serving bool
	stop    atomic.Bool
	// gate is held from Forking to Forked (gated says it is): the fds
	// the engine opens for a moment off the forking thread (handOn)
	// must not go to the child.
	gate  sync.RWMutex
	gated atomic.Bool
}

// ForkPage is the page shared with children of fork, nil before the
// first fork (or if it could not be mapped, and then nothing is kept).
func (e *Engine) ForkPage() *ForkPage {
	e.fork.mu.Lock()
	defer e.fork.mu.Unlock()
	return e.fork.page
}

// keepAtFork chooses, before a fork, which listeners and UDP sockets stay
// offloaded across it, and makes the connections Forking did not move
// claimable (not logged, as they may be a server's thousands: a claim
// is). The listeners and UDP sockets kept are those this process waits
// for in poll, select or epoll, an event loop that goes on serving them
// after the fork. (A
// blocking accept or receive may be a master's last before it hands the
// socket to the workers it forks, and what netstack took for this process
// meanwhile would wait for it in vain.) The preload library sees the
// child's every use of one, and its every exec (the exec family and
// posix_spawn), which hands the program the ones not close-on-exec:
// either claims the socket. What it cannot see (a raw system call, a
// request of io_uring) would find the socket still steered to this
// process. A listener on whose port a connection was just moved for the
// child (moved) stays with the kernel: the process accepts and forks, and
// its children serve the connections through the kernel anyway.
func (e *Engine) keepAtFork(moved map[uint16]bool) {
	e.fork.mu.Lock()
	defer e.fork.mu.Unlock()
	if e.fork.page == nil {
		mem, err := unix.Mmap(-1, 0, int(unsafe.Sizeof(ForkPage{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
		if err != nil {
			e.Log.Printf(params.LevelInfo, "fork: the page shared with children: %v; every socket goes back to the kernel at fork", err)
			return
		}
		e.fork.page = (*ForkPage)(unsafe.Pointer(&mem[0]))
		e.fork.page.EnginePID = int32(unix.Getpid())
	}
	p := e.fork.page
	was := e.fork.kept
	kept := map[int]any{}
	named := map[any][]int{}
	for fd := range e.fdsInUse() {
		if l := e.listeners.Load(fd); l != nil {
			named[l] = append(named[l], fd)
		}
	}
	e.mu.Lock()
	for fd := range e.fdsInUse() {
		if s := e.fds.Load(fd); s != nil {
			named[s] = append(named[s], fd)
		}
	}
	e.mu.Unlock()
	for fd := range e.fdsInUse() {
		if t := e.conns.Load(fd); t != nil {
			kept[fd] = t
		}
	}
	for obj, fds := range named {
		var what string
		switch o := obj.(type) {
		case *tcpListener:
			if !o.multiplexed.Load() || moved[o.nl.Addr().Port()] || o.nl.InHandover() {
				continue
			}
			what = fmt.Sprintf("tcp listener %s", o.nl.Addr())
		case *Socket:
			if !o.multiplexed.Load() || o.draining.Load() || o.conn.Load() == nil {
				continue
			}
			what = "udp socket"
		}
		for _, fd := range fds {
			kept[fd] = obj
		}
		if was[fds[0]] != obj {
			e.Log.Printf(params.LevelInfo, "fd %d: %s stays offloaded across fork: this process's event loop serves it; it goes to the kernel if a child uses it or execs a program that inherits it", fds[0], what)
		}
	}
	// A slot a child claimed and serveClaims has not answered yet keeps
	// its claim, kept again or not: the child waits for its answer.
	for fd := range was {
		if kept[fd] == nil && atomic.CompareAndSwapInt32(&p.FD[fd], forkKept, 0) {
			futexWake(&p.FD[fd])
		}
	}
	for fd := range kept {
		atomic.CompareAndSwapInt32(&p.FD[fd], 0, forkKept)
	}
	e.fork.kept, e.fork.atFork = kept, maps.Clone(kept)
	if len(kept) > 0 && !e.fork.serving {
		e.fork.serving = true
		go e.serveClaims()
	}
}

// claimWait bounds serveClaims' sleep, so that it sees stop.
const claimWait = time.Second

// serveClaims hands to the kernel each kept socket a child claims, then
// tells the child, which waits for it: until then this process's steering
// would take what the child waits for.
func (e *Engine) serveClaims() {
	p := e.ForkPage()
	for !e.fork.stop.Load() {
		seq := atomic.LoadUint32(&p.Seq)
		e.fork.mu.Lock()
		var claimed []int
		for fd := range e.fork.kept {
			if atomic.LoadInt32(&p.FD[fd]) > 0 {
				claimed = append(claimed, fd)
			}
		}
		e.fork.mu.Unlock()
		for _, fd := range claimed {
			e.claimed(fd)
		}
		futexWait(&p.Seq, seq, claimWait)
	}
}

// claimed hands the socket a child claimed through fd to the kernel, with
// every fd naming it, and answers the child.
func (e *Engine) claimed(fd int) {
	p := e.fork.page
	pid := atomic.LoadInt32(&p.FD[fd])
	e.fork.mu.Lock()
	obj := e.fork.kept[fd]
	fds := []int{fd} // answered whatever it names now
	delete(e.fork.kept, fd)
	for f, o := range e.fork.kept {
		if o == obj {
			fds = append(fds, f)
			delete(e.fork.kept, f)
		}
	}
	e.fork.mu.Unlock()
	cause := fmt.Sprintf("used by process %d, a child of fork: the kernel serves it to both processes", pid)
	switch o := obj.(type) {
	case *tcpListener:
		e.handover(fd, o, cause)
	case *Socket:
		if e.fds.Load(fd) == o {
			e.toOthers(o, cause)
		}
	case *tcpConn:
		if e.conns.Load(fd) == o {
			e.claimedConn(fd, o, pid)
		}
	}
	for _, f := range fds {
		atomic.StoreInt32(&p.FD[f], 0)
		futexWake(&p.FD[f])
	}
}

// claimedConn moves t, which a forked child (pid) claimed through fd, to a
// kernel socket under the same fds, and sends that socket to the child
// on the channel the child sent on t's mirror (the preload library's
// claim_conn): the child's fds name only the mirror, which carries no
// data (a CGI server's child makes the connection its standard output
// and execs the script: without the move, the script's answer goes into
// the mirror, lost). t stays this process's, and the child gets nothing
// (its calls fail with ENOTCONN), when no channel came, when it is in an
// epoll set, or while a thread of this process sleeps on it (its wait
// is on the mirror).
func (e *Engine) claimedConn(fd int, t *tcpConn, pid int32) {
	chans := t.channels()
	defer func() {
		for _, ch := range chans {
			unix.Close(ch)
		}
	}()
	if len(chans) == 0 {
		e.Log.Printf(params.LevelInfo, "fd %d: tcp connection: process %d, a child of fork, claimed it and sent nothing to take it on: it stays this process's", fd, pid)
		return
	}
	t.mu.Lock()
	asleep := t.sleepers > 0
	t.mu.Unlock()
	if asleep {
		local, remote := t.c.Addrs()
		e.Log.Printf(params.LevelInfo, "fd %d: tcp connection %s>%s stays this process's, which waits to read it: process %d, a child of fork, cannot use it", fd, local, remote, pid)
		return
	}
	e.connToKernel(t, e.namedConns()[t], connMove{
		when:  fmt.Sprintf("as process %d, a child of fork, claims it", pid),
		other: "the child",
		cause: fmt.Sprintf("claimed by process %d, a child of fork: handed to a kernel socket (TCP_REPAIR), which the kernel serves to both processes", pid),
		wait:  inFlightWait,
		give: func(kfd int) {
			for _, ch := range chans {
				if err := unix.Sendmsg(ch, []byte{0}, unix.UnixRights(kfd), nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL); err != nil {
					e.Log.Printf(params.LevelWarning, "fd %d: tcp connection: to a child of fork that claimed it: %v; that child cannot use it", fd, err)
				}
			}
		},
	})
}

// The futex operations on memory shared between processes (not
// FUTEX_PRIVATE_FLAG), which x/sys/unix does not name.
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// futexWait sleeps while *addr is val, at most d.
func futexWait[T ~uint32 | ~int32](addr *T, val T, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitOp, uintptr(uint32(val)), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every waiter on addr.
func futexWake[T ~uint32 | ~int32](addr *T) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakeOp, 1<<31-1, 0, 0, 0)
}

// stopClaims ends serveClaims: the process is exiting.
func (e *Engine) stopClaims() {
	e.fork.stop.Store(true)
	if p := e.ForkPage(); p != nil {
		futexWake(&p.Seq)
	}
}

// setOnce sets b, with a store only the first time: the flags it sets
// are read at fork, and set on paths that run often.
func setOnce(b *atomic.Bool) {
	if !b.Load() {
		b.Store(true)
	}
}

// passedCause is why a socket the process passed to another is the
// kernel's.
const passedCause = "passed to another process (SCM_RIGHTS), which reaches it through the kernel: the kernel serves it"

// Passed runs before the process passes fd to another process with
// SCM_RIGHTS: that process reaches the socket in the kernel, which got
// nothing once the socket was steered (a broker that binds a port and
// hands it to a worker; a server that hands a connection or its listener
// on). The kernel serves it from now on: a UDP socket goes back (what it
// queued goes to its kernel socket, for that process too), a TCP listener
// hands over, and a TCP connection moves to a kernel socket under the
// same fds when it can (as at fork). A forked child claims what it
// passes instead (the preload library).
func (e *Engine) Passed(fd int) {
	if l := e.listener(fd); l != nil {
		e.handover(fd, l, passedCause)
		return
	}
	if t := e.tcpConn(fd); t != nil {
		e.connToKernel(t, e.namedConns()[t], connMove{when: "as it is passed to another process", other: "that process", cause: passedCause, wait: inFlightWait})
		return
	}
	if s := e.get(fd); s != nil {
		e.toOthers(s, passedCause)
	}
}
