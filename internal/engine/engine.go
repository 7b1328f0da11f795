// Package engine is the offload engine that `vmaxdp run` loads into an
// application: it keeps the application's UDP sockets, decides at bind,
// connect, multicast join or first send whether vmaxdp serves each one
// (the rules file, VMAXDP_OFFLOADED_SOCKETS, the interface), adopts those
// it serves into a stack (package stack) and answers the socket calls the
// preload library hands it, fd by fd. With VMAXDP_TCP=1 it offloads TCP
// listeners and connections as well, on netstack (tcp.go).
//
// Every socket is a real kernel socket first and its fd number is the
// application's; offload adds the fast path beside it and falling back is
// one way and always possible. A socket that is not offloaded keeps the
// reason, for the log and the stats tool.
//
// What this package must not do: call libc (the preload library wraps
// libc's socket calls, so the engine uses raw system calls only), or block
// a call of a socket it does not serve.
package engine

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/internal/peernotify"
	"github.com/vmaxdp/vmaxdp/internal/rules"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/verbs"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// MaxFD bounds the fds the engine can serve; a socket on a higher fd stays
// on the kernel, with that reason.
const MaxFD = 1 << 16

// use notes that fd is about to be stored in one of the engine's per-fd
// arrays, before it is, so that a sweep that sees the entry sees fd in
// fdsInUse.
func (e *Engine) use(fd int) {
	for {
		n := e.fdEnd.Load()
		if int32(fd) < n || e.fdEnd.CompareAndSwap(n, int32(fd)+1) {
			return
		}
	}
}

// fdsInUse bounds the sweeps over the per-fd arrays: no fd at or above
// it was ever stored in them.
func (e *Engine) fdsInUse() int { return int(e.fdEnd.Load()) }

// State is what the preload library knows about an fd.
type State int32

const (
	// StateOS: the kernel serves the fd; the engine is never asked again.
	StateOS State = iota
	// StateCandidate: a UDP socket not yet decided.
	StateCandidate
	// StateOffloaded: the engine serves the fd's data calls.
	StateOffloaded
	// StateEpoll: an epoll fd some of whose members are engine sockets.
	StateEpoll
	// StateKernel: a socket the engine decided not to serve; the kernel
	// serves its calls, the engine keeps its reason until close.
	StateKernel
	// StateTCP: a TCP connection netstack serves; the engine serves its
	// data calls, the kernel its multiplexing (see tcp.go).
	StateTCP
)

// ErrPassOS is returned (as an errno the kernel never uses) when the
// preload library must make the call itself, on the kernel.
const ErrPassOS = unix.Errno(4095)

// Version is printed in the start-up banner; set by the linker.
var Version = "dev"

// Options configure an Engine.
type Options struct {
	Params  *params.Params // default: from the environment
	Program string         // the application's path (default: os.Args[0])
	Stderr  io.Writer      // default: os.Stderr
	// OnState is told each decision the engine takes on its own (the first
	// send, a fall-back), so that the caller's fd table follows.
	OnState func(fd int, s State)
	// Owed counts the TCP connections whose mirrors epoll sets owe a mark
	// (owed.go), for a caller that asks the kernel about them to call
	// PayOwed first while it is not 0. Default: the engine's own.
	Owed *atomic.Int32
	// Helper is the vmaxdp executable, which Spawn starts as the helper
	// that outlives the process (package peernotify) once a stack opens;
	// without both, a process that dies without closing its sockets
	// (SIGKILL, a crash) loses what its last sends left on the TX rings,
	// and the peers of its offloaded TCP connections are not told.
	Helper string
	Spawn  peernotify.SpawnFunc
}

// Engine serves one process's offloaded sockets.
type Engine struct {
	p       *params.Params
	rules   *rules.Config
	program string
	onState func(fd int, s State)
	owed    *atomic.Int32        // Options.Owed
	peers   *peernotify.Notifier // nil: VMAXDP_PEER_NOTIFY off
	// peersSaid: the helper's failure was logged.
	peersSaid atomic.Bool
	announced atomic.Bool // the banner was written (Announce)
	Log       *Log

	mu       sync.Mutex // stacks, stackErr, epolls, Socket.fds
	stacks   map[string]*stack.Stack
	stackErr map[string]error
	epolls   map[int]*epollSet
	// sets holds epolls by fd too, for the multiplexers' lock-free look
	// at an fd that may be an epoll fd (poll on one, one nested in
	// another).
	sets fdTable[epollSet]
	fds  fdTable[Socket]
	// The TCP sockets by fd (tcp.go): offloaded listeners and
	// connections; tcpWanting counts the listens waiting for a stack to
	// open, by interface (guarded by mu).
	listeners fdTable[tcpListener]
	conns     fdTable[tcpConn]
	// fdEnd is one past the highest fd ever stored in sets, fds,
	// listeners or conns (use): the sweeps over them stop there
	// (fdsInUse). Each table spans MaxFD fds, and a sweep of all of them
	// at exit wrote every page of them: 22 ms more for each program a
	// shell under vmaxdp ran, /bin/true's too, where 2 ms is the Go
	// runtime's own start.
	fdEnd atomic.Int32
	// streams are notes on stream sockets the kernel serves, by fd
	// (kernelStream): the option a listener chooses its group's member
	// by, and why one is not offloaded.
	streamMu   sync.Mutex
	streams    map[int]kernelStream
	tcpWanting map[string]int
	fork       forkState // the sockets kept offloaded across fork (fork.go)
	scratch    sync.Pool // []byte of 64 KiB, for gathers and scatters
	mux        [numMux]muxCounters
	muxSpin    [numMux]stack.Spin // how long select and poll waits poll (VMAXDP_SELECT_POLL auto)
	pub        *publisher
	causes     sync.Map                  // why sockets stayed on the kernel, each logged once at INFO
	opening    map[string][]pendingAdopt // stacks opening, and the sockets waiting for them (guarded by mu)
	opened     map[string]chan struct{}  // closed when a stack opening is done (guarded by mu)
	opens      sync.WaitGroup            // openStack goroutines
	// exiting: Shutdown has begun, and a stack that opens from now on is
	// closed, never pinned (guarded by mu). Its program would otherwise
	// stay attached after the process, a short-lived client's above all,
	// which often ends before its stack has opened.
	exiting bool
	ifaces  ifaceCache // pickInterface's answers
	// wildcardSaid: the interface wildcardInterface chose by the default
	// route was logged.
	wildcardSaid atomic.Bool
	cgroup       cgroupCheck // the cgroup's programs that rewrite UDP addresses (cgroup.go)
	// setuid is the call that gave up root (setuid.go), nil while the
	// process has not; chroot: the process chrooted; preparing: confine
	// is opening stacks no socket waits for.
	setuid    atomic.Pointer[setuidNote]
	chroot    atomic.Bool
	preparing atomic.Bool
	// rings watches for an io_uring instance in the process (iouring.go).
	rings ringWatch
}

