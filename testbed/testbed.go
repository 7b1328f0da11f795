// Package testbed builds the veth test bed that tests, benchmarks and
// `make demo` run on: two network namespaces, A and B, joined by one veth
// pair, with addresses from the benchmarking range 198.18.0.0/15; or, as
// a container network on one host has it, each joined by a veth pair to a
// bridge in a third namespace, Hub (Options.Bridged).
//
// A bed is named; its namespaces are "vmx-NAME-a", "vmx-NAME-b" (and
// "vmx-NAME-h") and its links "vmxa" (in A) and "vmxb" (in B). Up removes any bed of the same name
// first, so a bed left by a killed run never blocks the next one, and
// RemoveStale removes beds whose name carries the pid of a process that is
// gone (the names tests use). A bed must never route anywhere but between
// its two ends: nothing here touches the host namespace's links or routes.
package testbed

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
	"github.com/vmaxdp/vmaxdp/steer"
)

const nsDir = "/var/run/netns"

// Side selects one end of the bed.
type Side int

const (
	A Side = iota
	B
	// Hub is a bridged bed's third namespace (Options.Bridged): the host
	// of the container network, whose bridge joins A and B.
	Hub
)

const numSides = 3

func (s Side) String() string { return [...]string{"a", "b", "h"}[s] }

// Options configure a bed. The zero value means defaults: a tuned bed.
type Options struct {
	// Queues is the number of RX and TX queues of each veth end (default 1).
	Queues int
	// MTU of both ends (default 1500).
	MTU int
	// Plain makes the veth pair as `ip link add NAME type veth peer name
	// PEER` makes it, as users have it: the kernel's default queues (one
	// allocated per possible CPU, one running), every offload on (TX
	// checksum offload among them, so the kernel's UDP leaves with a
	// partial checksum) and IPv6 on. The default bed is tuned instead:
	// Queues queues allocated and running, TX checksum offload and IPv6
	// off. Both beds route multicast to the veth. Plain excludes Queues.
	Plain bool
	// Bridged joins A and B through a bridge in a third namespace, Hub,
	// as docker's default network joins containers: each side's veth end
	// pairs with a port of the bridge, and the bridge holds the sides'
	// gateway, Gateway. Hub also holds Addr(Hub), in another subnet, which
	// the sides reach through the gateway: a routed peer, whose frames
	// come from the gateway's MAC address. A bridged bed is plain.
	Bridged bool
}

// Bed is a running test bed.
type Bed struct {
	Name string
	// Queues is the RX queues each end runs (ethtool -l).
	Queues int
	MTU    int
	// Plain: the bed was made with Options.Plain (TX checksum offload on).
	Plain bool
	// Bridged: the bed has a Hub (Options.Bridged).
	Bridged bool
	ns      [numSides]netns.NsHandle
}

// Prefix is the bed's subnet; side A is .1 and side B is .2.
var Prefix = netip.MustParsePrefix("198.18.0.0/24")

// Gateway is a bridged bed's bridge address, the sides' gateway to
// Beyond.
var Gateway = netip.MustParseAddr("198.18.0.254")

// Beyond is the subnet behind a bridged bed's gateway, where Addr(Hub) is.
var Beyond = netip.MustParsePrefix("198.18.1.0/24")

