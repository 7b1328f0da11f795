package stack

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/backend"
	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// rxBatch is how many frames one poll drains from a queue's RX ring.
const rxBatch = 64

// maxQueues bounds the queues of one stack (the size of the XSKMAP).
const maxQueues = 64

// Options configure a Stack. The zero value means defaults.
type Options struct {
	// Queues lists the interface queues to serve (default: every RX queue
	// the interface runs, as `ethtool -l` counts them, followed as that
	// count changes).
	Queues []int
	// XSK configures the AF_XDP sockets.
	XSK *xsk.Options
	// Steer configures the steering program.
	Steer *steer.Options
	// RxPoll is how many times a blocking receive polls before it sleeps
	// (VMAXDP_RX_POLL): 0 means the default, each socket polling while
	// polling pays (see Spin); RxPollForever never sleeps; RxPollNever
	// sleeps at once (VMA's 0); N polls N times.
	RxPoll int
	// RxPollOSRatio: while polling, the kernel socket is checked once every
	// RxPollOSRatio polls (VMAXDP_RX_UDP_POLL_OS_RATIO): 0 means the
	// default, 100; OSPollBeforeSleep checks it only before sleeping (VMA's 0).
	RxPollOSRatio int
	// RxBytesLimit caps the payload bytes queued on one socket
	// (VMAXDP_RX_BYTES_MIN; default 1 MiB). A datagram beyond it is dropped
	// and counted in RxQueueDrops.
	RxBytesLimit int
	// MTU caps the IP datagrams the stack sends itself (VMAXDP_MTU; 0: the
	// interface's MTU); larger ones go through the kernel socket.
	MTU int
	// ResolveTimeout bounds the background lookup that refreshes an
	// expired next hop, and a stamped send's wait for ARP on a new
	// neighbour (default 1 s); past it, the kernel socket sends to that
	// destination for a while. No other send waits for ARP: while the
	// kernel resolves a new neighbour, UDP sends to it go through the
	// kernel socket, and TCP's packets wait beside the ARP request
	// (afterHop).
	ResolveTimeout time.Duration
	// NewBackend opens the backend of a queue (default: an AF_XDP socket);
	// rxOnly asks for one that only receives (the interface runs no TX
	// queue of that number).
	NewBackend func(ifname string, queue int, rxOnly bool) (backend.Backend, error)
	// OnQueue, when set, is told of each queue the stack starts to serve,
	// by name ("vmxb/q0") and its backend's fd; the function it returns
	// runs just before the backend closes. The engine hands the fd to a
	// helper process that sends what the TX ring holds if the process
	// dies before its kick (internal/peernotify).
	OnQueue func(name string, fd int) (release func())
	// ProgressInterval: when no receive has polled the queues for this
	// long, a goroutine of the stack drains their RX rings into the
	// sockets' queues (VMAXDP_PROGRESS_ENGINE_INTERVAL, VMA's progress
	// engine), so that datagrams of a socket the application is not
	// reading wait in its queue, up to its byte limit, instead of holding
	// the ring's frames until the fill ring runs dry and the kernel drops.
	// While nobody polls, it sleeps on the queues and drains each burst as
	// it comes. 0 means the default, 10 ms; ProgressNever disables it.
	ProgressInterval time.Duration
	// TxKickDelay lets a send leave its datagram on the TX ring without
	// the system call that sends it (a kick), for up to this long
	// (VMAXDP_TX_KICK_DELAY): the kick comes when a kernel batch is full,
	// when the application next receives or waits (a receive, poll,
	// select, epoll_wait), or when the delay is over. In copy mode a kick
	// runs the device's transmit inline, so consecutive sends share one.
	// 0 means the default, 20 us; TxKickNever kicks on every send.
	TxKickDelay time.Duration
	// ProgressMax bounds the frames one drain takes
	// (VMAXDP_PROGRESS_ENGINE_WCE_MAX; 0: 2048).
	ProgressMax int
	// Wanted, when set, is asked just before Open attaches the steering
	// program, and again before it opens the queues: false ends Open with
	// ErrNotWanted, leaving the interface untouched the first time (every
	// socket it was opened for went to the kernel meanwhile: attaching and
	// detaching a program costs a veth's traffic).
	Wanted func() bool
	// Ours, when set, says whether the kernel socket with this inode is
	// one the caller is handing to the stack (the stack knows those it
	// serves already): such a socket on a shareable socket's port is not
	// a reason to leave the port to the kernel (see ErrShared).
	Ours func(inode uint64) bool
	// Shared, when set, is told the steered sockets that share their
	// address and port with a kernel socket the stack does not serve, and
	// why; it must hand them back to the kernel (UDPConn.Unsteer and
	// whatever its own tables need). It runs on the stack's watcher and
	// must not wait for the stack to close. When nil, the stack unsteers
	// them itself.
	Shared func(cs []*UDPConn, reason string)
	// SharedListeners is Shared for netstack's SO_REUSEPORT listeners
	// (ListenNetstack): those whose port a kernel listener the stack does
	// not serve shares. It must close them (the kernel listeners take
	// over); when nil, the stack closes them itself.
	SharedListeners func(ls []*NetstackListener, reason string)
	// McLoopViaKernel, when set, is told of a socket's first multicast
	// send that goes through its kernel socket because the group has a
	// member on this host and the socket's IP_MULTICAST_LOOP is on
	// (mcmember.go), so that the application's log can say why. It runs
	// on the sending thread and must not block.
	McLoopViaKernel func(c *UDPConn, group netip.Addr)
}

// ErrNotWanted is returned by Open when Options.Wanted said no.
var ErrNotWanted = errors.New("no socket wants the stack any more")

// Sentinels of Options.RxPoll, Options.RxPollOSRatio,
// Options.ProgressInterval and Options.TxKickDelay: their zero value
// means "default", so VMA's 0 ("never") has a name of its own.
const (
	RxPollForever     = -1
	RxPollNever       = -2
	OSPollBeforeSleep = -1
	ProgressNever     = -1
	TxKickNever       = -1
)

// DefaultTxKickDelay is Options.TxKickDelay's default.
const DefaultTxKickDelay = 20 * time.Microsecond

// Counters are the stack's counters of frames that reached no socket.
type Counters struct {
	RxFrames atomic.Uint64
	// RxDropped counts frames dropped by the parser, by header.Result.
	RxDropped [header.NumResults]atomic.Uint64
	// RxNoSocket counts valid datagrams that no socket is bound to (a rule
	// outlived its socket for a moment).
	RxNoSocket      atomic.Uint64
	NeighUnresolved atomic.Uint64
	// RxProgressFrames counts the frames the progress engine drained
	// (see Options.ProgressInterval): no receive was polling.
	RxProgressFrames atomic.Uint64
	// RxPartialChecksum counts datagrams and TCP segments delivered with a
	// partial checksum (header.PartialUDPChecksum, PartialTCPChecksum) on
	// a link without a bus, where they come from this host's kernel with
	// TX checksum offload on. On a link with a bus they are dropped as
	// bad_udp_checksum or bad_tcp_checksum.
	RxPartialChecksum atomic.Uint64
	// RxSourceRejected counts datagrams and TCP segments dropped for a
	// source the kernel would have refused on input (source.go), and
	// RxSourceUnchecked those from a new source past the checks a second
	// allows.
	RxSourceRejected  atomic.Uint64
	RxSourceUnchecked atomic.Uint64
	// RxSpilled counts datagrams copied out of their frames because
	// sockets held half of their queue's receive frames (copies.go).
	RxSpilled atomic.Uint64
}

