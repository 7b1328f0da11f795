package steer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
)

// DefaultLockDir holds the files whose locks say which engine owns an
// interface (Options.LockDir).
const DefaultLockDir = "/run/vmaxdp"

// An engine owns its interface for as long as its Program lives, by an
// exclusive flock on a file named after the interface (its namespace's
// inode and its index), outside bpffs: `ip netns exec` gives each command
// a bpffs of its own, so pins do not meet there, and the kernel drops
// the lock when the process dies, however it dies. The attached program
// alone did not say it: two engines started at once both found the
// interface free, and the loser's clean-up removed the winner's pins; an
// engine whose program was detached while it had no rule (Detach) lost
// the interface to the next one, which removed its pins too.

// ownLock takes the interface's lock file under dir, at a high fd. When
// a live engine holds it, the error wraps ErrBusy and names it.
func ownLock(dir string, netns uint64, ifindex int) (fd int, path string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return -1, "", fmt.Errorf("lock dir: %w", err)
	}
	path = filepath.Join(dir, PinDirName(uint32(netns), ifindex)+".lock")
	// The file a holder unlinks at Close may be the one just opened:
	// locked, it must still be the one at path, or it is opened again.
	for range 8 {
		f, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return -1, "", fmt.Errorf("lock %s: %w", path, err)
		}
		f = highfd.Move(f)
		if err := unix.Flock(f, unix.LOCK_EX|unix.LOCK_NB); err != nil {
			highfd.Close(f)
			if errors.Is(err, unix.EWOULDBLOCK) {
				who := lockHolders(path)
				if len(who) == 0 {
					who = []string{"a process that is exiting"}
				}
				return -1, "", fmt.Errorf("%w: %s", ErrBusy, strings.Join(who, ", "))
			}
			return -1, "", fmt.Errorf("lock %s: %w", path, err)
		}
		var held, now unix.Stat_t
		if unix.Fstat(f, &held) == nil && unix.Stat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
			return f, path, nil
		}
		highfd.Close(f)
	}
	return -1, "", fmt.Errorf("lock %s: it kept being replaced", path)
}

// ownRelease unlinks the lock file, then lets it go: in that order, the
// next engine opens a new file rather than lock one that is gone.
func ownRelease(fd int, path string) {
	ownUnlink(fd, path)
	highfd.Close(fd)
}

// ownUnlink removes path if it is still the file fd holds locked (once
// removed, the next engine may have made and locked another there). A
// process that gave up root cannot: the next engine reuses the file.
func ownUnlink(fd int, path string) {
	var held, now unix.Stat_t
	if unix.Fstat(fd, &held) == nil && unix.Stat(path, &now) == nil && held.Ino == now.Ino && held.Dev == now.Dev {
		os.Remove(path)
	}
}

// lockHolders names the live processes, this one included, that hold
// an fd of the lock file at path.
func lockHolders(path string) []string {
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	self := strconv.Itoa(os.Getpid())
	seen := map[string]bool{}
	var out []string
	for _, f := range fds {
		pidDir := filepath.Dir(filepath.Dir(f))
		pid := filepath.Base(pidDir)
		if seen[pid] {
			continue
		}
		if l, err := os.Readlink(f); err != nil || l != path {
			continue
		}
		seen[pid] = true
		if pid == self {
			out = append(out, "this process")
			continue
		}
		comm, _ := os.ReadFile(filepath.Join(pidDir, "comm"))
		out = append(out, fmt.Sprintf("pid %s (%s)", pid, strings.TrimSpace(string(comm))))
	}
	return out
}

// RemoveNetnsLocks removes the lock files of every interface of the
// network namespace whose inode is netns, under lockDir (DefaultLockDir
// when empty), for a namespace that is going away: an engine killed
// there left them. One still locked is left to its holder.
func RemoveNetnsLocks(lockDir string, netns uint32) error {
	if lockDir == "" {
		lockDir = DefaultLockDir
	}
	return eachOfNetns(lockDir, ".lock", netns, func(path string) error {
		fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil // gone meanwhile
		}
		if unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB) == nil {
			os.Remove(path)
		}
		unix.Close(fd)
		return nil
	})
}

// Exiting readies the program of a process that exits without Close (the
// preload library's engine). It removes the interface's lock file: the
// kernel lets the lock go with the process, and the file, left, would
// stay in LockDir for every namespace an engine ever ran in. And it
// removes the pins: the process's own fds keep the program attached and
// serving until it ends, and the kernel detaches it then. Left pinned, it
// stayed on the interface, every frame passing through it, until the
// next engine there cleaned it: for ever where the mount namespace of the
// pins outlives the process (the host's, or that of a shell run under
// ip netns exec), where the end of one that an `ip netns exec` made for
// the process alone took them along.
func (p *Program) Exiting() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lockfd >= 0 {
		ownUnlink(p.lockfd, p.lockPath)
	}
	switch {
	case p.dirfd >= 0:
		p.unpinKept()
	case p.link != nil && p.dir != "":
		p.link.Unpin()
		for _, m := range p.maps() {
			if *m != nil {
				(*m).Unpin()
			}
		}
		os.Remove(p.dir)
	}
}
