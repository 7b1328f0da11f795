package steer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/cilium/ebpf"
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

func pinnedOwner(dir string) int {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "owner"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0
	}
	defer m.Close()
	var pid uint32
	if err := m.Lookup(uint32(0), &pid); err != nil {
		return 0
	}
	return int(pid)
}

func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

func addr32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

