package engine

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestResultingUIDs: which calls give up root for good and which for now,
// keeping root in the real or saved ID (BeforeSetuid opens the stacks
// before either).
func TestResultingUIDs(t *testing.T) {
	for _, c := range []struct {
		call       string
		r, e, s    int
		wr, we, ws int
	}{
		{"setuid", 109, 109, 109, 109, 109, 109},
		{"setresuid", 109, 109, 109, 109, 109, 109},
		{"setresuid", -1, 109, -1, 0, 109, 0}, // effective only: root stays saved
		{"seteuid", -1, 109, -1, 0, 109, 0},
		{"setreuid", 109, 109, -1, 109, 109, 109}, // saved follows effective
		{"setreuid", -1, 109, -1, 0, 109, 109},    // effective differs from real: saved follows
		{"setreuid", -1, 0, -1, 0, 0, 0},
	} {
		r, e, s := resultingUIDs(c.call, c.r, c.e, c.s, 0, 0, 0)
		if r != c.wr || e != c.we || s != c.ws {
			t.Errorf("%s(%d, %d, %d) from root: %d %d %d, want %d %d %d", c.call, c.r, c.e, c.s, r, e, s, c.wr, c.we, c.ws)
		}
	}
}

// TestAfterConfine: a stack that could not open for want of root, or of a
// path a chroot hid, says so; one that could not for a reason of its own
// (lo is no Ethernet interface) says that alone.
func TestAfterConfine(t *testing.T) {
	e := &Engine{}
	e.chroot.Store(true)
	denied := fmt.Errorf("stack vmxb: steer vmxb: mount bpffs on /sys/fs/bpf: %w", unix.EPERM)
	if got := e.afterConfine(denied).Error(); !strings.Contains(got, "the process chrooted, and a stack needs root and the whole file system to open") {
		t.Errorf("after chroot, a refused mount: %q", got)
	}
	hidden := fmt.Errorf("stack vmxb: steer vmxb: statfs /sys/fs/bpf: %w", unix.ENOENT)
	if got := e.afterConfine(hidden).Error(); !strings.Contains(got, "the process chrooted") {
		t.Errorf("after chroot, bpffs not found: %q", got)
	}
	lo := errors.New("stack lo: not an Ethernet interface (hardware address )")
	if got := e.afterConfine(lo); got != lo {
		t.Errorf("after chroot, lo: %q, want its own reason alone", got)
	}
}