// Socket is one application UDP socket.
type Socket struct {
	fd       int
	v6       bool // an AF_INET6 socket: its IPv4 traffic is served, IPv4-mapped
	conn     atomic.Pointer[stack.UDPConn]
	nonblock atomic.Bool
	rcvtimeo atomic.Int64 // nanoseconds, 0: none
	osReady  atomic.Bool  // a multiplexer saw the kernel socket readable
	// multiplexed: the process waited for it in poll, select or epoll
	// (keepAtFork).
	multiplexed atomic.Bool
	// draining: shared with a forked child, no longer steered; its queued
	// datagrams are still served, and the kernel serves it once they are.
	draining atomic.Bool
	cmsg     atomic.Uint32 // the ancillary data its receives report (Cmsg)
	// tx is its software transmit stamps' error queue, nil: none asked
	// (errqueue.go).
	tx atomic.Pointer[txStamps]
	// selectErr: SO_SELECT_ERR_QUEUE, a stamp waiting in tx polls
	// POLLPRI too (select's exceptfds).
	selectErr atomic.Bool
	// tsflags are the flags SO_TIMESTAMPING last set (tsNew: as
	// SO_TIMESTAMPING_NEW), which a stamp a send's own ancillary data asks
	// for is reported by.
	tsflags atomic.Uint32
	tsNew   atomic.Bool
	// ioctlStamp: SIOCGSTAMP was asked, which turns stamps on as the
	// kernel's sock_gettstamp does; lastStamp is what it reads: 0, no
	// datagram read yet (ENOENT); -1, one read unstamped (the time of
	// the call, kept); else the last one's arrival, unix nanoseconds.
	ioctlStamp atomic.Bool
	lastStamp  atomic.Int64
	// The kernel socket sends for it, as the kernel would: cork, UDP_CORK
	// is on; corked, a MSG_MORE send left the start of a datagram in the
	// kernel socket's cork, which the next send ends; shutWr, shutdown
	// ended its sending (EPIPE).
	cork, corked, shutWr atomic.Bool
	// drainCause is why a draining socket goes back to the kernel.
	drainCause string
	// inode names its kernel socket in sock_diag's answers (see
	// stack.Options.Ours); kernel: it is served by the kernel, or is going
	// back to it.
	inode  uint64
	kernel atomic.Bool
	// osRxPackets and osRxBytes count what a candidate received from its
	// kernel socket; adopt adds them to its offloaded socket's Rx OS
	// counters, so that nothing it received goes uncounted.
	osRxPackets, osRxBytes atomic.Uint64
	// osTxPackets and osTxBytes count what a candidate's kernel socket
	// sent while its stack opened (PrepareSend); adopt adds them to its
	// offloaded socket's Tx OS counters.
	osTxPackets, osTxBytes atomic.Uint64

	mu     sync.Mutex // decisions and options below
	state  State
	reason string // why it is not offloaded
	rcvbuf int    // SO_RCVBUF asked, 0: none
	ttl    int    // IP_TTL asked, -1: none
	mttl   int    // IP_MULTICAST_TTL asked, -1: none
	tos    int    // IP_TOS
	pmtud  int    // IP_MTU_DISCOVER
	// segment is UDP_SEGMENT's size (UDP GSO), 0: off.
	segment int
	// device is the interface SO_BINDTODEVICE or SO_BINDTOIFINDEX bound
	// the socket to, "": none.
	device string
	mcLoop bool         // IP_MULTICAST_LOOP
	mcIf   string       // IP_MULTICAST_IF's interface, "": by route; why not, when it could not be named
	groups []netip.Addr // joined by the kernel while a candidate
	// selects names the option by which the socket chooses its own
	// member of a SO_REUSEPORT group (see SetReuseportSelect), "": none.
	selects string
	fds     []int // the fds naming it (dup), guarded by Engine.mu
	// kernelReads are the fds a candidate's receives are reading from the
	// kernel now, one entry per receive.
	kernelReads []int
	// pending names the interface whose stack this candidate waits for
	// (see stackOrWait); closed: the application closed its last fd.
	pending string
	// sendDecided: a send decided the socket while its stack is opening
	// (pending), and the next ones go to the kernel socket undecided.
	sendDecided bool
	// heldRcvbuf is the kernel socket's own SO_RCVBUF while it is raised
	// for the wait on a stack (see holdKernelQueue), 0: not raised.
	heldRcvbuf int
	closed     bool
	// decided is an eventfd (-1 until a wait needs it) written when a
	// candidate is decided, so that a wait on its kernel socket (which
	// gets nothing once the socket is steered) ends at once.
	decided int
}

// decidedFD is the candidate's decision eventfd, made on first use.
// Caller holds s.mu.
func (s *Socket) decidedFD() int {
	if s.decided < 0 {
		if fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err == nil {
			s.decided = highfd.Move(fd)
		}
	}
	return s.decided
}

// wakeDecided wakes the waits on a candidate that was just decided.
// Caller holds s.mu.
func (s *Socket) wakeDecided() {
	if s.decided >= 0 {
		one := [8]byte{1}
		unix.Write(s.decided, one[:])
	}
}

// New starts an engine: it reads the parameters and the rules file, and
// writes the start-up banner. A bad parameter or rules line is an error
// naming it.
func New(opts *Options) (*Engine, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	var perr error
	if o.Params == nil {
		o.Params, perr = params.FromEnv()
	}
	if o.Program == "" {
		o.Program = os.Args[0]
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.OnState == nil {
		o.OnState = func(int, State) {}
	}
	if o.Owed == nil {
		o.Owed = new(atomic.Int32)
	}
	e := &Engine{p: o.Params, program: filepath.Base(o.Program), onState: o.OnState, owed: o.Owed, stacks: map[string]*stack.Stack{},
		stackErr: map[string]error{}, epolls: map[int]*epollSet{},
		streams: map[int]kernelStream{}, tcpWanting: map[string]int{}}
	e.scratch.New = func() any { b := make([]byte, 65536); return &b }
	if o.Params.PeerNotify {
		e.peers = peernotify.New(o.Helper, o.Spawn)
	}
	var err error
	e.Log, err = newLog(o.Params, o.Stderr)
	if err = errors.Join(perr, err); err != nil {
		return nil, err
	}
	slog.SetDefault(slog.New(&slogHandler{l: e.Log}))
	if e.rules, err = rules.Load(o.Params.ConfigFile); err != nil {
		if !errors.Is(err, os.ErrNotExist) || o.Params.ConfigFile != params.Defaults().ConfigFile {
			return nil, err
		}
		e.rules = nil // no default rules file: offload everything
	}
	if err := e.startStats(); err != nil {
		return nil, err
	}
	return e, nil
}

// Announce writes the banner (version, command line, the parameters
// not at their defaults), once: at the process's first IP socket, or
// the first one it inherited. VMA writes it as it loads, in every
// process: a program started through wrappers (a shell, env, pyenv's
// shims: more than eight processes for one python3) repeated it for
// each.
func (e *Engine) Announce() {
	if !e.announced.Load() && !e.announced.Swap(true) {
		e.banner()
		e.reportAtEnd()
	}
}

// reportAtEnd hands the helper VMAXDP_STATS_FILE and the stats file at
// the process's first IP socket, so that an end that writes no report
// (a signal, a crash, _exit) still has the sockets' counters written.
func (e *Engine) reportAtEnd() {
	pub := e.pub
	if pub == nil || pub.statsOut == nil || e.peers == nil {
		return
	}
	var live *os.File
	if pub.w != nil {
		live = pub.w.File()
	}
	if err := e.peers.ReportAtEnd(pub.statsOut, live); err != nil {
		e.noHelper(err)
	}
}

func (e *Engine) banner() {
	if !e.Log.Enabled(params.LevelInfo) {
		return
	}
	var b strings.Builder
	e.p.WriteBanner(&b, "")
	e.Log.Printf(params.LevelInfo, "---------------------------------------------------------------------------")
	e.Log.Printf(params.LevelInfo, "VMAXDP_VERSION: %s", Version)
	e.Log.Printf(params.LevelInfo, "Cmd Line: %s", strings.Join(os.Args, " "))
	e.Log.Printf(params.LevelDebug, "Pid: %d", os.Getpid())
	e.Log.Printf(params.LevelInfo, "---------------------------------------------------------------------------")
	for _, l := range strings.Split(strings.TrimRight(b.String(), "\n"), "\n") {
		e.Log.Printf(params.LevelInfo, "%s", l)
	}
	e.Log.Printf(params.LevelInfo, "---------------------------------------------------------------------------")
}

// Params are the engine's parameters.
func (e *Engine) Params() *params.Params { return e.p }

func (e *Engine) get(fd int) *Socket {
	if fd < 0 || fd >= MaxFD {
		return nil
	}
	return e.fds.Load(fd)
}

// Socket records a new AF_INET SOCK_DGRAM socket.
func (e *Engine) Socket(fd int, nonblock bool) State {
	e.Announce()
	if fd >= MaxFD {
		e.Log.Printf(params.LevelInfo, "fd %d: not offloaded: fd beyond %d", fd, MaxFD-1)
		return StateOS
	}
	s := &Socket{fd: fd, state: StateCandidate, ttl: -1, mttl: -1, pmtud: unix.IP_PMTUDISC_WANT, mcLoop: e.p.TxMCLoopback, fds: []int{fd}, decided: -1}
	if !s.mcLoop {
		// The kernel socket's default follows the parameter too, so that
		// getsockopt and the kernel's own sends agree with it.
		unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, 0)
	}
	s.nonblock.Store(nonblock)
	s.inode = inodeOf(fd)
	if dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN); err == nil && dom == unix.AF_INET6 {
		s.v6 = true
	}
	e.use(fd)
	e.fds.Store(fd, s)
	e.Log.Printf(params.LevelDebug, "fd %d: udp socket", fd)
	return StateCandidate
}

// IPv6 says whether fd is an offloaded or candidate AF_INET6 socket, whose
// receives give IPv4 sources as IPv4-mapped sockaddr_in6.
func (e *Engine) IPv6(fd int) bool {
	s := e.get(fd)
	return s != nil && s.v6
}

