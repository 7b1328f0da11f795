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
// rewrite a socket's addresses in the kernel's calls (Cilium's socket
// load balancing of Kubernetes services, a transparent proxy): the stack
// and netstack send, receive and connect past them, to a service's
// address rather than a backend's and from a backend's rather than the
// service's. tcp: the hook is TCP's (connect; UDP's connect is the
// kernel's, which the engine reads after), else UDP's.
var cgroupAddrHooks = []struct {
	attach ebpf.AttachType
	name   string
	tcp    bool
}{
	{ebpf.AttachCGroupUDP4Sendmsg, "cgroup/sendmsg4", false},
	{ebpf.AttachCGroupUDP4Recvmsg, "cgroup/recvmsg4", false},
	{ebpf.AttachCGroupInet4Connect, "cgroup/connect4", true},
}

// cgroupCheck holds what cgroupCause found, once for the process.
type cgroupCheck struct {
	once     sync.Once
	udp, tcp string
}

// cgroupCause says why the process's UDP sockets (tcp: its TCP
// connects) stay on the kernel when its cgroup, or an ancestor (the
// effective programs), has programs at cgroupAddrHooks, "" when it has
// none. What cannot be looked at (no cgroup v2 in the process's view, no
// BPF_PROG_QUERY) is logged at debug level and taken as none.
func (e *Engine) cgroupCause(tcp bool) string {
	e.cgroup.once.Do(func() {
		var err error
		e.cgroup.udp, e.cgroup.tcp, err = cgroupAddrCauses()
		if err != nil {
			e.Log.Printf(params.LevelDebug, "cgroup BPF programs that rewrite addresses not looked for: %v", err)
		}
	})
	if tcp {
		return e.cgroup.tcp
	}
	return e.cgroup.udp
}

func cgroupAddrCauses() (udp, tcp string, err error) {
	dir, err := ownCgroup2()
	if err != nil {
		return "", "", err
	}
	f, err := os.Open(dir)
	if err != nil {
		return "", "", fmt.Errorf("cgroup %s: %w", dir, err)
	}
	defer f.Close()
	var found [2][]string
	for _, h := range cgroupAddrHooks {
		r, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: h.attach, QueryFlags: unix.BPF_F_QUERY_EFFECTIVE})
		if err != nil {
			return "", "", fmt.Errorf("cgroup %s: %s: %w", dir, h.name, err)
		}
		i := 0
		if h.tcp {
			i = 1
		}
		for _, p := range r.Programs {
			found[i] = append(found[i], fmt.Sprintf("%s program id %d", h.name, p.ID))
		}
	}
	cause := func(found []string, proto, past string) string {
		if len(found) == 0 {
			return ""
		}
		return fmt.Sprintf("the process's cgroup %s has BPF programs that rewrite %s addresses in the kernel (%s: a service load balancer such as Cilium's, a transparent proxy), which vmaxdp would %s: run it in a cgroup without them to offload", dir, proto, strings.Join(found, ", "), past)
	}
	return cause(found[0], "UDP", "send and receive past"), cause(found[1], "TCP", "connect past"), nil
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
