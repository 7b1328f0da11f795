// Package steer attaches the XDP steering program (bpf/steer.c) to an
// interface and manages its rules, its XSKMAP and its counters.
//
// One Program owns one interface. Its program, link and maps are pinned
// under PinDir/<netns inode>_<ifindex>/ so that other tools (vmaxdp stats,
// nettrace) read the counters by path. A later Attach that finds our program
// with no live process holding it (its engine was killed) detaches it first;
// one that finds a live owner, or any XDP program that is not ours, refuses
// with an error naming it. This package never replaces a program silently.
//
// Rule changes and counter reads are safe for concurrent use.
package steer

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	vbpf "github.com/vmaxdp/vmaxdp/bpf"
	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
)

// PinDirName names the directory, under the pin directory, of the program
// on one interface: "<netns inode>_<ifindex>", unique on the host.
func PinDirName(netns uint32, ifindex int) string {
	return strconv.FormatUint(uint64(netns), 10) + "_" + strconv.Itoa(ifindex)
}

// ParsePinDirName reads a name PinDirName made.
func ParsePinDirName(name string) (netns uint32, ifindex int, ok bool) {
	ns, idx, ok := strings.Cut(name, "_")
	n, err1 := strconv.ParseUint(ns, 10, 32)
	i, err2 := strconv.ParseUint(idx, 10, 31)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return uint32(n), int(i), true
}

// DefaultPinDir is where programs and maps are pinned.
const DefaultPinDir = "/sys/fs/bpf/vmaxdp"

// RemoveNetnsPins removes the pins of every interface of the network
// namespace whose inode is netns, under pinDir (DefaultPinDir when
// empty), for a namespace that is going away: an engine killed there left
// them (a clean exit removes its own), and no engine would ever start in
// that namespace again to clear them.
func RemoveNetnsPins(pinDir string, netns uint32) error {
	if pinDir == "" {
		pinDir = DefaultPinDir
	}
	return eachOfNetns(pinDir, "", netns, func(path string) error {
		if err := os.RemoveAll(path); err != nil {
			return fmt.Errorf("steer: remove pins: %w", err)
		}
		return nil
	})
}

// eachOfNetns calls fn with the path of each entry of dir named after an
// interface of the network namespace whose inode is netns (PinDirName,
// then suffix), and joins its errors. A missing dir has none.
func eachOfNetns(dir, suffix string, netns uint32, fn func(path string) error) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("steer: %w", err)
	}
	var errs []error
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), suffix)
		if ns, _, valid := ParsePinDirName(name); ok && valid && ns == netns {
			errs = append(errs, fn(filepath.Join(dir, e.Name())))
		}
	}
	return errors.Join(errs...)
}

// MaxRules is the capacity of each rule map but the 5-tuple one, and the
// number of rules with counters (MAX_RULES in steer.c).
const MaxRules = 4096

// MaxConns is the capacity of the 5-tuple rule map (MAX_CONNS in
// steer.c), which takes a rule for each TCP connection. A 5-tuple rule
// gets an id with counters while more than countedReserve of those are
// free, and one without past that (MaxRules and above: its counters read
// zero), so that connections never take the last ids from listeners and
// UDP sockets, nor stop at 4,096.
const MaxConns = 65536

// countedReserve is how many ids with counters 5-tuple rules leave to
// the other kinds.
const countedReserve = 1024

var (
	// ErrForeignProgram: another XDP program is attached to the interface.
	ErrForeignProgram = errors.New("foreign XDP program attached")
	// ErrBusy: a live vmaxdp engine owns the interface.
	ErrBusy = errors.New("interface in use by another vmaxdp engine")
	// ErrNoRuleSpace: all rule slots are taken.
	ErrNoRuleSpace = errors.New("no rule slot left")
)

// Mode is the XDP attach mode actually obtained.
type Mode int

const (
	ModeNative Mode = iota + 1
	ModeGeneric
)

func (m Mode) String() string {
	switch m {
	case ModeNative:
		return "native"
	case ModeGeneric:
		return "generic"
	}
	return "none"
}

// Options configure Attach. The zero value means defaults.
type Options struct {
	// PinDir is the bpffs directory for pins (default DefaultPinDir).
	PinDir string
	// Generic forces generic (skb) XDP; by default native is tried first
	// and generic used, with a log line, when the driver refuses.
	Generic bool
	// Baseline attaches vmaxdp_pass, the empty XDP_PASS program, instead of
	// the steering program; it exists to measure the steering cost.
	Baseline bool
	// LockDir holds the files whose locks say which engine owns an
	// interface (default DefaultLockDir).
	LockDir string
	// MaxFrameLen is the longest frame the AF_XDP sockets take (0: no
	// limit); longer frames, and frames in several buffers, are passed to
	// the kernel and counted in the rule's too_long (a redirect would drop
	// them).
	MaxFrameLen uint32
	// DeferPin leaves the pins to Pin: for a caller that may exit before
	// it takes the program on (the preload engine opens a stack on a
	// goroutine). Unpinned, the program and its maps go with the process
	// however it ends; pinned, they would stay on the interface for as
	// long as the pins' mount namespace lives.
	DeferPin bool
	// UDPOnly: the program steers UDP alone (the preload engine without
	// VMAXDP_TCP), and AddRule refuses TCP rules. The maps only TCP uses,
	// handover_flows and stack_syns, then hold one entry each: LRU maps
	// are preallocated, and their 65,536 entries each took 3 ms of every
	// Attach.
	UDPOnly bool
	// OnLink, when set, is told of the fd of each XDP link the program
	// makes (at Attach, and at each attach after a Detach); the function
	// it returns runs before the program closes that link (Detach,
	// Close). The preload engine hands a copy to its helper process
	// (internal/peernotify), which closes it once the process has ended:
	// the kernel's detach, which on a veth waits for two RCU grace
	// periods (15-20 ms), no longer holds up the process's exit.
	OnLink func(fd int) (release func())
}

// RuleKind says which fields of a Rule are matched.
type RuleKind int

const (
	// Rule5Tuple matches protocol, local and remote address and port.
	Rule5Tuple RuleKind = iota
	// RuleMcast matches protocol, multicast group and port.
	RuleMcast
	// Rule3Tuple matches protocol, local address and port.
	Rule3Tuple
	// RulePort matches protocol and local port on any address.
	RulePort
)