// Bind is called after the kernel bound fd.
func (e *Engine) Bind(fd int) State {
	s := e.get(fd)
	if s == nil {
		return StateOS
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateCandidate {
		return s.state
	}
	local, _, err := stack.SockAddrs(fd)
	if err != nil {
		return e.notIPv4(s, rules.UDPReceiver, err)
	}
	return e.decide(s, rules.UDPReceiver, local, netip.AddrPort{}, "")
}

// notIPv4 leaves s, an AF_INET6 socket with IPv6 traffic only
// (stack.ErrIPv6), on the kernel.
func (e *Engine) notIPv4(s *Socket, role rules.Role, err error) State {
	local, remote := sockAddrs6(s.fd)
	return e.notOffloaded(s, socketWhat(role, local, remote), ipv6Only("UDP", err))
}

// IPv6Connect is called after the kernel took the connect of fd, an
// AF_INET6 stream socket, to to (VMAXDP_TCP=1), and says why it stays on
// the kernel: TCP offload serves IPv4, which an AF_INET6 socket carries
// to an IPv4-mapped address with IPV6_V6ONLY off.
func (e *Engine) IPv6Connect(fd int, to netip.AddrPort) {
	if !e.p.TCP || streamDomain(fd) != unix.AF_INET6 || to.Addr().Is4In6() {
		return // a mapped destination that is not offloaded says why itself
	}
	local, _ := sockAddrs6(fd)
	e.logNotOffloaded(fd, socketWhat(rules.TCPClient, local, to), "an IPv6 destination: TCP offload serves IPv4 (IPv6 keeps flowing through the kernel)")
}

// ipv6Only says why an AF_INET6 socket of proto ("UDP", "TCP") with IPv6
// traffic only (err, stack.ErrIPv6) stays on the kernel.
func ipv6Only(proto string, err error) string {
	return fmt.Sprintf("an IPv6 socket with IPv6 traffic only (%v): %s offload serves IPv4, which an AF_INET6 socket carries with IPV6_V6ONLY off on :: or an IPv4-mapped address", err, proto)
}

// sockAddrs6 are fd's local and peer addresses when it is an AF_INET6
// socket (invalid when it has none).
func sockAddrs6(fd int) (local, remote netip.AddrPort) {
	addr6 := func(sa unix.Sockaddr) netip.AddrPort {
		if s6, ok := sa.(*unix.SockaddrInet6); ok {
			return netip.AddrPortFrom(netip.AddrFrom16(s6.Addr), uint16(s6.Port))
		}
		return netip.AddrPort{}
	}
	if sa, err := unix.Getsockname(fd); err == nil {
		local = addr6(sa)
	}
	if sa, err := unix.Getpeername(fd); err == nil {
		remote = addr6(sa)
	}
	return local, remote
}

// Connect is called after the kernel connected (or, with AF_UNSPEC,
// disconnected) fd; an offloaded socket follows its new peer.
func (e *Engine) Connect(fd int) State {
	s := e.get(fd)
	if s == nil {
		return StateOS
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	local, remote, err := stack.SockAddrs(fd)
	switch s.state {
	case StateCandidate:
		role := rules.UDPConnect
		if !remote.IsValid() {
			role = rules.UDPReceiver
		}
		if err != nil {
			return e.notIPv4(s, role, err)
		}
		return e.decide(s, role, local, remote, "")
	case StateOffloaded:
		c, err := s.conn.Load().Reopen(fd)
		if err != nil {
			s.conn.Store(nil)
			return e.notOffloaded(s, fmt.Sprintf("re-attach after connect to %s", remote), err.Error())
		}
		s.conn.Store(c)
	}
	return s.state
}

// PrepareSend is called before a send on a candidate socket: the first
// send decides (the udp_sender role), binding the socket first as the
// kernel would. A socket whose stack is opening is sent by its kernel
// socket meanwhile, as a bound one is served by it (stackOrWait), and
// those sends are counted in its tx_os: by default the first send does
// not wait the tens of milliseconds that opening takes, which a
// short-lived client (dig, a QUIC client's connection, a health check)
// paid in full, at every start; VMAXDP_FIRST_SEND_WAIT makes it wait.
func (e *Engine) PrepareSend(fd int, to netip.AddrPort) State {
	s := e.get(fd)
	if s == nil {
		return StateOS
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state != StateCandidate {
		return s.state
	}
	if s.pending != "" && s.sendDecided {
		return StateCandidate
	}
	local, remote := sockAddrs(fd)
	if remote.IsValid() {
		to = remote
	}
	if !to.IsValid() || !to.Addr().Is4() {
		return StateCandidate // the kernel answers (EDESTADDRREQ and the like)
	}
	if local.Port() == 0 {
		if err := bindEphemeral(fd, s.v6); err != nil {
			return e.notOffloaded(s, "bind before first send", err.Error())
		}
		local, _ = sockAddrs(fd)
	}
	role := rules.UDPSender
	if remote.IsValid() {
		role = rules.UDPConnect
	}
	st := e.decide(s, role, local, to, "")
	if st == StateCandidate && s.pending != "" && e.p.FirstSendWait > 0 {
		done := e.openDone(s.pending)
		s.mu.Unlock()
		select {
		case <-done:
		case <-time.After(time.Duration(e.p.FirstSendWait) * time.Millisecond):
		}
		s.mu.Lock()
		st = s.state
	}
	s.sendDecided = st == StateCandidate && s.pending != ""
	return st
}

// openDone is closed once the stack of ifname, opening, is open (or
// failed) and its sockets adopted; a closed channel when it is not
// opening.
func (e *Engine) openDone(ifname string) <-chan struct{} {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ch, ok := e.opened[ifname]; ok {
		return ch
	}
	ch := make(chan struct{})
	close(ch)
	return ch
}

// sockAddrs: a socket whose addresses cannot be read is decided as
// unbound and unconnected; the kernel reports the error on its next call.
func sockAddrs(fd int) (local, remote netip.AddrPort) {
	local, remote, _ = stack.SockAddrs(fd)
	return local, remote
}

// decide applies the rules and, when they say so, offloads s. Caller
// holds s.mu.
func (e *Engine) decide(s *Socket, role rules.Role, local, remote netip.AddrPort, ifname string) State {
	what := socketWhat(role, local, remote)
	by, cause := e.ruleDecision(role, local, remote)
	if cause != "" {
		return e.notOffloaded(s, what, cause)
	}
	if s.selects != "" && reusePort(s.fd) {
		return e.notOffloaded(s, what, selectsCause(s.selects, "datagram"))
	}
	if cause := e.cgroupCause(false); cause != "" {
		return e.notOffloaded(s, what, cause)
	}
	if s.pending != "" {
		return StateCandidate // its stack is opening: adopt looks at it then
	}
	if ifname == "" {
		var err error
		if ifname, err = e.pickInterface(local.Addr(), remote.Addr()); err != nil {
			return e.notOffloaded(s, what, err.Error())
		}
	}
	if s.device != "" && s.device != ifname {
		return e.notOffloaded(s, what, deviceCause(s.device, ifname))
	}
	st, err := e.stackOrWait(ifname, s, what, by)
	switch {
	case err != nil:
		return e.notOffloaded(s, what, err.Error())
	case st == nil:
		return StateCandidate
	}
	return e.adopt(s, st, what, by)
}

// socketWhat names a socket for the log: its role and addresses.
func socketWhat(role rules.Role, local, remote netip.AddrPort) string {
	if remote.IsValid() {
		return fmt.Sprintf("%s %s>%s", role, local, remote)
	}
	return fmt.Sprintf("%s %s", role, local)
}

// ruleDecision applies the rules file and VMAXDP_OFFLOADED_SOCKETS to a
// socket in role: what allows its offload ("default" or the rule), or
// why it stays on the kernel (cause, "" when it may be offloaded).
func (e *Engine) ruleDecision(role rules.Role, local, remote netip.AddrPort) (by, cause string) {
	if e.ringsSeen() {
		return "", ioUringCause
	}
	r, matched := e.rules.Decide(e.program, e.p.ApplicationID, role, local, remote)
	switch {
	case matched && r.Transport == rules.OS:
		return "", fmt.Sprintf("rule %s: %s", r.Where, r)
	case !matched && !e.p.OffloadedSockets:
		return "", params.Prefix + "OFFLOADED_SOCKETS=0 and no rule offloads it"
	case matched:
		return "rule " + r.Where, ""
	}
	return "default", ""
}

// adopt offloads s onto st. Caller holds s.mu.
func (e *Engine) adopt(s *Socket, st *stack.Stack, what, by string) State {
	if s.selects != "" && reusePort(s.fd) { // set while its stack opened
		return e.notOffloaded(s, what, selectsCause(s.selects, "datagram"))
	}
	if s.device != "" && s.device != st.Interface() { // set while its stack opened
		return e.notOffloaded(s, what, deviceCause(s.device, st.Interface()))
	}
	if e.rings.seen.Load() { // seen while its stack opened
		return e.notOffloaded(s, what, ioUringCause)
	}
	c, err := st.Adopt(s.fd)
	if err != nil {
		return e.notOffloaded(s, what, err.Error())
	}
	e.watchRings()
	c.Counters.RxOSPackets.Add(s.osRxPackets.Swap(0))
	c.Counters.RxOSBytes.Add(s.osRxBytes.Swap(0))
	e.applyOptions(s, c)
	s.conn.Store(c)
	// After the store: SentOS adds to s's counters only while it finds
	// no conn, so what it added is swapped here or by itself.
	c.Counters.TxOSPackets.Add(s.osTxPackets.Swap(0))
	c.Counters.TxOSBytes.Add(s.osTxBytes.Swap(0))
	s.state = StateOffloaded
	e.onState(s.fd, StateOffloaded)
	s.wakeDecided()
	e.Log.Printf(params.LevelDebug, "fd %d: offloaded on %s (%s, %s)", s.fd, st.Interface(), what, by)
	return StateOffloaded
}

// pendingAdopt is a socket decided for offload on a stack still opening.
type pendingAdopt struct {
	s        *Socket
	what, by string
}

// stackOrWait returns ifname's stack when it is open. When it is not, s
// waits for it (nil, nil): the stack opens on a goroutine, and s is
// adopted once it is. A stack takes tens of milliseconds to open (an XDP
// program attached, AF_XDP sockets bound); the application's bind must not
// wait for that, nor stretch the time in which its socket is bound but
// not yet set up (dnsmasq turns IP_PKTINFO on after bind: the queries
// that came in between carried no packet info, and it dropped them). A
// failure is remembered: the interface's later sockets stay on the kernel
// with the same reason. Caller holds s.mu.
func (e *Engine) stackOrWait(ifname string, s *Socket, what, by string) (*stack.Stack, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if st := e.stacks[ifname]; st != nil {
		return st, nil
	}
	if err := e.stackErr[ifname]; err != nil {
		return nil, err
	}
	if e.opening == nil {
		e.opening = map[string][]pendingAdopt{}
	}
	waiting, started := e.opening[ifname]
	if !started {
		// The stack opens in the namespace of the thread that binds.
		if err := e.startOpen(ifname); err != nil {
			return nil, err
		}
	}
	e.opening[ifname] = append(waiting, pendingAdopt{s, what, by})
	s.pending = ifname
	e.holdKernelQueue(s)
	return nil, nil
}

// waitRcvbuf is the kernel receive buffer of a socket while it waits for
// its stack to open.
const waitRcvbuf = 4 << 20

// holdKernelQueue raises the receive buffer of s's kernel socket while s
// waits for its stack: the kernel serves it meanwhile, and the opening
// (a BPF program verified, a UMEM allocated) takes a core for tens of
// milliseconds, which on a small machine starves the thread that reads
// the kernel socket. 208 KiB (the default) hold 4 ms of 1400-byte
// datagrams at 20,000 a second: iperf3's server under vmaxdp lost up to
// 0.4% of them, counted in UdpRcvbufErrors. releaseKernelQueue puts the
// socket's own size back once it is decided. Caller holds s.mu.
func (e *Engine) holdKernelQueue(s *Socket) {
	if s.heldRcvbuf != 0 {
		return
	}
	n, err := unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	if err != nil || n >= waitRcvbuf {
		return
	}
	// SO_RCVBUFFORCE doubles what it is given, as SO_RCVBUF does.
	if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, waitRcvbuf/2); err != nil {
		e.Log.Printf(params.LevelDebug, "fd %d: kernel receive buffer kept at %d bytes while its stack opens: %v", s.fd, n, err)
		return
	}
	s.heldRcvbuf = n
}

// HeldRcvBuf is fd's kernel socket's own SO_RCVBUF while holdKernelQueue
// has raised it, 0 when it is not raised: getsockopt answers it, so that
// the application sees the size it has (iperf prints it).
func (e *Engine) HeldRcvBuf(fd int) int {
	s := e.get(fd)
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heldRcvbuf
}

// releaseKernelQueue gives s's kernel socket its own receive buffer size
// back (see holdKernelQueue); what it holds stays queued. Caller holds
// s.mu.
func (e *Engine) releaseKernelQueue(s *Socket) {
	if s.heldRcvbuf == 0 || s.closed {
		s.heldRcvbuf = 0
		return
	}
	if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, s.heldRcvbuf/2); err != nil {
		e.Log.Printf(params.LevelWarning, "fd %d: kernel receive buffer not set back to %d bytes: %v", s.fd, s.heldRcvbuf, err)
	}
	s.heldRcvbuf = 0
}

// openStack opens ifname's stack in the namespace ns, which it closes,
// and adopts the sockets that wait for it.
func (e *Engine) openStack(ifname string, ns netns.NsHandle) {
	defer e.opens.Done()
	var st *stack.Stack
	err := netnsutil.Do(ns, func() (err error) {
		st, err = e.newStack(ifname, func() bool { return e.stillWanted(ifname) })
		if err == nil {
			e.watchPeers(ifname, st) // in the interface's namespace
		}
		return err
	})
	if err != nil && !errors.Is(err, stack.ErrNotWanted) {
		err = e.afterConfine(err)
	}
	highfd.Close(int(ns))
	e.mu.Lock()
	exiting := e.exiting
	switch {
	case exiting:
		// Closed below, never pinned: its sockets stay on the kernel for
		// what is left of the process.
	case errors.Is(err, stack.ErrNotWanted):
		// Tried again by the interface's next socket.
	case err != nil:
		e.stackErr[ifname] = err
	default:
		// Pinned under e.mu, which Shutdown takes to set exiting: a stack
		// pinned is one Shutdown finds in e.stacks and unpins.
		if err = st.Program().Pin(); err != nil {
			e.stackErr[ifname] = err
		} else {
			e.stacks[ifname] = st
		}
	}
	waiting := e.opening[ifname]
	delete(e.opening, ifname)
	e.mu.Unlock()
	if st != nil && (exiting || err != nil) {
		st.Close()
		st = nil
	}
	for _, w := range waiting {
		w.s.mu.Lock()
		if w.s.state == StateCandidate && w.s.pending == ifname && !w.s.closed {
			w.s.pending = ""
			switch {
			case exiting:
			case errors.Is(err, stack.ErrNotWanted):
				// It came after Wanted said no: open the stack for it.
				if st, err := e.stackOrWait(ifname, w.s, w.what, w.by); err != nil {
					e.notOffloaded(w.s, w.what, err.Error())
				} else if st != nil {
					e.adopt(w.s, st, w.what, w.by)
				}
			case err != nil:
				e.notOffloaded(w.s, w.what, err.Error())
			default:
				e.adopt(w.s, st, w.what, w.by)
			}
		} else {
			w.s.pending = ""
		}
		if w.s.pending == "" {
			e.releaseKernelQueue(w.s)
		}
		w.s.mu.Unlock()
	}
	if st != nil && !e.preparing.Load() {
		// Every socket it opened for went to the kernel meanwhile (a
		// fork): its program would only slow the kernel's traffic.
		st.Program().Detach()
	}
	e.mu.Lock()
	if ch := e.opened[ifname]; ch != nil && e.opening[ifname] == nil {
		close(ch)
		delete(e.opened, ifname)
	}
	e.mu.Unlock()
}

// stillWanted says whether a socket waiting for ifname's stack still does
// (not forked, closed or decided otherwise meanwhile); none does once the
// process is exiting.
func (e *Engine) stillWanted(ifname string) bool {
	e.mu.Lock()
	exiting := e.exiting
	waiting := slices.Clone(e.opening[ifname])
	listens := e.tcpWanting[ifname]
	e.mu.Unlock()
	switch {
	case exiting:
		return false
	case e.preparing.Load() || listens > 0:
		return true
	}
	for _, w := range waiting {
		w.s.mu.Lock()
		wants := w.s.state == StateCandidate && w.s.pending == ifname && !w.s.closed
		w.s.mu.Unlock()
		if wants {
			return true
		}
	}
	return false
}

// WaitOpens waits until the stacks being opened are open (or failed) and
// their sockets adopted.
func (e *Engine) WaitOpens() { e.opens.Wait() }

// notOffloaded leaves s on the kernel: what the socket was doing, and the
// cause. The log says it at INFO once per cause (a server whose sockets
// all stay on the kernel for one reason says so once), at DEBUG after that;
// the stats tool shows every socket's reason.
func (e *Engine) notOffloaded(s *Socket, what, cause string) State {
	s.state, s.reason = StateKernel, what+": "+cause
	s.kernel.Store(true)
	e.onState(s.fd, StateKernel)
	s.wakeDecided()
	e.logNotOffloaded(s.fd, what, cause)
	return StateKernel
}

// logNotOffloaded logs why the socket on fd, doing what, stays on the
// kernel: at INFO once per cause (a server whose sockets all stay on the
// kernel for one reason says so once), at DEBUG after that.
func (e *Engine) logNotOffloaded(fd int, what, cause string) {
	level, more := params.LevelInfo, ""
	if _, seen := e.causes.LoadOrStore(cause, true); seen {
		level = params.LevelDebug
	} else {
		more = " (other sockets left on the kernel for this reason are logged at debug level)"
	}
	e.Log.Printf(level, "fd %d: not offloaded: %s: %s%s", fd, what, cause, more)
}

// logMcLoop says why a socket's multicast goes through the kernel: at
// INFO for the first socket, at DEBUG for the others, as logNotOffloaded.
func (e *Engine) logMcLoop(c *stack.UDPConn, group netip.Addr) {
	const cause = "mc-loop"
	level, more := params.LevelInfo, " (other sockets' are logged at debug level)"
	if _, seen := e.causes.LoadOrStore(cause, true); seen {
		level, more = params.LevelDebug, ""
	}
	e.Log.Printf(level, "fd %d: multicast to %v goes through the kernel while a socket of this host is a member of the group on %s: IP_MULTICAST_LOOP is on, and the kernel gives the member its copy (turn it off, or VMAXDP_TX_MC_LOOPBACK=0, to offload it)%s",
		c.FD(), group, c.Stack().Interface(), more)
}

func (e *Engine) applyMulticast(s *Socket, c *stack.UDPConn) {
	c.SetMulticastLoop(s.mcLoop)
	c.SetMulticastViaKernel(s.mcIf != "" && s.mcIf != c.Stack().Interface())
}

func (e *Engine) applyOptions(s *Socket, c *stack.UDPConn) {
	e.applyMulticast(s, c)
	c.SetRecvStamp(s.wantsStamps())
	if s.rcvbuf > 0 {
		c.SetRxBytesLimit(s.rcvbuf)
	}
	if s.ttl >= 0 {
		c.SetTTL(uint8(s.ttl), false)
	}
	if s.mttl >= 0 {
		c.SetTTL(uint8(s.mttl), true)
	}
	c.SetSegment(s.segment)
	c.SetTOS(uint8(s.tos))
	c.SetPMTUDisc(s.pmtud)
	for _, g := range s.groups {
		if err := c.SteerGroup(g); err != nil {
			e.Log.Printf(params.LevelWarning, "fd %d: group %s stays on the kernel: %v", s.fd, g, err)
		} else {
			e.Log.Printf(params.LevelDebug, "fd %d: group %s offloaded", s.fd, g)
		}
	}
}

// State is fd's state (StateOS when the engine does not know it).
func (e *Engine) State(fd int) State {
	s := e.get(fd)
	if s == nil {
		return StateOS
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Reason says why fd is not offloaded ("" when it is, or is unknown).
func (e *Engine) Reason(fd int) string {
	s := e.get(fd)
	if s == nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reason
}

// Conn is fd's stack socket, nil when the engine does not serve it.
func (e *Engine) Conn(fd int) *stack.UDPConn {
	if s := e.get(fd); s != nil {
		return s.conn.Load()
	}
	return nil
}

// NetnsMoved is told that a thread of the process entered another
// network namespace (setns, unshare).
func (e *Engine) NetnsMoved() {
	if !e.ifaces.perNS.Swap(true) {
		e.ifaces.mu.Lock()
		clear(e.ifaces.m)
		e.ifaces.mu.Unlock()
	}
}

// pickInterface: the interface owning local, else the route to remote, else
// VMAXDP_INTERFACE, else the one wildcardInterface picks.
func (e *Engine) pickInterface(local, remote netip.Addr) (string, error) {
	if local.IsValid() && !local.IsUnspecified() && !local.IsMulticast() {
		return e.ifaces.lookup(local, true)
	}
	if e.p.Interface != "" {
		return e.p.Interface, nil
	}
	if remote.IsValid() && !remote.IsUnspecified() {
		if name, err := e.ifaces.lookup(remote, false); err == nil {
			return name, nil
		}
	}
	if local.IsMulticast() {
		if name, err := e.ifaces.lookup(local, false); err == nil {
			return name, nil
		}
	}
	return e.wildcardInterface()
}

// ifaceCache keeps pickInterface's answers (the interface owning an
// address, or the kernel's route to one) for ifaceTTL. Each is a netlink
// request and a dump of the interfaces: 40% of a TCP connect's cost under
// vmaxdp (ab, a connection a request: perf), where the kernel's connect
// looks its route up in place. A route or address change is seen within
// ifaceTTL. Once a thread of the process has entered another network
// namespace (NetnsMoved), entries are per namespace, read from
// /proc/thread-self (a stat: 12 us a connect, so not before), and a
// thread whose namespace cannot be read (a chroot without /proc) is not
// cached.
type ifaceCache struct {
	mu    sync.Mutex
	m     map[ifaceKey]ifaceEntry
	perNS atomic.Bool // a thread entered another namespace
}

type ifaceKey struct {
	netns  uint64 // 0: the process's namespace, while every thread is in it
	addr   netip.Addr
	owning bool // the interface owning addr, not the route to it
}

type ifaceEntry struct {
	ifname string
	at     time.Time
}

const (
	ifaceTTL      = 100 * time.Millisecond
	ifaceCacheMax = 4096 // entries; the map is cleared when it is full
)

func (c *ifaceCache) lookup(a netip.Addr, owning bool) (string, error) {
	find := ifaceRoute
	if owning {
		find = ifaceOwning
	}
	k, now := ifaceKey{0, a, owning}, time.Now()
	if c.perNS.Load() {
		var st unix.Stat_t
		if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
			return find(a)
		}
		k.netns = st.Ino
	}
	c.mu.Lock()
	r, ok := c.m[k]
	c.mu.Unlock()
	if ok && now.Sub(r.at) < ifaceTTL {
		return r.ifname, nil
	}
	name, err := find(a)
	if err != nil {
		return "", err
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= ifaceCacheMax {
		c.m = map[ifaceKey]ifaceEntry{}
	}
	c.m[k] = ifaceEntry{name, now}
	c.mu.Unlock()
	return name, nil
}

func ifaceOwning(a netip.Addr) (string, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return "", fmt.Errorf("interface of %s: %w", a, err)
	}
	for _, ad := range addrs {
		if x, ok := netip.AddrFromSlice(ad.IP.To4()); ok && x == a {
			ifi, err := net.InterfaceByIndex(ad.LinkIndex)
			if err != nil {
				return "", fmt.Errorf("interface of %s: %w", a, err)
			}
			return ifi.Name, nil
		}
	}
	for _, ad := range addrs {
		// udp-sender and udp-receiver bind a socket to the broadcast
		// address to hear their peers' broadcasts.
		if x, ok := netip.AddrFromSlice(ad.Broadcast.To4()); ok && x == a {
			name := strconv.Itoa(ad.LinkIndex)
			if ifi, err := net.InterfaceByIndex(ad.LinkIndex); err == nil {
				name = ifi.Name
			}
			return "", fmt.Errorf("%s is the broadcast address of %s: broadcast stays with the kernel", a, name)
		}
	}
	return "", fmt.Errorf("no interface has address %s", a)
}

func ifaceRoute(dst netip.Addr) (string, error) {
	routes, err := netlink.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return "", fmt.Errorf("route to %s: %w", dst, errors.Join(err, unix.ENETUNREACH))
	}
	ifi, err := net.InterfaceByIndex(routes[0].LinkIndex)
	if err != nil {
		return "", fmt.Errorf("route to %s: %w", dst, err)
	}
	return ifi.Name, nil
}

// ifaceNamed names the interface of an ip_mreqn or IP_MULTICAST_IF:
// ifindex, else the one owning ifaddr, else "" (the route's).
func ifaceNamed(ifaddr netip.Addr, ifindex int) (string, error) {
	switch {
	case ifindex > 0:
		ifi, err := net.InterfaceByIndex(ifindex)
		if err != nil {
			return "", fmt.Errorf("interface %d: %w", ifindex, err)
		}
		return ifi.Name, nil
	case ifaddr.IsValid() && !ifaddr.IsUnspecified():
		return ifaceOwning(ifaddr)
	}
	return "", nil
}

// wildcardInterface is the interface a socket bound to 0.0.0.0 is
// offloaded on when VMAXDP_INTERFACE names none: the only up one with an
// IPv4 address, or else the one the default route leaves by, where most
// of a host's traffic comes and goes (a host has a docker0 or a second
// link beside it, and every wildcard socket used to stay on the kernel).
// What comes through the others still reaches the socket through its
// kernel socket, which the engine reads as well, and the socket's
// answers to them leave through the kernel. With neither, the socket
// stays on the kernel, saying so.
func (e *Engine) wildcardInterface() (string, error) {
	names, err := stack.IPv4Interfaces()
	if err != nil {
		return "", err
	}
	if len(names) == 1 {
		return names[0], nil
	}
	def, err := stack.DefaultRouteInterface()
	if err != nil || def == "" || !slices.Contains(names, def) {
		return "", fmt.Errorf("bound to 0.0.0.0 and %d interfaces have IPv4 addresses (%s), and the default route leaves by none: set %sINTERFACE", len(names), strings.Join(names, ", "), params.Prefix)
	}
	if !e.wildcardSaid.Swap(true) {
		others := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == def })
		e.Log.Printf(params.LevelInfo, "sockets bound to 0.0.0.0 are offloaded on %s, the default route's interface; what comes to them through %s reaches them through the kernel (%sINTERFACE chooses)", def, strings.Join(others, ", "), params.Prefix)
	}
	return def, nil
}