// Zero sets every counter to zero (vmaxdp stats -z).
func (c *Counters) Zero() {
	c.RxFrames.Store(0)
	for i := range c.RxDropped {
		c.RxDropped[i].Store(0)
	}
	c.RxNoSocket.Store(0)
	c.NeighUnresolved.Store(0)
	c.RxProgressFrames.Store(0)
	c.RxPartialChecksum.Store(0)
	c.RxSourceRejected.Store(0)
	c.RxSourceUnchecked.Store(0)
	c.RxSpilled.Store(0)
}

// queue is one backend queue.
type queue struct {
	idx int // the interface's queue number
	be  backend.Backend
	// arrivals is be's arrival stamps, nil when it has none.
	arrivals backend.ArrivalStamper
	// canTx: the interface runs a TX queue of that number too, so the
	// queue's socket has a TX ring.
	canTx bool
	// unkicked: a send left frames on the TX ring (Options.TxKickDelay),
	// since unkickedAt (monoNow nanoseconds). Both guarded by txMu; unkicked
	// is read without it to skip queues with nothing to flush.
	unkicked   atomic.Bool
	unkickedAt int64
	busyAt     atomic.Int64         // monoNow when a kick last left frames (device busy or failing; 0: none)
	sendGen    uint32               // Stack.waitGen at the last send, guarded by txMu
	closed     bool                 // the backend is closed (Stack.Close), guarded by txMu and kicks.mu
	release    func()               // Options.OnQueue's, run before the backend closes; nil: none
	kickDue    bool                 // a send asks for a kick once txMu is let go (unlockTx), guarded by txMu
	rx         [rxBatch]backend.Buf // guarded by Stack.rxMu
	rel        []backend.Buf        // frames to release, guarded by Stack.rxMu
	// lent counts the frames Receive handed out and Release has yet to
	// take back: in socket queues, lent to readers, or in rel (guarded by
	// Stack.rxMu). See Stack.deliverLocked.
	lent int

	txMu   sync.Mutex
	txBufs [rxBatch]backend.Buf // guarded by txMu

	// kicks makes the kicks (the backend's Flush), without txMu, one at
	// a time (kick.go).
	kicks kickLatch
}

// QueueError is an interface queue the stack does not serve, and why. The
// steering program passes what arrives on it to the kernel, so those
// datagrams reach the sockets through their kernel sockets, counted in
// each rule's redirect_failures.
type QueueError struct {
	Queue int
	Err   error
}

func (e QueueError) Error() string { return fmt.Sprintf("queue %d: %v", e.Queue, e.Err) }
func (e QueueError) Unwrap() error { return e.Err }

// sockKey is how received datagrams find their socket; unused fields zero.
type sockKey struct {
	laddr [4]byte
	raddr [4]byte
	lport uint16
	rport uint16
}

