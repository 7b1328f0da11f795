package engine

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// PublishInterval is how often the engine publishes its counters for
// `vmaxdp stats` and looks at its requests.
const PublishInterval = 100 * time.Millisecond

// Mux names a multiplexer, for its counters.
type Mux int

// The multiplexers.
const (
	MuxSelect Mux = iota
	MuxPoll
	MuxEpoll
	numMux
)

// muxCounters are stats.Iomux, field for field.
type muxCounters struct {
	Calls          atomic.Uint64
	RxReadyOS      atomic.Uint64
	RxReadyOffload atomic.Uint64
	Timeouts       atomic.Uint64
	Errors         atomic.Uint64
	PollHit        atomic.Uint64
	PollMiss       atomic.Uint64
	PollingNanos   atomic.Uint64
}

// publisher is the engine's side of the stats file.
type publisher struct {
	w        *stats.Writer
	statsOut *os.File // VMAXDP_STATS_FILE
	stop     chan struct{}
	done     chan struct{}
	shutdown sync.Once

	mu        sync.Mutex // everything below; Publish runs under it
	snap      stats.Snapshot
	zeroSeen  uint64
	dumpSeen  uint64
	levelSeen int
	detSeen   int
	xdpBase   map[*xsk.Socket]xsk.Statistics // XDP_STATISTICS at the last zeroing
	// ruleNames are the rules' names (steer.Rule.String) as published,
	// each marked with the last publish that saw it (gen): a server with
	// thousands of connections, a rule each, formatted every one ten
	// times a second (1.4% of the machine beside lighttpd closing 6,000
	// connections a second, perf).
	ruleNames map[steer.Rule]*ruleName
	gen       uint64
}

type ruleName struct {
	name string
	gen  uint64
}

// ruleName returns r's name, formatted once while r is installed. Caller
// holds mu.
func (pub *publisher) ruleName(r steer.Rule) string {
	n := pub.ruleNames[r]
	if n == nil {
		n = &ruleName{name: r.String()}
		pub.ruleNames[r] = n
	}
	n.gen = pub.gen
	return n.name
}

// forgetRules drops the names of the rules the last publish did not
// see. Caller holds mu.
func (pub *publisher) forgetRules() {
	for r, n := range pub.ruleNames {
		if n.gen != pub.gen {
			delete(pub.ruleNames, r)
		}
	}
}

// startStats opens VMAXDP_STATS_FILE and the stats file and starts
// publishing. Failing to publish is logged, never fatal: the application
// runs on without `vmaxdp stats`.
func (e *Engine) startStats() error {
	pub := &publisher{stop: make(chan struct{}), done: make(chan struct{}), levelSeen: -1, detSeen: -1,
		xdpBase: map[*xsk.Socket]xsk.Statistics{}, ruleNames: map[steer.Rule]*ruleName{}}
	e.pub = pub
	if e.p.StatsFile != "" {
		f, err := stats.OpenHigh(e.p.StatsFile, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("%sSTATS_FILE %s: %w", params.Prefix, e.p.StatsFile, err)
		}
		pub.statsOut = f
	}
	if e.p.StatsDir == "" {
		close(pub.done)
		return nil
	}
	w, err := stats.Create(e.p.StatsDir, os.Getpid())
	if err != nil {
		e.Log.Printf(params.LevelWarning, "counters not published, vmaxdp stats will not see this process: %v", err)
		close(pub.done)
		return nil
	}
	pub.w = w
	pub.snap.Process = stats.Process{PID: os.Getpid(), Program: e.program, Cmdline: cmdline(), Version: Version,
		CPUUsageStats: e.p.CPUUsageStats}
	e.publish()
	go func() {
		defer close(pub.done)
		t := time.NewTicker(PublishInterval)
		defer t.Stop()
		for {
			select {
			case <-pub.stop:
				return
			case <-t.C:
				e.serveRequests()
				e.publish()
			}
		}
	}()
	return nil
}