func (k RuleKind) String() string {
	return [...]string{"5tuple", "mcast", "3tuple", "port"}[k]
}

// Rule selects packets to steer. Local is the destination of received
// packets (for RuleMcast, the group).
type Rule struct {
	Kind   RuleKind
	Proto  uint8 // unix.IPPROTO_UDP or unix.IPPROTO_TCP
	Local  netip.AddrPort
	Remote netip.AddrPort
}

func (r Rule) String() string {
	p := "udp"
	if r.Proto == unix.IPPROTO_TCP {
		p = "tcp"
	}
	switch r.Kind {
	case Rule5Tuple:
		return fmt.Sprintf("%s %s %s<-%s", r.Kind, p, r.Local, r.Remote)
	case RulePort:
		return fmt.Sprintf("%s %s *:%d", r.Kind, p, r.Local.Port())
	}
	return fmt.Sprintf("%s %s %s", r.Kind, p, r.Local)
}

// RuleID identifies an installed rule and its counters.
type RuleID uint32

// RuleCounters are a rule's counters summed over CPUs (struct
// rule_counters). RedirectFailures (no AF_XDP socket on the arrival
// queue) and TooLong count what did not reach the stack: UDP passed to the
// kernel socket, TCP dropped (the kernel would reset the stack's
// connection; the sender sends it again).
type RuleCounters struct {
	MatchedPackets   uint64 `json:"matched_packets"`
	MatchedBytes     uint64 `json:"matched_bytes"`
	RedirectFailures uint64 `json:"redirect_failures"`
	TooLong          uint64 `json:"too_long"`
}

// ProgCounters are the program's counters summed over CPUs (struct prog_counters).
type ProgCounters struct {
	Passed      uint64 `json:"passed"`
	Redirected  uint64 `json:"redirected"`
	NonIP       uint64 `json:"non_ip"`
	Fragments   uint64 `json:"fragments"`
	ParseErrors uint64 `json:"parse_errors"`
	// MartianSources: a rule's packets from a source the kernel drops on
	// input (a group, 0.0.0.0, 127.0.0.0/8), passed to it to drop.
	MartianSources uint64 `json:"martian_sources"`
}

// Program is the steering program attached to one interface.
type Program struct {
	ifname  string
	ifindex int
	udpOnly bool // Options.UDPOnly
	cpus    int  // possible CPUs: each rule's row in rule_stats
	dir     string
	mode    Mode
	objs    vbpf.SteerObjects
	link    link.Link     // nil while detached (Detach); guarded by mu after Attach
	prog    *ebpf.Program // what link attaches, kept to attach it again
	flags   link.XDPAttachFlags
	ns      netns.NsHandle // the interface's namespace, to attach it again from any thread
	// dirfd and parentfd are the pin directory and the one holding it,
	// open once KeepFor readied the program for a process that will not
	// reach them by path; -1 until then.
	dirfd, parentfd int
	// lockfd holds the interface's lock file (lockPath) while the
	// program lives (own.go); -1 when it does not.
	lockfd   int
	lockPath string

	// onLink is Options.OnLink; linkRelease its release for the current
	// link, nil: none.
	onLink      func(fd int) (release func())
	linkRelease func()

	mu    sync.Mutex
	rules map[RuleID]Rule
	free  []RuleID // ids with counters
	// freeConns and nextConn give out the ids without counters: those
	// given back first, then the next never used (takeIDLocked).
	freeConns []RuleID
	nextConn  RuleID
	ports     map[uint16]uint32 // local port -> rules naming it
	handover  map[RuleID]bool   // rules in handover (Handover)
}

// Attach loads the steering program and attaches it to ifname in the
// calling thread's network namespace.
func Attach(ifname string, opts *Options) (_ *Program, err error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.PinDir == "" {
		o.PinDir = DefaultPinDir
	}
	if o.LockDir == "" {
		o.LockDir = DefaultLockDir
	}
	l, err := netnsutil.LinkByName(nil, ifname)
	if err != nil {
		return nil, fmt.Errorf("steer %s: %w", ifname, err)
	}
	p := &Program{ifname: ifname, ifindex: l.Attrs().Index, rules: map[RuleID]Rule{}, ports: map[uint16]uint32{}, handover: map[RuleID]bool{}, ns: -1, dirfd: -1, parentfd: -1, lockfd: -1}
	if err := ensureBPFFS(filepath.Dir(o.PinDir)); err != nil {
		return nil, fmt.Errorf("steer %s: %w", ifname, err)
	}
	ino, err := netnsInode()
	if err != nil {
		return nil, fmt.Errorf("steer %s: %w", ifname, err)
	}
	p.dir = filepath.Join(o.PinDir, PinDirName(uint32(ino), p.ifindex))
	if p.lockfd, p.lockPath, err = ownLock(o.LockDir, ino, p.ifindex); err != nil {
		return nil, fmt.Errorf("steer %s: %w", ifname, err)
	}
	if err := p.claim(l); err != nil {
		ownRelease(p.lockfd, p.lockPath)
		return nil, fmt.Errorf("steer %s: %w", ifname, err)
	}
	defer func() {
		if err != nil {
			p.Close()
			err = fmt.Errorf("steer %s: %w", ifname, err)
		}
	}()
	if p.ns, err = netns.Get(); err != nil {
		return p, fmt.Errorf("network namespace: %w", err)
	}
	p.ns = netns.NsHandle(highfd.Move(int(p.ns)))
	spec, err := vbpf.LoadSteer()
	if err != nil {
		return p, fmt.Errorf("load: %w", err)
	}
	if err := spec.Variables["max_frame_len"].Set(o.MaxFrameLen); err != nil {
		return p, fmt.Errorf("load: max_frame_len: %w", err)
	}
	if p.udpOnly = o.UDPOnly; p.udpOnly {
		for _, name := range []string{"handover_flows", "stack_syns"} {
			spec.Maps[name].MaxEntries = 1
		}
		if err := spec.Variables["udp_only"].Set(uint32(1)); err != nil {
			return p, fmt.Errorf("load: udp_only: %w", err)
		}
	}
	if p.cpus, err = ebpf.PossibleCPU(); err != nil {
		return p, fmt.Errorf("load: %w", err)
	}
	if err := spec.Variables["nr_cpus"].Set(uint32(p.cpus)); err != nil {
		return p, fmt.Errorf("load: nr_cpus: %w", err)
	}
	spec.Maps["rule_stats"].MaxEntries = MaxRules * uint32(p.cpus)
	if err := spec.LoadAndAssign(&p.objs, nil); err != nil {
		return p, fmt.Errorf("load: %w", err)
	}
	keep, other := p.objs.VmaxdpSteer, p.objs.VmaxdpPass
	if o.Baseline {
		keep, other = other, keep
	}
	other.Close()
	p.objs.SteerPrograms = vbpf.SteerPrograms{}
	if p.prog, err = moveProgHigh(keep); err != nil {
		return p, err
	}
	if !o.Generic {
		p.link, err = link.AttachXDP(link.XDPOptions{Program: p.prog, Interface: p.ifindex, Flags: link.XDPDriverMode})
		p.mode, p.flags = ModeNative, link.XDPDriverMode
	}
	if o.Generic || err != nil {
		if err != nil {
			slog.Warn("steer: native XDP refused, using generic XDP (slower)", "interface", ifname, "err", err)
		}
		p.link, err = link.AttachXDP(link.XDPOptions{Program: p.prog, Interface: p.ifindex, Flags: link.XDPGenericMode})
		p.mode, p.flags = ModeGeneric, link.XDPGenericMode
	}
	if err != nil {
		return p, fmt.Errorf("attach XDP: %w", err)
	}
	for i := MaxRules - 1; i >= 0; i-- {
		p.free = append(p.free, RuleID(i))
	}
	p.nextConn = MaxRules
	if err := p.moveHigh(); err != nil {
		return p, err
	}
	p.onLink = o.OnLink
	p.linkMade()
	if o.DeferPin {
		return p, nil
	}
	return p, p.pin()
}