// holdQueue hands the helper a copy of the AF_XDP socket fd of queue
// name (stack.Options.OnQueue), so that what the process's last sends
// left on its TX ring leaves if the process is killed before its kick.
func (e *Engine) holdQueue(name string, fd int) (release func()) {
	release, err := e.peers.Hold(name, fd)
	if err != nil {
		e.noHelper(err)
	}
	return release
}

// holdLink hands the helper a copy of the XDP link of ifname's steering
// program (steer.Options.OnLink), so that the process's end leaves the
// detach to it.
func (e *Engine) holdLink(ifname string, fd int) (release func()) {
	release, err := e.peers.HoldLink(ifname, fd)
	if err != nil {
		e.noHelper(err)
	}
	return release
}

// noHelper says, once, that no helper will outlive the process.
func (e *Engine) noHelper(err error) {
	if e.peersSaid.Swap(true) {
		return
	}
	e.Log.Printf(params.LevelWarning, "if this process ends without closing its sockets (SIGKILL, a crash), what its last sends left on the TX rings for a coalesced kick (%sTX_KICK_DELAY) is lost, %sSTATS_FILE gets no report, and the peers of its offloaded TCP connections are not told (%sPEER_NOTIFY=0 to hide this): %v",
		params.Prefix, params.Prefix, params.Prefix, err)
}

