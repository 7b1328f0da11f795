package stack

import (
	"encoding/binary"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzParseFIBRoute: whatever a route message holds, parseFIBRoute
// neither panics nor gives a main-table route a prefix that is not IPv4
// or longer than 32 bits.
func FuzzParseFIBRoute(f *testing.F) {
	f.Add(routeMsg())
	f.Add(routeMsg()[:unix.SizeofRtMsg+6])
	f.Fuzz(func(t *testing.T, b []byte) {
		table, r, err := parseFIBRoute(b)
		if err != nil || table != unix.RT_TABLE_MAIN {
			return
		}
		if !r.dst.Addr().Is4() || r.dst.Bits() < 0 || r.dst.Bits() > 32 {
			t.Fatalf("prefix %v from a main-table route", r.dst)
		}
	})
}

// TestParseFIBRoute: the seed is read as the main table's 198.19.0.0/16
// through two nexthops, interfaces 3 and 4, metric 7.
func TestParseFIBRoute(t *testing.T) {
	table, r, err := parseFIBRoute(routeMsg())
	if err != nil || table != unix.RT_TABLE_MAIN || r.dst.String() != "198.19.0.0/16" || r.priority != 7 || len(r.devs) != 2 || r.devs[0] != 3 || r.devs[1] != 4 {
		t.Fatalf("table %d, route %+v, %v", table, r, err)
	}
	dead := routeMsg()
	dead[unix.SizeofRtMsg-4] = unix.RTNH_F_DEAD // rtm_flags
	if _, _, err := parseFIBRoute(dead); !errors.Is(err, errFIBCustom) {
		t.Errorf("a dead route: %v, want errFIBCustom", err)
	}
}

// routeMsg is a unicast route of the main table to 198.19.0.0/16, metric
// 7, through two nexthops (RTA_MULTIPATH) on interfaces 3 and 4.
func routeMsg() []byte {
	msg := make([]byte, unix.SizeofRtMsg)
	msg[0], msg[1], msg[4], msg[7] = unix.AF_INET, 16, unix.RT_TABLE_MAIN, unix.RTN_UNICAST
	attr := func(typ uint16, v []byte) {
		a := make([]byte, (unix.SizeofRtAttr+len(v)+3)&^3)
		binary.NativeEndian.PutUint16(a, uint16(unix.SizeofRtAttr+len(v)))
		binary.NativeEndian.PutUint16(a[2:], typ)
		copy(a[unix.SizeofRtAttr:], v)
		msg = append(msg, a...)
	}
	attr(unix.RTA_DST, []byte{198, 19, 0, 0})
	attr(unix.RTA_PRIORITY, binary.NativeEndian.AppendUint32(nil, 7))
	var hops []byte
	for _, ifindex := range []uint32{3, 4} {
		nh := make([]byte, unix.SizeofRtNexthop)
		binary.NativeEndian.PutUint16(nh, unix.SizeofRtNexthop)
		binary.NativeEndian.PutUint32(nh[4:], ifindex)
		hops = append(hops, nh...)
	}
	attr(unix.RTA_MULTIPATH, hops)
	return msg
}