// holdersWait bounds how long Attach waits for the processes that hold
// a dead engine's program to let it go (waitHolders).
const holdersWait = 2 * time.Second

// waitHolders waits, within holdersWait, until no other process holds
// the program prog, and names those that still do. The
// caller holds the interface's lock, so no live engine owns it: what
// holds it is the dead engine's helper, which lets the link go once it
// has kicked the rings (Options.OnLink), or a tool that reads its maps.
// The next process of a loop that runs one after another looked while
// the helper of the one before was still detaching, and stayed on the
// kernel.
func waitHolders(prog uint32) []string {
	deadline := time.Now().Add(holdersWait)
	for {
		holders := programHolders(prog)
		if len(holders) == 0 || time.Now().After(deadline) {
			return holders
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitDetached waits, within holdersWait, for the interface to show
// program prog gone (its last link is released, or being released), and
// returns the interface as it is then.
func (p *Program) waitDetached(prog uint32) (netlink.Link, bool) {
	for deadline := time.Now().Add(holdersWait); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if l, err := netnsutil.LinkByIndex(p.ifindex); err == nil && (l.Attrs().Xdp == nil || l.Attrs().Xdp.ProgId != prog) {
			return l, true
		}
	}
	return nil, false
}

// linkMade tells Options.OnLink of the link just made.
func (p *Program) linkMade() {
	if raw, ok := p.link.(interface{ FD() int }); ok && p.onLink != nil {
		p.linkRelease = p.onLink(raw.FD())
	}
}

// linkGone runs OnLink's release before the link closes: a copy left
// with the helper would keep the program attached.
func (p *Program) linkGone() {
	if p.linkRelease != nil {
		p.linkRelease()
		p.linkRelease = nil
	}
}

// Pin pins the program's link and maps in its pin directory, which
// Options.DeferPin left to this call.
func (p *Program) Pin() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.link == nil {
		return fmt.Errorf("steer %s: pin: the program is not attached", p.ifname)
	}
	if err := p.pin(); err != nil {
		return fmt.Errorf("steer %s: %w", p.ifname, err)
	}
	return nil
}

// moveProgHigh moves a program's fd to the top of the fd space (package
// highfd), as moveHigh does the link's and the maps'.
func moveProgHigh(prog *ebpf.Program) (*ebpf.Program, error) {
	defer prog.Close()
	fd, err := highfd.Dup(prog.FD())
	if err != nil {
		return nil, fmt.Errorf("dup program: %w", err)
	}
	np, err := ebpf.NewProgramFromFD(fd)
	if err != nil {
		highfd.Close(fd)
		return nil, fmt.Errorf("program from fd %d: %w", fd, err)
	}
	return np, nil
}

// moveHigh moves the fds the program keeps (link and maps) to the top of
// the fd space (package highfd): left where the loader put them, a dozen
// fds with their BTF would sit on the application's next numbers.
func (p *Program) moveHigh() error {
	if err := p.moveLinkHigh(); err != nil {
		return err
	}
	for name, m := range p.maps() {
		fd, err := highfd.Dup((*m).FD())
		if err != nil {
			return fmt.Errorf("dup map %s: %w", name, err)
		}
		nm, err := ebpf.NewMapFromFD(fd)
		if err != nil {
			highfd.Close(fd)
			return fmt.Errorf("map %s from fd %d: %w", name, fd, err)
		}
		(*m).Close()
		*m = nm
	}
	return nil
}

func (p *Program) moveLinkHigh() error {
	raw, ok := p.link.(interface{ FD() int })
	if !ok {
		return fmt.Errorf("link %T has no fd", p.link)
	}
	fd, err := highfd.Dup(raw.FD())
	if err != nil {
		return fmt.Errorf("dup link: %w", err)
	}
	l, err := link.NewFromFD(fd)
	if err != nil {
		highfd.Close(fd)
		return fmt.Errorf("link from fd %d: %w", fd, err)
	}
	p.link.Close()
	p.link = l
	return nil
}

// Detach takes the program off the interface while it has no rule, and
// reports whether it did: with XDP attached, a veth copies every frame it
// passes to the kernel (it wants XDP's headroom), which cost the kernel's
// own traffic 6% in DNS queries per second here. The maps and AF_XDP
// registrations stay; the next AddRule attaches it again.
func (p *Program) Detach() (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.link == nil || len(p.rules) > 0 || p.dirfd >= 0 {
		return false, nil
	}
	if raw, ok := p.link.(interface{ FD() int }); ok {
		highfd.Forget(raw.FD())
	}
	p.linkGone()
	err := errors.Join(p.link.Unpin(), p.link.Close())
	p.link = nil
	if err != nil {
		return true, fmt.Errorf("steer %s: detach: %w", p.ifname, err)
	}
	return true, nil
}

// RuleCount is how many rules are installed.
func (p *Program) RuleCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.rules)
}