// newStack opens the stack of ifname with the engine's parameters.
func (e *Engine) newStack(ifname string, wanted func() bool) (*stack.Stack, error) {
	p := e.p
	o := &stack.Options{
		Wanted: wanted,
		Ours:   e.ours,
		// On the stack's watcher, which must not wait for a socket's
		// lock: a thread holding one may be closing the stack.
		Shared:           func(cs []*stack.UDPConn, reason string) { go e.sharedToKernel(cs, reason) },
		SharedListeners:  func(ls []*stack.NetstackListener, reason string) { go e.sharedListenersToKernel(ls, reason) },
		McLoopViaKernel:  e.logMcLoop,
		XSK:              &xsk.Options{NumFrames: uint32(p.RxBufs)},
		Steer:            &steer.Options{Generic: p.XDPMode == "generic", DeferPin: true, UDPOnly: !p.TCP}, // openStack pins
		RxPoll:           p.RxPoll,
		RxPollOSRatio:    p.RxUDPPollOSRatio,
		RxBytesLimit:     p.RxBytesMin,
		MTU:              p.MTU,
		ProgressInterval: time.Duration(p.ProgressInterval) * time.Millisecond,
		ProgressMax:      p.ProgressMax,
		TxKickDelay:      time.Duration(p.TxKickDelay) * time.Microsecond,
	}
	if e.peers != nil {
		o.OnQueue = e.holdQueue
		o.Steer.OnLink = func(fd int) func() { return e.holdLink(ifname, fd) }
	}
	if p.ProgressInterval == 0 {
		o.ProgressInterval = stack.ProgressNever
	}
	if p.TxKickDelay == 0 {
		o.TxKickDelay = stack.TxKickNever
	}
	switch p.RxPoll {
	case params.PollAuto:
		o.RxPoll = 0 // the stack's default: poll while polling pays
	case -1:
		o.RxPoll = stack.RxPollForever
	case 0:
		o.RxPoll = stack.RxPollNever
	}
	if p.RxUDPPollOSRatio == 0 {
		o.RxPollOSRatio = stack.OSPollBeforeSleep
	}
	chosen, err := chooseBackend(p.Backend, ifname)
	if err != nil {
		return nil, err
	}
	began := time.Now()
	st, err := stack.Open(ifname, o)
	if err == nil && p.XDPMode == "native" && st.Program().Mode() != steer.ModeNative {
		st.Close()
		err = fmt.Errorf("stack %s: %sXDP_MODE=native but the driver gave %s", ifname, params.Prefix, st.Program().Mode())
	}
	if err != nil {
		return nil, err
	}
	// Its sockets are served by the kernel until it is open: the time
	// says how long.
	csum := "in user space"
	if bes := st.Backends(); len(bes) > 0 && bes[0].TxChecksum() {
		csum = "by the kernel (TX metadata)"
	}
	e.Log.Printf(params.LevelDebug, "%s: XDP %s, %d queues, open in %v, UDP checksums of sent datagrams completed %s, backend %s", ifname, st.Program().Mode(), len(st.Backends()), time.Since(began).Round(time.Millisecond), csum, chosen)
	for _, u := range st.UnservedQueues() {
		e.Log.Printf(params.LevelInfo, "%s: %v: not served, its datagrams reach the sockets through the kernel", ifname, u)
	}
	return st, nil
}

