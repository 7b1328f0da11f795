// Package sockdiag sends NETLINK_SOCK_DIAG dump requests and finds which
// process holds a socket, for the packages that list the kernel's sockets
// (xsk: AF_XDP sockets; stack: UDP sockets sharing a port). It builds no
// requests and parses no answers: each caller knows its family's structs.
package sockdiag

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Dump sends req (a whole netlink message, NLM_F_DUMP set) on the
// netlink socket fd (NETLINK_SOCK_DIAG, NETLINK_ROUTE) and calls each with the payload of every
// answer, reading into buf, until the dump is done. An error the kernel
// answers with is returned as its unix.Errno, wrapped.
func Dump(fd int, req, buf []byte, each func(data []byte)) error {
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("netlink dump: send: %w", err)
	}
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("netlink dump: receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("netlink dump: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := unix.Errno(-int32(binary.NativeEndian.Uint32(m.Data))); e != 0 {
						return fmt.Errorf("netlink dump: %w", e)
					}
				}
				return nil
			}
			each(m.Data)
		}
	}
}

// Owner finds the process holding the socket with inode ino: its pid, the
// fd it holds it as and its command name; pid 0 when none is found (the
// socket is closing, or its process is in another pid namespace). Of
// several, the oldest by pid: a process's own rather than the copy the
// helper that outlives it holds (vmaxdp notify-peers, started later).
func Owner(ino uint64) (pid, fd int, comm string) {
	target := "socket:[" + strconv.FormatUint(ino, 10) + "]"
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	var held []string
	for _, f := range fds {
		if l, err := os.Readlink(f); err == nil && l == target {
			held = append(held, f)
		}
	}
	pid, fd = oldest(held)
	if pid == 0 {
		return 0, -1, ""
	}
	b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
	return pid, fd, strings.TrimSpace(string(b))
}

// oldest picks, of fd paths (/proc/PID/fd/FD), the one of the lowest pid:
// the glob lists them sorted as text, where 10003 comes before 9999.
func oldest(paths []string) (pid, fd int) {
	for _, f := range paths {
		p, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(f))))
		if pid == 0 || p < pid {
			pid = p
			fd, _ = strconv.Atoi(filepath.Base(f))
		}
	}
	return pid, fd
}