func cmdline() string {
	b, err := os.ReadFile("/proc/self/cmdline")
	if err != nil {
		return strings.Join(os.Args, " ")
	}
	return strings.Join(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00"), " ")
}

// Shutdown publishes a last time, writes VMAXDP_STATS_FILE for the
// sockets still open and removes the stats file. The process is exiting;
// later calls do nothing.
func (e *Engine) Shutdown() {
	e.mu.Lock()
	e.exiting = true
	e.mu.Unlock()
	if e.pub != nil {
		e.pub.shutdown.Do(e.shutdown)
	}
	e.stopClaims()
	e.exitTCP()
	for _, st := range e.openStacks() {
		st.Exiting()
	}
}

// FlushStacks sends what the sockets' sends left on the stacks' TX rings
// for a coalesced kick (stack.Stack.FlushSends): the process is exiting
// or becoming another program, and a datagram it sent must leave before
// it goes, as the kernel's would.
func (e *Engine) FlushStacks() {
	for _, st := range e.openStacks() {
		st.FlushSends()
	}
}

// CloseStacks shuts the engine down (Shutdown) and closes its stacks, which
// detaches their steering programs: for a Go program or test that ends its
// use of the engine before it exits. The preload library only shuts down:
// the process is exiting, and the next engine cleans what it left.
func (e *Engine) CloseStacks() error {
	e.Shutdown()
	e.WaitOpens()
	e.mu.Lock()
	defer e.mu.Unlock()
	var errs []error
	for name, st := range e.stacks {
		errs = append(errs, st.Close())
		delete(e.stacks, name)
	}
	return errors.Join(errs...)
}

func (e *Engine) shutdown() {
	pub := e.pub
	if pub.w != nil {
		close(pub.stop)
		<-pub.done
	}
	if pub.statsOut != nil {
		e.eachSocket(func(s *Socket, _ int) { e.writeStatsFile(s) })
		// And the TCP sockets open at exit (exitTCP closes them after).
		snap := stats.Snapshot{}
		e.tcpRecords(&snap, map[ruleKey]int{})
		for i := range snap.Sockets {
			e.writeCloseReport(&snap.Sockets[i])
		}
		pub.mu.Lock()
		// What the stacks dropped before any socket counted it.
		var b strings.Builder
		for _, st := range e.openStacks() {
			var snap stats.Snapshot
			e.stackRecords(st, &snap, map[ruleKey]int{})
			stats.WriteStacksReport(&b, &snap)
		}
		pub.statsOut.WriteString(b.String())
		stats.CloseHigh(pub.statsOut)
		pub.statsOut = nil
		pub.mu.Unlock()
		if e.peers != nil {
			e.peers.Written()
		}
	}
	if pub.w != nil {
		if err := pub.w.Close(); err != nil {
			e.Log.Printf(params.LevelWarning, "%v", err)
		}
	}
}

// writeStatsFile appends s's counters to VMAXDP_STATS_FILE.
func (e *Engine) writeStatsFile(s *Socket) {
	pub := e.pub
	if pub == nil || pub.statsOut == nil {
		return
	}
	var rec stats.Socket
	e.socketRecord(s, &rec)
	e.writeCloseReport(&rec)
}

// writeCloseReport appends the record of a socket closing (or open at
// exit) to VMAXDP_STATS_FILE.
func (e *Engine) writeCloseReport(rec *stats.Socket) {
	pub := e.pub
	if pub == nil || pub.statsOut == nil {
		return
	}
	var b strings.Builder
	stats.WriteCloseReport(&b, rec)
	pub.mu.Lock()
	if pub.statsOut != nil {
		pub.statsOut.WriteString(b.String())
	}
	pub.mu.Unlock()
}

// eachSocket calls fn for each socket once, under its first fd (a dup
// is not a socket of its own).
func (e *Engine) eachSocket(fn func(s *Socket, fd int)) {
	for fd := range e.fdsInUse() {
		s := e.fds.Load(fd)
		if s == nil {
			continue
		}
		s.mu.Lock()
		first := s.fd == fd // Close moves s.fd under s.mu
		s.mu.Unlock()
		if first {
			fn(s, fd)
		}
	}
}

// loadCounters copies atomic counters into a stats struct whose fields
// carry the same names in the same order (TestCounterNames checks).
func loadCounters(dst, src any) {
	d, s := reflect.ValueOf(dst).Elem(), reflect.ValueOf(src).Elem()
	for i := range s.NumField() {
		d.Field(i).SetUint(s.Field(i).Addr().Interface().(*atomic.Uint64).Load())
	}
}

// zeroCounters zeroes a struct of atomic counters (vmaxdp stats -z);
// increments racing with it land before or after, never half-way.
func zeroCounters(c any) {
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		v.Field(i).Addr().Interface().(*atomic.Uint64).Store(0)
	}
}

