package steer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// ensureBPFFS mounts bpffs on dir when something else (or nothing) is there.
func ensureBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs on %s: %w", dir, err)
	}
	return nil
}

func netnsInode() (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, fmt.Errorf("network namespace: %w", err)
	}
	return st.Ino, nil
}

// programHolders names the live processes (other than this one) holding a
// file descriptor of the program progID, or of a link to it, as bpftool
// does: fdinfo of BPF objects carries "prog_id:".
func programHolders(progID uint32) []string {
	want := fmt.Sprintf("prog_id:\t%d\n", progID)
	self := strconv.Itoa(os.Getpid())
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	seen := map[string]bool{}
	var out []string
	for _, f := range fds {
		pidDir := filepath.Dir(filepath.Dir(f))
		pid := filepath.Base(pidDir)
		if pid == self || seen[pid] {
			continue
		}
		if l, err := os.Readlink(f); err != nil || !strings.HasPrefix(l, "anon_inode:bpf") {
			continue
		}
		info, err := os.ReadFile(filepath.Join(pidDir, "fdinfo", filepath.Base(f)))
		if err != nil || !strings.Contains(string(info), want) {
			continue
		}
		seen[pid] = true
		comm, _ := os.ReadFile(filepath.Join(pidDir, "comm"))
		out = append(out, fmt.Sprintf("pid %s (%s)", pid, strings.TrimSpace(string(comm))))
	}
	return out
}

// detachXDPLink detaches the XDP bpf_link that attaches program prog to
// the interface ifindex. The program's ID names it: bpf_links are the
// host's, and an ifindex alone names an interface of every network
// namespace (both ends of a veth pair are often 2 in theirs), so a match
// on it alone detached a live engine's program in another namespace.
func detachXDPLink(ifindex int, prog ebpf.ProgramID) error {
	it := new(link.Iterator)
	defer it.Close()
	for it.Next() {
		l := it.Link
		info, err := l.Info()
		if err != nil || info.Type != link.XDPType || info.Program != prog {
			continue
		}
		if x := info.XDP(); x != nil && int(x.Ifindex) == ifindex {
			return l.Detach()
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: program id %d to ifindex %d", errNoLink, prog, ifindex)
}

// errNoLink: no bpf_link attaches the program, which the interface still
// shows attached (its last link is being released: the kernel's detach
// waits for an RCU grace period before the interface shows it gone).
var errNoLink = errors.New("no bpf_link attaches the program")

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

func ntohs(v uint16) uint16 { return htons(v) }

// addrOf32 is addr32's inverse.
func addrOf32(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func addr32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}
