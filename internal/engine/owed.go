package engine

import (
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stack"
)

// Owed marks. An offloaded connection's readiness reaches the kernel
// through its mirror: a byte queued on the application's end when data
// comes (markLocked), taken back once it is read (settleRead). For an
// event loop those are two system calls in every request's path (18% of
// redis-server's CPU under vmaxdp, perf): its epoll_wait processes the
// request's segment, the byte makes the kernel report the connection, the
// loop reads the request, and the byte is taken back.
//
// So while an epoll set's wait processes its connections' segments
// (pollTCP), and, for a loop's set, whenever no wait of it sleeps in the
// kernel (the drains process what comes while the loop answers), a
// connection that is an EPOLLIN member of that set and of no other
// (tcpConn.lazy) is left unmarked: the set owes its mark
// (tcpConn.deferred with no receive under way, and the connection on the
// set's owed list), and reports the connection itself for as long as
// netstack has data for it, or once, edge-triggered (reportOwed). The
// application's receive pays what it leaves unread, as any receive does
// (endRead); what it reads whole costs no byte. Everything else that looks at the mirror pays
// first: poll and select through the preload library (Engine.PayOwed, when
// Owed says any is owed), the set's wait when it passes to the kernel, and
// the end of the connection's membership. A raw system call on the mirror
// between the wait and the receive finds it unready: it is the only
// observer that cannot pay.

// Shared sets. A set whose connections' stack other threads' sets poll
// too (memcached's workers, each with its set: TCPPoller.Alone is false)
// leaves its waits to the kernel, which reported each request through
// the mirror: the byte's send from netstack's processor and its settling
// read in the worker, two system calls of the request's path and 12% of
// memcached's CPU under vmaxdp (perf). Such a set owes its marks all the
// time (owedSet.shared) and has a bell: an eventfd of the engine's in its
// epoll instance (BellData), rung (written) as a connection is owed. The
// kernel's epoll_wait then wakes for the bell as it did for the mirror,
// and the preload library hands what it returned to EpollRung, which
// takes the bell's event out and reports the owed connections. Edge-
// triggered, the bell is never read: each write is an edge.

// BellData is the epoll_data of a set's bell (the preload library's
// VMX_BELL_DATA): a non-canonical address, which no pointer an
// application registers can be.
const BellData uint64 = 0x8badf00d_00766d78

// bellEvent is BellData as an event's two halves.
var bellEvent = func() [2]int32 {
	d := BellData
	return [2]int32{int32(uint32(d)), int32(uint32(d >> 32))}
}()

// isBell says whether ev is a bell's.
func isBell(ev *unix.EpollEvent) bool { return [2]int32{ev.Fd, ev.Pad} == bellEvent }

// dropBells takes the bells' events out of evs and returns how many are
// left.
func dropBells(evs []unix.EpollEvent) int {
	n := 0
	for i := range evs {
		if !isBell(&evs[i]) {
			evs[n] = evs[i]
			n++
		}
	}
	return n
}

// one is what a bell's or a listener's eventfd write adds.
var one = [8]byte{1}

// tcpMember is a TCP connection's registration in an epoll set.
type tcpMember struct {
	t      *tcpConn
	set    *epollSet
	events uint32
	data   [2]int32 // epoll_data, opaque
}

// lazyEvents says whether a member registered for ev may owe its marks:
// EPOLLIN, level- or edge-triggered (an edge-triggered one is reported
// once a notice: reportOwed). One-shot and exclusive members are the
// kernel's to report, on the mirror.
func lazyEvents(ev uint32) bool {
	return ev&unix.EPOLLIN != 0 && ev&(unix.EPOLLONESHOT|unix.EPOLLEXCLUSIVE) == 0
}

// owedSet is an epoll set's part: the connections whose marks it owes.
type owedSet struct {
	mu      sync.Mutex
	polling bool // its wait processes segments: notices are owed
	shared  bool // a shared set's: notices are owed, and ring the bell
	// sleeping counts the set's waits asleep in the kernel, which only a
	// mark wakes: while none is, a loop's set (epollSet.polls) owes the
	// notices that come between its waits too, and its next wait reports
	// them (nginx, whose answers to 20 connections outlast the drains'
	// 200 us, left most of its segments to them: a mark and a settling
	// recvfrom each, 0.4 a request).
	sleeping int
	owed     []*tcpConn
	total    *atomic.Int32 // the engine's count of owed connections (Options.Owed)
	// bell is the shared set's eventfd, -1 before it has one; bellMu
	// keeps it open while a notice rings it.
	bellMu sync.RWMutex
	bell   int
}

