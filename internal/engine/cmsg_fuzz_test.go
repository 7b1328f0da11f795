package engine

import (
	"encoding/binary"
	"net/netip"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sendCmsg builds a control message as an application's sendmsg carries it.
func sendCmsg(level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

func pktinfoCmsg(ifindex int32, src [4]byte) []byte {
	var pi [unix.SizeofInet4Pktinfo]byte
	binary.NativeEndian.PutUint32(pi[0:], uint32(ifindex))
	copy(pi[4:8], src[:])
	return sendCmsg(unix.IPPROTO_IP, unix.IP_PKTINFO, pi[:])
}

func stampCmsg(flags uint32) []byte {
	var d [4]byte
	binary.NativeEndian.PutUint32(d[:], flags)
	return sendCmsg(unix.SOL_SOCKET, unix.SO_TIMESTAMPING_OLD, d[:])
}

// TestParseSendCmsg: IP_PKTINFO for the socket's interface and a
// software transmit stamp (or none) are the engine's; any other flag,
// interface or kind is the kernel's.
func TestParseSendCmsg(t *testing.T) {
	src := [4]byte{198, 18, 0, 2}
	for _, c := range []struct {
		name string
		ctl  []byte
		ok   bool
		want SendCmsg
	}{
		{"pktinfo", pktinfoCmsg(0, src), true, SendCmsg{Src: netip.AddrFrom4(src)}},
		{"pktinfo, this interface", pktinfoCmsg(7, src), true, SendCmsg{Src: netip.AddrFrom4(src)}},
		{"pktinfo, another interface", pktinfoCmsg(8, src), false, SendCmsg{}},
		{"a software stamp", stampCmsg(unix.SOF_TIMESTAMPING_TX_SOFTWARE), true, SendCmsg{Stamp: true, StampSet: true}},
		{"no stamp", stampCmsg(0), true, SendCmsg{StampSet: true}},
		{"a hardware stamp", stampCmsg(unix.SOF_TIMESTAMPING_TX_HARDWARE), false, SendCmsg{}},
		{"both", append(pktinfoCmsg(0, src), stampCmsg(unix.SOF_TIMESTAMPING_TX_SOFTWARE)...), true,
			SendCmsg{Src: netip.AddrFrom4(src), Stamp: true, StampSet: true}},
		{"IP_TOS", sendCmsg(unix.IPPROTO_IP, unix.IP_TOS, []byte{0x10, 0, 0, 0}), false, SendCmsg{}},
		{"cut short", pktinfoCmsg(0, src)[:20], false, SendCmsg{}},
	} {
		m, ok := ParseSendCmsg(c.ctl, 7)
		if ok != c.ok || ok && m != c.want {
			t.Errorf("%s: %+v, %v; want %+v, %v", c.name, m, ok, c.want, c.ok)
		}
	}
}

// FuzzParseSendCmsg: any control data an application passes to sendmsg
// is read without a panic, and a stamp is taken only from an
// SO_TIMESTAMPING message.
func FuzzParseSendCmsg(f *testing.F) {
	f.Add(pktinfoCmsg(0, [4]byte{198, 18, 0, 2}))
	f.Add(stampCmsg(unix.SOF_TIMESTAMPING_TX_SOFTWARE))
	f.Add(append(pktinfoCmsg(3, [4]byte{1, 2, 3, 4}), stampCmsg(0)...))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1, 0, 0, 0, 37, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ctl []byte) {
		m, ok := ParseSendCmsg(ctl, 3)
		if ok && m.Stamp && !m.StampSet {
			t.Fatalf("%+v from % x", m, ctl)
		}
	})
}
