package stack

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/stack/header"
)

// nextHop is how to reach one destination.
type nextHop struct {
	viaKernel  bool // not behind our interface, or not resolvable: the kernel sends it
	unresolved bool // viaKernel as the kernel could not resolve it (ARP)
	pending    bool // viaKernel while the kernel resolves it (ARP): not to be kept
	mac        header.MAC
	src        netip.Addr
	expires    int64 // monoNow nanoseconds
}

// How long a resolved next hop is trusted before the kernel's tables are
// read again, and how long a failed resolution sends through the kernel
// before it is tried again. An entry past its expiry is still used, for
// up to staleTTL more, while one background lookup refreshes it.
const (
	nextHopTTL      = 30 * time.Second
	unresolvableTTL = time.Second
	staleTTL        = 30 * time.Second
)

// nextHops caches the kernel's routing and neighbour decisions. Readers
// load an immutable map without a lock; a miss rebuilds it under mu. Only
// the first send to a destination waits for netlink (a route and
// neighbour lookup take tens of microseconds, an unanswered ARP up to
// ResolveTimeout); later ones never do, since an expired entry is served
// while a goroutine looks it up again.
type nextHops struct {
	mu sync.Mutex
	m  atomic.Pointer[map[netip.Addr]nextHop]

	refreshMu  sync.Mutex
	refreshing map[netip.Addr]bool
	// pending: destinations whose neighbour the kernel resolves, until
	// when (monoNow); pendingN is len(pending), read by sends without
	// refreshMu.
	pending   map[netip.Addr]int64
	pendingN  atomic.Int32
	waits     int // afterHop's goroutines
	closed    bool
	closing   atomic.Bool // ends the waits for ARP (stopRefreshes)
	refreshes sync.WaitGroup
}

// nextHop returns dst's next hop for a UDP send; now is monoNow's, read
// by the caller (a send reads the clock once). It does not wait for ARP
// but for a stamped send (up to ResolveTimeout: its stamp is taken as its
// frame goes on the ring, its key counted with the socket's others).
// While the kernel resolves dst's neighbour, the hop is the kernel's
// (pending): the kernel socket sends, and the kernel queues the datagrams
// on the neighbour as it queues its own (unres_qlen_bytes), sends them
// when the answer comes, or drops them and reports the error its way.
// They keep their order with the sends that follow, which the stack
// makes once the answer is seen, and outlive the process. A send that
// waited stalled a UDP server for a second per query from an address of
// its subnet that nobody holds.
func (st *Stack) nextHop(dst netip.Addr, now int64, stamped bool) (nextHop, error) {
	if !stamped && st.hops.pendingN.Load() != 0 && st.hopPending(dst, now) {
		return nextHop{viaKernel: true, pending: true}, nil
	}
	if h, ok := st.hopCached(dst, now); ok {
		return h, nil
	}
	if stamped {
		return st.resolve(dst, st.opts.ResolveTimeout)
	}
	h, err := st.resolve(dst, 0)
	if errors.Is(err, errNeighPending) {
		st.awaitHop(dst, now)
		return nextHop{viaKernel: true, pending: true}, nil
	}
	return h, err
}

// pendingRetry is how long sends to a destination go through the kernel
// socket without a lookup when no goroutine could wait for its neighbour
// (maxHopWaits wait already).
const pendingRetry = 100 * time.Millisecond

// hopPending says whether the kernel resolves dst's neighbour at now.
func (st *Stack) hopPending(dst netip.Addr, now int64) bool {
	hs := &st.hops
	hs.refreshMu.Lock()
	defer hs.refreshMu.Unlock()
	until, ok := hs.pending[dst]
	if ok && now >= until {
		delete(hs.pending, dst)
		hs.pendingN.Store(int32(len(hs.pending)))
		return false
	}
	return ok
}