// Stack serves the UDP sockets of one interface.
type Stack struct {
	// appPolled is monoNow's when an application thread last polled the
	// queues for a TCP connection (TCPConn.Poll), 0 once it stopped to
	// sleep (pollStopped); drains are the TCP drain goroutines it tells.
	appPolled atomic.Int64
	// ringSleeper says that an application thread sleeps on the queues'
	// descriptors for its TCP connections (sleepOnRings): the drains
	// leave the frames to it, as to a polling thread.
	ringSleeper atomic.Bool
	// mirrorSleepers count the threads asleep on their connections'
	// mirrors (SleepOnMirror): a ring sleeper that wakes leaves the
	// queues to the drains at once while there are any.
	mirrorSleepers atomic.Int32
	drainsMu       sync.Mutex
	drains         []*drain

	opts    Options
	ifname  string
	ifindex int
	mac     header.MAC
	mtu     atomic.Int32                 // the interface's MTU, or Options.MTU when lower
	addr    atomic.Pointer[netip.Addr]   // the interface's first IPv4 address
	addrs   atomic.Pointer[[]netip.Addr] // all its IPv4 addresses
	ns      netns.NsHandle
	nsInode uint32
	prog    *steer.Program
	// arrivalClock is set once a socket asks for receive stamps and the
	// steering program stamps arrivals (stampArrivals).
	arrivalClock    atomic.Pointer[kernelMono]
	arrivalMissTold atomic.Bool // a frame without an arrival stamp was logged
	// queues are the queues served, in the order opened; the slice is
	// replaced (under mu), never changed, so readers load it without a lock.
	queues   atomic.Pointer[[]*queue]
	unserved []QueueError // guarded by mu
	// partialCsum: the link carries frames from this host's kernel (veth
	// and other links without a bus), whose UDP checksum may be partial.
	partialCsum bool
	txFrameLen  int  // the longest frame a queue transmits
	rxFrameLen  int  // the longest frame a queue receives
	adaptive    bool // receives poll as Spin says (Options.RxPoll 0)
	ipID        atomic.Uint32
	hops        nextHops
	nextTxq     atomic.Uint32 // the queue the next socket transmits on

	rxMu     sync.Mutex
	polls    uint64 // pollLocked calls, guarded by rxMu
	appPolls uint64 // notePoll calls, guarded by rxMu

	// progressStop and progressStopFD (an eventfd, for its sleeps in
	// ppoll) end the progress engine; progressDone is nil without one.
	progressStop   chan struct{}
	progressStopFD int
	progressDone   chan struct{}

	// kernelOnly, when set, says why the stack sends nothing itself: the
	// interface is down or gone, and the kernel sockets send (and report
	// the kernel's errors). gone: the interface was deleted, its queues
	// are dead and never polled again.
	kernelOnly atomic.Pointer[string]
	gone       atomic.Bool
	watchStop  int           // eventfd that ends the watcher
	watchDone  chan struct{} // nil: no watcher
	ctlFD      int           // AF_INET socket for ethtool ioctls (-1: none)
	// srcConf is the interface's rp_filter and accept_local, rpMode and
	// acceptLocal their values as the watcher last read them, localAddrs
	// the namespace's IPv4 addresses (sortedAddrs); sources are the
	// verdicts of the kernel's source check since sourcesSince, under
	// rxMu, with the checks left in checkSecond (source.go).
	srcConf       sourceConf
	rpMode        atomic.Int32
	acceptLocal   atomic.Bool
	localAddrs    atomic.Pointer[[]uint32]
	fib           atomic.Pointer[fibCopy] // nil: each new source is asked of the kernel
	fibWhy        string                  // why not, as last logged; the rest is the watcher's too:
	fibRead       time.Time               // when the routes were last read
	fibStale      bool                    // they changed since
	sources       map[[4]byte]bool
	sourcesSince  time.Time
	checkSecond   int64
	checksLeft    int
	sourceErrTold atomic.Bool
	nlFD          int        // NETLINK_ROUTE socket for the stack's queries (rtnl.go; -1: none)
	nlMu          sync.Mutex // one query at a time on nlFD
	nlSeq         uint32     // the last query's sequence number
	nlBuf         []byte
	diag          *diag // lists the kernel sockets on a port (nil: none)
	shareKick     int   // eventfd: look for shared ports now (-1: none)

	// mcMembers: the groups the interface is a member of in the stack's
	// namespace, sorted; nil when the kernel does not say (mcmember.go).
	mcMembers atomic.Pointer[[]netip.Addr]

	// Multiplexers (poll, epoll) sleeping on the stack's sockets: the
	// demultiplexer writes the eventfd of each one whose sockets it queues
	// a datagram for while they sleep (wakeQueued), because the datagram
	// left the ring they watch, or that they do not watch (ringWatch).
	// One eventfd per sleeper: with a shared one, the first thread to
	// wake drained it and a second (another thread of a SO_REUSEPORT
	// group) slept on with its datagrams queued.
	muxWaiters  atomic.Int32
	muxMu       sync.Mutex
	muxSleeping []muxSleeper
	muxFree     []int32 // eventfds not in use
	muxWoke     []int32 // wakeQueued's eventfds written (guarded by rxMu)
	rings       ringWatch
	// queuedNow are the sockets the poll under way queued datagrams for
	// (guarded by rxMu).
	queuedNow []*UDPConn

	mu sync.Mutex // serialises socket table and rule changes
	// socks maps a key to the sockets bound there: one, or a SO_REUSEPORT
	// group (a flow goes to one of them), or several receivers of one
	// multicast group and port (each gets a copy).
	socks  atomic.Pointer[map[sockKey][]*UDPConn]
	conns  map[*UDPConn]struct{}
	closed bool
	// rules counts the sockets that share each steering rule (a
	// SO_REUSEPORT group, the receivers of one multicast group): the rule
	// goes when the last of them does; ruleUse keeps the rule beside its
	// count, so that removing one is a lookup, not a walk of every rule
	// (65,536 connections' worth). Guarded by mu.
	rules   map[steer.Rule]steer.RuleID
	ruleUse map[steer.RuleID]ruleUse

	// copies holds the buffers of datagrams copied out of their frames
	// (copies.go); copyQ marks their rxItems. Guarded by rxMu.
	copies copyPool
	copyQ  *queue

	// kickTimer flushes the TX rings a send left unkicked when no
	// receive or wait does first (Options.TxKickDelay).
	kickTimer *time.Timer
	kickArmed atomic.Bool
	// coalescing lists the TCP connections with coalesced writes
	// (coalesce.go), which wait points and kickTimer flush;
	// coalesceGen counts the wait points that followed a TCP write
	// (tcpWrote), as waitGen counts those that followed a send.
	coalescing  coalescing
	coalesceGen atomic.Uint32
	tcpWrote    atomic.Bool
	waitGen     atomic.Uint32 // counts receives and waits that followed a send (waitPoint)
	sent        atomic.Bool   // a send since the last waitPoint

	// listeners are netstack's listeners, for the watcher's look at the
	// ports SO_REUSEPORT listeners share (guarded by mu).
	listeners map[*NetstackListener]struct{}

	// tcp is netstack, once a TCP socket made it (tcpStack, under tcpMu).
	tcp   atomic.Pointer[tcpState]
	tcpMu sync.Mutex
	// tcpConns are the TCP connections by 5-tuple (tcpKey), for what the
	// link sees before netstack does (finArriving).
	tcpConns sync.Map
	// inline names the connections whose segments a drain on an
	// application thread processes there (tcpinline.go): the one a
	// receive polls for, or an epoll set's (TCPPoller); inlineHeld are
	// those whose endpoints the drain holds. Under rxMu.
	inline     inliner
	inlineHeld []*TCPConn
	// tcpPollers counts the TCPPollers open on the stack.
	tcpPollers atomic.Int32
	// eventLoop is true while a TCPPoller polls: the acknowledgements
	// netstack makes meanwhile are held until the poller's thread comes
	// back to wait (tcpLink.hold).
	eventLoop atomic.Bool
	// tcpAppSends counts the application's sends inside netstack now: the
	// segments the link sends meanwhile are theirs (tcpLink.transmit).
	tcpAppSends atomic.Int32

	Counters    Counters
	TCPCounters TCPCounters
}

// ErrNotSupported is backend.ErrNotSupported: what the stack cannot serve
// (a VLAN or macvlan interface), or the kernel lacks.
var ErrNotSupported = backend.ErrNotSupported

// ErrClosed is returned on a closed stack; sockets return net.ErrClosed.
var ErrClosed = errors.New("stack closed")

