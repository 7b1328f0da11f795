package stack

import (
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/stack/header"
)

// CallsInside is how many calls are using c's descriptors now.
func CallsInside(c *UDPConn) int64 { return c.use.Load() &^ useClosing }

// ExpireNextHops makes every cached next hop expired, as 30 s later.
func ExpireNextHops(st *Stack) {
	st.hops.mu.Lock()
	defer st.hops.mu.Unlock()
	m := map[netip.Addr]nextHop{}
	for k, v := range *st.hops.m.Load() {
		v.expires = monoNow() - 1
		m[k] = v
	}
	st.hops.m.Store(&m)
}

// WaitNextHopRefreshes waits for the background next-hop lookups.
func WaitNextHopRefreshes(st *Stack) { st.hops.refreshes.Wait() }

// DeliverFrame hands frame to st as its queues hand what they receive
// (Stack.demuxLocked), for TCP: parsed, then given to netstack. It
// reports whether the frame was TCP over IPv4 that parsed.
func DeliverFrame(st *Stack, frame []byte) bool {
	var p header.Packet
	if r := header.Parse(frame, &p); r != header.NotUDP || p.IP.Protocol() != header.ProtocolTCP {
		return false
	}
	st.rxMu.Lock()
	defer st.rxMu.Unlock()
	st.deliverTCP(p.IP)
	return true
}

// Poller is the descriptor a drain goroutine waits on for be's frames
// (pollerFile): readable reports whether it polls readable within wait.
func Poller(be backend.Backend) (readable func(wait time.Duration) (bool, error), close func(), err error) {
	f, rc, err := pollerFile(be)
	if err != nil {
		return nil, nil, err
	}
	readable = func(wait time.Duration) (bool, error) {
		var n int
		var werr error
		evs := make([]unix.EpollEvent, 1)
		if err := rc.Control(func(fd uintptr) {
			n, werr = unix.EpollWait(int(fd), evs, int(wait.Milliseconds()))
		}); err != nil {
			return false, err
		}
		return n > 0, werr
	}
	close = func() {
		highfd.Forget(int(f.Fd()))
		f.Close()
	}
	return readable, close, nil
}

// AppPolling says whether st takes an application thread to poll its
// queues now (notePoll), and AppPollRecent how long one poll says so.
func AppPolling(st *Stack) bool { return st.appPolling() }

const AppPollRecent = appPollRecent

// EndpointCorked says whether c's netstack endpoint has TCP_CORK on, the
// application's view (Option) aside.
func EndpointCorked(c *TCPConn) bool { return c.ep.SocketOptions().GetCorkOption() }

// HoldShrink keeps the link watcher from shrinking netstack's segments
// when the MTU comes down (on), as in the moment before it sees the
// change.
func HoldShrink(on bool) { shrinkOff.Store(on) }

// ShrinkMSS shrinks netstack's segments to the MTU now.
func ShrinkMSS(st *Stack) { st.shrinkMSS() }

// StopArrivalStamps has st's steering program stop writing arrival
// stamps, as a driver without XDP metadata room never writes them.
func StopArrivalStamps(st *Stack) error { return st.prog.StampArrivals(false) }

// RPMode is the rp_filter the watcher last read.
func RPMode(st *Stack) int32 { return st.rpMode.Load() }

// AcceptLocal is the accept_local the watcher last read.
func AcceptLocal(st *Stack) bool { return st.acceptLocal.Load() }

// LocalAddrCount is how many addresses of its namespace the stack knows.
func LocalAddrCount(st *Stack) int { return len(*st.localAddrs.Load()) }

// SourceVerdicts is the verdict of the copy of the routes (fib.go) and the
// kernel's on a packet from src to dst arriving on st's interface, under
// the rp_filter and accept_local in force now; the copy's error when the
// namespace routes in a way it does not follow.
func SourceVerdicts(st *Stack, src, dst netip.Addr) (copied, kernel bool, err error) {
	f, err := st.readFIB()
	if err != nil {
		return false, false, err
	}
	copied = st.copyVerdict(f, src, st.srcConf.rpMode(), st.srcConf.acceptsLocal())
	kernel, err = st.sourceValid(src, dst)
	return copied, kernel, err
}

// FIBFollowed says whether st checks sources against its copy of the
// routes.
func FIBFollowed(st *Stack) bool { return st.fib.Load() != nil }

// ErrFIBCustom is errFIBCustom.
var ErrFIBCustom = errFIBCustom

// SourceVerdict is one verdict on src arriving on st's interface: from
// the copy of the routes st follows (false when it follows none), or the
// kernel's (to dst).
func SourceVerdict(st *Stack, src, dst netip.Addr, kernel bool) (ok, decided bool) {
	if kernel {
		ok, err := st.sourceValid(src, dst)
		return ok, err == nil
	}
	f := st.fib.Load()
	if f == nil {
		return false, false
	}
	return st.copyVerdict(f, src, st.rpMode.Load(), st.acceptLocal.Load()), true
}

// TxUnkicked says whether c's queue holds frames left for a coalesced
// kick.
func TxUnkicked(c *UDPConn) bool { return c.txq.unkicked.Load() }
