package stack

import (
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The queues' watcher. Of the threads asleep on a stack's UDP sockets
// (multiplexers, BeginWait, and blocking receives, UDPConn.sleep) one at
// a time, the watcher, sleeps on the queues' descriptors; the others
// sleep on their eventfds alone, which the demultiplexer writes when it
// queues datagrams for their sockets (wakeQueued), as the kernel wakes
// only a socket's own waiters. With every sleeper on the queues, each
// frame woke them all: pdns_recursor with reuseport and two threads, one
// flow of queries, had its idle thread woken for every query of its
// busy sibling, take it off the ring and wake the sibling: 0.61-0.67x
// the kernel's queries a second, where one thread made 1.0-1.09x.
//
// The watcher leaves the queues as it wakes. The next sleeper takes them,
// unless a sleeper was woken for its datagrams since (the heir): the
// queues wait for the heir's next sleep, so that the thread the traffic
// is for sleeps on them and a frame wakes it alone. Nor does a sleeper
// take them while another thread polls them (a busy sibling that spins
// between its requests): each frame woke the sleeper for what the
// poller took. While nobody watches and others sleep off the queues, a
// frame for them waits for a thread that polls: the one that woke does,
// before it goes back to the application, and the heir does at its next
// wait. One that does not come back (gone to other work) is covered by
// ringVacancy: then the oldest sleeper off the queues is woken to take
// them.
type ringWatch struct {
	// held: a sleeper sleeps on the queues (written under muxMu).
	held atomic.Bool
	off  []int32 // eventfds of the sleepers off the queues (muxMu)
	// vacant is monoNow's when nobody watched the queues since, with
	// sleepers off them (muxMu); timer looks at it (ringsVacant), armed
	// while it runs.
	vacant int64
	timer  *time.Timer
	armed  bool
	// heir is the eventfd of the sleeper woken last for its datagrams
	// while nobody watched, -1 if none: the queues are kept for it.
	// Written without muxMu by wakeQueued.
	heir atomic.Int32
	// sleepers count the sleepers placed (takeRingsLocked); while there
	// are any, the application's polls mark themselves (markPoller):
	// polled is monoNow's at the mark, poller the polling thread's id, 0
	// once that thread sleeps.
	sleepers atomic.Int32
	polled   atomic.Int64
	poller   atomic.Int32
}

// ringVacancy bounds how long frames for sleepers off the queues wait
// while no thread watches them, twice over: the timer that looks is
// armed when a vacancy begins and left running after it ends, not reset
// at each, since each reset that comes before Go's netpoller's deadline
// wakes one of Go's threads: a watcher leaves at every query, and a timer
// reset there woke one per query (unbound with two threads, paced).
const ringVacancy = 4 * time.Millisecond

// takeRingsLocked says whether the sleeper whose eventfd is fd watches
// the queues. One that must sleep on them (a thread asleep on the queues
// for its TCP connections, sleepOnRings, which the drains leave the frames
// to) does whatever the answer, and takes the watch if nobody has it. A
// sleeper off the queues is recorded until leaveRingsLocked. Caller holds
// muxMu.
func (st *Stack) takeRingsLocked(fd int32, must bool) (watcher bool) {
	w := &st.rings
	w.sleepers.Add(1)
	tid := int32(unix.Gettid())
	w.poller.CompareAndSwap(tid, 0) // this thread stops polling
	p := w.poller.Load()
	polled := p != 0 && monoNow()-w.polled.Load() < int64(appPollRecent)
	heir := w.heir.Load()
	if !w.held.Load() && (heir == fd || must || heir < 0 && !polled) {
		w.held.Store(true)
		w.heir.Store(-1)
		w.vacant = 0
		return true
	}
	if !must {
		w.off = append(w.off, fd)
		if !w.held.Load() {
			st.vacantLocked() // kept for an heir that may not sleep again soon
		}
	}
	return false
}

// vacantLocked notes that nobody watches the queues while sleepers are
// off them, and arms the timer that looks (ringsVacant) unless it runs.
// Caller holds muxMu.
func (st *Stack) vacantLocked() {
	w := &st.rings
	if w.vacant == 0 {
		w.vacant = monoNow()
	}
	st.armVacancyLocked()
}

func (st *Stack) armVacancyLocked() {
	w := &st.rings
	switch {
	case w.armed:
	case w.timer == nil:
		w.timer = time.AfterFunc(ringVacancy, st.ringsVacant)
	default:
		w.timer.Reset(ringVacancy)
	}
	w.armed = true
}

// leaveRingsLocked ends a sleep that takeRingsLocked placed. A watcher
// that leaves while others sleep off the queues arms ringVacancy, and
// polls them for those (pollForOthers) if the queues woke it, whatever
// its caller's scan does: a set whose members are all disabled
// (EPOLLONESHOT) polls nothing. Not a thread that must sleep on them: it
// processes its TCP connections' segments itself (rx_inline) and polls
// the queues as it does. Caller holds muxMu.
func (st *Stack) leaveRingsLocked(fd int32, watcher, must bool) (pollForOthers bool) {
	w := &st.rings
	w.sleepers.Add(-1)
	switch {
	case watcher:
		w.held.Store(false)
		if len(w.off) > 0 {
			st.vacantLocked()
			return !must
		}
	case !must:
		if i := slices.Index(w.off, fd); i >= 0 {
			w.off = slices.Delete(w.off, i, i+1)
		}
	}
	return false
}

// ringsVacant wakes the oldest sleeper off the queues when nobody has
// watched them for ringVacancy: it polls them and, asleep again, watches
// them.
func (st *Stack) ringsVacant() {
	st.muxMu.Lock()
	defer st.muxMu.Unlock()
	w := &st.rings
	w.armed = false
	if w.held.Load() || len(w.off) == 0 {
		w.vacant = 0
		return
	}
	now := monoNow()
	if w.poller.Load() != 0 && now-w.polled.Load() < int64(ringVacancy) || now-w.vacant < int64(ringVacancy) {
		st.armVacancyLocked() // a thread polls them still, or the vacancy is young
		return
	}
	w.vacant = 0
	w.heir.Store(w.off[0])
	writeEventfd(w.off[0])
}

// markPoller marks an application thread's poll (notePoll) while threads
// sleep on the stack's sockets, for their choice of the watcher.
func (st *Stack) markPoller() {
	w := &st.rings
	if w.sleepers.Load() == 0 {
		return
	}
	w.polled.Store(monoNow())
	w.poller.Store(int32(unix.Gettid()))
}

// inherit makes fd, the eventfd of a sleeper just woken for its
// datagrams, the heir of the queues if nobody watches them.
func (st *Stack) inherit(fd int32) {
	if !st.rings.held.Load() {
		st.rings.heir.Store(fd)
	}
}

// writeEventfd adds one to eventfd fd: its sleepers wake.
func writeEventfd(fd int32) {
	var one = uint64(1)
	unix.Write(int(fd), (*[8]byte)(unsafe.Pointer(&one))[:])
}