// chooseBackend applies VMAXDP_BACKEND to ifname: it says which backend
// serves it and, for auto, why, or why verbs, asked for, cannot.
func chooseBackend(backend, ifname string) (string, error) {
	if backend == "xdp" {
		return "AF_XDP", nil
	}
	_, err := verbs.Probe(ifname)
	if backend == "verbs" {
		return "", fmt.Errorf("%sBACKEND=verbs: %w", params.Prefix, err)
	}
	return fmt.Sprintf("AF_XDP (auto; verbs: %v)", err), nil
}

// Close forgets fd. Its socket's offload ends when no other fd names it
// (dup); when the closing fd is the one the stack reads, the socket moves
// to a remaining fd with its queued datagrams. It returns once no receive
// uses fd any more, so the application may close fd then.
func (e *Engine) Close(fd int) {
	if fd < 0 || fd >= MaxFD {
		return
	}
	s := e.fds.Swap(fd, nil)
	tcp := s == nil && e.closeTCP(fd)
	e.mu.Lock()
	// A registration is the open socket's, as the kernel's is the open
	// file's: while another fd names the socket, it stays, under that
	// fd (an event loop that registers a socket, dups it and closes the
	// first name, as Python's socket.dup and close do).
	heir := -1
	if s != nil {
		for _, f := range s.fds {
			if f != fd {
				heir = f
				break
			}
		}
	}
	for _, set := range e.epolls {
		set.forget(fd, heir)
	}
	var parents []*epollSet
	if set := e.epolls[fd]; set != nil {
		delete(e.epolls, fd)
		e.sets.Store(fd, nil)
		if set.dropName(fd) {
			parents = set.close()
		}
	}
	if s == nil || tcp {
		e.mu.Unlock()
		e.propagate(parents)
		return
	}
	s.fds = slices.DeleteFunc(s.fds, func(f int) bool { return f == fd })
	others := slices.Clone(s.fds)
	e.mu.Unlock()
	if len(others) == 0 {
		e.writeStatsFile(s)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(others) == 0 {
		s.closed = true
		// No wait uses it any more: the waits on fd end before Close
		// goes on (kernelReads), and no fd names s.
		if s.decided >= 0 {
			defer func() { highfd.Close(s.decided); s.decided = -1 }()
		}
	}
	// A candidate's receive on fd ends within candidateSlice, and no new
	// one starts: fd no longer names s.
	for slices.Contains(s.kernelReads, fd) {
		s.mu.Unlock()
		time.Sleep(100 * time.Microsecond)
		s.mu.Lock()
	}
	if s.fd != fd {
		return // a dup closes
	}
	c := s.conn.Load()
	switch {
	case len(others) == 0:
		if c != nil {
			c.Close()
			s.conn.Store(nil)
			e.Log.Printf(params.LevelDebug, "fd %d: closed", fd)
		}
	case c == nil:
		s.fd = others[0] // decisions to come adopt a remaining fd
	default:
		nc, err := c.Reopen(others[0])
		s.fd = others[0]
		if err != nil {
			s.conn.Store(nil)
			e.notOffloaded(s, fmt.Sprintf("fd %d closed, its dup %d could not be re-attached", fd, others[0]), err.Error())
			return
		}
		s.conn.Store(nc)
	}
}

// toKernel hands s to the kernel for cause, for good: a candidate is
// decided for the kernel; an offloaded socket is no longer steered, its
// queued datagrams are still served to its reads, in order, and once they
// are the kernel serves it.
func (e *Engine) toKernel(s *Socket, cause string) { e.handBack(s, cause, true) }

// toOthers is toKernel for a socket that readers the engine does not see
// will read through the kernel (an io_uring ring, another process after
// fork or SCM_RIGHTS): what an offloaded one queued goes to its kernel
// socket (stack.UDPConn.Reinject), where they find it. Served to this
// process's reads, a master that never reads again would hold it for
// ever.
func (e *Engine) toOthers(s *Socket, cause string) { e.handBack(s, cause, false) }

// handBack is toKernel, or with serve false toOthers.
func (e *Engine) handBack(s *Socket, cause string, serve bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case StateCandidate:
		e.notOffloaded(s, fmt.Sprintf("fd %d", s.fd), cause)
	case StateOffloaded:
		c := s.conn.Load()
		s.kernel.Store(true)
		c.Unsteer() // the rings' datagrams for it go to its queue
		s.drainCause = cause
		n, _ := c.QueueLen()
		switch {
		case n > 0 && serve:
			s.draining.Store(true)
			e.Log.Printf(params.LevelInfo, "fd %d: %s; the %d datagrams queued are served first", s.fd, cause, n)
		case n > 0:
			handed, dropped, err := c.Reinject()
			if dropped > 0 {
				e.Log.Printf(params.LevelWarning, "fd %d: %s; of the %d datagrams it had queued, %d are handed to its kernel socket and %d dropped: %v", s.fd, cause, handed+dropped, handed, dropped, err)
			} else {
				e.Log.Printf(params.LevelInfo, "fd %d: %s; the %d datagrams it had queued are handed to its kernel socket", s.fd, cause, handed)
			}
			e.fallBack(s, c)
		default:
			e.fallBack(s, c)
		}
	}
}

