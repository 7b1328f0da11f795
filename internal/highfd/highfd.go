// Package highfd moves the file descriptors vmaxdp keeps for itself (AF_XDP
// sockets, BPF maps and links, eventfds, namespace handles, the counters
// file) to the top quarter of the process's fd space, out of the way of the
// application it runs in. POSIX gives each new fd the lowest free number:
// an engine that kept fd 4 to 22 would shift every later fd of the
// application, and a dup2 onto one of those numbers (which an application
// may do to a number it never opened) would silently close the engine's
// AF_XDP socket or steering map.
//
// The top is the soft RLIMIT_NOFILE, at most 65536 (the preload's fd table
// ends there, and a higher fd would make the kernel grow the process's fd
// table for nothing). It must not be used for fds handed to the
// application, which expects the lowest free number.
//
// Inside an application (the preload library) Track is set, and every fd
// given out here is reported until it is closed through Close or Forget,
// so that the application's close(), dup2() and closefrom() leave it alone.
package highfd

import (
	"golang.org/x/sys/unix"
)

// Track, when set (once, before any fd is given out), is told of each fd
// Move or Dup gives out (on true) and of each Close or Forget releases.
var Track func(fd int, on bool)

func track(fd int, on bool) {
	if Track != nil && fd >= 0 {
		Track(fd, on)
	}
}

// Close releases and closes an fd Move gave out.
func Close(fd int) error {
	track(fd, false)
	return unix.Close(fd)
}

// Forget releases an fd Dup gave out, just before the library owning it
// closes it.
func Forget(fd int) { track(fd, false) }

// maxTop bounds the top: fds above it cost the process a larger fd table.
const maxTop = 1 << 16

// Floor is the lowest number Move gives out, or 0 when the fd limit is too
// low for a reserved range (below 64).
func Floor() int {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < 64 {
		return 0
	}
	top := int(min(lim.Cur, maxTop))
	return top - top/4
}

// Move returns a duplicate of fd at or above Floor, with close-on-exec set,
// and closes fd. When no number is free up there (or the limit is too
// low) it returns fd itself: the engine then works as before, at a low
// number, rather than failing.
func Move(fd int) int {
	floor := Floor()
	if fd < 0 || floor == 0 || fd >= floor {
		track(fd, true)
		return fd
	}
	if high, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, floor); err == nil {
		unix.Close(fd)
		fd = high
	}
	track(fd, true)
	return fd
}

// Dup returns a duplicate of fd at or above Floor with close-on-exec set,
// leaving fd open: for fds a library owns and closes itself.
func Dup(fd int) (int, error) {
	high, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, Floor())
	if err != nil {
		high, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	}
	if err == nil {
		track(high, true)
	}
	return high, err
}