// Attached reports whether the program is on the interface (see Detach).
func (p *Program) Attached() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.link != nil
}

// reattachLocked attaches the program again after Detach, in the mode it
// had; nothing else may have taken the interface meanwhile. Caller holds
// p.mu.
func (p *Program) reattachLocked() error {
	return netnsutil.Do(p.ns, p.reattachHere)
}

func (p *Program) reattachHere() error {
	l, err := netnsutil.LinkByIndex(p.ifindex)
	if err != nil {
		return fmt.Errorf("steer %s: attach again: %w", p.ifname, err)
	}
	if x := l.Attrs().Xdp; x != nil && x.Attached {
		return fmt.Errorf("steer %s: attach again: %w: program id %d took the interface while vmaxdp had no rule on it", p.ifname, ErrForeignProgram, x.ProgId)
	}
	if p.link, err = link.AttachXDP(link.XDPOptions{Program: p.prog, Interface: p.ifindex, Flags: p.flags}); err != nil {
		p.link = nil
		return fmt.Errorf("steer %s: attach again: %w", p.ifname, err)
	}
	if err := p.moveLinkHigh(); err != nil {
		return fmt.Errorf("steer %s: attach again: %w", p.ifname, err)
	}
	p.linkMade()
	if err := p.link.Pin(filepath.Join(p.dir, "link")); err != nil {
		return fmt.Errorf("steer %s: attach again: pin link: %w", p.ifname, err)
	}
	return nil
}

// maps names each of the program's maps as it is pinned.
func (p *Program) maps() map[string]**ebpf.Map {
	o := &p.objs.SteerMaps
	return map[string]**ebpf.Map{
		"prog_stats": &o.ProgStats, "rule_stats": &o.RuleStats,
		"rules_5tuple": &o.Rules5tuple, "rules_mcast": &o.RulesMcast, "rules_3tuple": &o.Rules3tuple,
		"rules_port": &o.RulesPort, "xsks_map": &o.XsksMap, "active_ports": &o.ActivePorts,
		"handover_flows": &o.HandoverFlows, "stack_syns": &o.StackSyns, "arrival_stamps": &o.ArrivalStamps,
	}
}

// claim makes sure nothing else owns the interface. The program attached,
// if any, is found through netlink; when it is ours, the processes holding
// it are found through /proc/*/fdinfo, which works whichever mount namespace
// holds its pins (`ip netns exec` gives each command a fresh /sys). With no
// live holder, its owner died without cleaning up: its link is detached by
// ID and its pins, where visible, removed.
func (p *Program) claim(l netlink.Link) error {
	x := l.Attrs().Xdp
	if x != nil && x.Attached && x.ProgId != 0 {
		prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(x.ProgId))
		if err != nil {
			return fmt.Errorf("%w: program id %d is attached to %s (%w)", ErrForeignProgram, x.ProgId, p.ifname, err)
		}
		defer prog.Close()
		info, err := prog.Info()
		if err != nil {
			return fmt.Errorf("%w: program id %d is attached to %s (%w)", ErrForeignProgram, x.ProgId, p.ifname, err)
		}
		if info.Name != progName && info.Name != baselineName {
			return fmt.Errorf("%w: program id %d (name %q) is attached to %s; vmaxdp will not replace it (detach it with `ip link set dev %s xdp off`)",
				ErrForeignProgram, x.ProgId, info.Name, p.ifname, p.ifname)
		}
		if holders := waitHolders(uint32(x.ProgId)); len(holders) > 0 {
			return fmt.Errorf("%w: %s", ErrBusy, strings.Join(holders, ", "))
		}
		// The last holder may have let the link go, detaching it.
		err = detachXDPLink(p.ifindex, ebpf.ProgramID(x.ProgId))
		if errors.Is(err, errNoLink) {
			if now, gone := p.waitDetached(x.ProgId); gone {
				return p.claim(now)
			}
		}
		if err != nil {
			return fmt.Errorf("detach program id %d left by a dead vmaxdp engine: %w", x.ProgId, err)
		}
		slog.Info("steer: detached the program of a vmaxdp engine that died without cleaning up", "interface", p.ifname, "prog_id", x.ProgId)
	}
	if err := os.RemoveAll(p.dir); err != nil {
		return fmt.Errorf("remove stale pins %s: %w", p.dir, err)
	}
	return nil
}

// Program names as the kernel shortens them (BPF_OBJ_NAME_LEN is 16).
const (
	progName     = "vmaxdp_steer"
	baselineName = "vmaxdp_pass"
)

func (p *Program) pin() error {
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return fmt.Errorf("pin dir: %w", err)
	}
	if err := p.link.Pin(filepath.Join(p.dir, "link")); err != nil {
		return fmt.Errorf("pin link: %w", err)
	}
	for name, m := range p.maps() {
		if err := (*m).Pin(filepath.Join(p.dir, name)); err != nil {
			return fmt.Errorf("pin map %s: %w", name, err)
		}
	}
	return nil
}

// Mode is the XDP mode obtained.
func (p *Program) Mode() Mode { return p.mode }

// PinDir is where the program's link and maps are pinned.
func (p *Program) PinDir() string { return p.dir }