// owe records that the set owes t's mark, when its wait is processing
// segments, or it is a loop's (looping: its last wait polled) and no wait
// of it sleeps in the kernel, or it is shared; false otherwise. ring: t
// was not owed yet, and the set is shared: the caller rings the bell
// once it let t.mu go. Caller holds t.mu.
func (o *owedSet) owe(t *tcpConn, looping bool) (owed, ring bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.polling && !o.shared && (!looping || o.sleeping > 0) {
		return false, false
	}
	return true, o.addLocked(t) && o.shared
}

// ring writes the bell, if the set has one.
func (o *owedSet) ring() {
	o.bellMu.RLock()
	if o.bell >= 0 {
		unix.Write(o.bell, one[:])
	}
	o.bellMu.RUnlock()
}

// share makes the set shared (on) or not. A set becomes shared with a
// bell in its epoll instance epfd, false when it cannot have one (then
// its marks are paid, and its waits are the kernel's as before). A set
// that stops being shared pays what it owes: its waits no longer report
// owed connections but when alone (pollTCP).
func (set *epollSet) share(e *Engine, epfd int, on bool) bool {
	o := &set.owed
	o.mu.Lock()
	was := o.shared
	o.mu.Unlock()
	if on && !was && !o.addBell(e, epfd) {
		on = false
	}
	if on == was {
		return on
	}
	o.mu.Lock()
	o.shared = on
	o.mu.Unlock()
	if !on {
		set.payOwed()
	}
	return on
}

// addBell gives the set its bell, unless it has one, in epoll instance
// epfd; false if it cannot (logged once).
func (o *owedSet) addBell(e *Engine, epfd int) bool {
	o.bellMu.Lock()
	defer o.bellMu.Unlock()
	if o.bell >= 0 {
		return true
	}
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err == nil {
		fd = highfd.Move(fd)
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: bellEvent[0], Pad: bellEvent[1]}
		if err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			highfd.Close(fd)
		}
	}
	if err != nil {
		level := params.LevelWarning
		if _, seen := e.causes.LoadOrStore("bell", true); seen {
			level = params.LevelDebug
		}
		e.Log.Printf(level, "epoll fd %d: its TCP connections are reported through their mirrors, two system calls a request more (its bell: %v)", epfd, err)
		return false
	}
	o.bell = fd
	return true
}

// closeBell closes the set's bell, which leaves its epoll instance.
func (o *owedSet) closeBell() {
	o.bellMu.Lock()
	if o.bell >= 0 {
		highfd.Close(o.bell)
		o.bell = -1
	}
	o.bellMu.Unlock()
}

// addLocked puts t on the owed list, once (tcpConn.owedListed: a wait
// that processes many connections' segments appends each in constant
// time), and says whether it was not there. Caller holds o.mu.
func (o *owedSet) addLocked(t *tcpConn) bool {
	if t.owedListed.CompareAndSwap(false, true) {
		o.owed = append(o.owed, t)
		o.total.Add(1)
		return true
	}
	return false
}

// sleep counts a wait of the set going to sleep in the kernel (+1) or
// back from it (-1). The wait looks at the owed list after it counted
// itself: a notice owed before is seen there, one after marks.
func (o *owedSet) sleep(d int) {
	o.mu.Lock()
	o.sleeping += d
	o.mu.Unlock()
}

func (o *owedSet) setPolling(on bool) {
	o.mu.Lock()
	o.polling = on
	o.mu.Unlock()
}

// take empties the owed list into list (its array reused) and returns it.
func (o *owedSet) take(list []*tcpConn) []*tcpConn {
	o.mu.Lock()
	defer o.mu.Unlock()
	list = append(list[:0], o.owed...)
	for _, t := range o.owed {
		t.owedListed.Store(false)
	}
	o.total.Add(-int32(len(o.owed)))
	clear(o.owed)
	o.owed = o.owed[:0]
	return list
}

