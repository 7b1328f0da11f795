package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunCgroupHooks: a process whose cgroup has a BPF program at
// cgroup/sendmsg4 (Cilium's socket load balancing attaches one for
// Kubernetes services: it rewrites a UDP send to a service's address into
// one to a backend) keeps its UDP sockets on the kernel, which runs the
// program, and says why: the stack would send past it, to the service's
// address. Every request of a kernel client is answered. With one at
// cgroup/connect4 as well, a TCP client's connect (VMAXDP_TCP=1) stays the
// kernel's, said so: netstack would connect to the service's address. The
// programs here let everything through unchanged; what matters is that
// they are there.
func TestRunCgroupHooks(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	root := cgroup2Mount(t)
	rel := fmt.Sprintf("vmaxdp-test-%d", os.Getpid())
	cg := filepath.Join(root, rel)
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Skipf("no cgroup of our own to be had: %v", err)
	}
	t.Cleanup(func() { os.Remove(cg) }) // last: once the program's processes are gone
	attach := func(at ebpf.AttachType) {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Type:         ebpf.CGroupSockAddr,
			AttachType:   at,
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
			License:      "GPL",
		})
		if err != nil {
			t.Skipf("no %v program to be had: %v", at, err)
		}
		t.Cleanup(func() { prog.Close() })
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: at, Program: prog})
		if err != nil {
			t.Skipf("%v not attached: %v", at, err)
		}
		t.Cleanup(func() { l.Close() })
	}
	b := testutil.Bed(t, &testbed.Options{Plain: true}) // as ip link add makes it
	// ip netns exec mounts a sysfs of the namespace's, without the cgroup
	// hierarchy under it: mount it again, as a container has it, and
	// join the cgroup.
	join := []string{"sh", "-c", `mount -t cgroup2 none /sys/fs/cgroup && echo $$ > "/sys/fs/cgroup/$0/cgroup.procs" && exec "$@"`, rel}
	t.Run("udp", func(t *testing.T) {
		attach(ebpf.AttachCGroupUDP4Sendmsg)
		const port, count = 11441, 10
		p := startArgv(t, b, nil, append(join, tools(t), "run", "--", "python3", "-c", echoCount, b.Addr(testbed.B).String(), strconv.Itoa(port), strconv.Itoa(count))...)
		if err := p.waitFor("ready\n"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		before := udpInDatagrams(t, b, testbed.B)
		if err := echoFromA(b, netip.AddrPortFrom(b.Addr(testbed.B), port), count); err != nil {
			t.Fatalf("%v\n%s", err, tail(p.out.String(), 20))
		}
		if moved := udpInDatagrams(t, b, testbed.B) - before; moved != count {
			t.Errorf("side B's kernel delivered %d datagrams, want all %d", moved, count)
		}
		p.wantSaid(t, "fd 3: not offloaded", "has BPF programs that rewrite UDP addresses in the kernel (cgroup/sendmsg4 program id")
	})
	t.Run("tcp-connect", func(t *testing.T) {
		attach(ebpf.AttachCGroupInet4Connect)
		const port = 11443
		var ln net.Listener
		if err := b.Do(testbed.A, func() (err error) {
			ln, err = net.Listen("tcp4", netip.AddrPortFrom(b.Addr(testbed.A), port).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				io.Copy(c, c)
				c.Close()
			}
		}()
		client := `import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
c.sendall(b"through the kernel")
c.shutdown(socket.SHUT_WR)
sys.stdout.write("echo " + c.recv(100).decode() + "\n"); sys.stdout.flush()
`
		p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, append(join, tools(t), "run", "--", "python3", "-c", client, b.Addr(testbed.A).String(), strconv.Itoa(port))...)
		if err := p.exited(); err != nil {
			t.Fatalf("client: %v\n%s", err, p.out.String())
		}
		p.wantSaid(t, "echo through the kernel", "has BPF programs that rewrite TCP addresses in the kernel (cgroup/connect4 program id")
	})
}

// cgroup2Mount is where the cgroup v2 hierarchy is mounted here
// (/sys/fs/cgroup, or its unified/ in a hybrid hierarchy).
func cgroup2Mount(t *testing.T) string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Skip(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, x := range fields {
			if x == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && len(fields) > 4 {
				return fields[4]
			}
		}
	}
	t.Skip("no cgroup v2 hierarchy mounted")
	return ""
}