// socketRecord fills rec with s.
func (e *Engine) socketRecord(s *Socket, rec *stats.Socket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*rec = stats.Socket{FD: s.fd, Proto: "udp", Blocking: !s.nonblock.Load(), Reason: s.reason, KernelDrops: kernelDrops(s.fd)}
	switch s.state {
	case StateOffloaded:
		rec.State = stats.StateOffloaded
	case StateKernel:
		rec.State = stats.StateKernel
	default:
		rec.State = stats.StateCandidate
	}
	c := s.conn.Load()
	if c == nil {
		local, remote := sockAddrs(s.fd)
		if !local.IsValid() {
			// An AF_INET6 socket of IPv6 only, left on the kernel.
			local, remote = sockAddrs6(s.fd)
		}
		if local.IsValid() {
			rec.Local = local.String()
		}
		if remote.IsValid() {
			rec.Remote = remote.String()
		}
		for _, g := range s.groups {
			rec.Groups = append(rec.Groups, g.String())
		}
		rec.ReusePort = reusePort(s.fd)
		// What its kernel socket served before a decision, or since.
		rec.Counters.RxOSPackets, rec.Counters.RxOSBytes = s.osRxPackets.Load(), s.osRxBytes.Load()
		rec.Counters.TxOSPackets, rec.Counters.TxOSBytes = s.osTxPackets.Load(), s.osTxBytes.Load()
		return
	}
	rec.ReusePort = c.ReusePort()
	rec.Interface = c.Stack().Interface()
	if why := c.Stack().KernelOnly(); why != "" {
		rec.Reason = "its kernel socket serves it: " + why
	}
	rec.Local = c.LocalAddrPort().String()
	if r := c.RemoteAddrPort(); r.IsValid() {
		rec.Remote = r.String()
	}
	for _, g := range c.Groups() {
		rec.Groups = append(rec.Groups, g.String())
	}
	for _, id := range c.Rules() {
		rec.Rules = append(rec.Rules, uint32(id))
	}
	p, b := c.QueueLen()
	rec.RxQueuePackets, rec.RxQueueBytes = uint64(p), uint64(b)
	rec.RxBytesLimit = uint64(c.RxBytesLimit())
	loadCounters(&rec.Counters, c.Counters)
}

// kernelDrops reads the datagrams the kernel socket fd dropped
// (SO_MEMINFO's SK_MEMINFO_DROPS), 0 when it cannot be read.
func kernelDrops(fd int) uint64 {
	var mem [unix.SK_MEMINFO_VARS]uint32
	n := uint32(unsafe.Sizeof(mem))
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_MEMINFO,
		uintptr(unsafe.Pointer(&mem[0])), uintptr(unsafe.Pointer(&n)), 0)
	if errno != 0 || n < (unix.SK_MEMINFO_DROPS+1)*4 {
		return 0
	}
	return uint64(mem[unix.SK_MEMINFO_DROPS])
}

// publish takes a snapshot and writes it to the stats file.
func (e *Engine) publish() {
	pub := e.pub
	pub.mu.Lock()
	defer pub.mu.Unlock()
	snap := &pub.snap
	snap.Process.Published = time.Now().UnixNano()
	snap.Process.LogLevel, snap.Process.LogDetails = e.Log.Level(), e.Log.Details()
	for i, m := range []*stats.Iomux{&snap.Process.Select, &snap.Process.Poll, &snap.Process.Epoll} {
		loadCounters(m, &e.mux[i])
	}
	snap.Sockets = snap.Sockets[:0]
	snap.Process.SocketsHidden = 0
	owner := map[ruleKey]int{}
	e.eachSocket(func(s *Socket, fd int) {
		if e.p.StatsFDNum > 0 && len(snap.Sockets) >= e.p.StatsFDNum {
			snap.Process.SocketsHidden++
			return
		}
		snap.Sockets = append(snap.Sockets, stats.Socket{})
		rec := &snap.Sockets[len(snap.Sockets)-1]
		e.socketRecord(s, rec)
		for _, id := range rec.Rules {
			owner[ruleKey{rec.Interface, id}] = fd
		}
	})
	e.tcpRecords(snap, owner)
	snap.Queues, snap.Programs, snap.Rules = snap.Queues[:0], snap.Programs[:0], snap.Rules[:0]
	pub.gen++
	for _, st := range e.openStacks() {
		e.stackRecords(st, snap, owner)
	}
	pub.forgetRules()
	if err := pub.w.Publish(snap); err != nil {
		e.Log.Printf(params.LevelWarning, "%v", err)
	}
}