// Addr is the IPv4 address of a side; Hub's is in Beyond.
func (b *Bed) Addr(s Side) netip.Addr {
	return [...]netip.Addr{netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.1.1")}[s]
}

// Link is the name of a side's veth end, inside that side's namespace;
// Hub's is the bridge.
func (b *Bed) Link(s Side) string {
	if s == Hub {
		return "vmxbr"
	}
	return "vmx" + s.String()
}

// port is the name of the bridge's port that pairs with side s, in Hub.
func port(s Side) string { return "vmxp" + s.String() }

// sides are the bed's namespaces.
func (b *Bed) sides() []Side {
	if b.Bridged {
		return []Side{A, B, Hub}
	}
	return []Side{A, B}
}

// NSName is the name of a side's namespace (for `ip netns exec`).
func (b *Bed) NSName(s Side) string { return nsName(b.Name, s) }

// NS is a side's namespace handle.
func (b *Bed) NS(s Side) netns.NsHandle { return b.ns[s] }

func nsName(bed string, s Side) string { return "vmx-" + bed + "-" + s.String() }

// TestName returns a bed name unique to this process and n, recognised by
// RemoveStale once the process is gone.
func TestName(n int) string { return fmt.Sprintf("t%d-%d", os.Getpid(), n) }

// Up creates the bed called name, replacing a bed of that name left behind.
func Up(name string, opts *Options) (_ *Bed, err error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Bridged {
		o.Plain = true
	}
	if o.Plain && o.Queues != 0 {
		return nil, fmt.Errorf("testbed %s: a plain bed has the kernel's default queues: %d queues asked", name, o.Queues)
	}
	if o.Queues == 0 {
		o.Queues = 1
	}
	if o.MTU == 0 {
		o.MTU = 1500
	}
	if o.Queues < 1 || o.Queues > 64 {
		return nil, fmt.Errorf("testbed %s: %d queues: must be 1 to 64", name, o.Queues)
	}
	if o.MTU < 576 || o.MTU > 9000 {
		return nil, fmt.Errorf("testbed %s: MTU %d: must be 576 to 9000", name, o.MTU)
	}
	if name == "" || strings.ContainsAny(name, "/ ") || len(nsName(name, A)) > 64 {
		return nil, fmt.Errorf("testbed %q: bad name", name)
	}
	if err := Down(name); err != nil {
		return nil, err
	}
	b := &Bed{Name: name, Queues: o.Queues, MTU: o.MTU, Plain: o.Plain, Bridged: o.Bridged, ns: [numSides]netns.NsHandle{-1, -1, -1}}
	defer func() {
		if err != nil {
			b.Down()
			err = fmt.Errorf("testbed %s: %w", name, err)
		}
	}()
	for _, s := range b.sides() {
		if b.ns[s], err = newNamedNS(b.NSName(s)); err != nil {
			return b, fmt.Errorf("create namespace %s: %w", b.NSName(s), err)
		}
	}
	if o.Bridged {
		if err := b.bridge(); err != nil {
			return b, err
		}
		return b, b.readQueues()
	}
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{
			Name: b.Link(A), MTU: o.MTU, NumTxQueues: o.Queues, NumRxQueues: o.Queues,
			Namespace: netlink.NsFd(b.ns[A]),
		},
		PeerName: b.Link(B), PeerMTU: uint32(o.MTU), PeerNamespace: netlink.NsFd(b.ns[B]),
		PeerNumTxQueues: uint32(o.Queues), PeerNumRxQueues: uint32(o.Queues),
	}
	if o.Plain {
		// Zero counts: the kernel's defaults, as ip link add leaves them.
		veth.NumTxQueues, veth.NumRxQueues, veth.PeerNumTxQueues, veth.PeerNumRxQueues = 0, 0, 0, 0
	}
	// The pair is created from the host namespace straight into A and B,
	// so no name is ever taken in the host namespace.
	if err := netlink.LinkAdd(veth); err != nil {
		return b, fmt.Errorf("add veth pair: %w", err)
	}
	for _, s := range []Side{A, B} {
		if err := b.configure(s); err != nil {
			return b, err
		}
	}
	return b, b.readQueues()
}