// KeepFor readies the program for a process about to confine itself:
// to give up root for uid (setuid; -1: it stays root), or to chroot.
// After that it could neither attach the program again nor reach its
// pins by path (bpffs and the pin directory are root's, mode 0700; a
// chroot hides them): the program stays attached while it has no rule
// (Detach does nothing), the pin directory goes to uid, and it and its
// parent stay open, so that Close still removes the pins, and the
// directory itself while the process is root (otherwise the next Attach
// on the interface, or the namespace's removal, clears it).
func (p *Program) KeepFor(uid int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dirfd >= 0 {
		if uid >= 0 {
			return p.chownPins(uid)
		}
		return nil
	}
	if p.link == nil {
		if err := p.reattachLocked(); err != nil {
			return err
		}
	}
	open := func(dir string) (int, error) {
		fd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, fmt.Errorf("steer %s: keep: %w", p.ifname, err)
		}
		return highfd.Move(fd), nil
	}
	var err error
	if p.parentfd, err = open(filepath.Dir(p.dir)); err != nil {
		return err
	}
	if p.dirfd, err = open(p.dir); err != nil {
		highfd.Close(p.parentfd)
		p.parentfd = -1
		return err
	}
	if uid >= 0 {
		return p.chownPins(uid)
	}
	return nil
}

// pinNames are the names of the program's pins in its directory.
func (p *Program) pinNames() []string {
	return append([]string{"link"}, slices.Sorted(maps.Keys(p.maps()))...)
}

// chownPins gives the pin directory and its pins to uid. Caller holds
// p.mu; p.dirfd is open.
func (p *Program) chownPins(uid int) error {
	for _, name := range p.pinNames() {
		if err := unix.Fchownat(p.dirfd, name, uid, -1, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("steer %s: keep for uid %d: pin %s: %w", p.ifname, uid, name, err)
		}
	}
	if err := unix.Fchown(p.dirfd, uid, -1); err != nil {
		return fmt.Errorf("steer %s: keep for uid %d: pin directory: %w", p.ifname, uid, err)
	}
	return nil
}

// unpinKept removes the pins of a program KeepFor readied, through the
// open directories.
func (p *Program) unpinKept() error {
	var errs []error
	for _, name := range p.pinNames() {
		if err := unix.Unlinkat(p.dirfd, name, 0); err != nil && err != unix.ENOENT {
			errs = append(errs, fmt.Errorf("unpin %s: %w", name, err))
		}
	}
	// In root's directory: only a process that stayed root may.
	unix.Unlinkat(p.parentfd, filepath.Base(p.dir), unix.AT_REMOVEDIR)
	errs = append(errs, highfd.Close(p.dirfd), highfd.Close(p.parentfd))
	p.dirfd, p.parentfd = -1, -1
	return errors.Join(errs...)
}

// Interface names the interface the program is attached to.
func (p *Program) Interface() string { return p.ifname }

// RegisterQueue puts an AF_XDP socket in the XSKMAP slot of its queue.
func (p *Program) RegisterQueue(queue, fd int) error {
	if err := p.objs.XsksMap.Put(uint32(queue), uint32(fd)); err != nil {
		return fmt.Errorf("steer %s: register AF_XDP fd %d for queue %d: %w", p.ifname, fd, queue, err)
	}
	return nil
}

// UnregisterQueue empties the XSKMAP slot of a queue.
func (p *Program) UnregisterQueue(queue int) error {
	if err := p.objs.XsksMap.Delete(uint32(queue)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("steer %s: unregister queue %d: %w", p.ifname, queue, err)
	}
	return nil
}

func (p *Program) ruleMap(k RuleKind) *ebpf.Map {
	return [...]*ebpf.Map{p.objs.Rules5tuple, p.objs.RulesMcast, p.objs.Rules3tuple, p.objs.RulesPort}[k]
}

func ruleKey(r Rule) (vbpf.SteerFlowKey, error) {
	var k vbpf.SteerFlowKey
	if r.Proto != unix.IPPROTO_UDP && r.Proto != unix.IPPROTO_TCP {
		return k, fmt.Errorf("rule %s: protocol %d: want UDP or TCP", r, r.Proto)
	}
	k.Proto = r.Proto
	k.LocalPort = htons(r.Local.Port())
	if r.Local.Port() == 0 {
		return k, fmt.Errorf("rule %s: local port 0", r)
	}
	switch r.Kind {
	case Rule5Tuple:
		if !r.Remote.Addr().Is4() || !r.Local.Addr().Is4() {
			return k, fmt.Errorf("rule %s: 5-tuple needs IPv4 local and remote addresses", r)
		}
		k.RemoteAddr = addr32(r.Remote.Addr())
		k.RemotePort = htons(r.Remote.Port())
		k.LocalAddr = addr32(r.Local.Addr())
	case RuleMcast:
		if !r.Local.Addr().Is4() || !r.Local.Addr().IsMulticast() {
			return k, fmt.Errorf("rule %s: not an IPv4 multicast group", r)
		}
		k.LocalAddr = addr32(r.Local.Addr())
	case Rule3Tuple:
		if !r.Local.Addr().Is4() || r.Local.Addr().IsMulticast() || r.Local.Addr().IsUnspecified() {
			return k, fmt.Errorf("rule %s: needs an IPv4 unicast local address", r)
		}
		k.LocalAddr = addr32(r.Local.Addr())
	case RulePort:
	default:
		return k, fmt.Errorf("rule kind %d: unknown", r.Kind)
	}
	return k, nil
}

// AddRule installs a rule; its counters start at zero.
func (p *Program) AddRule(r Rule) (_ RuleID, err error) {
	k, err := ruleKey(r)
	if err != nil {
		return 0, fmt.Errorf("steer %s: %w", p.ifname, err)
	}
	if r.Proto == unix.IPPROTO_TCP && p.udpOnly {
		return 0, fmt.Errorf("steer %s: rule %s: %w: the program was attached for UDP alone (Options.UDPOnly)", p.ifname, r, errors.ErrUnsupported)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	id, err := p.takeIDLocked(r)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			p.giveIDLocked(id)
		}
	}()
	if p.link == nil {
		if err := p.reattachLocked(); err != nil {
			return 0, err
		}
	}
	if err := p.zeroRuleCounters(id); err != nil {
		return 0, fmt.Errorf("steer %s: rule %s: reset counters: %w", p.ifname, r, err)
	}
	if err := p.ruleMap(r.Kind).Update(k, vbpf.SteerRuleValue{RuleId: uint32(id)}, ebpf.UpdateNoExist); err != nil {
		return 0, fmt.Errorf("steer %s: rule %s: %w", p.ifname, r, err)
	}
	port := r.Local.Port()
	if p.ports[port] == 0 {
		if err := p.objs.ActivePorts.Put(uint32(port), uint32(1)); err != nil {
			p.ruleMap(r.Kind).Delete(k)
			return 0, fmt.Errorf("steer %s: rule %s: activate port: %w", p.ifname, r, err)
		}
	}
	p.ports[port]++
	p.rules[id] = r
	if r.Kind == Rule5Tuple && r.Proto == unix.IPPROTO_TCP {
		// The connection has its rule: it leaves stack_syns, which keeps
		// the ones not accepted yet for ReleaseUnaccepted. A failure
		// costs at most a needless SYN to a closed connection's peer
		// should the process die.
		p.objs.StackSyns.Delete(k)
	}
	return id, nil
}

