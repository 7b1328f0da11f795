package engine

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
)

// cgroupAddrHooks are the cgroup BPF attach points where a program may
// rewrite a UDP socket's addresses in the kernel's sendmsg and recvmsg
// (Cilium's socket load balancing of Kubernetes services, a transparent
// proxy): the stack sends and receives past them, to the service's
// address rather than a backend's and from a backend's rather than the
// service's.
var cgroupAddrHooks = []struct {
	attach ebpf.AttachType
	name   string
}{
	{ebpf.AttachCGroupUDP4Sendmsg, "cgroup/sendmsg4"},
	{ebpf.AttachCGroupUDP4Recvmsg, "cgroup/recvmsg4"},
}

// cgroupCheck holds what udpCgroupCause found, once for the process.
type cgroupCheck struct {
	once  sync.Once
	cause string
}

// udpCgroupCause says why the process's UDP sockets stay on the kernel
// when its cgroup (or an ancestor: the effective programs) has programs
// at cgroupAddrHooks, "" when it has none. What cannot be looked at (no
// cgroup v2, no BPF_PROG_QUERY) is logged at debug level and taken as
// none.
func (e *Engine) udpCgroupCause() string {
	e.cgroup.once.Do(func() {
		cause, err := cgroupAddrCause()
		if err != nil {
			e.Log.Printf(params.LevelDebug, "cgroup BPF programs that rewrite UDP addresses not looked for: %v", err)
		}
		e.cgroup.cause = cause
	})
	return e.cgroup.cause
}

func cgroupAddrCause() (string, error) {
	dir, err := ownCgroup2()
	if err != nil {
		return "", err
	}
	f, err := os.Open(dir)
	if err != nil {
		return "", fmt.Errorf("cgroup %s: %w", dir, err)
	}
	defer f.Close()
	var found []string
	for _, h := range cgroupAddrHooks {
		r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: h.attach, QueryFlags: unix.BPF_F_QUERY_EFFECTIVE})
		if err != nil {
			return "", fmt.Errorf("cgroup %s: %s: %w", dir, h.name, err)
		}
		for _, p := range r.Programs {
			found = append(found, fmt.Sprintf("%s program id %d", h.name, p.ID))
		}
	}
	if len(found) == 0 {
		return "", nil
	}
	return fmt.Sprintf("the process's cgroup %s has BPF programs that rewrite UDP addresses in the kernel (%s: a service load balancer such as Cilium's, a transparent proxy), which the stack would send and receive past: run it in a cgroup without them to offload", dir, strings.Join(found, ", ")), nil
}

// ownCgroup2 is the directory of the process's cgroup in the cgroup v2
// hierarchy (its "0::" line in /proc/self/cgroup, under the mount of
// cgroup2 in /proc/self/mountinfo: /sys/fs/cgroup, or its unified/ in a
// hybrid hierarchy).
func ownCgroup2() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	rel, ok := "", false
	for _, l := range strings.Split(string(b), "\n") {
		if p, found := strings.CutPrefix(l, "0::"); found {
			rel, ok = p, true
		}
	}
	if !ok {
		return "", errors.New("no cgroup v2 line in /proc/self/cgroup")
	}
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer mi.Close()
	sc := bufio.NewScanner(mi)
	for sc.Scan() {
		// mountinfo: ID parent major:minor root mountpoint options ... - fstype source options
		fields := strings.Fields(sc.Text())
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return filepath.Join(fields[4], rel), nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("/proc/self/mountinfo: %w", err)
	}
	return "", errors.New("no cgroup2 mount in /proc/self/mountinfo")
}