// bridge makes a bridged bed's links: the bridge in Hub, a veth pair from
// each side to a port of it, and the addresses and routes (Options.Bridged).
func (b *Bed) bridge() error {
	h, err := netlink.NewHandleAt(b.ns[Hub])
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", b.NSName(Hub), err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: b.Link(Hub), MTU: b.MTU}}); err != nil {
		return fmt.Errorf("add bridge %s in %s: %w", b.Link(Hub), b.NSName(Hub), err)
	}
	br, err := netnsutil.LinkByName(h, b.Link(Hub))
	if err != nil {
		return fmt.Errorf("%s in %s: %w", b.Link(Hub), b.NSName(Hub), err)
	}
	for _, s := range []Side{A, B} {
		// Created from the host namespace straight into the side and Hub,
		// as Up's pair, with the kernel's default queues.
		veth := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: b.Link(s), MTU: b.MTU, Namespace: netlink.NsFd(b.ns[s])},
			PeerName:  port(s), PeerMTU: uint32(b.MTU), PeerNamespace: netlink.NsFd(b.ns[Hub]),
		}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth pair %s-%s: %w", b.Link(s), port(s), err)
		}
		p, err := netnsutil.LinkByName(h, port(s))
		if err != nil {
			return fmt.Errorf("%s in %s: %w", port(s), b.NSName(Hub), err)
		}
		if err := h.LinkSetMaster(p, br); err != nil {
			return fmt.Errorf("%s into %s: %w", port(s), b.Link(Hub), err)
		}
		if err := h.LinkSetUp(p); err != nil {
			return fmt.Errorf("set %s up in %s: %w", port(s), b.NSName(Hub), err)
		}
		if err := b.configure(s); err != nil {
			return err
		}
		if err := b.addRoute(s, &netlink.Route{Dst: prefixNet(Beyond), Gw: Gateway.AsSlice()}); err != nil {
			return err
		}
	}
	gw := &netlink.Addr{IPNet: &net.IPNet{IP: Gateway.AsSlice(), Mask: net.CIDRMask(Prefix.Bits(), 32)}}
	if err := h.AddrAdd(br, gw); err != nil {
		return fmt.Errorf("address %s on %s: %w", gw, b.Link(Hub), err)
	}
	lo, err := netnsutil.LinkByName(h, "lo")
	if err != nil {
		return fmt.Errorf("lo in %s: %w", b.NSName(Hub), err)
	}
	beyond := &netlink.Addr{IPNet: &net.IPNet{IP: b.Addr(Hub).AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := h.AddrAdd(lo, beyond); err != nil {
		return fmt.Errorf("address %s on lo in %s: %w", beyond, b.NSName(Hub), err)
	}
	for _, l := range []netlink.Link{lo, br} {
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up in %s: %w", l.Attrs().Name, b.NSName(Hub), err)
		}
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// handle opens a netlink handle in side s's namespace (the caller closes
// it) and finds s's link there.
func (b *Bed) handle(s Side) (*netlink.Handle, netlink.Link, error) {
	h, err := netlink.NewHandleAt(b.ns[s])
	if err != nil {
		return nil, nil, fmt.Errorf("netlink in %s: %w", b.NSName(s), err)
	}
	l, err := netnsutil.LinkByName(h, b.Link(s))
	if err != nil {
		h.Close()
		return nil, nil, fmt.Errorf("%s in %s: %w", b.Link(s), b.NSName(s), err)
	}
	return h, l, nil
}

// addRoute adds r in side s's namespace, through s's link.
func (b *Bed) addRoute(s Side, r *netlink.Route) error {
	h, l, err := b.handle(s)
	if err != nil {
		return err
	}
	defer h.Close()
	r.LinkIndex = l.Attrs().Index
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("route %s on %s in %s: %w", r.Dst, b.Link(s), b.NSName(s), err)
	}
	return nil
}

// readQueues reads the queues side A runs, and whether it offloads TX
// checksums (a plain bed does).
func (b *Bed) readQueues() error {
	return b.Do(A, func() error {
		q, plain, err := runningQueues(b.Link(A))
		b.Queues, b.Plain = q, plain
		return err
	})
}

func (b *Bed) configure(s Side) error {
	h, l, err := b.handle(s)
	if err != nil {
		return err
	}
	defer h.Close()
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: b.Addr(s).AsSlice(), Mask: net.CIDRMask(Prefix.Bits(), 32)}}
	if err := h.AddrAdd(l, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", addr, b.Link(s), err)
	}
	for _, name := range []string{b.Link(s), "lo"} {
		ll, err := netnsutil.LinkByName(h, name)
		if err != nil {
			return fmt.Errorf("%s in %s: %w", name, b.NSName(s), err)
		}
		if err := h.LinkSetUp(ll); err != nil {
			return fmt.Errorf("set %s up in %s: %w", name, b.NSName(s), err)
		}
	}
	// Multicast groups are routed to the veth, so group traffic stays on the bed.
	mc := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(224, 0, 0, 0), Mask: net.CIDRMask(4, 32)}}
	if err := h.RouteAdd(mc); err != nil {
		return fmt.Errorf("multicast route on %s: %w", b.Link(s), err)
	}
	// No IPv6 on the bed: router solicitations and DAD would be noise in
	// counters and traces.
	if b.Plain {
		return nil
	}
	return b.Do(s, func() error {
		if err := disableTxChecksum(b.Link(s)); err != nil {
			return err
		}
		for _, k := range []string{"all", "default", b.Link(s)} {
			p := "/proc/sys/net/ipv6/conf/" + k + "/disable_ipv6"
			if err := os.WriteFile(p, []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%s in %s: %w", p, b.NSName(s), err)
			}
		}
		return nil
	})
}