type ruleKey struct {
	ifname string
	id     uint32
}

func (e *Engine) openStacks() []*stack.Stack {
	e.mu.Lock()
	defer e.mu.Unlock()
	sts := make([]*stack.Stack, 0, len(e.stacks))
	for _, st := range e.stacks {
		sts = append(sts, st)
	}
	slices.SortFunc(sts, func(a, b *stack.Stack) int { return strings.Compare(a.Interface(), b.Interface()) })
	return sts
}

// stackRecords adds st's program, queues and rules to snap. Caller holds
// pub.mu.
func (e *Engine) stackRecords(st *stack.Stack, snap *stats.Snapshot, owner map[ruleKey]int) {
	prog := st.Program()
	mode := prog.Mode().String()
	pr := stats.Program{Interface: st.Interface(), Netns: st.NetnsInode(), XDPMode: mode, PinDir: prog.PinDir()}
	if pc, err := prog.Counters(); err != nil {
		pr.CountersError = err.Error()
	} else {
		pr.Counters = pc
	}
	sc := &st.Counters
	pr.Stack = stats.StackCounters{RxFrames: sc.RxFrames.Load(), RxNoSocket: sc.RxNoSocket.Load(),
		NeighUnresolved: sc.NeighUnresolved.Load(), RxProgressFrames: sc.RxProgressFrames.Load(),
		RxPartialChecksum: sc.RxPartialChecksum.Load(), RxSourceRejected: sc.RxSourceRejected.Load(),
		RxSourceUnchecked: sc.RxSourceUnchecked.Load(), RxSpilled: sc.RxSpilled.Load()}
	for r := range sc.RxDropped {
		if n := sc.RxDropped[r].Load(); n > 0 {
			pr.Stack.RxDropped = append(pr.Stack.RxDropped, stats.Drop{Reason: header.Result(r).String(), Packets: n})
		}
	}
	if nc, ok := st.Netstack(); ok {
		pr.HasTCP = true
		loadCounters(&pr.TCP, &st.TCPCounters) // the link's, the first fields
		// The rest are stack.NetstackCounters, field for field
		// (TestCounterNames).
		dst, src := reflect.ValueOf(&pr.TCP).Elem(), reflect.ValueOf(nc)
		link := reflect.TypeFor[stack.TCPCounters]().NumField()
		for i := range src.NumField() {
			dst.Field(link + i).SetUint(src.Field(i).Uint())
		}
	}
	snap.Programs = append(snap.Programs, pr)
	for _, be := range st.Backends() {
		x, ok := be.(*xsk.Socket)
		if !ok {
			continue
		}
		pools, occ := x.Pools(), x.Occupancy()
		q := stats.Queue{Interface: st.Interface(), Queue: x.Queue(), Backend: "AF_XDP", XDPMode: mode, ZeroCopy: x.ZeroCopy(),
			RingSize: uint64(pools.RingSize), RxRing: uint64(occ.Rx), TxRing: uint64(occ.Tx),
			FillRing: uint64(occ.Fill), CompletionRing: uint64(occ.Completion),
			RxPoolSize: uint64(pools.RxSize), RxPoolFree: uint64(pools.RxFree),
			TxPoolSize: uint64(pools.TxSize), TxPoolFree: uint64(pools.TxFree)}
		loadCounters(&q.Counters, &x.Counters)
		if xs, err := x.Statistics(); err != nil {
			q.StatisticsError = err.Error()
		} else {
			b := e.pub.xdpBase[x]
			q.Statistics = stats.XDPStatistics{RxDropped: xs.Rx_dropped - b.Rx_dropped,
				RxInvalidDescs: xs.Rx_invalid_descs - b.Rx_invalid_descs, TxInvalidDescs: xs.Tx_invalid_descs - b.Tx_invalid_descs,
				RxRingFull: xs.Rx_ring_full - b.Rx_ring_full, RxFillRingEmptyDescs: xs.Rx_fill_ring_empty_descs - b.Rx_fill_ring_empty_descs,
				TxRingEmptyDescs: xs.Tx_ring_empty_descs - b.Tx_ring_empty_descs}
		}
		snap.Queues = append(snap.Queues, q)
	}
	rules, err := prog.RuleSnapshots()
	for _, rs := range rules {
		r := stats.Rule{Interface: st.Interface(), ID: uint32(rs.ID), Rule: e.pub.ruleName(rs.Rule), FD: -1, Counters: rs.Counters}
		if fd, ok := owner[ruleKey{st.Interface(), uint32(rs.ID)}]; ok {
			r.FD = fd
		}
		if err != nil {
			r.CountersError = err.Error()
		}
		snap.Rules = append(snap.Rules, r)
	}
}