// keep puts t back on the owed list.
func (o *owedSet) keep(t *tcpConn) {
	o.mu.Lock()
	o.addLocked(t)
	o.mu.Unlock()
}

// drop takes t off the owed list, if it is there, and says whether it was.
// The list is short (the connections of one wait's batch), so the scan is.
func (o *owedSet) drop(t *tcpConn) bool {
	if !t.owedListed.Load() {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	i := slices.Index(o.owed, t)
	if i < 0 {
		return false
	}
	last := len(o.owed) - 1
	o.owed[i] = o.owed[last]
	o.owed[last] = nil
	o.owed = o.owed[:last]
	t.owedListed.Store(false)
	o.total.Add(-1)
	return true
}

func (o *owedSet) any() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.owed) > 0
}

// reportOwed adds to out the set's owed connections that netstack has data
// for (EPOLLIN, with their members' data) and keeps those owed; the others
// leave the list. An edge-triggered member's report is its edge, made
// once: it leaves the list too, and the next notice of netstack's (more
// data) owes the next, as the kernel's ET wakes once a segment (nginx's
// connections). It returns how many it added. Caller holds set.mu.
func (set *epollSet) reportOwed(out []unix.EpollEvent) int {
	list := set.owed.take(set.owedScratch)
	n := 0
	for _, t := range list {
		t.mu.Lock()
		m := t.lazy
		owed := t.deferred && t.readers == 0 && m != nil && m.set == set
		t.mu.Unlock()
		if !owed {
			continue
		}
		if t.c.Events()&stack.TCPReadable == 0 {
			t.mu.Lock()
			if t.readers == 0 {
				t.deferred = false // read meanwhile: nothing is owed
			}
			t.mu.Unlock()
			continue
		}
		if n == len(out) || m.events&unix.EPOLLET == 0 {
			set.owed.keep(t) // level-triggered, or not reported yet
		} else {
			t.mu.Lock()
			if t.readers == 0 {
				t.deferred = false
			}
			t.mu.Unlock()
		}
		if n < len(out) {
			out[n] = unix.EpollEvent{Events: unix.EPOLLIN, Fd: m.data[0], Pad: m.data[1]}
			n++
		}
	}
	clear(list)
	set.owedScratch = list[:0]
	return n
}

// payOwed marks the mirrors of every connection the set owes. It may run
// on any thread, set.mu held or not.
func (set *epollSet) payOwed() {
	for _, t := range set.owed.take(nil) {
		t.pay()
	}
}

// payFor marks t's mirror if the set owes it: t stopped being the set's
// to report (its member was removed or changed). What the set owes other
// connections stays owed: paying those too would cost an event loop that
// changes one member's events per request (redis-benchmark: EPOLL_CTL_DEL
// and ADD after each reply) a mark and a settle for every other
// connection its wait reported, about to be read anyway.
func (set *epollSet) payFor(t *tcpConn) {
	if set.owed.drop(t) {
		t.pay()
	}
}

// pay marks t's mirror if a mark is owed and netstack has data. It asks
// netstack with no lock of its own held, as endRead does.
func (t *tcpConn) pay() {
	t.mu.Lock()
	owed := t.deferred && t.readers == 0
	if owed {
		t.deferred = false
	}
	t.mu.Unlock()
	if owed && t.c.Events()&stack.TCPReadable != 0 {
		t.mu.Lock()
		if !t.closed {
			t.markLocked()
		}
		t.mu.Unlock()
	}
}

// relazyLocked says again which member, if any, may owe t's marks: only,
// when it is t's only one and level-triggered EPOLLIN. The caller pays
// what the set of a member that no longer may owed. Caller holds t.mu.
func (t *tcpConn) relazyLocked(only *tcpMember) {
	if t.sets == 1 && only != nil && lazyEvents(only.events) {
		t.lazy = only
		return
	}
	t.lazy = nil
}

// PayOwed marks the mirrors of all the connections epoll sets owe marks,
// for a caller about to ask the kernel about them (poll and select on
// TCP connections go to the kernel, which sees the mirrors).
func (e *Engine) PayOwed() {
	e.mu.Lock()
	sets := make([]*epollSet, 0, len(e.epolls))
	for _, set := range e.epolls {
		sets = append(sets, set)
	}
	e.mu.Unlock()
	for _, set := range sets {
		set.payOwed()
	}
}
