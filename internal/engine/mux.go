package engine

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stack"
)

// The multiplexers (select, poll, epoll_wait) over any mix of engine and
// kernel fds work as VMA's do: poll the engine's sockets for
// VMAXDP_SELECT_POLL microseconds, looking at the kernel fds once every
// VMAXDP_SELECT_POLL_OS_RATIO polls, then sleep in the kernel on the kernel
// fds, the queues' fds and the stacks' wake eventfds, so that nothing that
// arrives while they sleep goes unseen.

// spinChecks: a spinning multiplexer reads the clock (its deadline, its
// polling time) once every spinChecks scans.
const spinChecks = 8

// spin runs scan until it finds something, the timeout passes, a signal
// ends sw or polling ends, then sleeps with sleep and scans again.
// timeout < 0: none. scan returns how many fds are ready and how many of
// those the kernel made ready, for the multiplexer's counters.
//
// With VMAXDP_SELECT_POLL at auto, sp says how long it polls and learns
// from the wait (stack.Spin); sp nil: it scans once, the kernel fds
// included, and sleeps.
func (e *Engine) spin(kind Mux, timeout time.Duration, sw *stack.SignalWait, sp *stack.Spin, scan func(osTurn bool) (n, os int, errno unix.Errno),
	sleep func(deadline time.Time, infinite bool) unix.Errno) (int, unix.Errno) {
	mc := &e.mux[kind]
	mc.Calls.Add(1)
	start := time.Now()
	polling := start // start of the current polling stretch
	slept := false
	adaptive := e.p.SelectPoll == params.PollAuto
	var clock stack.SpinClock
	done := func(n, os int, errno unix.Errno) (int, unix.Errno) {
		if adaptive && clock.Start != 0 && n > 0 {
			sp.Done(clock.Start, time.Now().UnixNano())
		}
		if e.p.CPUUsageStats && !polling.IsZero() {
			mc.PollingNanos.Add(uint64(time.Since(polling)))
		}
		switch {
		case errno != 0:
			mc.Errors.Add(1)
		case n == 0:
			mc.Timeouts.Add(1)
		default:
			mc.RxReadyOS.Add(uint64(os))
			mc.RxReadyOffload.Add(uint64(n - os))
		}
		if slept {
			mc.PollMiss.Add(1)
		} else {
			mc.PollHit.Add(1)
		}
		return n, errno
	}
	infinite := timeout < 0
	deadline := start.Add(timeout)
	pollFor := time.Duration(e.p.SelectPoll) * time.Microsecond
	spinning := e.p.SelectPoll != 0
	if adaptive && sp == nil {
		adaptive, spinning = false, false
	}
	ratio := e.p.SelectPollOSRatio
	if adaptive {
		// A look at the kernel fds is a system call, where a scan of the
		// engine's sockets costs a few hundred nanoseconds: an adaptive
		// spin looks once every ratio clock readings.
		ratio *= spinChecks
	}
	// The kernel fds are looked at on entry once every SelectSkipOS
	// calls (VMA_SELECT_SKIP_OS); a call whose engine sockets have nothing
	// looks at them in its next scans anyway.
	entryOS := sp == nil || e.p.SelectSkipOS == 0 || mc.Calls.Load()%uint64(e.p.SelectSkipOS) == 0
	for i := 0; ; i++ {
		n, os, errno := scan(i == 0 && entryOS || i == 1 && !entryOS || ratio > 0 && i > 0 && i%ratio == 0)
		if n > 0 || errno != 0 {
			return done(n, os, errno)
		}
		if timeout == 0 {
			return done(0, 0, 0)
		}
		if sw.Interrupted() {
			return done(0, 0, unix.EINTR)
		}
		// The clock is read once every few scans (SpinClock, spinChecks):
		// on a VM a read costs as much as a scan of a few sockets.
		switch {
		case adaptive && spinning:
			if clock.Start == 0 {
				now := time.Now().UnixNano()
				sw.Resched(now)
				clock.Begin(now, sp.Budget())
			}
			if !clock.Tick() {
				if !infinite && clock.Now() >= deadline.UnixNano() {
					return done(0, 0, 0)
				}
				continue
			}
		case spinning && i%spinChecks != 0:
			continue
		}
		now := time.Now()
		if !infinite && !now.Before(deadline) {
			return done(0, 0, 0)
		}
		if !adaptive && spinning && (e.p.SelectPoll < 0 || now.Sub(start) < pollFor) {
			continue
		}
		spinning = false
		if e.p.CPUUsageStats {
			mc.PollingNanos.Add(uint64(now.Sub(polling)))
		}
		polling = time.Time{}
		slept = true
		if errno := sleep(deadline, infinite); errno != 0 {
			return done(0, 0, errno)
		}
		// Scan with the kernel fds after a sleep, whatever the ratio.
		if n, os, errno := scan(true); n > 0 || errno != 0 {
			return done(n, os, errno)
		}
		i = 0
		clock.Stop()
	}
}