// awaitHop marks dst pending from now until the kernel's verdict on its
// neighbour is in the cache (afterHop).
func (st *Stack) awaitHop(dst netip.Addr, now int64) {
	hs := &st.hops
	hs.refreshMu.Lock()
	if _, ok := hs.pending[dst]; ok {
		hs.refreshMu.Unlock()
		return
	}
	if hs.pending == nil {
		hs.pending = map[netip.Addr]int64{}
	}
	hs.pending[dst] = now + int64(afterHopMax+time.Second)
	hs.pendingN.Store(int32(len(hs.pending)))
	hs.refreshMu.Unlock()
	waits := st.afterHop(dst, func(nextHop, error) {
		hs.refreshMu.Lock()
		delete(hs.pending, dst)
		hs.pendingN.Store(int32(len(hs.pending)))
		hs.refreshMu.Unlock()
	})
	if !waits {
		hs.refreshMu.Lock()
		if _, ok := hs.pending[dst]; ok {
			hs.pending[dst] = now + int64(pendingRetry)
		}
		hs.refreshMu.Unlock()
		// The mark goes when it expires, sent to again or not: while any
		// is left, every send looks at the marks under refreshMu.
		time.AfterFunc(pendingRetry, func() { st.hopPending(dst, monoNow()) })
	}
}

// hopCached returns dst's next hop if the cache has it at now (monoNow),
// fresh or stale (then refreshed in the background).
func (st *Stack) hopCached(dst netip.Addr, now int64) (nextHop, bool) {
	if m := st.hops.m.Load(); m != nil {
		if h, ok := (*m)[dst]; ok {
			if now < h.expires {
				return h, true
			}
			if now < h.expires+int64(staleTTL) {
				st.refreshHop(dst)
				return h, true
			}
		}
	}
	return nextHop{}, false
}

// errNeighPending: the kernel has no neighbour entry for the next hop
// yet, and its ARP request is on its way (hopNow).
var errNeighPending = errors.New("neighbour not resolved yet")

// hopNow is nextHop without the wait for ARP: when the kernel's tables
// need an ARP answer first, it sends the request and returns
// errNeighPending; afterHop waits for the answer elsewhere. netstack's
// goroutines use it: one that waited for ARP held a listener's every
// handshake (a SYN flood from addresses nobody holds stalled it for
// ResolveTimeout per address).
func (st *Stack) hopNow(dst netip.Addr) (nextHop, error) {
	if h, ok := st.hopCached(dst, monoNow()); ok {
		return h, nil
	}
	return st.resolve(dst, 0)
}

// maxHopWaits bounds the goroutines afterHop keeps waiting for ARP.
const maxHopWaits = 16

// afterHopMax bounds afterHop's wait for the kernel's verdict on a
// neighbour, which comes after its ARP requests (mcast_solicit times
// retrans_time_ms: 3 s by default).
const afterHopMax = 10 * time.Second

// afterHop calls fn, on a goroutine of its own, with dst's next hop once
// the kernel resolves it or gives up on it (NUD_FAILED; at most
// afterHopMax). It waits as long as the kernel's own first packet to a
// new neighbour would, not ResolveTimeout: the packets parked for it are
// a connect's SYN, which the kernel sends when the second or third ARP
// request is answered. False, and fn is never called, when maxHopWaits
// wait already or the stack is closing.
func (st *Stack) afterHop(dst netip.Addr, fn func(nextHop, error)) bool {
	hs := &st.hops
	hs.refreshMu.Lock()
	defer hs.refreshMu.Unlock()
	if hs.closed || hs.waits >= maxHopWaits {
		return false
	}
	hs.waits++
	hs.refreshes.Add(1)
	go func() {
		defer hs.refreshes.Done()
		h, ok := st.hopCached(dst, monoNow())
		var err error
		if !ok {
			h, err = st.resolve(dst, max(st.opts.ResolveTimeout, afterHopMax))
		}
		fn(h, err)
		hs.refreshMu.Lock()
		hs.waits--
		hs.refreshMu.Unlock()
	}()
	return true
}

// refreshHop looks dst up again in the background, once at a time.
func (st *Stack) refreshHop(dst netip.Addr) {
	hs := &st.hops
	hs.refreshMu.Lock()
	defer hs.refreshMu.Unlock()
	if hs.closed || hs.refreshing[dst] {
		return
	}
	if hs.refreshing == nil {
		hs.refreshing = map[netip.Addr]bool{}
	}
	hs.refreshing[dst] = true
	hs.refreshes.Add(1)
	go func() {
		defer hs.refreshes.Done()
		if _, err := st.resolve(dst, st.opts.ResolveTimeout); err != nil {
			// No route any more: the next send looks it up itself and
			// gets the error.
			st.forgetHop(dst)
		}
		hs.refreshMu.Lock()
		delete(hs.refreshing, dst)
		hs.refreshMu.Unlock()
	}()
}