// Open attaches a stack to ifname in the calling thread's network
// namespace (lock the OS thread when it differs from the process's).
func Open(ifname string, opts *Options) (_ *Stack, err error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	// From here on RxPoll is VMA's value (-1 forever, 0 never, else a
	// count) unless adaptive, and RxPollOSRatio 0 means "only before
	// sleeping".
	adaptive := o.RxPoll == 0
	if o.RxPoll == RxPollNever {
		o.RxPoll = 0
	}
	switch o.RxPollOSRatio {
	case 0:
		o.RxPollOSRatio = 100
	case OSPollBeforeSleep:
		o.RxPollOSRatio = 0
	}
	if o.RxPoll < RxPollForever || o.RxPollOSRatio < 0 {
		return nil, fmt.Errorf("stack %s: RxPoll %d, RxPollOSRatio %d: out of range", ifname, opts.RxPoll, opts.RxPollOSRatio)
	}
	if o.RxBytesLimit == 0 {
		o.RxBytesLimit = 1 << 20
	}
	if o.ResolveTimeout == 0 {
		o.ResolveTimeout = time.Second
	}
	if o.ProgressInterval == 0 {
		o.ProgressInterval = 10 * time.Millisecond
	}
	if o.ProgressMax <= 0 {
		o.ProgressMax = 2048
	}
	switch {
	case o.TxKickDelay == 0:
		o.TxKickDelay = DefaultTxKickDelay
	case o.TxKickDelay < 0:
		o.TxKickDelay = 0
	}
	if o.NewBackend == nil {
		xo := o.XSK
		o.NewBackend = func(ifname string, q int, rxOnly bool) (backend.Backend, error) {
			xq := xsk.Options{}
			if xo != nil {
				xq = *xo
			}
			xq.RxOnly = rxOnly
			return xsk.Open(ifname, q, &xq)
		}
	}
	st := &Stack{opts: o, ifname: ifname, ns: -1, ctlFD: -1, nlFD: -1, shareKick: -1, srcConf: sourceConf{rpFilter: [2]int{-1, -1}, acceptLocal: [2]int{-1, -1}}, sources: map[[4]byte]bool{}, conns: map[*UDPConn]struct{}{}, listeners: map[*NetstackListener]struct{}{}, queuedNow: make([]*UDPConn, 0, 16), adaptive: adaptive,
		rules: map[steer.Rule]steer.RuleID{}, ruleUse: map[steer.RuleID]ruleUse{}, copyQ: &queue{idx: -1}}
	st.kickTimer = time.AfterFunc(time.Hour, st.kickFired)
	st.kickTimer.Stop()
	st.rings.heir.Store(-1)
	defer func() {
		if err != nil {
			st.Close()
			err = fmt.Errorf("stack %s: %w", ifname, err)
		}
	}()
	if st.ns, err = netns.Get(); err != nil {
		return st, fmt.Errorf("network namespace: %w", err)
	}
	st.ns = netns.NsHandle(highfd.Move(int(st.ns)))
	var nsStat unix.Stat_t
	if err := unix.Fstat(int(st.ns), &nsStat); err != nil {
		return st, fmt.Errorf("network namespace: %w", err)
	}
	st.nsInode = uint32(nsStat.Ino)
	nl, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return st, fmt.Errorf("netlink: %w", err)
	}
	defer nl.Close()
	l, err := netnsutil.LinkByName(nl, ifname)
	if err != nil {
		return st, err
	}
	a := l.Attrs()
	switch l.Type() {
	case "vlan":
		// Its frames reach the stack's XDP program on the parent, where a
		// veth or NIC with VLAN offload has already taken the tag off:
		// the program could not tell them from the parent's own.
		return st, fmt.Errorf("%w: %s is a VLAN interface: vmaxdp serves untagged interfaces only, and leaves VLAN traffic to the kernel", ErrNotSupported, ifname)
	case "macvlan", "macvtap", "ipvlan", "ipvtap":
		// The kernel hands a unicast frame over from the parent's receive
		// path, where XDP ran, and no XDP program on this interface sees
		// it (a macvlan's steering program counted nothing, the kernel
		// delivering every datagram, though the sockets were said to be
		// offloaded).
		parent := parentName(nl, a.ParentIndex)
		return st, fmt.Errorf("%w: %s is a %s interface on %s, whose frames reach XDP on %s only: vmaxdp leaves its traffic to the kernel", ErrNotSupported, ifname, l.Type(), parent, parent)
	}
	st.ifindex = a.Index
	st.setMTU(a.MTU)
	if len(a.HardwareAddr) != 6 {
		return st, fmt.Errorf("not an Ethernet interface (hardware address %v)", a.HardwareAddr)
	}
	st.mac = header.MAC(a.HardwareAddr)
	if err := st.readAddr(nl, l); err != nil {
		return st, err
	}
	// One socket for the ethtool ioctls, now and in the watcher, kept at a
	// high fd: one opened per reading would take a low number from the
	// application now and then.
	ctl, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return st, fmt.Errorf("ethtool socket: %w", err)
	}
	st.ctlFD = highfd.Move(ctl)
	// And one netlink socket for the watcher's reads of the interface
	// and the next-hop lookups, for the same reason (rtnl.go).
	rt, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return st, fmt.Errorf("netlink socket: %w", err)
	}
	st.nlFD, st.nlBuf = highfd.Move(rt), make([]byte, 1<<16)
	if st.diag, err = openDiag(); err != nil {
		return st, err
	}
	st.partialCsum = virtualLink(st.ctlFD, ifname)
	if st.srcConf, err = openSourceConf(ifname); err != nil {
		// Not a reason to leave the interface to the kernel: its sources
		// go unchecked, as before the checks, and the log says so.
		slog.Warn(fmt.Sprintf("stack %s: sources are not checked as the kernel checks them: %v", ifname, err))
	}
	st.rpMode.Store(st.srcConf.rpMode())
	st.acceptLocal.Store(st.srcConf.acceptsLocal())
	st.sourcesSince = time.Now()
	var local []netip.Addr
	if err := st.dumpAddrs(func(_ int, a netip.Addr) { local = append(local, a) }); err != nil {
		return st, fmt.Errorf("namespace addresses: %w", err)
	}
	localAddrs := sortedAddrs(local)
	st.localAddrs.Store(&localAddrs)
	st.routesChanged(time.Now())
	ch, err := xsk.QueueChannels(st.ctlFD, ifname, a.NumRxQueues, a.NumTxQueues)
	if err != nil {
		return st, err
	}
	if len(o.Queues) > maxQueues {
		return st, fmt.Errorf("%d queues: at most %d", len(o.Queues), maxQueues)
	}
	so := steer.Options{}
	if o.Steer != nil {
		so = *o.Steer
	}
	if so.MaxFrameLen == 0 {
		so.MaxFrameLen = o.XSK.RxFrameLen()
	}
	st.txFrameLen, st.rxFrameLen = int(o.XSK.TxFrameLen()), int(so.MaxFrameLen)
	if o.Wanted != nil && !o.Wanted() {
		return st, ErrNotWanted
	}
	if st.prog, err = steer.Attach(ifname, &so); err != nil {
		return st, err
	}
	// Asked again: the program's load, just done, is most of an open, and
	// a process that began to exit meanwhile wants no AF_XDP sockets.
	if o.Wanted != nil && !o.Wanted() {
		return st, ErrNotWanted
	}
	queues := o.Queues
	if len(queues) == 0 {
		queues = firstQueues(ch.Rx)
	}
	if err := st.openQueues(queues, ch); err != nil {
		return st, err
	}
	empty := map[sockKey][]*UDPConn{}
	st.socks.Store(&empty)
	ls := linkState{up: a.Flags&net.FlagUp != 0, mtu: a.MTU, addr: st.Addr(), addrs: *st.addrs.Load(), rx: ch.Rx, local: localAddrs}
	if !ls.up {
		reason := fmt.Sprintf("interface %s is down", ifname)
		st.kernelOnly.Store(&reason)
	}
	if err := st.startWatch(ls); err != nil {
		return st, err
	}
	if o.ProgressInterval > 0 {
		stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			return st, fmt.Errorf("stack %s: progress engine: eventfd: %w", ifname, err)
		}
		st.progressStopFD = highfd.Move(stop)
		st.progressStop, st.progressDone = make(chan struct{}), make(chan struct{})
		go st.progress(o.ProgressInterval, o.ProgressMax)
	}
	return st, nil
}

// firstQueues lists the queues 0 to n-1, at most maxQueues.
func firstQueues(n int) []int {
	qs := make([]int, min(n, maxQueues))
	for i := range qs {
		qs[i] = i
	}
	return qs
}