// counted says whether rule id has counters.
func counted(id RuleID) bool { return id < MaxRules }

// takeIDLocked gives r an id: one with counters, unless r is a 5-tuple
// rule and no more than countedReserve of those are free. Caller holds
// p.mu.
func (p *Program) takeIDLocked(r Rule) (RuleID, error) {
	switch {
	case r.Kind == Rule5Tuple && len(p.free) <= countedReserve:
		if n := len(p.freeConns); n > 0 {
			id := p.freeConns[n-1]
			p.freeConns = p.freeConns[:n-1]
			return id, nil
		}
		if p.nextConn < MaxRules+MaxConns {
			p.nextConn++
			return p.nextConn - 1, nil
		}
		return 0, fmt.Errorf("steer %s: rule %s: %w (%d 5-tuple rules)", p.ifname, r, ErrNoRuleSpace, MaxConns)
	case len(p.free) == 0:
		return 0, fmt.Errorf("steer %s: rule %s: %w (%d rules)", p.ifname, r, ErrNoRuleSpace, MaxRules)
	}
	id := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return id, nil
}

// giveIDLocked makes id free again. Caller holds p.mu.
func (p *Program) giveIDLocked(id RuleID) {
	if counted(id) {
		p.free = append(p.free, id)
	} else {
		p.freeConns = append(p.freeConns, id)
	}
}

// installedLocked is the installed rule id and its key. Caller holds p.mu.
func (p *Program) installedLocked(id RuleID) (Rule, vbpf.SteerFlowKey, error) {
	r, ok := p.rules[id]
	if !ok {
		return r, vbpf.SteerFlowKey{}, fmt.Errorf("steer %s: rule id %d: not installed", p.ifname, id)
	}
	k, err := ruleKey(r)
	return r, k, err
}

// StampArrivals makes the program stamp every frame it redirects from now
// on with the time it redirected it, in XDP metadata (bpf.ArrivalMetaLen
// bytes just before the frame), for receive timestamps; off, it stops.
func (p *Program) StampArrivals(on bool) error {
	var v uint32
	if on {
		v = 1
	}
	if err := p.objs.ArrivalStamps.Put(uint32(0), v); err != nil {
		return fmt.Errorf("steer %s: arrival stamps: %w", p.ifname, err)
	}
	return nil
}

// ruleHandover and ruleKernel are steer.c's enum rule_flags.
const (
	ruleHandover = 1
	ruleKernel   = 2
)

// ToKernel makes a TCP 5-tuple rule give its connection to the kernel,
// ahead of the listener's rule that would steer it: a kernel socket took
// the connection over (TCP_REPAIR). The rule stays until RemoveRule.
func (p *Program) ToKernel(id RuleID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flagLocked(id, ruleKernel, "to the kernel", isTCP5Tuple, "TCP 5-tuple rules only")
}

// FromKernel takes back what ToKernel did: the rule steers its
// connection to the stack again (a move that failed half-way).
func (p *Program) FromKernel(id RuleID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.flagLocked(id, 0, "back from the kernel", isTCP5Tuple, "TCP 5-tuple rules only")
}

func isTCP5Tuple(r Rule) bool { return r.Kind == Rule5Tuple }

// Handover puts a TCP rule in handover: its listeners are going back to
// the kernel while the stack still holds connections they made. From now
// on a new connection (a SYN) goes to the kernel, and the rest of it
// after it, while the segments of the connections the stack holds still
// come to the stack. RemoveRule ends it.
func (p *Program) Handover(id RuleID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.flagLocked(id, ruleHandover, "handover", func(Rule) bool { return true }, "TCP rules only"); err != nil {
		return err
	}
	p.handover[id] = true
	return nil
}

// flagLocked sets flags on the installed TCP rule id, which must be one
// kind says (else EINVAL with only); what names the change in errors.
// Caller holds p.mu.
func (p *Program) flagLocked(id RuleID, flags uint32, what string, kind func(Rule) bool, only string) error {
	r, k, err := p.installedLocked(id)
	if err != nil {
		return err
	}
	if r.Proto != unix.IPPROTO_TCP || !kind(r) {
		return fmt.Errorf("steer %s: %s of rule %s: %w: %s", p.ifname, what, r, unix.EINVAL, only)
	}
	if err := p.ruleMap(r.Kind).Update(k, vbpf.SteerRuleValue{RuleId: uint32(id), Flags: flags}, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("steer %s: %s of rule %s: %w", p.ifname, what, r, err)
	}
	return nil
}

// RemoveRule uninstalls a rule.
func (p *Program) RemoveRule(id RuleID) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, k, err := p.installedLocked(id)
	if err != nil {
		return err
	}
	if err := p.ruleMap(r.Kind).Delete(k); err != nil {
		return fmt.Errorf("steer %s: remove rule %s: %w", p.ifname, r, err)
	}
	// The rule is gone from the program: its slot and port count go with
	// it whatever handover_flows says.
	var forgetErr error
	if p.handover[id] {
		delete(p.handover, id)
		if err := p.forgetHandoverFlows(k, r.Kind); err != nil {
			forgetErr = fmt.Errorf("steer %s: remove rule %s: %w", p.ifname, r, err)
		}
	}
	var portErr error
	port := r.Local.Port()
	p.ports[port]--
	if p.ports[port] == 0 {
		delete(p.ports, port)
		if err := p.objs.ActivePorts.Put(uint32(port), uint32(0)); err != nil {
			portErr = fmt.Errorf("steer %s: deactivate port %d: %w", p.ifname, port, err)
		}
	}
	delete(p.rules, id)
	p.giveIDLocked(id)
	return errors.Join(forgetErr, portErr)
}