// Do runs fn on an OS thread switched into side s's namespace. Sockets and
// netlink handles that fn opens stay in that namespace after it returns.
func (b *Bed) Do(s Side, fn func() error) error {
	return Do(b.ns[s], fn)
}

// Do runs fn on an OS thread switched into the namespace ns.
func Do(ns netns.NsHandle, fn func() error) error { return netnsutil.Do(ns, fn) }

// Down removes the bed. Removing a namespace removes its veth end, and the
// peer with it.
func (b *Bed) Down() error {
	for i, h := range b.ns {
		if h >= 0 {
			h.Close()
			b.ns[i] = -1
		}
	}
	return Down(b.Name)
}

// Down removes the bed called name, if there is one, and the steering
// pins and lock files that engines killed in its namespaces left behind.
func Down(name string) error {
	var errs []error
	for _, s := range []Side{A, B, Hub} {
		n := nsName(name, s)
		fi, err := os.Stat(filepath.Join(nsDir, n))
		if err != nil {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			if err := steer.RemoveNetnsPins("", uint32(st.Ino)); err != nil {
				errs = append(errs, fmt.Errorf("namespace %s: %w", n, err))
			}
			if err := steer.RemoveNetnsLocks("", uint32(st.Ino)); err != nil {
				errs = append(errs, fmt.Errorf("namespace %s: %w", n, err))
			}
		}
		if err := deleteNamedNS(n); err != nil {
			errs = append(errs, fmt.Errorf("remove namespace %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// deleteNamedNS removes the namespace file name: unmounted, then removed.
// A file with no namespace mounted on it (a creation that failed after
// the file was made; one was found after a make test) is removed as it
// is: netns.DeleteNamed stops at its unmount (EINVAL), and every later
// Down failed on it.
func deleteNamedNS(name string) error {
	err := netns.DeleteNamed(name)
	if errors.Is(err, syscall.EINVAL) {
		return os.Remove(filepath.Join(nsDir, name))
	}
	return err
}

// List returns the names of the beds present.
func List() ([]string, error) {
	ents, err := os.ReadDir(nsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, e := range ents {
		n, ok := strings.CutPrefix(e.Name(), "vmx-")
		if !ok || len(n) < 3 || n[len(n)-2] != '-' {
			continue
		}
		n = n[:len(n)-2]
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out, nil
}

// RemoveStale removes beds named by TestName whose process is gone.
func RemoveStale() ([]string, error) {
	names, err := List()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, n := range names {
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(n, "t"), "-")
		pid, perr := strconv.Atoi(pidStr)
		if !strings.HasPrefix(n, "t") || !ok || perr != nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		if err := Down(n); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, n)
	}
	return removed, errors.Join(errs...)
}

// Open returns a bed that already exists.
func Open(name string) (*Bed, error) {
	b := &Bed{Name: name, ns: [numSides]netns.NsHandle{-1, -1, -1}}
	for _, s := range []Side{A, B} {
		h, err := netns.GetFromName(b.NSName(s))
		if err != nil {
			b.Down()
			return nil, fmt.Errorf("testbed %s: namespace %s: %w", name, b.NSName(s), err)
		}
		b.ns[s] = h
	}
	if h, err := netns.GetFromName(b.NSName(Hub)); err == nil {
		b.ns[Hub], b.Bridged = h, true
	}
	h, err := netlink.NewHandleAt(b.ns[A])
	if err == nil {
		defer h.Close()
		if l, err := netnsutil.LinkByName(h, b.Link(A)); err == nil {
			b.MTU = l.Attrs().MTU
		}
	}
	b.readQueues()
	return b, nil
}

// Close releases the bed's handles without removing it.
func (b *Bed) Close() {
	for i, h := range b.ns {
		if h >= 0 {
			h.Close()
			b.ns[i] = -1
		}
	}
}

func newNamedNS(name string) (netns.NsHandle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return -1, err
	}
	defer orig.Close()
	h, nerr := netns.NewNamed(name)
	if nerr != nil && !errors.Is(nerr, os.ErrExist) {
		// NewNamed leaves the file it made when the bind mount fails.
		os.Remove(filepath.Join(nsDir, name))
	}
	if err := netns.Set(orig); err != nil {
		runtime.LockOSThread()
		return -1, errors.Join(nerr, err)
	}
	return h, nerr
}