// serveRequests does what `vmaxdp stats` asked: zero the counters, change
// the log level or details, dump sockets to the log.
func (e *Engine) serveRequests() {
	pub := e.pub
	c, err := pub.w.Control()
	if err != nil {
		e.Log.Printf(params.LevelWarning, "%v", err)
		return
	}
	if c.LogLevel >= 0 && c.LogLevel != pub.levelSeen {
		pub.levelSeen = c.LogLevel
		e.Log.SetLevel(c.LogLevel)
		e.Log.Printf(params.LevelInfo, "log level set to %s by vmaxdp stats", params.LevelNames[min(c.LogLevel, len(params.LevelNames)-1)])
	}
	if c.LogDetails >= 0 && c.LogDetails != pub.detSeen {
		pub.detSeen = c.LogDetails
		e.Log.SetDetails(c.LogDetails)
	}
	if c.ZeroRequest != pub.zeroSeen {
		pub.zeroSeen = c.ZeroRequest
		e.zero()
		if err := pub.w.AckZero(c.ZeroRequest); err != nil {
			e.Log.Printf(params.LevelWarning, "%v", err)
		}
	}
	if c.DumpRequest != pub.dumpSeen {
		pub.dumpSeen = c.DumpRequest
		e.dump(c.DumpFD, c.DumpLevel)
	}
}

// zero zeroes every counter the engine publishes.
func (e *Engine) zero() {
	e.eachSocket(func(s *Socket, _ int) {
		if c := s.conn.Load(); c != nil {
			zeroCounters(c.Counters)
		}
	})
	for i := range e.mux {
		zeroCounters(&e.mux[i])
	}
	pub := e.pub
	pub.mu.Lock()
	defer pub.mu.Unlock()
	for _, st := range e.openStacks() {
		st.Counters.Zero()
		if err := st.Program().ZeroCounters(); err != nil {
			e.Log.Printf(params.LevelWarning, "%v", err)
		}
		for _, be := range st.Backends() {
			if x, ok := be.(*xsk.Socket); ok {
				zeroCounters(&x.Counters)
				if xs, err := x.Statistics(); err == nil {
					pub.xdpBase[x] = xs
				}
			}
		}
	}
	e.Log.Printf(params.LevelInfo, "counters zeroed by vmaxdp stats")
}

// dump writes fd's counters (0: every socket's) to the log at level.
func (e *Engine) dump(fd, level int) {
	var rec stats.Socket
	found := false
	e.eachSocket(func(s *Socket, f int) {
		if fd != 0 && f != fd {
			return
		}
		found = true
		e.socketRecord(s, &rec)
		var b strings.Builder
		stats.WriteFDDump(&b, &rec)
		for _, l := range strings.Split(strings.TrimRight(b.String(), "\n"), "\n") {
			e.Log.Printf(level, "%s", l)
		}
	})
	if !found {
		e.Log.Printf(level, "fd dump: fd %d is not a socket vmaxdp knows", fd)
	}
}
