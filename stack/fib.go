package stack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"golang.org/x/sys/unix"
)

// A copy of the namespace's IPv4 routes, for the source check with
// rp_filter on (source.go): with it a new source costs a search of a few
// prefixes instead of a netlink round trip under the receive lock, and
// needs no cap on lookups a second. It is taken only while the namespace
// routes as most hosts do, where the kernel's lookup is the longest
// prefix of its main table (which holds the local table's routes) and
// then of its default table (fib_lookup without custom rules): the three
// rules the kernel starts with, routes with no TOS, no source prefix, no
// nexthop objects and no dead or link-down nexthops, and at most
// fibMaxRoutes of them. Otherwise, and until the watcher has read it,
// each new source is asked of the kernel (sourceValid).

// fibMaxRoutes bounds the copy: a host with a router's table is asked,
// as the copy's search is linear.
const fibMaxRoutes = 1024

// rtaNHID is RTA_NH_ID: a route through a nexthop object.
const rtaNHID = 30

// sizeofFibRuleHdr is struct fib_rule_hdr's size: family, dst_len,
// src_len, tos, table, res1, res2, action, then flags (u32).
const sizeofFibRuleHdr = 12

// errFIBCustom says the namespace routes in a way the copy does not
// follow.
var errFIBCustom = errors.New("routing the copy does not follow")

// fibRoute is one route of the copy.
type fibRoute struct {
	dst      netip.Prefix
	typ      uint8 // RTN_*
	priority uint32
	devs     []int // the nexthops' interfaces
}

// fibCopy is the main table (with the local table's routes) and the
// default table, each longest prefix first, then lowest metric.
type fibCopy struct {
	main, deflt []fibRoute
}

// lookup is fib_lookup's answer for dst: the route, or false when none
// matches (or one whose type is an error: unreachable, blackhole,
// prohibit).
func (f *fibCopy) lookup(dst netip.Addr) (fibRoute, bool) {
tables:
	for _, table := range [2][]fibRoute{f.main, f.deflt} {
		for _, r := range table {
			if !r.dst.Contains(dst) {
				continue
			}
			switch r.typ {
			case unix.RTN_UNICAST, unix.RTN_LOCAL, unix.RTN_BROADCAST, unix.RTN_MULTICAST, unix.RTN_ANYCAST:
				return r, true
			case unix.RTN_THROW:
				continue tables
			}
			return fibRoute{}, false
		}
	}
	return fibRoute{}, false
}

// sourceOK is the kernel's source check (fib_validate_source with
// rp_filter mode, 1 strict or 2 loose) of a packet from src arriving on
// interface ifindex: the route back to src must be unicast (or local,
// with acceptLocal) and, strict, go through ifindex; an interface with no
// address has only the strict check.
func (f *fibCopy) sourceOK(src netip.Addr, ifindex int, mode int32, acceptLocal, hasAddr bool) bool {
	r, ok := f.lookup(src)
	if !ok {
		return false // EXDEV
	}
	if r.typ != unix.RTN_UNICAST && (r.typ != unix.RTN_LOCAL || !acceptLocal) {
		return false // EINVAL
	}
	if slices.Contains(r.devs, ifindex) {
		return true
	}
	return hasAddr && mode != 1
}

// readFIB reads the namespace's rules and IPv4 routes through the
// stack's netlink socket; errFIBCustom when they are not what the copy
// follows.
func (st *Stack) readFIB() (*fibCopy, error) {
	if err := st.defaultRules(); err != nil {
		return nil, err
	}
	f := &fibCopy{}
	var bad error
	err := st.rtDump(routeDump(unix.RTM_GETROUTE, unix.SizeofRtMsg, unix.AF_INET), func(data []byte) {
		if bad != nil {
			return
		}
		table, r, err := parseFIBRoute(data)
		switch {
		case err != nil:
			bad = err
		case table == unix.RT_TABLE_MAIN || table == unix.RT_TABLE_LOCAL:
			f.main = append(f.main, r)
		case table == unix.RT_TABLE_DEFAULT:
			f.deflt = append(f.deflt, r)
		}
		if len(f.main)+len(f.deflt) > fibMaxRoutes {
			bad = fmt.Errorf("%w: more than %d routes", errFIBCustom, fibMaxRoutes)
		}
	})
	if err == nil {
		err = bad
	}
	if err != nil {
		return nil, err
	}
	for _, t := range [2][]fibRoute{f.main, f.deflt} {
		slices.SortStableFunc(t, func(a, b fibRoute) int {
			if a.dst.Bits() != b.dst.Bits() {
				return b.dst.Bits() - a.dst.Bits()
			}
			return int(a.priority) - int(b.priority)
		})
	}
	return f, nil
}

