package stack

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzParseDiagMsg: whatever a sock_diag answer holds, parseDiagMsg
// neither panics nor reports a socket of another port or family.
func FuzzParseDiagMsg(f *testing.F) {
	msg := make([]byte, diagMsgLen+8)
	msg[0] = unix.AF_INET6
	binary.BigEndian.PutUint16(msg[4:], 53)
	binary.NativeEndian.PutUint16(msg[diagMsgLen:], 5)
	binary.NativeEndian.PutUint16(msg[diagMsgLen+2:], diagV6Only)
	f.Add(msg, uint8(unix.AF_INET6), uint16(53))
	f.Add(msg[:diagMsgLen], uint8(unix.AF_INET), uint16(53))
	f.Fuzz(func(t *testing.T, b []byte, family uint8, port uint16) {
		k, ok := parseDiagMsg(b, family, port)
		if ok && (b[0] != family || binary.BigEndian.Uint16(b[4:]) != port || !k.local.IsValid() && !k.v6any) {
			t.Fatalf("parsed %+v from a message of family %d port %d", k, b[0], binary.BigEndian.Uint16(b[4:]))
		}
	})
}