func (st *Stack) forgetHop(dst netip.Addr) {
	st.hops.mu.Lock()
	defer st.hops.mu.Unlock()
	if old := st.hops.m.Load(); old != nil {
		m := maps.Clone(*old)
		delete(m, dst)
		st.hops.m.Store(&m)
	}
}

// stopRefreshes waits for the background lookups and starts no more.
func (st *Stack) stopRefreshes() {
	st.hops.refreshMu.Lock()
	st.hops.closed = true
	st.hops.refreshMu.Unlock()
	st.hops.closing.Store(true)
	st.hops.refreshes.Wait()
}

// resolve asks the kernel: the route to dst, then the neighbour entry of the
// next hop, triggering ARP (NTF_USE) and waiting up to wait when the
// kernel has none (with no wait: errNeighPending), or until the kernel
// gives up. A destination the kernel cannot resolve is sent through the
// kernel socket for a while, so the kernel keeps trying and reports
// errors the usual way.
func (st *Stack) resolve(dst netip.Addr, wait time.Duration) (nextHop, error) {
	// The lookup goes without the lock: one that waits for an ARP answer
	// held every other destination's for up to ResolveTimeout.
	h, err := st.lookupHop(dst, wait)
	if err != nil {
		return h, err
	}
	st.cacheHop(dst, h)
	return h, nil
}

// unresolved caches dst as a destination the kernel could not resolve
// (unresolvableTTL): its packets go the kernel's way, with no lookup each.
func (st *Stack) unresolved(dst netip.Addr) {
	st.cacheHop(dst, nextHop{viaKernel: true, unresolved: true, expires: monoNow() + int64(unresolvableTTL)})
}

// cacheHop puts h in the cache for dst, and drops the entries past their
// staleness.
func (st *Stack) cacheHop(dst netip.Addr, h nextHop) {
	st.hops.mu.Lock()
	defer st.hops.mu.Unlock()
	old := st.hops.m.Load()
	m := make(map[netip.Addr]nextHop, 1)
	if old != nil {
		now := monoNow()
		for k, v := range *old {
			if now < v.expires+int64(staleTTL) {
				m[k] = v
			}
		}
	}
	m[dst] = h
	st.hops.m.Store(&m)
}

func (st *Stack) lookupHop(dst netip.Addr, wait time.Duration) (nextHop, error) {
	h := nextHop{expires: monoNow() + int64(nextHopTTL)}
	// Broadcast goes the kernel's way: it refuses it without SO_BROADCAST
	// (EACCES), and routes 255.255.255.255 (ENETUNREACH without a route).
	if dst == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
		h.viaKernel = true
		return h, nil
	}
	// The stack's own netlink socket, opened in its namespace at Open:
	// no setns here (which fails once a program dropped CAP_SYS_ADMIN, as
	// knotd does) and no low fd taken from the application (rtnl.go).
	r, err := st.routeGet(dst)
	if err != nil {
		return h, fmt.Errorf("route to %s: %w", dst, errors.Join(err, unix.ENETUNREACH))
	}
	if r.oif != st.ifindex || r.local || r.broadcast {
		h.viaKernel = true
		return h, nil
	}
	h.src = st.Addr()
	if r.src.IsValid() {
		h.src = r.src
	}
	if dst.IsMulticast() {
		h.mac = header.MulticastMAC(dst)
		return h, nil
	}
	hop := dst
	if r.gw.IsValid() {
		hop = r.gw
	}
	deadline := time.Now().Add(wait)
	// A failed entry seen before our NTF_USE is an old verdict, which the
	// use starts over.
	for triggered, poll := false, 100*time.Microsecond; ; {
		mac, ok, failed := st.neighbourNow(hop)
		if ok {
			h.mac = mac
			return h, nil
		}
		if !triggered {
			st.neighbourUse(hop)
			triggered = true
		} else if failed || time.Now().After(deadline) {
			st.Counters.NeighUnresolved.Add(1)
			return nextHop{viaKernel: true, unresolved: true, expires: monoNow() + int64(unresolvableTTL)}, nil
		}
		if wait == 0 {
			return h, errNeighPending
		}
		if st.hops.closing.Load() {
			return h, fmt.Errorf("neighbour %s: %w", hop, net.ErrClosed)
		}
		// An answer on a link comes within the first polls (while they
		// last, a UDP sender's datagrams go the kernel's way); one
		// that takes the kernel's next request (a second later) need not
		// cost a netlink dump each millisecond.
		time.Sleep(poll)
		poll = min(2*poll, 16*time.Millisecond)
	}
}