// openQueues opens and registers the queues of qs not served yet. A queue
// that fails is kept in unserved with its error; the others are served.
// It fails only when no queue at all is served: with one or more, what
// arrives on the others still reaches the sockets through the kernel.
func (st *Stack) openQueues(qs []int, ch xsk.Channels) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	old := st.queueList()
	served := map[int]bool{}
	for _, q := range old {
		served[q.idx] = true
	}
	next := slices.Clone(old)
	st.unserved = st.unserved[:0]
	for _, qi := range qs {
		if served[qi] {
			continue
		}
		if qi >= ch.Rx {
			st.unserved = append(st.unserved, QueueError{qi, fmt.Errorf("the interface runs %d RX queues (ethtool -l %s)", ch.Rx, st.ifname)})
			continue
		}
		rxOnly := qi >= ch.Tx
		be, err := st.opts.NewBackend(st.ifname, qi, rxOnly)
		if err != nil {
			st.unserved = append(st.unserved, QueueError{qi, err})
			continue
		}
		if err := st.prog.RegisterQueue(qi, be.FD()); err != nil {
			be.Close()
			st.unserved = append(st.unserved, QueueError{qi, err})
			continue
		}
		q := &queue{idx: qi, be: be, canTx: !rxOnly, sendGen: math.MaxUint32, rel: make([]backend.Buf, 0, 2*rxBatch)}
		q.arrivals, _ = be.(backend.ArrivalStamper)
		if st.opts.OnQueue != nil {
			q.release = st.opts.OnQueue(fmt.Sprintf("%s/q%d", st.ifname, qi), be.FD())
		}
		next = append(next, q)
	}
	if len(next) == 0 {
		errs := make([]error, len(st.unserved))
		for i, u := range st.unserved {
			errs[i] = u
		}
		return fmt.Errorf("no queue could be served: %w", errors.Join(errs...))
	}
	if !slices.ContainsFunc(next, func(q *queue) bool { return q.canTx }) {
		return fmt.Errorf("no queue can transmit (the interface runs %d TX queues)", ch.Tx)
	}
	st.queues.Store(&next)
	return nil
}

// pickTxQueue is the queue a new socket transmits on. Each socket
// transmits on one queue, so its datagrams stay in order; sockets take the
// queues that can transmit in turn, so that threads sending on different
// sockets do not all wait on one queue's lock.
func (st *Stack) pickTxQueue() *queue {
	var txqs [maxQueues]*queue
	n := 0
	for _, q := range st.queueList() {
		if q.canTx {
			txqs[n] = q
			n++
		}
	}
	return txqs[int(st.nextTxq.Add(1)-1)%n]
}

// pollQueues is the queues a sleeper polls: none once the interface is
// gone (their sockets would poll in error for ever).
func (st *Stack) pollQueues() []*queue {
	if st.gone.Load() {
		return nil
	}
	return st.queueList()
}

// KernelOnly says why the stack sends nothing itself ("" when it does):
// the interface is down, or was deleted, and the kernel sockets serve.
func (st *Stack) KernelOnly() string {
	if r := st.kernelOnly.Load(); r != nil {
		return *r
	}
	return ""
}

// queueList is the queues served now.
func (st *Stack) queueList() []*queue {
	if qs := st.queues.Load(); qs != nil {
		return *qs
	}
	return nil
}

// UnservedQueues lists the queues of the interface the stack does not
// serve, and why (see QueueError).
func (st *Stack) UnservedQueues() []QueueError {
	st.mu.Lock()
	defer st.mu.Unlock()
	return slices.Clone(st.unserved)
}

func (st *Stack) setMTU(mtu int) {
	if st.opts.MTU > 0 && st.opts.MTU < mtu {
		mtu = st.opts.MTU
	}
	st.mtu.Store(int32(mtu))
}

// readAddr reads the interface's IPv4 addresses.
func (st *Stack) readAddr(nl *netlink.Handle, l netlink.Link) error {
	addrs, err := ipv4Addrs(nl, l)
	if err != nil || len(addrs) == 0 {
		return fmt.Errorf("no IPv4 address: %w", errors.Join(err, errors.New("add one")))
	}
	st.addr.Store(&addrs[0])
	st.addrs.Store(&addrs)
	return nil
}

func ipv4Addrs(nl *netlink.Handle, l netlink.Link) ([]netip.Addr, error) {
	list, err := nl.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return nil, err
	}
	addrs := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if x, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			addrs = append(addrs, x)
		}
	}
	return addrs, nil
}

// IPv4Interfaces names the interfaces of the calling thread's network
// namespace a stack could serve: up, not loopback, with an IPv4 address.
func IPv4Interfaces() ([]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("interfaces: %w", err)
	}
	var names []string
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 || a.Flags&net.FlagUp == 0 {
			continue
		}
		if addrs, err := netlink.AddrList(l, netlink.FAMILY_V4); err == nil && len(addrs) > 0 {
			names = append(names, a.Name)
		}
	}
	return names, nil
}

// DefaultRouteInterface names the interface the calling thread's
// namespace's IPv4 default route leaves by (of the main table, the lowest
// metric's), "" when it has none.
func DefaultRouteInterface() (string, error) {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return "", fmt.Errorf("routes: %w", err)
	}
	best := -1
	for i, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		if r.LinkIndex > 0 && (best < 0 || r.Priority < routes[best].Priority) {
			best = i
		}
	}
	if best < 0 {
		return "", nil
	}
	l, err := netlink.LinkByIndex(routes[best].LinkIndex)
	if err != nil {
		return "", fmt.Errorf("the default route's interface: %w", err)
	}
	return l.Attrs().Name, nil
}

// HasAddr says whether a is one of the interface's IPv4 addresses.
func (st *Stack) HasAddr(a netip.Addr) bool {
	if p := st.addrs.Load(); p != nil {
		return slices.Contains(*p, a)
	}
	return false
}

// progress is the progress engine (Options.ProgressInterval). It costs
// the receive path one increment under the lock it holds anyway, and
// stays away while a receive holds the lock or has polled since its last
// look, unless the queues' frames run low.
//
// A look that finds nobody polled for a whole interval, and no sleeper
// watching the queues (ringWatch), makes it the queues' watcher: it
// sleeps on their descriptors and drains each burst as it comes, until a
// receive polls again or a sleeper takes them. A reader that is neither
// receiving nor asleep in a receive (a Python loop in time.sleep) left a
// burst on the RX ring for up to an interval: 2,048 frames fill in 10 ms
// at 200,000 datagrams a second, the fill ring ran dry and the queue
// dropped for every socket on it, where the kernel would have queued them
// (a burst of 10,000 to a sleeping reader lost 0 to 584, 8 runs).
//
// A reader that polls, but with gaps in which bursts pile up on the RX
// ring (syslog-ng busy with its workers behind loggen's bursts: 529 to
// 1,527 of 20,000 dropped at the ring, 3 runs), is behind: a look finds
// more than an eighth of a queue's frames waiting. Then the engine looks
// ten times as often, so that a gap of a tenth of the interval lets it
// drain, until it has found none behind for ten intervals.
func (st *Stack) progress(every time.Duration, most int) {
	defer close(st.progressDone)
	var seen uint64
	watching := false
	var fastUntil int64 // monoNow's until which it looks every/10
	t := time.NewTimer(every)
	defer t.Stop()
	pfds := make([]unix.PollFd, 0, maxQueues+1)
	for {
		wait := every
		if monoNow() < fastUntil {
			wait = every / 10
		}
		if !st.progressWait(watching, wait, t, pfds) {
			return
		}
		n, idle, behind := 0, false, false
		if st.rxMu.TryLock() { // else a receive is polling
			idle = st.polls == seen
			behind = !idle && slices.ContainsFunc(st.queueList(), st.behindLocked)
			if idle || st.anyFramesLowLocked() {
				for n < most {
					k := st.pollLocked()
					if k == 0 {
						break
					}
					n += k
					st.Counters.RxProgressFrames.Add(uint64(k))
				}
			}
			seen = st.polls
			st.rxMu.Unlock()
		}
		watching = idle && !st.rings.held.Load()
		if behind || n > 0 && !watching {
			fastUntil = monoNow() + 10*int64(every)
		}
	}
}