// forgetHandoverFlows removes from handover_flows the connections the
// kernel took while the rule of key k was in handover: the rule is gone,
// and the same 5-tuple must not go to the kernel when the port is
// offloaded again.
func (p *Program) forgetHandoverFlows(k vbpf.SteerFlowKey, kind RuleKind) error {
	var (
		fk    vbpf.SteerFlowKey
		v     uint32
		stale []vbpf.SteerFlowKey
	)
	it := p.objs.HandoverFlows.Iterate()
	for it.Next(&fk, &v) {
		if fk.Proto == k.Proto && fk.LocalPort == k.LocalPort && (kind == RulePort || fk.LocalAddr == k.LocalAddr) {
			stale = append(stale, fk)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("handover_flows: %w", err)
	}
	for _, fk := range stale {
		if err := p.objs.HandoverFlows.Delete(fk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("handover_flows: %w", err)
		}
	}
	return nil
}

// ConnMap is the program's map of 5-tuple rules, which a process that
// outlives this one holds to release its TCP connections (ReleaseTCPConns).
func (p *Program) ConnMap() *ebpf.Map { return p.objs.Rules5tuple }

// SYNMap is the program's map of the connections whose SYN went to the
// stack under a listener's rule, which a process that died before it
// accepted them leaves to tell of (ReleaseUnaccepted).
func (p *Program) SYNMap() *ebpf.Map { return p.objs.StackSyns }

// UnacceptedAge bounds how long ago the SYN of a connection that
// ReleaseUnaccepted tells of came: a connection waits in the accept queue
// for as long as the application takes to accept it, and one older is
// most likely closed. Telling the peer of a closed connection is harmless:
// its kernel answers the SYN with a reset.
const UnacceptedAge = 10 * time.Minute

// ReleaseUnaccepted gives the kernel the connections of syns (the SYNMap
// of a program whose process is gone) that came within UnacceptedAge and
// have no rule in conns (its ConnMap): those netstack held for the
// application to accept, which reached the stack through their listener's
// rule. Each gets a 5-tuple rule marked for the kernel in conns, so that
// its peer's next segment reaches the kernel, which has no socket for it
// and resets it; the program would have dropped it for want of an AF_XDP
// socket. They are returned. Call it after ReleaseTCPConns, whose
// connections it leaves alone.
func ReleaseUnaccepted(syns, conns *ebpf.Map) ([]Rule, error) {
	var now unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &now); err != nil {
		return nil, fmt.Errorf("stack_syns: clock: %w", err)
	}
	oldest := uint64(max(0, now.Nano()-UnacceptedAge.Nanoseconds()))
	var (
		k     vbpf.SteerFlowKey
		at    uint64
		keys  []vbpf.SteerFlowKey
		out   []Rule
		errs  []error
		value = vbpf.SteerRuleValue{RuleId: MaxRules + MaxConns, Flags: ruleKernel} // an id with no counters
	)
	it := syns.Iterate()
	for it.Next(&k, &at) {
		if at >= oldest {
			keys = append(keys, k)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("stack_syns: %w", err)
	}
	for _, k := range keys {
		r := connRule(k)
		switch err := conns.Update(k, value, ebpf.UpdateNoExist); {
		case errors.Is(err, ebpf.ErrKeyExist):
			// Accepted: ReleaseTCPConns told of it.
		case err != nil:
			errs = append(errs, fmt.Errorf("rule %s: %w", r, err))
		default:
			out = append(out, r)
		}
	}
	return out, errors.Join(errs...)
}

// connRule is the TCP 5-tuple rule whose key k is.
func connRule(k vbpf.SteerFlowKey) Rule {
	return Rule{Kind: Rule5Tuple, Proto: unix.IPPROTO_TCP,
		Local:  netip.AddrPortFrom(addrOf32(k.LocalAddr), ntohs(k.LocalPort)),
		Remote: netip.AddrPortFrom(addrOf32(k.RemoteAddr), ntohs(k.RemotePort))}
}

// ReleaseTCPConns gives the kernel the TCP connections of m, the ConnMap
// of a program whose process is gone: each TCP 5-tuple rule not marked
// for the kernel yet is marked so, as ToKernel marks one, and its rule is
// returned. The kernel has no socket for such a connection, and answers
// its peer's next segment with a reset, where the program would have
// dropped it for want of an AF_XDP socket.
func ReleaseTCPConns(m *ebpf.Map) ([]Rule, error) {
	var (
		k     vbpf.SteerFlowKey
		v     vbpf.SteerRuleValue
		keys  []vbpf.SteerFlowKey
		vals  []vbpf.SteerRuleValue
		conns []Rule
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if k.Proto == unix.IPPROTO_TCP && v.Flags&ruleKernel == 0 {
			keys, vals = append(keys, k), append(vals, v)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("rules_5tuple: %w", err)
	}
	var errs []error
	for i, k := range keys {
		v := vals[i]
		v.Flags |= ruleKernel
		r := connRule(k)
		if err := m.Update(k, v, ebpf.UpdateExist); err != nil {
			// Gone meanwhile: a connection closing as its process died.
			if !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("rule %s: %w", r, err))
			}
			continue
		}
		conns = append(conns, r)
	}
	return conns, errors.Join(errs...)
}

// Rules returns the installed rules by id.
func (p *Program) Rules() map[RuleID]Rule {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[RuleID]Rule, len(p.rules))
	for k, v := range p.rules {
		out[k] = v
	}
	return out
}

// RuleSnapshot is an installed rule with its counters.
type RuleSnapshot struct {
	ID       RuleID
	Rule     Rule
	Counters RuleCounters
}

