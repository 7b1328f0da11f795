package xsk

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// busyOwner names the process holding an AF_XDP socket on (ifindex, queue),
// found through sock_diag (the kernel's list of AF_XDP sockets with their
// binding) and /proc/*/fd (which process holds that socket's inode). It
// returns a phrase for an error message; on any failure it says what it knows.
func busyOwner(ifindex, queue int) string {
	ino, err := xdpSocketInode(ifindex, queue)
	if err != nil {
		return fmt.Sprintf("another AF_XDP socket is bound to it (its owner cannot be named: AF_XDP sock_diag: %v; kernels without CONFIG_XDP_SOCKETS_DIAG lack it)", err)
	}
	if ino == 0 {
		return "another AF_XDP socket, in another network namespace or closing, is bound to it"
	}
	pid, comm := inodeOwner(ino)
	if pid == 0 {
		return fmt.Sprintf("AF_XDP socket inode %d is bound to it", ino)
	}
	return fmt.Sprintf("AF_XDP socket inode %d of pid %d (%s) is bound to it", ino, pid, comm)
}

const (
	sockDiagByFamily = 20
	xdpShowInfo      = 1
	xdpDiagInfo      = 1
)

func xdpSocketInode(ifindex, queue int) (uint32, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	// nlmsghdr (16) + xdp_diag_req (20)
	req := make([]byte, 36)
	binary.NativeEndian.PutUint32(req[0:], 36)
	binary.NativeEndian.PutUint16(req[4:], sockDiagByFamily)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	req[16] = unix.AF_XDP
	binary.NativeEndian.PutUint32(req[24:], xdpShowInfo)
	binary.NativeEndian.PutUint32(req[28:], ^uint32(0))
	binary.NativeEndian.PutUint32(req[32:], ^uint32(0))
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, err
	}
	buf := make([]byte, 32768)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return 0, err
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return 0, err
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return 0, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
						return 0, unix.Errno(-e)
					}
				}
				return 0, nil
			}
			if len(m.Data) < 16 {
				continue
			}
			ino := binary.NativeEndian.Uint32(m.Data[4:])
			attrs, err := parseAttrs(m.Data[16:])
			if err != nil {
				continue
			}
			if info, ok := attrs[xdpDiagInfo]; ok && len(info) >= 8 &&
				int(binary.NativeEndian.Uint32(info)) == ifindex && int(binary.NativeEndian.Uint32(info[4:])) == queue {
				return ino, nil
			}
		}
	}
}

func parseAttrs(b []byte) (map[uint16][]byte, error) {
	out := map[uint16][]byte{}
	for len(b) >= unix.SizeofRtAttr {
		a := (*unix.RtAttr)(unsafe.Pointer(&b[0]))
		if int(a.Len) < unix.SizeofRtAttr || int(a.Len) > len(b) {
			return out, fmt.Errorf("bad attribute length %d", a.Len)
		}
		out[a.Type] = b[unix.SizeofRtAttr:a.Len]
		b = b[min(len(b), (int(a.Len)+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1)):]
	}
	return out, nil
}

func inodeOwner(ino uint32) (int, string) {
	target := fmt.Sprintf("socket:[%d]", ino)
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, f := range fds {
		if l, err := os.Readlink(f); err == nil && l == target {
			pidDir := filepath.Dir(filepath.Dir(f))
			pid, _ := strconv.Atoi(filepath.Base(pidDir))
			comm, _ := os.ReadFile(filepath.Join(pidDir, "comm"))
			return pid, strings.TrimSpace(string(comm))
		}
	}
	return 0, ""
}