// progressWait waits for the progress engine's next look, at most wait,
// and says false when the stack closes. Watching, it sleeps in ppoll on
// the queues; else on Go's timer t: asleep in ppoll at every look, it
// made sockperf's ping-pong under vmaxdp slower, 3.47-5.08 us against
// 2.85-3.34 (both sides under vmaxdp, the client --nonblocked, 6
// interleaved rounds).
func (st *Stack) progressWait(watching bool, wait time.Duration, t *time.Timer, pfds []unix.PollFd) bool {
	if !watching {
		t.Reset(wait)
		select {
		case <-st.progressStop:
			return false
		case <-t.C:
			return true
		}
	}
	pfds = append(pfds[:0], unix.PollFd{Fd: int32(st.progressStopFD), Events: unix.POLLIN})
	pfds = st.AppendQueues(pfds)
	ts := unix.NsecToTimespec(int64(wait))
	if _, err := unix.Ppoll(pfds, &ts, nil); err != nil && err != unix.EINTR {
		slog.Warn("stack: progress engine stops", "interface", st.ifname, "err", err)
		return false
	}
	return pfds[0].Revents == 0
}

// Ifindex is the index of the stack's interface.
func (st *Stack) Ifindex() int { return st.ifindex }

// Interface names the stack's interface.
func (st *Stack) Interface() string { return st.ifname }

// NetnsInode is the inode number of the interface's network namespace,
// which names it in nettrace recordings and `ip netns identify`.
func (st *Stack) NetnsInode() uint32 { return st.nsInode }

// Addr is the interface's first IPv4 address.
func (st *Stack) Addr() netip.Addr { return *st.addr.Load() }

// Program is the steering program, for its counters.
func (st *Stack) Program() *steer.Program { return st.prog }

// Exiting readies the stack for the end of its process without Close
// (steer.Program.Exiting).
func (st *Stack) Exiting() {
	st.mu.Lock()
	prog := st.prog
	st.mu.Unlock()
	if prog != nil {
		prog.Exiting()
	}
}

// Backends lists the queues' backends, for their counters.
func (st *Stack) Backends() []backend.Backend {
	qs := st.queueList()
	out := make([]backend.Backend, len(qs))
	for i, q := range qs {
		out[i] = q.be
	}
	return out
}

// Poll drains the queues' RX rings into the sockets' queues and returns
// how many frames it saw; for an application thread (notePoll). Its wait
// point's kicks come before the receive lock: a kick runs the device's
// transmit, for a veth the peer's receive, and other threads' receives
// waited for it (knot's two workers: most of the lock's hand-offs, see
// spinLock).
func (st *Stack) Poll() int {
	st.waitPoint()
	spinLock(&st.rxMu)
	defer st.rxMu.Unlock()
	st.notePoll()
	return st.drainRings()
}

// muxSleeper is a multiplexer asleep on the stack (BeginWait).
type muxSleeper struct {
	fd      int32      // its eventfd
	conns   []*UDPConn // the sockets it waits for (of any stack)
	watcher bool       // takeRingsLocked's answer
	must    bool       // asleep on the queues for its TCP connections
}

// BeginWait announces a multiplexer about to sleep for conns (those of
// other stacks are passed over) and appends what it must sleep on: an
// eventfd that the stack writes when it queues a datagram for one of
// conns meanwhile, and the queues' fds if it watches them (ringWatch) or
// must (a thread asleep on them for its TCP connections, sleepOnRings).
// The caller looks at its sockets once more after BeginWait, sleeps, and
// calls EndWait.
func (st *Stack) BeginWait(pfds []unix.PollFd, conns []*UDPConn, must bool) ([]unix.PollFd, error) {
	st.muxMu.Lock()
	defer st.muxMu.Unlock()
	var fd int32
	if n := len(st.muxFree); n > 0 {
		fd, st.muxFree = st.muxFree[n-1], st.muxFree[:n-1]
	} else {
		e, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
		if err != nil {
			return pfds, fmt.Errorf("stack %s: eventfd: %w", st.ifname, err)
		}
		fd = int32(highfd.Move(e))
	}
	for _, c := range conns {
		if c.st == st {
			c.muxFDs = append(c.muxFDs, fd)
			c.muxSleepers.Add(1)
		}
	}
	watcher := st.takeRingsLocked(fd, must)
	st.muxSleeping = append(st.muxSleeping, muxSleeper{fd: fd, conns: conns, watcher: watcher, must: must})
	st.muxWaiters.Add(1)
	if watcher || must {
		pfds = st.AppendQueues(pfds)
	}
	return append(pfds, unix.PollFd{Fd: fd, Events: unix.POLLIN}), nil
}

// EndWait ends a BeginWait; pfds are what the multiplexer slept on, with
// their revents. Its eventfd is read only when it woke the sleep: a read
// of one that did not costs a system call per sleep.
func (st *Stack) EndWait(pfds []unix.PollFd) {
	if st.endWait(pfds) {
		st.Poll()
	}
}

// endWait is EndWait but for its poll, which it says is owed to the
// sleepers off the queues (leaveRingsLocked).
func (st *Stack) endWait(pfds []unix.PollFd) (pollForOthers bool) {
	st.muxMu.Lock()
	defer st.muxMu.Unlock()
	for _, p := range pfds {
		i := slices.IndexFunc(st.muxSleeping, func(m muxSleeper) bool { return m.fd == p.Fd })
		if i < 0 {
			continue
		}
		m := st.muxSleeping[i]
		st.muxSleeping = slices.Delete(st.muxSleeping, i, i+1)
		st.muxWaiters.Add(-1)
		for _, c := range m.conns {
			if c.st != st {
				continue
			}
			if j := slices.Index(c.muxFDs, m.fd); j >= 0 {
				c.muxFDs = slices.Delete(c.muxFDs, j, j+1)
				c.muxSleepers.Add(-1)
			}
		}
		others := st.leaveRingsLocked(m.fd, m.watcher, m.must)
		if p.Revents&unix.POLLIN != 0 {
			var v [8]byte
			unix.Read(int(p.Fd), v[:])
		}
		st.muxFree = append(st.muxFree, p.Fd)
		return others && st.queuesReady(pfds)
	}
	return false
}