// RuleSnapshots returns the installed rules, by id, with their counters.
// The counters are read in one batch lookup of ids 0 up to the highest
// counted id installed, not one lookup per rule: a server that takes 2,500
// connections a second holds as many rules, and the stats publisher reads
// them ten times a second. Where the kernel has no batch lookup, they are
// read one by one. The rules are returned with the error when the counters
// cannot be read.
func (p *Program) RuleSnapshots() ([]RuleSnapshot, error) {
	p.mu.Lock()
	out := make([]RuleSnapshot, 0, len(p.rules))
	for id, r := range p.rules {
		out = append(out, RuleSnapshot{ID: id, Rule: r})
	}
	p.mu.Unlock()
	slices.SortFunc(out, func(a, b RuleSnapshot) int { return int(a.ID) - int(b.ID) })
	n := 0 // the counted ids 0..n-1 hold every counted rule
	for _, s := range out {
		if counted(s.ID) {
			n = int(s.ID) + 1
		}
	}
	if n == 0 {
		return out, nil
	}
	cpus := p.cpus
	keys := make([]uint32, n*cpus)
	per := make([]vbpf.SteerRuleCounters, n*cpus)
	var cursor ebpf.MapBatchCursor
	got, err := p.objs.RuleStats.BatchLookup(&cursor, keys, per, nil)
	switch {
	case errors.Is(err, ebpf.ErrNotSupported):
		for i := range out {
			if out[i].Counters, err = p.RuleCounters(out[i].ID); err != nil {
				return out, err
			}
		}
		return out, nil
	case err != nil && !errors.Is(err, ebpf.ErrKeyNotExist):
		return out, fmt.Errorf("steer %s: rule counters: %w", p.ifname, err)
	case got != n*cpus:
		return out, fmt.Errorf("steer %s: rule counters: batch lookup gave %d of %d", p.ifname, got, n*cpus)
	}
	for i := range out {
		if !counted(out[i].ID) {
			continue
		}
		id := int(out[i].ID)
		out[i].Counters = sumRuleCounters(per[id*cpus : (id+1)*cpus])
	}
	return out, nil
}

// RuleCounters reads a rule's counters, zero for a rule without any
// (see MaxConns).
func (p *Program) RuleCounters(id RuleID) (RuleCounters, error) {
	if !counted(id) {
		return RuleCounters{}, nil
	}
	per := make([]vbpf.SteerRuleCounters, p.cpus)
	for cpu := range per {
		if err := p.objs.RuleStats.Lookup(uint32(int(id)*p.cpus+cpu), &per[cpu]); err != nil {
			return RuleCounters{}, fmt.Errorf("steer %s: rule %d counters: %w", p.ifname, id, err)
		}
	}
	return sumRuleCounters(per), nil
}

// zeroRuleCounters zeroes a rule's row in rule_stats (none for an id
// without counters): one batch update, one update per CPU where the
// kernel has no batch operations.
func (p *Program) zeroRuleCounters(id RuleID) error {
	if !counted(id) {
		return nil
	}
	keys := make([]uint32, p.cpus)
	for cpu := range keys {
		keys[cpu] = uint32(int(id)*p.cpus + cpu)
	}
	zero := make([]vbpf.SteerRuleCounters, p.cpus)
	_, err := p.objs.RuleStats.BatchUpdate(keys, zero, nil)
	if !errors.Is(err, ebpf.ErrNotSupported) {
		return err
	}
	for i, k := range keys {
		if err := p.objs.RuleStats.Put(k, zero[i]); err != nil {
			return err
		}
	}
	return nil
}

// sumRuleCounters adds up a rule's per-CPU counters.
func sumRuleCounters(per []vbpf.SteerRuleCounters) RuleCounters {
	var c RuleCounters
	for _, v := range per {
		c.MatchedPackets += v.MatchedPackets
		c.MatchedBytes += v.MatchedBytes
		c.RedirectFailures += v.RedirectFailures
		c.TooLong += v.TooLong
	}
	return c
}

// Counters reads the program's counters.
func (p *Program) Counters() (ProgCounters, error) {
	return ReadProgCounters(p.objs.ProgStats)
}

// ZeroCounters zeroes the program's counters and its rules' (vmaxdp
// stats -z). Packets counted while it runs may survive the zeroing.
func (p *Program) ZeroCounters() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.objs.ProgStats.Put(uint32(0), make([]vbpf.SteerProgCounters, p.cpus)); err != nil {
		return fmt.Errorf("steer %s: zero prog_stats: %w", p.ifname, err)
	}
	for id := range p.rules {
		if err := p.zeroRuleCounters(id); err != nil {
			return fmt.Errorf("steer %s: zero rule %d counters: %w", p.ifname, id, err)
		}
	}
	return nil
}

// ReadProgCounters sums a prog_stats map, live or opened from its pin.
func ReadProgCounters(m *ebpf.Map) (ProgCounters, error) {
	var per []vbpf.SteerProgCounters
	if err := m.Lookup(uint32(0), &per); err != nil {
		return ProgCounters{}, fmt.Errorf("prog_stats: %w", err)
	}
	var c ProgCounters
	for _, v := range per {
		c.Passed += v.Passed
		c.Redirected += v.Redirected
		c.NonIP += v.NonIp
		c.Fragments += v.Fragments
		c.ParseErrors += v.ParseErrors
		c.MartianSources += v.MartianSources
	}
	return c, nil
}

// Close detaches the program and removes its pins.
func (p *Program) Close() error {
	var errs []error
	if raw, ok := p.link.(interface{ FD() int }); ok {
		highfd.Forget(raw.FD())
	}
	if p.prog != nil {
		highfd.Forget(p.prog.FD())
		errs = append(errs, p.prog.Close())
		p.prog = nil
	}
	if p.ns >= 0 {
		highfd.Close(int(p.ns))
		p.ns = -1
	}
	for _, m := range p.maps() {
		if *m != nil {
			highfd.Forget((*m).FD())
		}
	}
	kept := p.dirfd >= 0
	if kept {
		if err := p.unpinKept(); err != nil {
			errs = append(errs, err)
		}
	}
	if p.link != nil {
		if !kept {
			if err := p.link.Unpin(); err != nil {
				errs = append(errs, err)
			}
		}
		p.linkGone()
		if err := p.link.Close(); err != nil {
			errs = append(errs, err)
		}
		p.link = nil
	}
	if p.dir != "" && !kept {
		if err := os.RemoveAll(p.dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := p.objs.Close(); err != nil {
		errs = append(errs, err)
	}
	if p.lockfd >= 0 {
		ownRelease(p.lockfd, p.lockPath)
		p.lockfd = -1
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("steer %s: close: %w", p.ifname, err)
	}
	return nil
}