// fallBack hands the offloaded socket s back to the kernel, for
// s.drainCause. Caller holds s.mu.
func (e *Engine) fallBack(s *Socket, c *stack.UDPConn) {
	s.conn.Store(nil)
	c.Close()
	s.draining.Store(false)
	e.notOffloaded(s, fmt.Sprintf("fd %d on %s", s.fd, c.Stack().Interface()), s.drainCause)
}

// endDrain hands a draining socket to the kernel once its queue is empty.
func (e *Engine) endDrain(s *Socket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.conn.Load(); c != nil && s.draining.Load() {
		if n, _ := c.QueueLen(); n == 0 {
			e.fallBack(s, c)
		}
	}
}

// Dup makes newfd name oldfd's socket (dup, dup2, dup3, F_DUPFD).
func (e *Engine) Dup(oldfd, newfd int) State {
	s := e.get(oldfd)
	if newfd < 0 || newfd >= MaxFD {
		if s != nil {
			e.Log.Printf(params.LevelInfo, "fd %d: dup to fd %d beyond %d: the duplicate is served by the kernel", oldfd, newfd, MaxFD-1)
		}
		return StateOS
	}
	if e.get(newfd) != nil || e.listener(newfd) != nil || e.tcpConn(newfd) != nil || e.epollSetAt(newfd) != nil {
		e.Close(newfd)
	}
	if s == nil {
		if st, ok := e.dupEpoll(oldfd, newfd); ok {
			return st
		}
		st, _ := e.dupTCP(oldfd, newfd)
		return st
	}
	e.mu.Lock()
	s.fds = append(s.fds, newfd)
	e.use(newfd)
	e.fds.Store(newfd, s)
	e.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// SetNonblock follows O_NONBLOCK (fcntl F_SETFL, ioctl FIONBIO).
func (e *Engine) SetNonblock(fd int, on bool) {
	if s := e.get(fd); s != nil {
		s.nonblock.Store(on)
	} else if t := e.tcpConn(fd); t != nil {
		t.nonblock.Store(on)
	}
}

// SetRcvTimeo follows SO_RCVTIMEO.
func (e *Engine) SetRcvTimeo(fd int, d time.Duration) {
	if s := e.get(fd); s != nil {
		s.rcvtimeo.Store(int64(d))
	}
}

// SetRcvBuf follows SO_RCVBUF: the offloaded queue holds at least as much
// as the kernel socket would (which doubles the asked size), and never
// less than VMAXDP_RX_BYTES_MIN.
func (e *Engine) SetRcvBuf(fd int, n int) {
	s := e.get(fd)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rcvbuf = 2 * n
	s.heldRcvbuf = 0 // the application's size replaces the raised one
	if c := s.conn.Load(); c != nil {
		c.SetRxBytesLimit(s.rcvbuf)
	}
}

// SetTTL follows IP_TTL and IP_MULTICAST_TTL.
func (e *Engine) SetTTL(fd int, ttl int, multicast bool) {
	e.setOption(fd, func(s *Socket) {
		if multicast {
			s.mttl = ttl
		} else {
			s.ttl = ttl
		}
	}, func(_ *Socket, c *stack.UDPConn) { c.SetTTL(uint8(ttl), multicast) })
}

// SetBoundDevice follows SO_BINDTODEVICE and SO_BINDTOIFINDEX (ifname "":
// unbound). The kernel delivers to such a socket only what arrives on
// that interface, and the stack would serve it whatever its own interface
// received: a socket bound to another interface than its stack's stays
// on, or goes back to, the kernel. An offloaded TCP listener is handed
// over (handover): the connections netstack made are still accepted, as
// the kernel's queued ones are, and new ones go to the kernel's listener.
func (e *Engine) SetBoundDevice(fd int, ifname string) {
	if l := e.listener(fd); l != nil && ifname != "" && ifname != l.ifname {
		e.handover(fd, l, deviceCause(ifname, l.ifname))
		return
	}
	s := e.get(fd)
	if s == nil {
		return
	}
	s.mu.Lock()
	s.device = ifname
	c := s.conn.Load()
	s.mu.Unlock()
	if c != nil && ifname != "" && ifname != c.Stack().Interface() {
		e.toKernel(s, deviceCause(ifname, c.Stack().Interface()))
	}
}

// boundDevice is the interface the kernel socket fd is bound to
// (SO_BINDTODEVICE), "": none. A TCP socket's is read where it is decided
// (listen, connect).
func boundDevice(fd int) string {
	dev, err := unix.GetsockoptString(fd, unix.SOL_SOCKET, unix.SO_BINDTODEVICE)
	if err != nil {
		return ""
	}
	return dev
}

// deviceCause says why a socket bound to device is not served on ifname.
func deviceCause(device, ifname string) string {
	return fmt.Sprintf("bound to interface %s (SO_BINDTODEVICE), where its traffic would come through %s: the kernel serves it, and takes only what %s receives", device, ifname, device)
}

// setOption records an option of fd's socket (set, under its lock) and
// applies it to its stack socket, when it has one (apply); applyOptions
// applies it to one adopted later.
func (e *Engine) setOption(fd int, set func(*Socket), apply func(*Socket, *stack.UDPConn)) {
	s := e.get(fd)
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	set(s)
	if c := s.conn.Load(); c != nil {
		apply(s, c)
	}
}

// SetTOS follows IP_TOS: the TOS byte of the socket's datagrams.
func (e *Engine) SetTOS(fd, tos int) {
	e.setOption(fd, func(s *Socket) { s.tos = tos }, func(_ *Socket, c *stack.UDPConn) { c.SetTOS(uint8(tos)) })
}

// SetPMTUDisc follows IP_MTU_DISCOVER: whether the socket's datagrams
// carry DF (stack.UDPConn.SetPMTUDisc).
func (e *Engine) SetPMTUDisc(fd, mode int) {
	e.setOption(fd, func(s *Socket) { s.pmtud = mode }, func(_ *Socket, c *stack.UDPConn) { c.SetPMTUDisc(mode) })
}

// FlushSends sends what fd's earlier sends left on its TX ring, before a
// send the kernel socket makes: the datagrams leave in the order sent.
func (e *Engine) FlushSends(fd int) {
	if c := e.Conn(fd); c != nil {
		c.FlushSends()
	}
}

// SetCork follows UDP_CORK: while it is on, the socket's sends go to the
// kernel socket, which joins them into one datagram when it goes off.
func (e *Engine) SetCork(fd int, on bool) {
	if s := e.get(fd); s != nil {
		s.cork.Store(on)
	}
}

// ShutdownUDP follows shutdown(2) on a UDP socket, which the kernel socket
// has taken: once sending is shut down, sends go to the kernel socket,
// which refuses them (EPIPE, and SIGPIPE unless MSG_NOSIGNAL).
func (e *Engine) ShutdownUDP(fd, how int) {
	if s := e.get(fd); s != nil && (how == unix.SHUT_WR || how == unix.SHUT_RDWR) {
		s.shutWr.Store(true)
	}
}

// SetSegment follows UDP_SEGMENT (UDP GSO), which the kernel socket has
// taken: a send longer than size goes to the kernel socket, which cuts it
// into datagrams of size bytes as the application asked.
func (e *Engine) SetSegment(fd, size int) {
	e.setOption(fd, func(s *Socket) { s.segment = size }, func(_ *Socket, c *stack.UDPConn) { c.SetSegment(size) })
}

// SetMulticastLoop follows IP_MULTICAST_LOOP: while it is on, the socket's
// multicast to a group with a member on this host goes through the
// kernel, which gives the member its copy.
func (e *Engine) SetMulticastLoop(fd int, on bool) {
	e.setMulticast(fd, func(s *Socket) { s.mcLoop = on })
}

// SetMulticastIf follows IP_MULTICAST_IF: ifindex, else ifaddr, names the
// interface (neither: back to the route's). Multicast for an interface
// other than the socket's stack's goes through the kernel.
func (e *Engine) SetMulticastIf(fd int, ifaddr netip.Addr, ifindex int) {
	name, err := ifaceNamed(ifaddr, ifindex)
	if err != nil {
		name = err.Error() // an interface the kernel has and no stack serves
	}
	e.setMulticast(fd, func(s *Socket) { s.mcIf = name })
}

func (e *Engine) setMulticast(fd int, set func(*Socket)) { e.setOption(fd, set, e.applyMulticast) }

// Membership joins (add) or leaves a multicast group on fd. ifindex or
// else ifaddr names the interface, as ip_mreqn does (neither: by route).
// It returns ErrPassOS when the kernel must do it (the socket is not
// offloaded).
func (e *Engine) Membership(fd int, add bool, group, ifaddr netip.Addr, ifindex int) (State, unix.Errno) {
	s := e.get(fd)
	if s == nil {
		return StateOS, ErrPassOS
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == StateCandidate && add {
		if !e.joinCandidate(s, group, ifaddr, ifindex) {
			if s.state == StateCandidate && s.pending != "" {
				return s.state, e.joinWhileOpening(s, group, ifaddr, ifindex)
			}
			return s.state, ErrPassOS
		}
	}
	c := s.conn.Load()
	if c == nil {
		if !add {
			s.groups = slices.DeleteFunc(s.groups, func(g netip.Addr) bool { return g == group })
		}
		return s.state, ErrPassOS
	}
	var err error
	if add {
		err = c.JoinGroup(group)
	} else {
		err = c.LeaveGroup(group)
	}
	return s.state, errnoOf(err)
}

// joinWhileOpening joins group on the kernel socket of s, a candidate
// whose stack is opening, and keeps the group for the adoption, which
// steers it as the kernel socket's membership then stands (applyOptions).
// The join is made here, under s.mu, not by the caller after: the
// adoption could look before it. A program that binds and joins at once,
// as the first socket of its interface, had its group left to the kernel
// for good (a Java receiver: every datagram through the kernel socket).
// Caller holds s.mu.
func (e *Engine) joinWhileOpening(s *Socket, group, ifaddr netip.Addr, ifindex int) unix.Errno {
	mreq := &unix.IPMreqn{Multiaddr: group.As4(), Ifindex: int32(ifindex)}
	if ifaddr.Is4() {
		mreq.Address = ifaddr.As4()
	}
	if err := unix.SetsockoptIPMreqn(s.fd, unix.IPPROTO_IP, unix.IP_ADD_MEMBERSHIP, mreq); err != nil {
		return errnoOf(err)
	}
	if !slices.Contains(s.groups, group) {
		s.groups = append(s.groups, group)
	}
	return 0
}

// joinCandidate decides whether a candidate that joins group is offloaded,
// as a receiver of group on the socket's port, and says whether it is.
// An unbound candidate keeps the group: bind decides, and steers it then.
func (e *Engine) joinCandidate(s *Socket, group, ifaddr netip.Addr, ifindex int) bool {
	local, _ := sockAddrs(s.fd)
	if local.Port() == 0 {
		if !slices.Contains(s.groups, group) {
			s.groups = append(s.groups, group)
		}
		return false
	}
	ifname, err := ifaceNamed(ifaddr, ifindex)
	if err != nil {
		e.notOffloaded(s, "join "+group.String(), err.Error())
		return false
	}
	return e.decide(s, rules.UDPReceiver, netip.AddrPortFrom(group, local.Port()), netip.AddrPort{}, ifname) == StateOffloaded
}

// SourceMembership follows a change the kernel socket has made to fd's
// membership of group through a source-filter or protocol-independent
// option (IP_ADD_SOURCE_MEMBERSHIP, IP_BLOCK_SOURCE, IP_MSFILTER,
// MCAST_JOIN_GROUP, MCAST_JOIN_SOURCE_GROUP...): a candidate decides as a
// join does (join: the option may add a membership; one that only drops or
// unblocks decides nothing), and an offloaded socket steers the group with
// the kernel's source filter while it is a member
// (stack.UDPConn.SteerGroup). The kernel validated the option and keeps
// the state.
func (e *Engine) SourceMembership(fd int, join bool, group, ifaddr netip.Addr, ifindex int) {
	s := e.get(fd)
	if s == nil || !group.Is4() || !group.IsMulticast() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == StateCandidate && (!join || !e.joinCandidate(s, group, ifaddr, ifindex)) {
		return
	}
	c := s.conn.Load()
	if c == nil {
		return
	}
	if err := c.SteerGroup(group); err != nil {
		e.Log.Printf(params.LevelWarning, "fd %d: group %s stays on the kernel: %v", fd, group, err)
	}
}

// errnoOf maps an engine or stack error to the errno the application sees.
func errnoOf(err error) unix.Errno {
	if err == nil {
		return 0
	}
	// Unwrapped by hand: errors.As would move its target to the heap on
	// every nonblocking receive that finds nothing.
	for e := err; e != nil; e = errors.Unwrap(e) {
		if errno, ok := e.(unix.Errno); ok {
			return errno
		}
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return unix.EAGAIN
	case errors.Is(err, net.ErrClosed):
		return unix.EBADF
	}
	return unix.EIO
}

// ours says whether the kernel socket with this inode is one of the
// engine's sockets that is not served by the kernel: offloaded, or a
// candidate (one whose stack is opening is about to be adopted). A
// SO_REUSEPORT group whose members are all ours may be offloaded.
func (e *Engine) ours(inode uint64) bool {
	for fd := range e.fdsInUse() {
		if s := e.fds.Load(fd); s != nil && s.inode == inode {
			return !s.kernel.Load()
		}
	}
	return false
}

// sharedToKernel hands the offloaded sockets of cs back to the kernel:
// they share their address and port with a kernel socket the engine does
// not serve (stack.ErrShared).
func (e *Engine) sharedToKernel(cs []*stack.UDPConn, reason string) {
	for fd := range e.fdsInUse() {
		if s := e.fds.Load(fd); s != nil && slices.Contains(cs, s.conn.Load()) {
			e.toKernel(s, reason)
		}
	}
}

// bindEphemeral binds fd to an ephemeral port of its own, as the
// kernel's autobind at a first send would, except that a socket with
// SO_REUSEADDR (and not SO_REUSEPORT) is bound with the option off for
// the moment: the kernel would let it share a port other such sockets
// hold, at random, and then every unicast answer of both goes to one of
// them (memcaslap, whose 16 sockets set SO_REUSEADDR, aborts on it under
// the kernel too). If no port is free on those terms, it binds as the
// kernel would. An AF_INET6 socket (v6) is bound to ::.
func bindEphemeral(fd int, v6 bool) error {
	var addr unix.Sockaddr = &unix.SockaddrInet4{}
	if v6 {
		addr = &unix.SockaddrInet6{}
	}
	reuse, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR)
	if err != nil || reuse == 0 || reusePort(fd) {
		return unix.Bind(fd, addr)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 0); err != nil {
		return unix.Bind(fd, addr)
	}
	err = unix.Bind(fd, addr)
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, reuse)
	if errors.Is(err, unix.EADDRINUSE) {
		return unix.Bind(fd, addr)
	}
	return err
}