// queuesReady says whether pfds, after a ppoll, have one of the stack's
// queues readable.
func (st *Stack) queuesReady(pfds []unix.PollFd) bool {
	for _, q := range st.pollQueues() {
		for _, p := range pfds {
			if p.Fd == int32(q.be.FD()) && p.Revents&unix.POLLIN != 0 {
				return true
			}
		}
	}
	return false
}

// WakeWaiters wakes the multiplexers asleep on the stack's sockets, for
// what they wait for that the stack did not queue (the engine's transmit
// stamps: POLLERR).
func (st *Stack) WakeWaiters() {
	if st.muxWaiters.Load() > 0 {
		st.wakeMux()
	}
}

// wakeMux wakes every sleeping multiplexer.
func (st *Stack) wakeMux() {
	st.muxMu.Lock()
	for _, m := range st.muxSleeping {
		writeEventfd(m.fd)
	}
	st.muxMu.Unlock()
}

// pollLocked drains every queue's RX ring into socket queues and returns
// how many frames it saw; a poll of the application's, it is a wait point
// (kick.go), whose kick runs under rxMu here. Stack.Poll makes its wait
// point before the lock, where the hand-offs were (knot's two workers);
// a receive that polls an empty queue (tryOffload, sleep) made one
// already at its start (recvZC), so theirs rarely kicks: 25 hand-offs a
// second of tryOffload's in the same run. FIONREAD's (Pending) and the
// progress engine's and TCP's inline polls are left as they were.
// Caller holds rxMu.
func (st *Stack) pollLocked() int {
	st.waitPoint()
	return st.drainRings()
}

// drainLocked is pollLocked for the stack's own goroutines (netstack's
// drains), which are not the application waiting: the application's next
// send still counts as following its last, and what sends left goes only
// once it waited half the delay (kick.go: flushAged), so that a stream's
// sender keeps sharing kicks while the acks a receiver deferred still
// leave with the next segments that come in. Caller holds rxMu.
func (st *Stack) drainLocked() int {
	st.flushAged(st.opts.TxKickDelay / 2)
	return st.drainRings()
}

// drainRings drains every queue's RX ring into socket queues and returns
// how many frames it saw. Caller holds rxMu.
func (st *Stack) drainRings() int {
	st.polls++
	if st.gone.Load() {
		return 0
	}
	total := 0
	for _, q := range st.queueList() {
		st.flushLocked(q)
		n := q.be.Receive(q.rx[:])
		if n == 0 {
			continue
		}
		for {
			total += n
			q.lent += n
			st.Counters.RxFrames.Add(uint64(n))
			socks := *st.socks.Load()
			for i := 0; i < n; i++ {
				st.demuxLocked(q, socks, q.rx[i])
			}
			st.flushLocked(q)
			if n < rxBatch || !st.framesLowLocked(q) {
				break
			}
			n = q.be.Receive(q.rx[:])
		}
	}
	st.flushTCP()
	if len(st.queuedNow) > 0 {
		st.wakeQueued()
	}
	return total
}

// wakeQueued wakes the sleepers on the sockets the poll queued datagrams
// for, once each: a SO_REUSEPORT group's threads share the stack's queues,
// and whichever polls hands the others their datagrams, a wakeup (an
// eventfd write) per socket and batch instead of per datagram, and a
// multiplexer's once however many of its sockets got some. Only their
// own sleepers wake (ringWatch), and the first woken is the queues' heir.
// Waiters are looked at after the datagrams are queued, so that none
// arrives unseen (see UDPConn.sleep). Caller holds rxMu.
func (st *Stack) wakeQueued() {
	mux := false
	for _, c := range st.queuedNow {
		c.queuedNow = false
		if c.waiters.Load() > 0 {
			c.wake()
			st.inherit(int32(c.evfd))
		}
		mux = mux || c.muxSleepers.Load() > 0
	}
	if mux {
		st.muxMu.Lock()
		woke := st.muxWoke[:0]
		for _, c := range st.queuedNow {
			for _, fd := range c.muxFDs {
				if !slices.Contains(woke, fd) {
					writeEventfd(fd)
					woke = append(woke, fd)
				}
			}
		}
		if len(woke) > 0 {
			st.inherit(woke[0])
		}
		st.muxWoke = woke
		st.muxMu.Unlock()
	}
	clear(st.queuedNow)
	st.queuedNow = st.queuedNow[:0]
}

func (st *Stack) flushLocked(q *queue) {
	if len(q.rel) > 0 {
		q.be.Release(q.rel)
		q.lent -= len(q.rel)
		q.rel = q.rel[:0]
	}
}

// releaseLocked returns a frame to its queue, in batches (a copy, to the
// copies' free list).
func (st *Stack) releaseLocked(q *queue, b backend.Buf) {
	if q == st.copyQ {
		st.copies.put(b.Data)
		return
	}
	q.rel = append(q.rel, b)
	if len(q.rel) >= rxBatch {
		st.flushLocked(q)
	}
}

func (st *Stack) demuxLocked(q *queue, socks map[sockKey][]*UDPConn, b backend.Buf) {
	var p header.Packet
	switch r := header.ParseOn(b.Data, &p, st.partialCsum); {
	case r == header.NotUDP && p.IP.Protocol() == header.ProtocolTCP:
		if st.sourceOKLocked(p.IP) {
			st.deliverTCP(p.IP)
		}
		st.releaseLocked(q, b)
		return
	case !st.checked(r):
		st.releaseLocked(q, b)
		return
	}
	if !st.sourceOKLocked(p.IP) {
		st.releaseLocked(q, b)
		return
	}
	k := sockKey{laddr: [4]byte(p.IP[16:20]), raddr: [4]byte(p.IP[12:16]), lport: p.UDP.DstPort(), rport: p.UDP.SrcPort()}
	cs := socks[k]
	if len(cs) == 0 {
		k.raddr, k.rport = [4]byte{}, 0
		if cs = socks[k]; len(cs) == 0 {
			k.laddr = [4]byte{}
			cs = socks[k]
		}
	}
	switch {
	case len(cs) == 0:
		st.Counters.RxNoSocket.Add(1)
		st.releaseLocked(q, b)
	case len(cs) == 1:
		st.deliverLocked(cs[0], q, b, &p)
	case k.laddr[0]>>4 == 0xe:
		// Receivers of one multicast group: each gets its copy, as from
		// the kernel; the last gets the frame itself.
		for _, c := range cs[:len(cs)-1] {
			st.enqueueCopyLocked(c, q, b, &p)
		}
		st.deliverLocked(cs[len(cs)-1], q, b, &p)
	default:
		// A SO_REUSEPORT group: one socket per flow, by a hash of the
		// source, as the kernel spreads a group (its hash is seeded at
		// boot, so the choice is not the kernel's, but a flow keeps its
		// socket while the group stays the same).
		st.deliverLocked(cs[flowIndex(&p, len(cs))], q, b, &p)
	}
}