// parseFIBRoute reads one route message: its table and route, or
// errFIBCustom for what the copy does not follow.
func parseFIBRoute(data []byte) (uint32, fibRoute, error) {
	if len(data) < unix.SizeofRtMsg {
		return 0, fibRoute{}, fmt.Errorf("rtnetlink: short route message")
	}
	rtm := (*unix.RtMsg)(ptr(data))
	table := uint32(rtm.Table)
	r := fibRoute{typ: rtm.Type}
	var custom string
	switch {
	case rtm.Src_len != 0:
		custom = "a route from a source prefix"
	case rtm.Tos != 0:
		custom = "a route for a TOS"
	case rtm.Flags&(unix.RTNH_F_DEAD|unix.RTNH_F_LINKDOWN) != 0:
		custom = "a route through a dead or link-down nexthop"
	case rtm.Dst_len > 32:
		custom = "a route with a prefix longer than 32 bits"
	}
	dst := netip.IPv4Unspecified()
	rtAttrs(data[unix.SizeofRtMsg:], func(typ uint16, v []byte) {
		switch {
		case typ == unix.RTA_TABLE && len(v) >= 4:
			table = binary.NativeEndian.Uint32(v)
		case typ == unix.RTA_DST && len(v) == 4:
			dst = netip.AddrFrom4([4]byte(v))
		case typ == unix.RTA_OIF && len(v) >= 4:
			r.devs = append(r.devs, int(binary.NativeEndian.Uint32(v)))
		case typ == unix.RTA_PRIORITY && len(v) >= 4:
			r.priority = binary.NativeEndian.Uint32(v)
		case typ == unix.RTA_MULTIPATH:
			for len(v) >= unix.SizeofRtNexthop {
				nh := (*unix.RtNexthop)(ptr(v))
				if int(nh.Len) < unix.SizeofRtNexthop || int(nh.Len) > len(v) {
					break
				}
				if nh.Flags&(unix.RTNH_F_DEAD|unix.RTNH_F_LINKDOWN) != 0 {
					custom = "a route through a dead or link-down nexthop"
				}
				r.devs = append(r.devs, int(nh.Ifindex))
				v = v[min(len(v), (int(nh.Len)+unix.RTNH_ALIGNTO-1)&^(unix.RTNH_ALIGNTO-1)):]
			}
		case typ == rtaNHID:
			custom = "a route through a nexthop object"
		}
	})
	if table != unix.RT_TABLE_MAIN && table != unix.RT_TABLE_LOCAL && table != unix.RT_TABLE_DEFAULT {
		return table, r, nil // another table: no default rule looks at it
	}
	if custom != "" {
		return table, r, fmt.Errorf("%w: %s", errFIBCustom, custom)
	}
	r.dst = netip.PrefixFrom(dst, int(rtm.Dst_len)).Masked()
	return table, r, nil
}

// defaultRules checks that the namespace has the three IPv4 rules the
// kernel starts with (local, main and default tables, in that order, with
// no selector); errFIBCustom otherwise.
func (st *Stack) defaultRules() error {
	var tables []uint32
	var custom string
	err := st.rtDump(routeDump(unix.RTM_GETRULE, sizeofFibRuleHdr, unix.AF_INET), func(data []byte) {
		if len(data) < sizeofFibRuleHdr {
			custom = "a short rule message"
			return
		}
		if data[1] != 0 || data[2] != 0 || data[3] != 0 || data[7] != unix.FR_ACT_TO_TBL || binary.NativeEndian.Uint32(data[8:]) != 0 {
			custom = "a rule with a selector or an action other than a table"
		}
		table := uint32(data[4])
		rtAttrs(data[sizeofFibRuleHdr:], func(typ uint16, v []byte) {
			switch typ {
			case unix.FRA_TABLE:
				if len(v) >= 4 {
					table = binary.NativeEndian.Uint32(v)
				}
			case unix.FRA_PRIORITY, unix.FRA_PROTOCOL, unix.FRA_PAD:
			case unix.FRA_SUPPRESS_PREFIXLEN, unix.FRA_SUPPRESS_IFGROUP:
				if len(v) < 4 || binary.NativeEndian.Uint32(v) != 0xffffffff {
					custom = "a rule that suppresses"
				}
			default:
				custom = "a rule with a selector"
			}
		})
		tables = append(tables, table)
	})
	if err != nil {
		return fmt.Errorf("rules: %w", err)
	}
	if custom == "" && !slices.Equal(tables, []uint32{unix.RT_TABLE_LOCAL, unix.RT_TABLE_MAIN, unix.RT_TABLE_DEFAULT}) {
		custom = fmt.Sprintf("rules for tables %v", tables)
	}
	if custom != "" {
		return fmt.Errorf("%w: %s", errFIBCustom, custom)
	}
	return nil
}
