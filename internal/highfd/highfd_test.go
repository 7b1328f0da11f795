package highfd

import (
	"testing"

	"golang.org/x/sys/unix"
)

func TestMoveTrackClose(t *testing.T) {
	tracked := map[int]bool{}
	Track = func(fd int, on bool) { tracked[fd] = on }
	defer func() { Track = nil }()
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	high := Move(fd)
	floor := Floor()
	if floor == 0 {
		t.Skip("the fd limit is below 64: nothing is moved")
	}
	if high < floor {
		t.Errorf("Move(%d) = %d, below the floor %d", fd, high, floor)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != unix.EBADF {
		t.Errorf("fd %d still open after Move: %v", fd, err)
	}
	if flags, err := unix.FcntlInt(uintptr(high), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("fd %d: flags %#x, %v; want close-on-exec", high, flags, err)
	}
	if !tracked[high] {
		t.Errorf("fd %d was not reported to Track", high)
	}
	dup, err := Dup(high)
	if err != nil || dup < floor || !tracked[dup] {
		t.Errorf("Dup(%d) = %d, %v (tracked %v)", high, dup, err, tracked[dup])
	}
	Forget(dup)
	unix.Close(dup)
	if err := Close(high); err != nil {
		t.Fatal(err)
	}
	if tracked[high] || tracked[dup] {
		t.Errorf("Close or Forget left fds tracked: %v", tracked)
	}
}

func TestMoveKeepsFdWhenLimitIsLow(t *testing.T) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	low := lim
	low.Cur = 32
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Skipf("cannot lower the fd limit: %v", err)
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		t.Skipf("eventfd under a limit of 32: %v", err)
	}
	if got := Move(fd); got != fd {
		t.Errorf("Move(%d) = %d under a limit of 32, want it kept", fd, got)
	}
	Close(fd)
}