// sleepOn sleeps in ppoll on pfds and what sc.w watches; after a sleep,
// pfds hold the revents it gave them (not when ready found work first, or
// on error).
func sleepOn(pfds []unix.PollFd, sc *sleepScratch, deadline time.Time, infinite bool, sw *stack.SignalWait, ready func() bool) (slept bool, errno unix.Errno) {
	w := &sc.w
	for _, c := range w.mirrors {
		c.SleepOnMirror()
	}
	defer func() {
		for _, c := range w.mirrors {
			c.WokeFromMirror()
		}
	}()
	all := append(sc.all[:0], pfds...)
	for _, fd := range w.wakes {
		all = append(all, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
	}
	began := sc.began[:0]
	defer func() {
		for _, st := range began {
			st.EndWait(all)
		}
		sc.all, sc.began = all, began
	}()
	for _, st := range w.stacks {
		var err error
		if all, err = st.BeginWait(all, w.udp, slices.Contains(w.rings, st)); err != nil {
			return false, errnoOf(err)
		}
		began = append(began, st)
	}
	// A datagram queued between the caller's scan and BeginWait left the
	// ring unseen by ppoll: look once more.
	if ready() {
		return false, 0
	}
	var ts *unix.Timespec
	if !infinite {
		t := unix.NsecToTimespec(max(time.Until(deadline).Nanoseconds(), 0))
		ts = &t
	}
	if _, err := sw.Ppoll(all, ts); err != nil {
		return false, errnoOf(err)
	}
	copy(pfds, all)
	return true, 0
}

// sleepScratch holds the lists of one multiplexer's sleep, reused through
// sleepPool: a wait that sleeps (a server between sparse requests) made
// five allocations a sleep (BenchmarkEpollWaitSleep).
type sleepScratch struct {
	w                  sleepWatch
	all                []unix.PollFd
	began              []*stack.Stack
	sleepers, mirrored []*stack.TCPPoller
}

var sleepPool = sync.Pool{New: func() any { return new(sleepScratch) }}

// getSleep returns an empty sleepScratch; putSleep gives it back.
func getSleep() *sleepScratch { return sleepPool.Get().(*sleepScratch) }

// putSleep gives sc back, keeping its lists' room but nothing they named:
// a pooled scratch must not keep a closed stack or connection alive.
func putSleep(sc *sleepScratch) {
	clear(sc.w.stacks)
	clear(sc.w.udp)
	clear(sc.w.rings)
	clear(sc.w.mirrors)
	clear(sc.began)
	clear(sc.sleepers)
	clear(sc.mirrored)
	sc.w = sleepWatch{stacks: sc.w.stacks[:0], udp: sc.w.udp[:0], rings: sc.w.rings[:0], wakes: sc.w.wakes[:0], mirrors: sc.w.mirrors[:0]}
	sc.all, sc.began = sc.all[:0], sc.began[:0]
	sc.sleepers, sc.mirrored = sc.sleepers[:0], sc.mirrored[:0]
	sleepPool.Put(sc)
}

// sleepWatch is what a multiplexer's sleep watches besides its fds: the
// stacks of its offloaded sockets and the wake eventfds of its listeners
// and candidates. slice cuts the sleep to candidateSlice (a candidate
// with no eventfd to be had).
type sleepWatch struct {
	stacks  []*stack.Stack
	udp     []*stack.UDPConn // the offloaded UDP sockets the sleep is for
	rings   []*stack.Stack   // stacks whose queues the sleep must watch (TCP's sleepOnRings)
	wakes   []int
	mirrors []*stack.TCPConn // TCP connections the sleep watches the mirrors of
	slice   bool
}

// testHookWatch runs between watch's first look at an fd and its look
// under the socket's lock: a test decides the socket there.
var testHookWatch = func(fd int) {}

// watch adds to w what a sleep must watch for fd. A socket neither
// offloaded nor listening at the first look is looked at again under its
// lock, which its decision holds, so that one the goroutine opening its
// stack adopted in between is watched as offloaded. (Looked at without
// the lock, it was watched as neither, and the sleep was on its kernel
// socket alone, which gets nothing once the socket is steered: unbound's
// second thread slept for good, 100 datagrams queued on its socket.)
func (e *Engine) watch(fd int, w *sleepWatch) {
	if set := e.epollSetAt(fd); set != nil {
		set.mu.Lock()
		set.watchLocked(e, w)
		set.mu.Unlock()
		return
	}
	if t := e.tcpConn(fd); t != nil {
		w.mirrors = append(w.mirrors, t.c) // the sleep watches its mirror, a kernel fd
	}
	if c := e.Conn(fd); c != nil {
		w.stacks = appendStack(w.stacks, c.Stack())
		w.udp = append(w.udp, c)
		return
	}
	if l := e.listener(fd); l != nil {
		l.settle()
		w.wakes = append(w.wakes, l.wake)
		return
	}
	s := e.get(fd)
	if s == nil {
		return
	}
	testHookWatch(fd)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch c := s.conn.Load(); {
	case c != nil:
		w.stacks = appendStack(w.stacks, c.Stack())
		w.udp = append(w.udp, c)
	case s.state != StateCandidate:
	case s.decidedFD() >= 0:
		w.wakes = append(w.wakes, s.decided)
	default:
		w.slice = true
	}
}

// deadline is the sleep's deadline: cut to candidateSlice for w.slice.
func (w *sleepWatch) deadline(deadline time.Time, infinite bool) (time.Time, bool) {
	if !w.slice {
		return deadline, infinite
	}
	cut := time.Now().Add(candidateSlice)
	if infinite || cut.Before(deadline) {
		return cut, false
	}
	return deadline, infinite
}

func appendStack(stacks []*stack.Stack, st *stack.Stack) []*stack.Stack {
	if slices.Contains(stacks, st) {
		return stacks
	}
	return append(stacks, st)
}

// beginMux starts a multiplexer's wait: it sets the thread's signal mask
// to sigmask (ppoll, pselect, epoll_pwait) for the whole call and not only
// its sleep, so that a signal sigmask lets through ends the spinning too;
// restoreMask undoes it. The wait begins first: a signal that setting the
// mask unblocks is taken at once and must count.
func beginMux(sigmask *unix.Sigset_t, sig *stack.Signals) (sw stack.SignalWait, old unix.Sigset_t, errno unix.Errno) {
	sw = sig.Begin(false)
	if sigmask == nil {
		return sw, old, 0
	}
	runtime.LockOSThread() // the mask is the thread's
	if err := unix.PthreadSigmask(unix.SIG_SETMASK, sigmask, &old); err != nil {
		runtime.UnlockOSThread()
		return sw, old, errnoOf(err)
	}
	return sw, old, 0
}

func restoreMask(sigmask *unix.Sigset_t, old *unix.Sigset_t) {
	if sigmask != nil {
		unix.PthreadSigmask(unix.SIG_SETMASK, old, nil)
		runtime.UnlockOSThread()
	}
}

// Poll serves poll and ppoll (and select through them) over pfds, some
// of which are engine sockets. timeout < 0 waits for ever. sig counts the
// handlers of the calling thread's signals (nil: none end the wait).
func (e *Engine) Poll(kind Mux, pfds []unix.PollFd, timeout time.Duration, sigmask *unix.Sigset_t, sig *stack.Signals) (int, unix.Errno) {
	sw, old, errno := beginMux(sigmask, sig)
	if errno != 0 {
		return 0, errno
	}
	defer restoreMask(sigmask, &old)
	return e.poll(kind, pfds, timeout, &sw)
}

func (e *Engine) poll(kind Mux, pfds []unix.PollFd, timeout time.Duration, sw *stack.SignalWait) (int, unix.Errno) {
	if e.owed.Load() != 0 { // the kernel's poll looks at TCP connections' mirrors
		e.PayOwed()
	}
	zero := unix.Timespec{}
	// known: a sleep just left the kernel fds' revents in pfds, and the
	// scan after it need not poll them again (a system call per wait).
	known := false
	scan := func(osTurn bool) (int, int, unix.Errno) {
		switch {
		case known:
			known = false
		default:
			for i := range pfds {
				pfds[i].Revents = 0
			}
			if osTurn {
				if _, err := unix.Ppoll(pfds, &zero, nil); err != nil && err != unix.EINTR {
					return 0, 0, errnoOf(err)
				}
			}
		}
		n, os := 0, 0
		var polled polledStacks
		for i := range pfds {
			p := &pfds[i]
			if p.Revents&pollRead != 0 {
				os++
			}
			if s := e.get(int(p.Fd)); s != nil {
				setOnce(&s.multiplexed)
				if c := s.conn.Load(); c != nil {
					if p.Revents&pollRead != 0 {
						s.osReady.Store(true)
					}
					if p.Events&pollRead != 0 {
						if polled.poll(c.Stack()); c.Queued() {
							p.Revents |= p.Events & pollRead
						}
					}
					p.Revents |= p.Events & pollWrite
					// A transmit stamp waits: POLLERR whatever was asked,
					// POLLPRI if asked.
					if ev := int16(s.errQueueEvents()); ev != 0 {
						p.Revents |= ev & (unix.POLLERR | p.Events)
					}
				}
			} else if l := e.listener(int(p.Fd)); l != nil {
				setOnce(&l.multiplexed)
				if p.Events&pollRead != 0 && l.nl.Pending() {
					p.Revents |= p.Events & pollRead
				}
			} else if set := e.epollSetAt(int(p.Fd)); set != nil && p.Events&pollRead != 0 && set.ready(e, &polled) {
				p.Revents |= p.Events & pollRead
			}
			if p.Revents != 0 {
				n++
			}
		}
		return n, os, 0
	}
	sleep := func(deadline time.Time, infinite bool) unix.Errno {
		sc := getSleep()
		defer putSleep(sc)
		for _, p := range pfds {
			e.watch(int(p.Fd), &sc.w)
		}
		deadline, infinite = sc.w.deadline(deadline, infinite)
		slept, errno := sleepOn(pfds, sc, deadline, infinite, sw, func() bool { n, _, _ := scan(false); return n > 0 })
		known = slept
		return errno
	}
	return e.spin(kind, timeout, sw, &e.muxSpin[kind], scan, sleep)
}

// The readiness bits of a datagram socket, as the kernel's datagram_poll
// sets them and poll masks them with what was asked: a program that asks
// for POLLRDNORM alone (BSD's way) is told of a datagram as one that asks
// for POLLIN.
// poll's bits are epoll's (x/sys/unix names POLLRDNORM and its kin only
// for epoll).
const (
	epollRead  = unix.EPOLLIN | unix.EPOLLRDNORM
	epollWrite = unix.EPOLLOUT | unix.EPOLLWRNORM | unix.EPOLLWRBAND
	pollRead   = epollRead
	pollWrite  = epollWrite
)

// polledStacks are the stacks a multiplexer's scan has polled: each once
// per scan, whatever the number of its sockets in the set, which then
// report their queues without a lock (stack.UDPConn.Queued).
type polledStacks struct {
	n  int
	st [4]*stack.Stack
}

func (ps *polledStacks) poll(st *stack.Stack) {
	for _, s := range ps.st[:ps.n] {
		if s == st {
			return
		}
	}
	st.Poll()
	if ps.n < len(ps.st) {
		ps.st[ps.n] = st
		ps.n++
	}
}

// epollSet is what the engine knows of one epoll fd: its members that are
// engine sockets (the kernel knows them too, for their kernel sockets).
type epollSet struct {
	mu      sync.Mutex
	members map[int]*epollMember
	// list holds the members too, for the scans: ranging over the map
	// took 4.5% of memcaslap's CPU under vmaxdp (perf). next rotates
	// where a scan starts, so that a small maxevents starves no member.
	list []*epollMember
	next int
	spin stack.Spin // how long its waits poll (VMAXDP_SELECT_POLL auto)
	// tcp are its offloaded TCP connections' registrations, by fd. The
	// kernel reports their events (their mirrors), but for those whose
	// marks the set owes (owed); its epoll_wait processes their segments
	// itself (pollers: one per stack).
	tcp     map[int]*tcpMember
	pollers []*stack.TCPPoller
	owed    owedSet // the marks its waits owe (owed.go)
	// polls says whether its last wait polled its connections' segments
	// (tcpAlone).
	polls atomic.Bool
	// owedScratch is reportOwed's list, reused; under mu.
	owedScratch []*tcpConn
	// writers are its connections registered for EPOLLOUT: their held
	// ACKs stay held as its waits begin (TCPPoller.Wait).
	writers []*stack.TCPConn
	// fds name its epoll instance: the fd epoll_create gave and its
	// duplicates (dup, dup2, F_DUPFD), each told of the set's state.
	// Under mu.
	fds []int
	// parents are the sets its epoll fd is nested in (EpollNest), which
	// the engine tells of its state. The slice is replaced, never changed
	// in place, so that propagate may read it after mu is let go.
	parents []*epollSet
}

// noteWriter keeps m's connection in writers while m asks for EPOLLOUT.
// Caller holds set.mu.
func (set *epollSet) noteWriter(m *tcpMember, member bool) {
	i := slices.Index(set.writers, m.t.c)
	switch want := member && m.events&unix.EPOLLOUT != 0; {
	case want && i < 0:
		set.writers = append(set.writers, m.t.c)
	case !want && i >= 0:
		set.writers = slices.Delete(set.writers, i, i+1)
	}
}

// addTCP adds the connection t, named by fd, or changes its events (ev).
// Caller holds set.mu.
func (set *epollSet) addTCP(fd int, t *tcpConn, ev *unix.EpollEvent) {
	if m := set.tcp[fd]; m != nil {
		t.mu.Lock()
		m.events, m.data = ev.Events, [2]int32{ev.Fd, ev.Pad}
		set.noteWriter(m, true)
		was := t.lazy == m
		t.relazyLocked(m)
		lost := was && t.lazy == nil
		t.mu.Unlock()
		if lost {
			set.payFor(t)
		}
		return
	}
	m := &tcpMember{t: t, set: set, events: ev.Events, data: [2]int32{ev.Fd, ev.Pad}}
	set.tcp[fd] = m
	set.noteWriter(m, true)
	t.mu.Lock()
	t.sets++
	was := t.lazy
	t.relazyLocked(m)
	t.mu.Unlock()
	if was != nil && t.lazy == nil {
		was.set.payFor(t)
	}
	st := t.c.Stack()
	for _, p := range set.pollers {
		if p.Stack() == st {
			p.Add(t.c)
			return
		}
	}
	p := st.NewTCPPoller()
	p.Add(t.c)
	set.pollers = append(set.pollers, p)
}

// delTCP removes fd's connection. Caller holds set.mu.
func (set *epollSet) delTCP(fd int) {
	m := set.tcp[fd]
	if m == nil {
		return
	}
	delete(set.tcp, fd)
	set.noteWriter(m, false)
	t := m.t
	t.mu.Lock()
	t.sets--
	lost := t.lazy == m
	if lost {
		t.lazy = nil
	}
	t.mu.Unlock()
	if lost {
		set.payFor(t)
	}
	st := t.c.Stack()
	set.pollers = slices.DeleteFunc(set.pollers, func(p *stack.TCPPoller) bool {
		if p.Stack() != st || p.Remove(t.c) {
			return false
		}
		p.Close()
		return true
	})
	if len(set.tcp) == 0 {
		// Its waits are the kernel's alone now, which would give the
		// application the bell's event.
		set.share(nil, -1, false)
		set.owed.closeBell()
	}
}

// close ends the set's pollers and its nesting, and returns the sets it
// was nested in: its epoll fd is closed.
func (set *epollSet) close() []*epollSet {
	set.mu.Lock()
	defer set.mu.Unlock()
	for fd := range set.tcp {
		set.delTCP(fd)
	}
	for _, p := range set.pollers {
		p.Close()
	}
	set.pollers = nil
	set.owed.closeBell()
	for _, m := range set.list {
		if m.inner != nil {
			m.inner.unnest(set)
		}
	}
	return set.parents
}

// unnest forgets that the set is nested in parent.
func (set *epollSet) unnest(parent *epollSet) {
	set.mu.Lock()
	set.parents = slices.DeleteFunc(slices.Clone(set.parents), func(p *epollSet) bool { return p == parent })
	set.mu.Unlock()
}

// tcpAlone says whether the set has TCP connections and nothing else of
// the engine's, and each of its pollers is its stack's only one: then
// its waits poll those connections' segments (TCPPoller.Alone).
func (set *epollSet) tcpAlone() bool {
	if len(set.list) > 0 || len(set.pollers) == 0 {
		return false
	}
	for _, p := range set.pollers {
		if !p.Alone() {
			return false
		}
	}
	return true
}

// waitTCP tells the set's pollers that a wait begins (TCPPoller.Wait).
// Caller holds set.mu.
func (set *epollSet) waitTCP() {
	for _, p := range set.pollers {
		p.Wait(set.writers)
	}
}

// pollTCP processes what came for the set's connections (TCPPoller.Poll)
// and says whether any frame came. Caller holds set.mu.
func (set *epollSet) pollTCP() bool {
	seen := false
	for _, p := range set.pollers {
		if p.Alone() && p.Poll() > 0 {
			seen = true
		}
	}
	return seen
}

// put adds or replaces fd's member, and returns it. Caller holds set.mu.
func (set *epollSet) put(fd int, events uint32, data [2]int32) *epollMember {
	m := set.members[fd]
	if m == nil {
		m = &epollMember{}
		set.list = append(set.list, m)
		set.members[fd] = m
	}
	// A MOD starts the member anew, as an ADD does (EPOLLET and
	// EPOLLONESHOT state included), in place: an event loop that
	// switches EPOLLOUT on and off made an allocation a call.
	*m = epollMember{fd: fd, events: events, data: data}
	return m
}

// del removes fd's member. Caller holds set.mu.
func (set *epollSet) del(fd int) {
	if m := set.members[fd]; m != nil {
		delete(set.members, fd)
		set.list = slices.DeleteFunc(set.list, func(x *epollMember) bool { return x == m })
	}
}

type epollMember struct {
	fd       int
	events   uint32
	data     [2]int32 // epoll_data, opaque
	disabled bool     // EPOLLONESHOT fired
	// EPOLLET: reported is set once the member was reported, and seenRx is
	// the socket's count of queued datagrams then.
	reported bool
	seenRx   uint64
	// inner is the set of the epoll fd this member is (EpollNest).
	inner *epollSet
}

// poll is what m would report on c now, and c's count of queued datagrams
// (RxOffloadPackets) for mark. Level-triggered: what c is ready for.
// Edge-triggered (EPOLLET): the same, but only when a datagram was queued
// since the last report, or once after EPOLL_CTL_ADD/MOD, as the kernel
// does; a zeroed count (vmaxdp stats -z) makes one extra report.
func (m *epollMember) poll(c *stack.UDPConn, polled *polledStacks) (ev uint32, rx uint64) {
	if m.disabled {
		return 0, 0
	}
	// Datagrams count once they leave the ring, whatever c holds.
	polled.poll(c.Stack())
	if m.events&unix.EPOLLET != 0 {
		rx = c.Counters.RxOffloadPackets.Load()
		if m.reported && rx == m.seenRx {
			return 0, rx
		}
	}
	if m.events&epollRead != 0 && c.Queued() {
		ev |= m.events & epollRead
	}
	ev |= m.events & epollWrite
	return ev, rx
}

// pollListener is what m would report on l now, and l's count of
// arrivals for mark, as poll does for a socket.
func (m *epollMember) pollListener(l *tcpListener) (ev uint32, rx uint64) {
	if m.disabled {
		return 0, 0
	}
	if m.events&unix.EPOLLET != 0 {
		rx = l.arrivals.Load()
		if m.reported && rx == m.seenRx {
			return 0, rx
		}
	}
	if m.events&epollRead != 0 && l.nl.Pending() {
		ev |= m.events & epollRead
	}
	return ev, rx
}

// pollInner is what m, an epoll fd nested in the set (m.inner), would
// report now, and the count of datagrams queued on the engine's sockets
// in it for mark, as poll does for a socket: readable while an epoll_wait
// on it would report one of them; with EPOLLET only when one was queued
// since the last report, as the kernel reports a nested epoll fd when an
// event joins its ready list.
func (m *epollMember) pollInner(e *Engine, polled *polledStacks) (ev uint32, rx uint64) {
	if m.disabled || m.events&epollRead == 0 {
		return 0, 0
	}
	// ready first: it polls the stacks, and what came counts once it
	// left the ring.
	ready := m.inner.ready(e, polled)
	if m.events&unix.EPOLLET != 0 {
		rx = m.inner.arrivals(e)
		if m.reported && rx == m.seenRx {
			return 0, rx
		}
	}
	if ready {
		ev = m.events & epollRead
	}
	return ev, rx
}

// arrivals counts the datagrams queued so far on the engine's sockets in
// the set and in the sets nested in it: what an edge-triggered nesting
// compares (pollInner).
func (set *epollSet) arrivals(e *Engine) uint64 {
	set.mu.Lock()
	defer set.mu.Unlock()
	var n uint64
	for _, m := range set.list {
		if m.inner != nil {
			n += m.inner.arrivals(e)
		} else if c := e.Conn(m.fd); c != nil {
			n += c.Counters.RxOffloadPackets.Load()
		}
	}
	return n
}

// mark records that m was reported.
func (m *epollMember) mark(rx uint64) {
	m.reported, m.seenRx = true, rx
	if m.events&unix.EPOLLONESHOT != 0 {
		m.disabled = true
	}
}

// forget follows the close of fd: its member moves to heir, another fd
// of the same socket, unless heir is -1 or a member already (the kernel
// would keep both registrations: the one made under fd ends here);
// otherwise it goes.
func (set *epollSet) forget(fd, heir int) {
	set.mu.Lock()
	defer set.mu.Unlock()
	if m := set.members[fd]; m != nil && heir >= 0 && set.members[heir] == nil {
		delete(set.members, fd)
		m.fd = heir
		set.members[heir] = m
	} else {
		set.del(fd)
	}
	set.delTCP(fd)
}

// epollSetLocked returns epfd's set, made if it has none. Caller holds
// e.mu.
func (e *Engine) epollSetLocked(epfd int) *epollSet {
	set := e.epolls[epfd]
	if set == nil {
		set = &epollSet{fds: []int{epfd}, members: map[int]*epollMember{}, tcp: map[int]*tcpMember{}, owed: owedSet{total: e.owed, bell: -1}}
		e.epolls[epfd] = set
		if epfd >= 0 && epfd < MaxFD {
			e.use(epfd)
			e.sets.Store(epfd, set)
		}
	}
	return set
}

// epollSetAt returns fd's set, if fd is an epoll fd the engine knows.
func (e *Engine) epollSetAt(fd int) *epollSet {
	if fd < 0 || fd >= MaxFD {
		return nil
	}
	return e.sets.Load(fd)
}

// EpollCtl records an epoll_ctl on an engine socket, after the kernel
// accepted it. It returns StateEpoll while the set has engine members.
func (e *Engine) EpollCtl(epfd, op, fd int, ev *unix.EpollEvent) State {
	if l := e.listener(fd); l != nil {
		e.epollListener(epfd, op, fd, l, ev)
		return e.epollState(epfd)
	}
	t := e.tcpConn(fd)
	if e.get(fd) == nil && t == nil {
		return e.epollState(epfd)
	}
	e.mu.Lock()
	set := e.epollSetLocked(epfd)
	e.mu.Unlock()
	set.mu.Lock()
	switch {
	case t != nil && op == unix.EPOLL_CTL_DEL:
		set.delTCP(fd)
	case t != nil:
		set.addTCP(fd, t, ev)
	case op == unix.EPOLL_CTL_DEL:
		set.del(fd)
	default:
		if s := e.get(fd); s != nil {
			setOnce(&s.multiplexed)
		}
		set.put(fd, ev.Events, [2]int32{ev.Fd, ev.Pad})
	}
	st, parents := set.stateLocked(), set.parents
	set.tellLocked(e, epfd, st)
	set.mu.Unlock()
	e.propagate(parents)
	if c := e.Conn(fd); c != nil && op == unix.EPOLL_CTL_ADD {
		// A thread asleep on the set is woken only for the sockets it
		// went to sleep for (Stack.BeginWait): it looks again.
		c.Stack().WakeWaiters()
	}
	return st
}

// EpollNest records an epoll_ctl that puts the epoll fd inner in epfd's
// set, changes it there or takes it out, after the kernel accepted it.
// The kernel makes inner readable to epfd for inner's kernel fds; the
// engine does for its offloaded sockets, whose datagrams never reach
// the kernel (an event loop nested in another's, as libuv's in a GUI's,
// and poll or select on an epoll fd). It returns epfd's state: StateEpoll
// while inner, or anything nested in it, has engine members.
func (e *Engine) EpollNest(epfd, op, inner int, ev *unix.EpollEvent) State {
	e.mu.Lock()
	set, in := e.epollSetLocked(epfd), e.epollSetLocked(inner)
	e.mu.Unlock()
	switch op {
	case unix.EPOLL_CTL_ADD:
		in.mu.Lock()
		in.parents = append(slices.Clone(in.parents), set)
		in.mu.Unlock()
	case unix.EPOLL_CTL_DEL:
		in.unnest(set)
	}
	set.mu.Lock()
	if op == unix.EPOLL_CTL_DEL {
		set.del(inner)
	} else {
		set.put(inner, ev.Events, [2]int32{ev.Fd, ev.Pad}).inner = in
	}
	st, parents := set.stateLocked(), set.parents
	set.tellLocked(e, epfd, st)
	set.mu.Unlock()
	e.propagate(parents)
	return st
}

// tellLocked tells the interposer st for each of the set's fds but
// except, whose caller takes it back. Caller holds set.mu.
func (set *epollSet) tellLocked(e *Engine, except int, st State) {
	for _, fd := range set.fds {
		if fd != except {
			e.onState(fd, st)
		}
	}
}

// dupEpoll makes newfd a second name of oldfd's epoll set, if it has one,
// and returns its state and whether it had.
func (e *Engine) dupEpoll(oldfd, newfd int) (State, bool) {
	set := e.epollSetAt(oldfd)
	if set == nil {
		return StateOS, false
	}
	e.mu.Lock()
	e.epolls[newfd] = set
	e.use(newfd)
	e.sets.Store(newfd, set)
	e.mu.Unlock()
	set.mu.Lock()
	defer set.mu.Unlock()
	set.fds = append(set.fds, newfd)
	return set.stateLocked(), true
}

// dropName forgets fd, a name of the set, and says whether it was its
// last. Caller holds e.mu.
func (set *epollSet) dropName(fd int) bool {
	set.mu.Lock()
	defer set.mu.Unlock()
	set.fds = slices.DeleteFunc(set.fds, func(n int) bool { return n == fd })
	return len(set.fds) == 0
}

// propagate tells the interposer the state of each of sets, and of the
// sets they are nested in, after a change below them: a set waits
// through the engine while anything nested in it has engine members.
func (e *Engine) propagate(sets []*epollSet) {
	for _, p := range sets {
		p.mu.Lock()
		st, parents := p.stateLocked(), p.parents
		p.tellLocked(e, -1, st)
		p.mu.Unlock()
		e.propagate(parents)
	}
}

func (e *Engine) epollState(epfd int) State {
	e.mu.Lock()
	set := e.epolls[epfd]
	e.mu.Unlock()
	if set == nil {
		return StateOS
	}
	set.mu.Lock()
	defer set.mu.Unlock()
	return set.stateLocked()
}

// stateLocked is what the interposer is to call the set's epoll fd: the
// engine's while it has members, or has an epoll fd nested in it that
// is the engine's. Caller holds set.mu; it takes the nested sets' (the
// kernel allows no loop).
func (set *epollSet) stateLocked() State {
	if len(set.tcp) > 0 {
		return StateEpoll
	}
	for _, m := range set.list {
		if m.inner == nil {
			return StateEpoll
		}
		m.inner.mu.Lock()
		st := m.inner.stateLocked()
		m.inner.mu.Unlock()
		if st == StateEpoll {
			return StateEpoll
		}
	}
	return StateOS
}

// ready says whether an epoll_wait on the set would report one of its
// engine members now: what makes its epoll fd readable, beside what the
// kernel sees, to a set it is nested in and to poll and select. Its
// listeners and TCP connections the kernel sees (their wake eventfds and
// mirrors), but for the marks the set owes.
func (set *epollSet) ready(e *Engine, polled *polledStacks) bool {
	set.mu.Lock()
	defer set.mu.Unlock()
	if set.owed.any() {
		return true
	}
	for _, m := range set.list {
		switch c := e.Conn(m.fd); {
		case m.disabled:
		case m.inner != nil:
			if ev, _ := m.pollInner(e, polled); ev != 0 {
				return true
			}
		case c != nil:
			if ev, _ := m.poll(c, polled); ev != 0 || e.TxStampPending(m.fd) {
				return true
			}
		}
	}
	return false
}

// watchLocked adds to w what a sleep must watch for the set's members,
// those of the sets nested in it too. Caller holds set.mu.
func (set *epollSet) watchLocked(e *Engine, w *sleepWatch) {
	for _, m := range set.list {
		if m.inner == nil {
			e.watch(m.fd, w)
			continue
		}
		m.inner.mu.Lock()
		m.inner.watchLocked(e, w)
		m.inner.mu.Unlock()
	}
}

// EpollWait serves epoll_wait and epoll_pwait on an epoll fd with engine
// members, with EPOLLET and EPOLLONESHOT as the kernel serves them.
func (e *Engine) EpollWait(epfd int, out []unix.EpollEvent, timeout time.Duration, sigmask *unix.Sigset_t, sig *stack.Signals) (int, unix.Errno) {
	sw, old, errno := beginMux(sigmask, sig)
	if errno != 0 {
		return 0, errno
	}
	defer restoreMask(sigmask, &old)
	return e.epollWait(epfd, out, timeout, &sw)
}

func (e *Engine) epollWait(epfd int, out []unix.EpollEvent, timeout time.Duration, sw *stack.SignalWait) (int, unix.Errno) {
	e.mu.Lock()
	set := e.epolls[epfd]
	e.mu.Unlock()
	if set == nil || len(out) == 0 {
		return 0, ErrPassOS
	}
	set.mu.Lock()
	tcpOnly, alone := len(set.list) == 0, set.tcpAlone()
	set.polls.Store(alone)
	set.waitTCP()
	shared := set.share(e, epfd, tcpOnly && !alone)
	set.mu.Unlock()
	if shared {
		return e.waitShared(set, epfd, out)
	}
	if tcpOnly && !alone {
		// The kernel reports the mirrors' readiness, and the drains
		// process the segments, as for any kernel fd.
		set.payOwed()
		return 0, ErrPassOS
	}
	scan := func(osTurn bool) (int, int, unix.Errno) {
		var polled polledStacks
		set.mu.Lock()
		// The kernel reports what the set's TCP connections' own
		// processing made ready, at once, but for the connections the
		// set owes marks, which it reports itself (owed.go).
		owed := 0
		if alone {
			set.owed.setPolling(true)
			osTurn = set.pollTCP() || osTurn
			set.owed.setPolling(false)
			owed = set.reportOwed(out)
			osTurn = osTurn || owed > 0
		} else {
			osTurn = set.pollTCP() || osTurn
		}
		n := owed
		l := len(set.list)
		start := set.next % max(l, 1)
		set.next++
		for i := 0; i < l && n < len(out); i++ {
			m := set.list[(start+i)%l]
			var ev uint32
			var rx uint64
			if c := e.Conn(m.fd); c != nil {
				if ev, rx = m.poll(c, &polled); !m.disabled {
					if s := e.get(m.fd); s != nil {
						// EPOLLERR reported whatever the member asked for, as the kernel does
						ev |= s.errQueueEvents() & (unix.EPOLLERR | m.events)
					}
				}
			} else if tl := e.listener(m.fd); tl != nil {
				ev, rx = m.pollListener(tl)
			} else if m.inner != nil {
				ev, rx = m.pollInner(e, &polled)
			}
			if ev != 0 {
				out[n] = unix.EpollEvent{Events: ev, Fd: m.data[0], Pad: m.data[1]}
				n++
				m.mark(rx)
			}
		}
		set.mu.Unlock()
		if !osTurn || n == len(out) {
			return n, 0, 0
		}
		k, err := unix.EpollWait(epfd, out[n:], 0)
		if err != nil && err != unix.EINTR {
			return n, 0, errnoOf(err)
		}
		k = dropBells(out[n : n+max(k, 0)]) // rung while the set was shared
		os := e.mergeKernel(set, out[:n], out[n:n+k], owed)
		return n + os, os, 0
	}
	pfds := []unix.PollFd{{Fd: int32(epfd), Events: unix.POLLIN}}
	sleep := func(deadline time.Time, infinite bool) unix.Errno {
		sc := getSleep()
		defer putSleep(sc)
		set.mu.Lock()
		set.watchLocked(e, &sc.w)
		for _, p := range set.pollers {
			if p.Alone() && p.Sleep() {
				sc.sleepers = append(sc.sleepers, p)
				sc.w.stacks = appendStack(sc.w.stacks, p.Stack())
				sc.w.rings = appendStack(sc.w.rings, p.Stack())
				continue
			}
			p.SleepOnMirrors() // the drains mark the mirrors the sleep watches
			sc.mirrored = append(sc.mirrored, p)
		}
		set.mu.Unlock()
		defer func() {
			for _, p := range sc.sleepers {
				p.Woke()
			}
			for _, p := range sc.mirrored {
				p.WokeFromMirrors()
			}
		}()
		deadline, infinite = sc.w.deadline(deadline, infinite)
		set.owed.sleep(1)
		defer set.owed.sleep(-1)
		_, errno := sleepOn(pfds, sc, deadline, infinite, sw, func() bool {
			if set.owed.any() {
				return true
			}
			set.mu.Lock()
			defer set.mu.Unlock()
			var polled polledStacks
			for _, m := range set.list {
				if c := e.Conn(m.fd); c != nil {
					if ev, _ := m.poll(c, &polled); ev&epollRead != 0 || !m.disabled && e.TxStampPending(m.fd) {
						return true
					}
				} else if l := e.listener(m.fd); l != nil {
					if ev, _ := m.pollListener(l); ev != 0 {
						return true
					}
				} else if m.inner != nil {
					if ev, _ := m.pollInner(e, &polled); ev != 0 {
						return true
					}
				}
			}
			return false
		})
		return errno
	}
	// A set of TCP connections (with listeners or kernel fds, no socket
	// of the engine's own) does not spin by default: each call processes
	// what came for them, and the kernel reports their readiness at once.
	// Spinning gave redis' event loop nothing that this does not (42.5k
	// and 39.2k requests a second spinning, 42.7k and 37.5k not), and
	// cost CPU its peer wants.
	sp := &set.spin
	if tcpOnly {
		sp = nil
	}
	return e.spin(MuxEpoll, timeout, sw, sp, scan, sleep)
}

// waitShared serves a wait on a shared set (owed.go): the connections it
// owes, with what the kernel has ready at once; with none owed, the
// kernel's wait (ErrPassOS), whose events the preload library hands to
// EpollRung when the bell is among them.
func (e *Engine) waitShared(set *epollSet, epfd int, out []unix.EpollEvent) (int, unix.Errno) {
	set.mu.Lock()
	n := set.reportOwed(out)
	set.mu.Unlock()
	if n == 0 {
		return 0, ErrPassOS
	}
	if n == len(out) {
		return n, 0
	}
	// The kernel's fds each time: a busy set always owes, and would
	// starve them (memcached's workers hear of new connections on a
	// pipe).
	k, err := unix.EpollWait(epfd, out[n:], 0)
	if err != nil {
		return n, 0
	}
	k = dropBells(out[n : n+k])
	return n + e.mergeKernel(set, out[:n], out[n:n+k], n), 0
}

// EpollRung serves the events the kernel's epoll_wait gave for a shared
// set's epoll fd epfd, among them its bell's: out[:n], room for len(out).
// The bell's event leaves, and the connections the set owes join, once
// each. It returns how many events there are: 0 when nothing is owed any
// more (reported by a wait between), and the caller waits again.
func (e *Engine) EpollRung(epfd int, out []unix.EpollEvent, n int) int {
	n = dropBells(out[:n])
	set := e.epollSetAt(epfd)
	if set == nil {
		return n
	}
	set.mu.Lock()
	k := set.reportOwed(out[n:])
	set.mu.Unlock()
	// A connection whose mirror the kernel reported as well (marked
	// before the set owed its marks): once, with both its events.
	kept := n
	for _, o := range out[n : n+k] {
		i := slices.IndexFunc(out[:n], func(ev unix.EpollEvent) bool { return ev.Fd == o.Fd && ev.Pad == o.Pad })
		if i >= 0 {
			out[i].Events |= o.Events
			continue
		}
		out[kept] = o
		kept++
	}
	return kept
}

// mergeKernel folds the kernel's events for engine sockets (their kernel
// sockets) and for the TCP connections the set reported itself (the
// first owed of ours: their mirrors) into the engine's, marks those
// sockets' kernel side readable, and returns how many kernel events
// remain in kev (compacted).
func (e *Engine) mergeKernel(set *epollSet, ours, kev []unix.EpollEvent, owed int) int {
	set.mu.Lock()
	defer set.mu.Unlock()
	kept := 0
	for _, k := range kev {
		dup := false
		for i := range ours[:owed] {
			if ours[i].Fd == k.Fd && ours[i].Pad == k.Pad {
				ours[i].Events |= k.Events
				dup = true
			}
		}
		for _, m := range set.list {
			if m.data != [2]int32{k.Fd, k.Pad} {
				continue
			}
			if s := e.get(m.fd); s != nil && s.conn.Load() != nil {
				if k.Events&epollRead != 0 {
					s.osReady.Store(true)
				}
			} else if m.inner == nil && e.listener(m.fd) == nil {
				continue
			}
			for i := range ours {
				if ours[i].Fd == k.Fd && ours[i].Pad == k.Pad {
					ours[i].Events |= k.Events
					dup = true
				}
			}
		}
		if !dup {
			kev[kept] = k
			kept++
		}
	}
	return kept
}