// reusePort reads whether the kernel socket fd has SO_REUSEPORT.
func reusePort(fd int) bool {
	v, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT)
	return err == nil && v != 0
}

// kernelStream is what the engine notes of a stream socket the kernel
// serves. It names the socket's inode: such a socket closes without the
// engine's knowing, and the next socket with its fd number has another.
type kernelStream struct {
	inode uint64
	// selects is the option by which the socket chooses the member of
	// its SO_REUSEPORT group (SetReuseportSelect), for Listen.
	selects string
	// reason is why it is not offloaded, for vmaxdp stats.
	reason string
}

// stream returns fd's note, if fd still names the socket it was taken of.
func (e *Engine) stream(fd int) (kernelStream, bool) {
	e.streamMu.Lock()
	n, ok := e.streams[fd]
	e.streamMu.Unlock()
	if !ok || n.inode != inodeOf(fd) {
		return kernelStream{}, false
	}
	return n, true
}

// noteStream changes fd's note with fn, starting from an empty one when
// fd names another socket now.
func (e *Engine) noteStream(fd int, fn func(*kernelStream)) {
	ino := inodeOf(fd)
	e.streamMu.Lock()
	defer e.streamMu.Unlock()
	n := e.streams[fd]
	if n.inode != ino {
		n = kernelStream{inode: ino}
	}
	fn(&n)
	e.streams[fd] = n
}

// inodeOf is the inode of fd's file, 0 if fstat fails.
func inodeOf(fd int) uint64 {
	var st unix.Stat_t
	if unix.Fstat(fd, &st) != nil {
		return 0
	}
	return st.Ino
}

// selectsCause is why a socket that picks its own member of a
// SO_REUSEPORT group, by option opt, stays on the kernel.
// what is what the group's members get: datagram, connection.
func selectsCause(opt, what string) string {
	return opt + " chooses the socket of its SO_REUSEPORT group that gets each " + what + ", which vmaxdp does not: the group stays on the kernel"
}

// SetReuseportSelect follows an option by which a socket chooses which
// member of its SO_REUSEPORT group gets each datagram
// (SO_ATTACH_REUSEPORT_CBPF, SO_ATTACH_REUSEPORT_EBPF, SO_INCOMING_CPU),
// named opt. The stack spreads a group by flow and cannot run the
// group's program, so a socket of a group that chooses goes to the
// kernel, and the rest of its group follows (stack.ErrShared: a member
// the engine does not serve shares their port).
func (e *Engine) SetReuseportSelect(fd int, opt string) {
	s := e.get(fd)
	if s == nil {
		// A stream socket: its listen reads it (Listen), or its listener
		// leaves netstack's group now.
		if fd >= 0 && fd < MaxFD && streamDomain(fd) != 0 {
			e.noteStream(fd, func(n *kernelStream) { n.selects = opt })
			if reusePort(fd) {
				e.handover(fd, e.listener(fd), selectsCause(opt, "connection"))
			}
		}
		return
	}
	s.mu.Lock()
	s.selects = opt
	state := s.state
	s.mu.Unlock()
	if state == StateOffloaded && reusePort(fd) {
		e.toKernel(s, selectsCause(opt, "datagram"))
	}
}
