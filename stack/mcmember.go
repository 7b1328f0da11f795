package stack

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"
)

// Multicast loopback. The kernel gives a socket's multicast a copy for
// this host (IP_MULTICAST_LOOP, on by default) only when a socket of the
// namespace is a member of the group on the output interface: that
// interface's membership list (ip_mc_output, ip_check_mc_rcu). A send
// the stack makes reaches the wire only, so such a send goes through the
// kernel while the group has a member here, and through the stack while
// it has none: the same copies as the kernel would make. Recent kernels
// (6.18 here) announce the interface's memberships (RTNLGRP_IPV4_MCADDR)
// and list them (RTM_GETMULTICAST for AF_INET); on one that does not,
// every group counts as having a member, and multicast with loopback on
// goes through the kernel.
//
// A member that joins just before a send may miss that datagram: the
// event reaches the stack once its watcher has run (under make test's
// load, 5 sends in a row went out first). A join has no order with
// another process's send but through a third channel, through which the
// kernel would deliver a datagram sent after the join returned.

// rtnlgrpIPv4McAddr is RTNLGRP_IPV4_MCADDR, which x/sys does not name
// yet.
const rtnlgrpIPv4McAddr = 37

// RTM_NEWMULTICAST and RTM_DELMULTICAST: the membership events.
const (
	rtmNewMulticast = 56
	rtmDelMulticast = 57
)

// watchMembers subscribes fd (the watcher's netlink socket) to the
// namespace's membership events and reads the interface's memberships.
// When the kernel has neither, the stack keeps treating every group as
// having a member here (mcMembers nil), and says so at DEBUG.
func (st *Stack) watchMembers(fd int) {
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, rtnlgrpIPv4McAddr); err != nil {
		slog.Debug(fmt.Sprintf("stack %s: multicast with IP_MULTICAST_LOOP on goes through the kernel: the kernel announces no memberships: %v", st.ifname, err))
		return
	}
	if err := st.readMembers(); err != nil {
		slog.Debug(fmt.Sprintf("stack %s: multicast with IP_MULTICAST_LOOP on goes through the kernel: %v", st.ifname, err))
	}
}

// readMembers reads the groups the interface is a member of in the
// stack's namespace (RTM_GETMULTICAST).
func (st *Stack) readMembers() error {
	var groups []netip.Addr
	req := routeDump(unix.RTM_GETMULTICAST, unix.SizeofIfAddrmsg, unix.AF_INET)
	err := st.rtDump(req, func(data []byte) {
		if g, ok := memberOf(data, st.ifindex); ok {
			groups = append(groups, g)
		}
	})
	if err != nil {
		st.mcMembers.Store(nil)
		return fmt.Errorf("read the memberships of %s: %w", st.ifname, err)
	}
	slices.SortFunc(groups, netip.Addr.Compare)
	groups = slices.Compact(groups)
	was := st.mcMembers.Swap(&groups)
	if was != nil {
		for _, g := range groups {
			if _, had := slices.BinarySearchFunc(*was, g, netip.Addr.Compare); !had {
				slog.Debug(fmt.Sprintf("stack %s: %v has a member on this host: multicast to it with IP_MULTICAST_LOOP on goes through the kernel", st.ifname, g))
			}
		}
		for _, g := range *was {
			if _, has := slices.BinarySearchFunc(groups, g, netip.Addr.Compare); !has {
				slog.Debug(fmt.Sprintf("stack %s: %v has no member on this host left: multicast to it is offloaded", st.ifname, g))
			}
		}
	}
	return nil
}

// memberOf reads a membership message (an ifaddrmsg and its IFA_MULTICAST
// attribute): the group, when the membership is ifindex's and IPv4.
func memberOf(data []byte, ifindex int) (netip.Addr, bool) {
	if len(data) < unix.SizeofIfAddrmsg || data[0] != unix.AF_INET ||
		int(binary.NativeEndian.Uint32(data[4:])) != ifindex {
		return netip.Addr{}, false
	}
	var g netip.Addr
	rtAttrs(data[unix.SizeofIfAddrmsg:], func(typ uint16, v []byte) {
		if typ == unix.IFA_MULTICAST && len(v) == 4 {
			g = netip.AddrFrom4([4]byte(v))
		}
	})
	return g, g.IsMulticast()
}

// localMember says whether group has a member on the interface in the
// stack's namespace (true when the kernel does not say).
func (st *Stack) localMember(group netip.Addr) bool {
	m := st.mcMembers.Load()
	if m == nil {
		return true
	}
	_, ok := slices.BinarySearchFunc(*m, group, netip.Addr.Compare)
	return ok
}