// checked says whether a packet the parser found r of is delivered, and
// counts why when it is not. A partial checksum is what the kernel on the
// other end of a veth left for the link to finish: the kernel here would
// deliver it (it trusts CHECKSUM_PARTIAL), so the stack does too, and
// counts it; from a wire it is a bad checksum.
func (st *Stack) checked(r header.Result) bool {
	switch {
	case r == header.Ok:
		return true
	case (r == header.PartialUDPChecksum || r == header.PartialTCPChecksum) && st.partialCsum:
		st.Counters.RxPartialChecksum.Add(1)
		return true
	case r == header.PartialUDPChecksum:
		r = header.BadUDPChecksum
	case r == header.PartialTCPChecksum:
		r = header.BadTCPChecksum
	}
	st.Counters.RxDropped[r].Add(1)
	return false
}

// flowIndex picks one of n sockets for p's flow.
func flowIndex(p *header.Packet, n int) int {
	h := uint32(p.IP[12])<<24 | uint32(p.IP[13])<<16 | uint32(p.IP[14])<<8 | uint32(p.IP[15])
	h ^= uint32(p.UDP.SrcPort()) * 0x9e3779b1
	h *= 0x85ebca6b
	h ^= h >> 13
	return int(uint64(h) * uint64(n) >> 32)
}

// ruleUse is a steering rule and the number of sockets that use it.
type ruleUse struct {
	rule  steer.Rule
	users int
}

// addRule installs r, or counts one more user of it when another socket
// installed it already (a SO_REUSEPORT group, receivers of one group).
func (st *Stack) addRule(r steer.Rule) (steer.RuleID, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if id, ok := st.rules[r]; ok {
		u := st.ruleUse[id]
		u.users++
		st.ruleUse[id] = u
		return id, nil
	}
	id, err := st.prog.AddRule(r)
	if err != nil {
		return 0, err
	}
	st.rules[r], st.ruleUse[id] = id, ruleUse{rule: r, users: 1}
	return id, nil
}

// removeRule counts one user less of a rule, and removes it with the last.
func (st *Stack) removeRule(id steer.RuleID) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	u, ok := st.ruleUse[id]
	if u.users--; u.users > 0 {
		st.ruleUse[id] = u
		return nil
	}
	delete(st.ruleUse, id)
	if ok {
		delete(st.rules, u.rule)
	}
	if st.prog == nil {
		return nil // the stack closed: its program went with every rule
	}
	return st.prog.RemoveRule(id)
}

func (st *Stack) addSocket(c *UDPConn, keys ...sockKey) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed {
		return ErrClosed
	}
	old := *st.socks.Load()
	for _, k := range keys {
		for _, o := range old[k] {
			// The kernel let both sockets bind: receivers of a multicast
			// group, or a SO_REUSEPORT group; anything else is a clash.
			if o != c && k.laddr[0]>>4 != 0xe && !(c.reusePort && o.reusePort) {
				return fmt.Errorf("%s: %w", c.local, unix.EADDRINUSE)
			}
		}
	}
	m := maps.Clone(old)
	for _, k := range keys {
		if !slices.Contains(m[k], c) {
			m[k] = append(slices.Clone(m[k]), c)
		}
	}
	st.socks.Store(&m)
	st.conns[c] = struct{}{}
	return nil
}

func (st *Stack) removeSocket(c *UDPConn, keys ...sockKey) {
	st.mu.Lock()
	defer st.mu.Unlock()
	m := maps.Clone(*st.socks.Load())
	for _, k := range keys {
		cs := slices.DeleteFunc(slices.Clone(m[k]), func(o *UDPConn) bool { return o == c })
		if len(cs) == 0 {
			delete(m, k)
		} else {
			m[k] = cs
		}
	}
	st.socks.Store(&m)
}

// Group lists the sockets that share c's address and port (a SO_REUSEPORT
// group, in the order they joined), c included; nil when c is alone.
func (st *Stack) Group(c *UDPConn) []*UDPConn {
	if len(c.keys) == 0 {
		return nil
	}
	cs := (*st.socks.Load())[c.keys[0]]
	if len(cs) < 2 {
		return nil
	}
	return slices.Clone(cs)
}

// Close closes every socket (waiting for the calls in them to leave),
// detaches the steering program and closes the queues. It must not run
// concurrently with Backends, BeginWait or EndWait.
func (st *Stack) Close() error {
	st.mu.Lock()
	st.closed = true
	conns := make([]*UDPConn, 0, len(st.conns))
	for c := range st.conns {
		conns = append(conns, c)
	}
	st.mu.Unlock()
	var errs []error
	st.stopWatch()
	if st.progressDone != nil {
		close(st.progressStop)
		writeEventfd(int32(st.progressStopFD))
		<-st.progressDone
		highfd.Close(st.progressStopFD)
		st.progressDone = nil
	}
	for _, c := range conns {
		c.Close()
	}
	st.closeTCP()
	st.kickTimer.Stop()
	st.flushTx(true)
	// Under mu: a socket's Close on another goroutine may be removing
	// its rule (removeRule).
	st.mu.Lock()
	prog := st.prog
	st.prog = nil
	st.mu.Unlock()
	if prog != nil {
		for _, q := range st.queueList() {
			prog.UnregisterQueue(q.idx)
		}
		errs = append(errs, prog.Close())
	}
	// Receives that find their socket's queue empty poll the rings under
	// rxMu without entering the socket (a spinning reader's fast path pays
	// no reference count), so the rings are closed under rxMu too.
	st.rxMu.Lock()
	for _, q := range st.queueList() {
		// Under txMu and the kick latch too: kickTimer's flush, or a sender's
		// kick, may be running.
		q.txMu.Lock()
		q.kicks.mu.Lock()
		q.closed = true
		if q.release != nil {
			q.release()
		}
		errs = append(errs, q.be.Close())
		q.kicks.mu.Unlock()
		q.txMu.Unlock()
	}
	st.queues.Store(nil)
	st.rxMu.Unlock()
	st.stopRefreshes()
	st.muxMu.Lock()
	for _, fd := range st.muxFree {
		highfd.Close(int(fd))
	}
	for _, m := range st.muxSleeping {
		highfd.Close(int(m.fd))
	}
	if st.rings.timer != nil {
		st.rings.timer.Stop()
	}
	st.rings.off = nil
	st.muxFree, st.muxSleeping = nil, nil
	st.muxMu.Unlock()
	if st.ns >= 0 {
		highfd.Close(int(st.ns))
		st.ns = -1
	}
	if st.ctlFD >= 0 {
		highfd.Close(st.ctlFD)
		st.ctlFD = -1
	}
	st.srcConf.close()
	st.nlMu.Lock() // a late query must not write to a number reused since
	if st.nlFD >= 0 {
		highfd.Close(st.nlFD)
		st.nlFD = -1
	}
	st.nlMu.Unlock()
	st.diag.close()
	st.diag = nil
	return errors.Join(errs...)
}

// parentName names the interface of index i, for a message.
func parentName(nl *netlink.Handle, i int) string {
	if l, err := nl.LinkByIndex(i); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprintf("the interface of index %d", i)
}
