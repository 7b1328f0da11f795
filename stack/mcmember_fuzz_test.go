package stack

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzMemberOf: whatever a membership message holds, memberOf neither
// panics nor reports a group of another interface, or one that is not
// IPv4 multicast.
func FuzzMemberOf(f *testing.F) {
	msg := memberMsg()
	f.Add(msg, uint32(7))
	f.Add(msg[:unix.SizeofIfAddrmsg+6], uint32(7))
	f.Fuzz(func(t *testing.T, b []byte, ifindex uint32) {
		g, ok := memberOf(b, int(ifindex))
		if ok && (b[0] != unix.AF_INET || binary.NativeEndian.Uint32(b[4:]) != ifindex || !g.Is4() || !g.IsMulticast()) {
			t.Fatalf("group %v from a message of family %d interface %d", g, b[0], binary.NativeEndian.Uint32(b[4:]))
		}
	})
}

// TestMemberOf: the seed message is read as interface 7's 239.1.1.1, and
// not as another interface's.
func TestMemberOf(t *testing.T) {
	msg := memberMsg()
	if g, ok := memberOf(msg, 7); !ok || g.String() != "239.1.1.1" {
		t.Errorf("interface 7: %v, %v", g, ok)
	}
	if _, ok := memberOf(msg, 8); ok {
		t.Error("interface 8: read as a member")
	}
}

// memberMsg is the kernel's message of interface 7's membership of
// 239.1.1.1: an ifaddrmsg and its IFA_MULTICAST attribute.
func memberMsg() []byte {
	msg := make([]byte, unix.SizeofIfAddrmsg+8)
	msg[0] = unix.AF_INET
	binary.NativeEndian.PutUint32(msg[4:], 7)
	binary.NativeEndian.PutUint16(msg[unix.SizeofIfAddrmsg:], 8)
	binary.NativeEndian.PutUint16(msg[unix.SizeofIfAddrmsg+2:], unix.IFA_MULTICAST)
	copy(msg[unix.SizeofIfAddrmsg+4:], []byte{239, 1, 1, 1})
	return msg
}
