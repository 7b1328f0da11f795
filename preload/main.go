// Command preload is libvmaxdp.so, the library `vmaxdp run` preloads into an
// application (go build -buildmode=c-shared). Its C half (interpose.c)
// wraps libc's socket calls and sends the calls of engine sockets here; this
// half turns C arguments into Go values for package engine and back. It
// exports only vmxgo_* names, never libc's (golang/go#26184).
//
// make build sets two defaults of this library's Go runtime (GODEBUG,
// PRELOAD_GODEBUG in the Makefile), and the tests build it with make:
//   - containermaxprocs=0: with it on, the runtime keeps two cgroup files
//     open for the life of the process, fds the application did not ask for.
//   - asyncpreemptoff=1: the runtime preempts a goroutine that runs too long
//     with SIGURG sent to its thread, and an application thread that calls
//     the engine runs goroutines. The signal can land after the thread went
//     back to the application's code, and a poll, select, epoll_wait or
//     sleep of its own then returns EINTR though the application got no
//     signal: sockperf's poll over offloaded TCP connections, which go to
//     the kernel's poll, failed so in 4 of 140 runs under load. The
//     engine's loops make function calls, where goroutines are preempted
//     without a signal.
package main

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE // struct mmsghdr
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include "interpose.h"
#include "helper.h"
*/
import "C"

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/engine"
	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/internal/sysmon"
	"github.com/vmaxdp/vmaxdp/stack"
)

var eng *engine.Engine

// The C enums of interpose.h mirror the engine's values: a mismatch
// does not compile (an array index out of range).
var (
	_ = [1]struct{}{}[int(engine.StateCandidate)-C.VMX_CANDIDATE]
	_ = [1]struct{}{}[int(engine.StateOffloaded)-C.VMX_OFFLOADED]
	_ = [1]struct{}{}[int(engine.StateEpoll)-C.VMX_EPOLL]
	_ = [1]struct{}{}[int(engine.StateKernel)-C.VMX_KERNEL]
	_ = [1]struct{}{}[int(engine.StateTCP)-C.VMX_TCP]
	_ = [1]struct{}{}[int(engine.MuxSelect)-C.VMX_MUX_SELECT]
	_ = [1]struct{}{}[int(engine.MuxPoll)-C.VMX_MUX_POLL]
	_ = [1]struct{}{}[int(engine.MuxEpoll)-C.VMX_MUX_EPOLL]
	_ = [1]struct{}{}[engine.BellData-C.VMX_BELL_DATA]
	_ = [1]struct{}{}[unsafe.Sizeof(stack.Signals{})-C.sizeof_struct_vmx_signals]
	_ = [1]struct{}{}[unsafe.Sizeof(engine.ForkPage{})-C.sizeof_struct_vmx_fork_page]
	_ = [1]struct{}{}[unsafe.Offsetof(engine.ForkPage{}.FD)-unsafe.Offsetof(C.struct_vmx_fork_page{}.fd)]
	_ = [1]struct{}{}[unsafe.Offsetof(engine.ForkPage{}.Handoff)-unsafe.Offsetof(C.struct_vmx_fork_page{}.handoff)]
	_ = [1]struct{}{}[unsafe.Sizeof(engine.Handoff{})-C.sizeof_struct_vmx_handoff]
	_ = [1]struct{}{}[unsafe.Offsetof(engine.ForkPage{}.Knocks)-unsafe.Offsetof(C.struct_vmx_fork_page{}.knocks)]
	_ = [1]struct{}{}[unsafe.Offsetof(engine.ForkPage{}.Handoffs)-unsafe.Offsetof(C.struct_vmx_fork_page{}.handoffs)]
	_ = [1]struct{}{}[unsafe.Offsetof(stack.Signals{}.Intr)-unsafe.Offsetof(C.struct_vmx_signals{}.intr)]
	_ = [1]struct{}{}[unsafe.Offsetof(stack.Signals{}.Cancel)-unsafe.Offsetof(C.struct_vmx_signals{}.cancel)]
)

func main() {}

// Go's Ps, sized by the application's threads. Each application thread
// that calls into the engine holds one of Go's Ps while it is back in C
// (in a "system call", to Go). When no P is left idle, Go's sysmon takes
// them back at every one of its ticks, which it then makes every 20 us,
// and the threads' next calls must find a P again: with dnsperf's two
// threads on a two-CPU machine, sysmon alone used 12% of a CPU and the
// client lost 8% of its queries per second against a P to spare (3.5%).
// A P too many costs as well: while one is idle, every goroutine the
// engine readies (netstack's processor, a queue's drain) first wakes
// another thread to look for work, which on a busy machine takes the
// CPU the application's own thread needs (sockperf --tcp ping-pong, one
// thread on two CPUs: 0.61-0.93x the kernel with 3 or 32 Ps, 1.22-1.87x
// with 2). So the engine runs with one P for each thread that made a data
// call and one for its goroutines, never fewer than Go's default (the
// CPUs) nor more than maxPs. A GOMAXPROCS the user set holds.
var ps struct {
	sync.Mutex
	auto    bool
	threads int
}

// maxPs bounds the Ps a process of many threads (one per connection, say)
// gets: beyond it, threads share.
const maxPs = 32

// vmxgo_thread is a thread's first data call: it gets a P of its own.
// The first one logs what vmxgo_init did with Go's sysmon thread.
//
//export vmxgo_thread
func vmxgo_thread() {
	sysmonSaid.Do(func() {
		if sysmonDone != "" {
			eng.Log.Printf(params.LevelDebug, "%s", sysmonDone)
		}
	})
	if !ps.auto { // set once, before any thread calls
		return
	}
	ps.Lock()
	defer ps.Unlock()
	ps.threads++
	if want := min(ps.threads+1, max(maxPs, runtime.NumCPU())); want > runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(want)
	}
}

// sysmonDone says what quietSysmon did, for the log of the first data
// call: at start-up the log has not begun (its banner comes with the
// first socket).
var (
	sysmonDone string
	sysmonSaid sync.Once
)

// quietSysmon makes Go's sysmon thread SCHED_BATCH (package sysmon) when
// VMAXDP_SYSMON_BATCH says so (the latency profile does): its
// wake-ups, hundreds a second while the application's threads hold Ps in
// their own code, no longer take a polling thread's CPU. The threads
// sysmon creates (Go's Ms) would inherit the policy; the interposer's
// pthread_create gives them SCHED_OTHER (vmx_sysmon_tid).
//
// It runs in vmxgo_init, before the application's code: the look reads
// /proc files, and each open takes the lowest free fd for a moment, which
// an application opening its own beside it would miss (run on a
// goroutine, it gave TestRunTCPCalls an accept's fd one off the kernel
// run's). sysmon is awake then, since the caller is in Go; the look does
// not pause, for 20 ms at most, and takes a few looks of some 30 us.
func quietSysmon() {
	if !eng.Params().SysmonBatch {
		return
	}
	tid, err := sysmon.Find(0, 20*time.Millisecond)
	if err == nil {
		err = sysmon.Batch(tid)
	}
	if err != nil {
		sysmonDone = fmt.Sprintf("Go's sysmon thread left as it is: %v", err)
		return
	}
	C.vmx_sysmon_tid = C.int(tid)
	sysmonDone = fmt.Sprintf("Go's sysmon thread %d: SCHED_BATCH, so that its wake-ups do not preempt the application's threads", tid)
}

// vmxgo_init starts the engine. nofile, when not nil, is the fd limit the
// process was started with, which the Go runtime raised as it started: it
// is put back first, so that the application sees its own limit and the
// engine's fds (package highfd) are placed under it.
//
//export vmxgo_init
func vmxgo_init(nofile *C.struct_rlimit) C.int {
	ps.auto = os.Getenv("GOMAXPROCS") == ""
	if nofile != nil {
		lim := unix.Rlimit{Cur: uint64(nofile.rlim_cur), Max: uint64(nofile.rlim_max)}
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			fmt.Fprintf(os.Stderr, "vmaxdp: restore RLIMIT_NOFILE %d: %v\n", lim.Cur, err)
		}
	}
	highfd.Track = func(fd int, on bool) {
		v := C.int(0)
		if on {
			v = 1
		}
		C.vmx_set_internal(C.int(fd), v)
	}
	knock := stack.KnockAddr.As4()
	C.vmx_knock_addr = C.uint(binary.BigEndian.Uint32(knock[:]))
	var err error
	onState := func(fd int, s engine.State) { C.vmx_set_state(C.int(fd), C.int(s)) }
	owed := (*atomic.Int32)(unsafe.Pointer(&C.vmx_tcp_owed))
	if eng, err = engine.New(&engine.Options{OnState: onState, Owed: owed, Helper: helperPath(), Spawn: spawnDetached}); err != nil {
		fmt.Fprintf(os.Stderr, "vmaxdp: %v\n", err)
		return 1
	}
	quietSysmon()
	return 0
}

// helperPath is the vmaxdp executable beside this library, as `vmaxdp
// run` finds the library beside itself ("" if the library's path is
// unknown).
func helperPath() string {
	p := C.vmx_library_path()
	if p == nil {
		return ""
	}
	lib, err := filepath.Abs(C.GoString(p))
	if err != nil {
		return ""
	}
	return filepath.Join(filepath.Dir(lib), "vmaxdp")
}

// spawnDetached is peernotify.SpawnFunc over vmx_spawn_detached.
func spawnDetached(path string, argv []string, fd int) (int, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	cargv := make([]*C.char, len(argv)+1)
	for i, a := range argv {
		cargv[i] = C.CString(a)
		defer C.free(unsafe.Pointer(cargv[i]))
	}
	// cargv is Go memory holding C pointers only, which cgo lets C read.
	pid := C.vmx_spawn_detached(cpath, &cargv[0], C.int(fd))
	if pid < 0 {
		return 0, unix.Errno(-pid)
	}
	return int(pid), nil
}

// vmxgo_refused logs a call the interposer refused because it would have
// replaced one of vmaxdp's own fds.
//
//export vmxgo_refused
func vmxgo_refused(fd C.int, call *C.char) {
	eng.Log.Printf(params.LevelWarning, "%s onto fd %d refused (EBADF): vmaxdp's engine holds that fd for itself", C.GoString(call), int(fd))
}

//export vmxgo_tcp_pay
func vmxgo_tcp_pay() { eng.PayOwed() }

//export vmxgo_fini
func vmxgo_fini() { eng.Shutdown() }

// vmxgo_announce: the process made its first IP socket.
//
//export vmxgo_announce
func vmxgo_announce() { eng.Announce() }

// vmxgo_flush: the process is about to end (exit, _exit, _Exit,
// exit_group) or exec: what sends left for a coalesced kick leaves now.
//
//export vmxgo_flush
func vmxgo_flush() { eng.FlushStacks() }

//export vmxgo_forked
func vmxgo_forked() { eng.Forked() }

// vmxgo_passed: the process is about to pass fd, a socket the engine
// serves or may serve, to another process (SCM_RIGHTS).
//
//export vmxgo_passed
func vmxgo_passed(fd C.int) { eng.Passed(int(fd)) }

// vmxgo_sent_os: the kernel socket of fd, offloaded, sent packets
// datagrams (bytes in all) that the engine passed to it.
//
//export vmxgo_sent_os
func vmxgo_sent_os(fd C.int, packets, bytes C.long) { eng.SentOS(int(fd), int(packets), int(bytes)) }

// vmxgo_before_setuid: the calling thread is about to set the process's
// user IDs (-1: unchanged) with call.
//
//export vmxgo_before_setuid
func vmxgo_before_setuid(call *C.char, r, e, s C.long) {
	eng.BeforeSetuid(C.GoString(call), int(r), int(e), int(s))
}

// vmxgo_netns_moved: a thread of the process entered another network
// namespace.
//
//export vmxgo_netns_moved
func vmxgo_netns_moved() { eng.NetnsMoved() }

// vmxgo_before_chroot: the calling thread is about to chroot to dir.
//
//export vmxgo_before_chroot
func vmxgo_before_chroot(dir *C.char) { eng.BeforeChroot(C.GoString(dir)) }

// vmxgo_forking returns the page shared with the child (engine.ForkPage),
// NULL if there is none: the C half keeps it for the child's claims.
//
//export vmxgo_forking
func vmxgo_forking() unsafe.Pointer {
	eng.Forking()
	return unsafe.Pointer(eng.ForkPage())
}

// vmxgo_take_handoff serves an accept on fd, a kernel listener, with a
// connection handed off at fork if one waits for it; -VMX_PASS if none.
//
//export vmxgo_take_handoff
func vmxgo_take_handoff(fd, flags C.int) C.long {
	nfd, errno := eng.TakeHandoff(int(fd), int(flags))
	if errno != 0 {
		return -C.long(errno)
	}
	return C.long(nfd)
}

//export vmxgo_socket
func vmxgo_socket(fd, nonblock C.int) C.int { return C.int(eng.Socket(int(fd), nonblock != 0)) }

//export vmxgo_bind
func vmxgo_bind(fd C.int) C.int { return C.int(eng.Bind(int(fd))) }

//export vmxgo_ipv6_connect
func vmxgo_ipv6_connect(fd C.int, sa *C.struct_sockaddr, alen C.socklen_t) {
	if to, ok := getAddr6(sa, alen); ok {
		eng.IPv6Connect(int(fd), to)
	}
}

//export vmxgo_connect
func vmxgo_connect(fd C.int) C.int { return C.int(eng.Connect(int(fd))) }

//export vmxgo_close
func vmxgo_close(fd C.int) { eng.Close(int(fd)) }

//export vmxgo_to_stdio
func vmxgo_to_stdio(fd C.int) { eng.ToStdio(int(fd)) }

//export vmxgo_execing
func vmxgo_execing() { eng.Execing() }

//export vmxgo_dup
func vmxgo_dup(oldfd, newfd C.int) C.int { return C.int(eng.Dup(int(oldfd), int(newfd))) }

//export vmxgo_set_nonblock
func vmxgo_set_nonblock(fd, on C.int) { eng.SetNonblock(int(fd), on != 0) }

//export vmxgo_shutdown
func vmxgo_shutdown(fd, how C.int) { eng.ShutdownUDP(int(fd), int(how)) }

//export vmxgo_setsockopt
func vmxgo_setsockopt(fd, level, name C.int, val unsafe.Pointer, n C.socklen_t) {
	f := int(fd)
	eng.ListenerOptionSet(f)
	switch {
	case level == unix.SOL_SOCKET && name == unix.SO_RCVTIMEO && n >= C.socklen_t(unsafe.Sizeof(unix.Timeval{})):
		tv := (*unix.Timeval)(val)
		eng.SetRcvTimeo(f, time.Duration(tv.Nano()))
	case val != nil && n >= 1 && eng.SetIntOption(f, int(level), int(name), optInt(val, n)):
		return
	case level == unix.SOL_SOCKET && name == unix.SO_ATTACH_REUSEPORT_CBPF:
		eng.SetReuseportSelect(f, "SO_ATTACH_REUSEPORT_CBPF")
		return
	case level == unix.SOL_SOCKET && name == unix.SO_ATTACH_REUSEPORT_EBPF:
		eng.SetReuseportSelect(f, "SO_ATTACH_REUSEPORT_EBPF")
		return
	case level == unix.SOL_SOCKET && name == unix.SO_INCOMING_CPU && n >= 4:
		if cpu := *(*int32)(val); cpu >= 0 {
			eng.SetReuseportSelect(f, fmt.Sprintf("SO_INCOMING_CPU (%d)", cpu))
		}
		return
	case level == unix.IPPROTO_IP && name == unix.IP_MULTICAST_IF && n >= 4:
		// struct in_addr, ip_mreq or ip_mreqn, as the kernel takes them.
		ifindex := 0
		addr := (*[4]byte)(val)
		if n >= C.socklen_t(unsafe.Sizeof(unix.IPMreq{})) {
			addr = &(*unix.IPMreqn)(val).Address
		}
		if n >= C.socklen_t(unsafe.Sizeof(unix.IPMreqn{})) {
			ifindex = int((*unix.IPMreqn)(val).Ifindex)
		}
		eng.SetMulticastIf(f, netip.AddrFrom4(*addr), ifindex)
	case level == unix.SOL_SOCKET && name == unix.SO_BINDTODEVICE:
		name := unsafe.Slice((*byte)(val), n)
		if i := bytes.IndexByte(name, 0); i >= 0 {
			name = name[:i]
		}
		eng.SetBoundDevice(f, string(name))
		return
	case level == unix.SOL_SOCKET && name == unix.SO_BINDTOIFINDEX && n >= 4:
		ifname := ""
		if i := int(*(*int32)(val)); i > 0 {
			if ifi, err := net.InterfaceByIndex(i); err == nil {
				ifname = ifi.Name
			} else {
				ifname = fmt.Sprintf("index %d", i)
			}
		}
		eng.SetBoundDevice(f, ifname)
		return
	case level == unix.SOL_SOCKET && (name == unix.SO_TIMESTAMPING_OLD || name == unix.SO_TIMESTAMPING_NEW) && n >= 4:
		// An int, or struct so_timestamping whose first field it is.
		eng.SetTimestamping(f, int(*(*int32)(val)), name == unix.SO_TIMESTAMPING_NEW)
		return
	case level == unix.IPPROTO_IP:
		if group, ifaddr, ifindex, ok := sourceOptionGroup(int(name), unsafe.Slice((*byte)(val), n)); ok {
			eng.SourceMembership(f, sourceOptionJoins(int(name)), group, ifaddr, ifindex)
			return
		}
	}
	if val != nil && n >= 1 {
		eng.SetCmsgOption(f, int(level), int(name), optInt(val, n) != 0)
	}
}

// optInt reads an IPPROTO_IP option's value as the kernel does: an int,
// or a single byte when the option is shorter.
func optInt(val unsafe.Pointer, n C.socklen_t) int {
	if n >= 4 {
		return int(*(*int32)(val))
	}
	return int(*(*uint8)(val))
}

// sourceOptionJoins says whether a source option may add a membership.
func sourceOptionJoins(name int) bool {
	switch name {
	case unix.IP_DROP_SOURCE_MEMBERSHIP, unix.IP_UNBLOCK_SOURCE, unix.MCAST_LEAVE_GROUP, unix.MCAST_LEAVE_SOURCE_GROUP, unix.MCAST_UNBLOCK_SOURCE:
		return false
	}
	return true
}

// sourceOptionGroup reads the group and interface of a source-filter or
// protocol-independent multicast option, which the kernel socket has just
// applied: ip_mreq_source and ip_msfilter begin with the group and the
// interface's address; group_req, group_source_req and group_filter with
// the interface's index and, 8 bytes in (sockaddr_storage's alignment),
// the group's sockaddr.
func sourceOptionGroup(name int, b []byte) (group, ifaddr netip.Addr, ifindex int, ok bool) {
	switch name {
	case unix.IP_ADD_SOURCE_MEMBERSHIP, unix.IP_DROP_SOURCE_MEMBERSHIP, unix.IP_BLOCK_SOURCE, unix.IP_UNBLOCK_SOURCE, unix.IP_MSFILTER:
		if len(b) < 12 {
			return
		}
		return netip.AddrFrom4([4]byte(b[0:4])), netip.AddrFrom4([4]byte(b[4:8])), 0, true
	case unix.MCAST_JOIN_GROUP, unix.MCAST_LEAVE_GROUP, unix.MCAST_JOIN_SOURCE_GROUP, unix.MCAST_LEAVE_SOURCE_GROUP,
		unix.MCAST_BLOCK_SOURCE, unix.MCAST_UNBLOCK_SOURCE, unix.MCAST_MSFILTER:
		if len(b) < 8+unix.SizeofSockaddrInet4 || binary.NativeEndian.Uint16(b[8:10]) != unix.AF_INET {
			return
		}
		return netip.AddrFrom4([4]byte(b[12:16])), netip.Addr{}, int(binary.NativeEndian.Uint32(b[0:4])), true
	}
	return
}

func addr4(nbo C.uint32_t) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], uint32(nbo))
	return netip.AddrFrom4(b)
}

//export vmxgo_membership
func vmxgo_membership(fd, add C.int, group, ifaddr C.uint32_t, ifindex C.int) C.long {
	_, errno := eng.Membership(int(fd), add != 0, addr4(group), addr4(ifaddr), int(ifindex))
	return -C.long(errno)
}

// putAddr writes from as a sockaddr_in into sa, cut to *alen, as the
// kernel does, and sets *alen to its full size; as a sockaddr_in6 when v6
// (an AF_INET6 socket's receive: an IPv4 source mapped).
func putAddr(sa *C.struct_sockaddr, alen *C.socklen_t, from netip.AddrPort, v6 bool) {
	if sa == nil || alen == nil {
		return
	}
	if !from.Addr().IsValid() {
		// No address (a socket that was never bound or connected, or
		// whose connect failed): the unspecified one, as the kernel
		// writes.
		from = netip.AddrPortFrom(netip.IPv4Unspecified(), from.Port())
	}
	if v6 {
		var raw unix.RawSockaddrInet6
		raw.Family = unix.AF_INET6
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&raw.Port))[:], from.Port())
		raw.Addr = from.Addr().As16()
		if zone := from.Addr().Zone(); zone != "" {
			id, _ := strconv.ParseUint(zone, 10, 32) // as stack.KernelRecvFrom wrote it
			raw.Scope_id = uint32(id)
		}
		n := min(int(*alen), int(unsafe.Sizeof(raw)))
		copy(unsafe.Slice((*byte)(unsafe.Pointer(sa)), n), unsafe.Slice((*byte)(unsafe.Pointer(&raw)), n))
		*alen = C.socklen_t(unsafe.Sizeof(raw))
		return
	}
	var raw unix.RawSockaddrInet4
	raw.Family = unix.AF_INET
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&raw.Port))[:], from.Port())
	raw.Addr = from.Addr().As4()
	n := min(int(*alen), int(unsafe.Sizeof(raw)))
	copy(unsafe.Slice((*byte)(unsafe.Pointer(sa)), n), unsafe.Slice((*byte)(unsafe.Pointer(&raw)), n))
	*alen = C.socklen_t(unsafe.Sizeof(raw))
}

// getAddr reads a destination: a sockaddr_in, or for an AF_INET6 socket
// (v6) a sockaddr_in6 with an IPv4-mapped address; false for any other,
// which the kernel serves (or refuses: an AF_INET socket's sendto to a
// sockaddr_in6 fails with EAFNOSUPPORT).
func getAddr(sa *C.struct_sockaddr, alen C.socklen_t, v6 bool) (netip.AddrPort, bool) {
	if sa == nil {
		return netip.AddrPort{}, true
	}
	if to, ok := getAddr6(sa, alen); ok {
		if !v6 || !to.Addr().Is4In6() {
			return netip.AddrPort{}, false
		}
		return netip.AddrPortFrom(to.Addr().Unmap(), to.Port()), true
	}
	if alen < C.socklen_t(unsafe.Sizeof(unix.RawSockaddrInet4{})) {
		return netip.AddrPort{}, false
	}
	raw := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
	if raw.Family != unix.AF_INET {
		return netip.AddrPort{}, false
	}
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&raw.Port))[:])
	return netip.AddrPortFrom(netip.AddrFrom4(raw.Addr), port), true
}

// getAddr6 reads a sockaddr_in6; false for any other.
func getAddr6(sa *C.struct_sockaddr, alen C.socklen_t) (netip.AddrPort, bool) {
	if sa == nil || alen < C.socklen_t(unsafe.Sizeof(unix.RawSockaddrInet6{})) {
		return netip.AddrPort{}, false
	}
	raw := (*unix.RawSockaddrInet6)(unsafe.Pointer(sa))
	if raw.Family != unix.AF_INET6 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(netip.AddrFrom16(raw.Addr), binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&raw.Port))[:])), true
}

// signals is the calling thread's count of signal handlers, kept by the
// interposer's handler wrapper.
func signals(p *C.struct_vmx_signals) *stack.Signals { return (*stack.Signals)(unsafe.Pointer(p)) }

func bytesOf(p unsafe.Pointer, n C.size_t) []byte {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(p), int(n))
}

//export vmxgo_recvfrom
func vmxgo_recvfrom(fd C.int, buf unsafe.Pointer, n C.size_t, flags C.int, sa *C.struct_sockaddr, alen *C.socklen_t, sig *C.struct_vmx_signals) C.long {
	got, full, from, errno := eng.Recv(int(fd), bytesOf(buf, n), int(flags), time.Time{}, signals(sig), nil)
	if errno != 0 {
		return -C.long(errno)
	}
	putAddr(sa, alen, from, eng.IPv6(int(fd)))
	if flags&unix.MSG_TRUNC != 0 {
		return C.long(full)
	}
	return C.long(got)
}

func iovecs(msg *C.struct_msghdr) []unix.Iovec {
	if msg.msg_iov == nil || msg.msg_iovlen == 0 {
		return nil
	}
	return unsafe.Slice((*unix.Iovec)(unsafe.Pointer(msg.msg_iov)), int(msg.msg_iovlen))
}

//export vmxgo_recvmsg
func vmxgo_recvmsg(fd C.int, msg *C.struct_msghdr, flags C.int, sig *C.struct_vmx_signals) C.long {
	return recvmsg(fd, msg, flags, time.Time{}, sig)
}

// vmxgo_recvmmsg serves recvmmsg in one crossing. As in the kernel, the
// first datagram waits as the socket and flags say, later ones until
// vlen have come, MSG_WAITFORONE makes those non-blocking, and the time
// left of timeout is written back. Unlike the kernel (recvmmsg(2), BUGS),
// the timeout also bounds the waits for the later datagrams.
//
//export vmxgo_recvmmsg
func vmxgo_recvmmsg(fd C.int, v unsafe.Pointer, n C.uint, flags C.int, ts *C.struct_timespec, sig *C.struct_vmx_signals) C.long {
	// v is a struct mmsghdr *, which the export header cannot name.
	msgs := unsafe.Slice((*C.struct_mmsghdr)(v), int(n))
	var end time.Time
	if ts != nil {
		end = time.Now().Add(time.Duration(ts.tv_sec)*time.Second + time.Duration(ts.tv_nsec))
	}
	f := flags &^ unix.MSG_WAITFORONE
	got := 0
	for i := range msgs {
		var deadline time.Time
		if i > 0 {
			deadline = end
		}
		r := recvmsg(fd, &msgs[i].msg_hdr, f, deadline, sig)
		if r < 0 {
			if got == 0 {
				return r // ErrPassOS included: the kernel serves the whole call
			}
			break
		}
		msgs[i].msg_len = C.uint(r)
		got++
		if flags&unix.MSG_WAITFORONE != 0 {
			f |= unix.MSG_DONTWAIT
		}
		if ts != nil && !time.Now().Before(end) {
			break
		}
	}
	if ts != nil {
		left := max(time.Until(end), 0)
		ts.tv_sec, ts.tv_nsec = C.long(left/time.Second), C.long(left%time.Second)
	}
	return C.long(got)
}

func recvmsg(fd C.int, msg *C.struct_msghdr, flags C.int, deadline time.Time, sig *C.struct_vmx_signals) C.long {
	if flags&unix.MSG_ERRQUEUE != 0 {
		return recvErrQueue(fd, msg)
	}
	r := newRecvBuf(msg)
	defer r.release()
	var meta *stack.RecvMeta
	var m stack.RecvMeta
	cm := engine.Cmsg(0)
	if msg.msg_control != nil && msg.msg_controllen > 0 {
		if cm = eng.Cmsg(int(fd)); cm != 0 {
			meta = &m
		}
	}
	got, full, from, errno := eng.Recv(int(fd), r.b, int(flags), deadline, signals(sig), meta)
	if errno != 0 {
		return -C.long(errno)
	}
	got = r.scatter(got)
	alen := msg.msg_namelen
	putAddr((*C.struct_sockaddr)(msg.msg_name), &alen, from, eng.IPv6(int(fd)))
	if msg.msg_name != nil {
		msg.msg_namelen = alen
	}
	msg.msg_flags = 0
	if meta != nil {
		ctl := bytesOf(msg.msg_control, C.size_t(msg.msg_controllen))
		used, cut := engine.PutCmsgs(ctl, cm, meta)
		msg.msg_controllen = C.size_t(used)
		if cut {
			msg.msg_flags |= unix.MSG_CTRUNC
		}
	} else {
		msg.msg_controllen = 0
	}
	if full > got {
		msg.msg_flags |= unix.MSG_TRUNC
	}
	if flags&unix.MSG_TRUNC != 0 {
		return C.long(full)
	}
	return C.long(got)
}

// recvErrQueue serves recvmsg with MSG_ERRQUEUE from the engine's
// transmit stamps (with their looped packet, unless
// SOF_TIMESTAMPING_OPT_TSONLY), and hands it to the kernel socket, whose
// error queue holds the rest (ICMP errors, or EAGAIN), once they are
// read. It never waits, as the kernel's. As the kernel's, it returns the
// bytes copied, MSG_TRUNC when the packet was longer.
func recvErrQueue(fd C.int, msg *C.struct_msghdr) C.long {
	var ctl []byte
	if msg.msg_control != nil {
		ctl = bytesOf(msg.msg_control, C.size_t(msg.msg_controllen))
	}
	r := newRecvBuf(msg)
	defer r.release()
	m, ok := eng.RecvErrQueue(int(fd), r.b, ctl)
	if !ok {
		return -C.long(engine.ErrPassOS)
	}
	m.N = r.scatter(m.N)
	msg.msg_controllen = C.size_t(m.Ctl)
	msg.msg_flags = unix.MSG_ERRQUEUE
	if m.CtlCut {
		msg.msg_flags |= unix.MSG_CTRUNC
	}
	if m.Full > m.N {
		msg.msg_flags |= unix.MSG_TRUNC
	}
	if msg.msg_name != nil {
		msg.msg_namelen = 0 // a stamp names no address
	}
	return C.long(m.N)
}

// recvBuf is where a receive into a msghdr's iovecs lands: the one iovec
// itself, or a scratch buffer that scatter then copies into several.
type recvBuf struct {
	iov     []unix.Iovec
	b       []byte
	scratch *[]byte
}

func newRecvBuf(msg *C.struct_msghdr) recvBuf {
	r := recvBuf{iov: iovecs(msg)}
	switch len(r.iov) {
	case 0:
	case 1:
		r.b = bytesOf(unsafe.Pointer(r.iov[0].Base), C.size_t(r.iov[0].Len))
	default:
		r.scratch = eng.Scratch()
		r.b = *r.scratch
	}
	return r
}

// scatter puts the n bytes received into the iovecs and returns how many
// they held.
func (r *recvBuf) scatter(n int) int {
	if r.scratch == nil {
		return min(n, len(r.b))
	}
	rest := r.b[:min(n, len(r.b))]
	for _, v := range r.iov {
		rest = rest[copy(bytesOf(unsafe.Pointer(v.Base), C.size_t(v.Len)), rest):]
	}
	return min(n, iovLen(r.iov))
}

func (r *recvBuf) release() {
	if r.scratch != nil {
		eng.PutScratch(r.scratch)
	}
}

func iovLen(iov []unix.Iovec) int {
	n := 0
	for _, v := range iov {
		n += int(v.Len)
	}
	return n
}

//export vmxgo_sendto
func vmxgo_sendto(fd C.int, buf unsafe.Pointer, n C.size_t, flags C.int, sa *C.struct_sockaddr, alen C.socklen_t) C.long {
	to, ok := getAddr(sa, alen, eng.IPv6(int(fd)))
	if !ok {
		return -C.long(engine.ErrPassOS)
	}
	sent, errno := eng.Send(int(fd), bytesOf(buf, n), to, engine.SendCmsg{}, int(flags))
	if errno != 0 {
		return -C.long(errno)
	}
	return C.long(sent)
}

//export vmxgo_sendmsg
func vmxgo_sendmsg(fd C.int, msg *C.struct_msghdr, flags C.int) C.long {
	to, ok := getAddr((*C.struct_sockaddr)(msg.msg_name), msg.msg_namelen, eng.IPv6(int(fd)))
	if !ok {
		return -C.long(engine.ErrPassOS)
	}
	var m engine.SendCmsg
	if msg.msg_control != nil && msg.msg_controllen != 0 {
		// IP_PKTINFO (the source a DNS server answers from) and a software
		// transmit stamp are served; other ancillary data is the
		// kernel's to apply.
		if m, ok = engine.ParseSendCmsg(bytesOf(msg.msg_control, C.size_t(msg.msg_controllen)), eng.Ifindex(int(fd))); !ok {
			eng.FlushSends(int(fd))
			return -C.long(engine.ErrPassOS)
		}
	}
	iov := iovecs(msg)
	if iovLen(iov) > 65536 {
		return -C.long(engine.ErrPassOS)
	}
	// Each piece is copied once, into the frame; past 16 the pieces are
	// gathered here first, as a send of that many is rare.
	var pieces [16][]byte
	vec := pieces[:0]
	if len(iov) <= len(pieces) {
		for _, v := range iov {
			vec = append(vec, bytesOf(unsafe.Pointer(v.Base), C.size_t(v.Len)))
		}
	} else {
		scratch := eng.Scratch()
		defer eng.PutScratch(scratch)
		b := (*scratch)[:0]
		for _, v := range iov {
			b = append(b, bytesOf(unsafe.Pointer(v.Base), C.size_t(v.Len))...)
		}
		vec = append(vec, b)
	}
	sent, errno := eng.SendVec(int(fd), vec, to, m, int(flags))
	if errno != 0 {
		return -C.long(errno)
	}
	return C.long(sent)
}

//export vmxgo_gettstamp
func vmxgo_gettstamp(fd C.int, ns *C.longlong) C.long {
	t, errno := eng.GetTimestamp(int(fd))
	if errno != 0 {
		return -C.long(errno)
	}
	*ns = C.longlong(t)
	return 0
}

//export vmxgo_fionread
func vmxgo_fionread(fd C.int) C.long {
	n, errno := eng.Pending(int(fd))
	if errno != 0 {
		return -C.long(errno)
	}
	return C.long(n)
}

func timeout(ns C.longlong) time.Duration {
	if ns < 0 {
		return -1
	}
	return time.Duration(ns)
}

//export vmxgo_poll
func vmxgo_poll(kind C.int, fds *C.struct_pollfd, n C.nfds_t, ns C.longlong, sigmask unsafe.Pointer, sig *C.struct_vmx_signals) C.long {
	pfds := unsafe.Slice((*unix.PollFd)(unsafe.Pointer(fds)), int(n))
	got, errno := eng.Poll(engine.Mux(kind), pfds, timeout(ns), (*unix.Sigset_t)(sigmask), signals(sig))
	if errno != 0 {
		return -C.long(errno)
	}
	return C.long(got)
}

//export vmxgo_epoll_ctl
func vmxgo_epoll_ctl(epfd, op, fd C.int, ev *C.struct_epoll_event) C.int {
	return C.int(eng.EpollCtl(int(epfd), int(op), int(fd), (*unix.EpollEvent)(unsafe.Pointer(ev))))
}

//export vmxgo_epoll_nest
func vmxgo_epoll_nest(epfd, op, inner C.int, ev *C.struct_epoll_event) C.int {
	return C.int(eng.EpollNest(int(epfd), int(op), int(inner), (*unix.EpollEvent)(unsafe.Pointer(ev))))
}

//export vmxgo_epoll_wait
func vmxgo_epoll_wait(epfd C.int, ev *C.struct_epoll_event, max C.int, ns C.longlong, sigmask unsafe.Pointer, sig *C.struct_vmx_signals) C.long {
	if max <= 0 {
		return -C.long(unix.EINVAL)
	}
	out := unsafe.Slice((*unix.EpollEvent)(unsafe.Pointer(ev)), int(max))
	got, errno := eng.EpollWait(int(epfd), out, timeout(ns), (*unix.Sigset_t)(sigmask), signals(sig))
	if errno != 0 {
		return -C.long(errno)
	}
	return C.long(got)
}

// vmxgo_epoll_rung serves the n events the kernel's epoll_wait gave on
// epfd, a shared set's, with its bell's among them (engine.EpollRung).
//
//export vmxgo_epoll_rung
func vmxgo_epoll_rung(epfd C.int, ev *C.struct_epoll_event, n, max C.int) C.int {
	out := unsafe.Slice((*unix.EpollEvent)(unsafe.Pointer(ev)), int(max))
	return C.int(eng.EpollRung(int(epfd), out, int(n)))
}

//export vmxgo_listen
func vmxgo_listen(fd, backlog C.int) C.int { return C.int(eng.Listen(int(fd), int(backlog))) }

// vmxgo_inherited serves a socket the process started with, activated:
// passed by socket activation.
//
//export vmxgo_inherited
func vmxgo_inherited(fd, activated C.int) C.int { return C.int(eng.Inherited(int(fd), activated != 0)) }

//export vmxgo_accept
func vmxgo_accept(fd C.int, sa *C.struct_sockaddr, alen *C.socklen_t, flags C.int, sig *C.struct_vmx_signals) C.long {
	nfd, peer, errno := eng.Accept(int(fd), int(flags), signals(sig))
	if errno != 0 {
		return -C.long(errno)
	}
	putAddr(sa, alen, peer, eng.TCPListenerIPv6(int(fd)))
	return C.long(nfd)
}

// maxIovecs is how many iovecs a TCP call takes without allocating.
const maxIovecs = 8

// buffers views n iovecs as byte slices, in arr when they fit.
func buffers(iov *C.struct_iovec, n C.int, arr *[maxIovecs][]byte) [][]byte {
	if iov == nil || n <= 0 {
		return nil
	}
	v := unsafe.Slice((*unix.Iovec)(unsafe.Pointer(iov)), int(n))
	bufs := arr[:0]
	if len(v) > maxIovecs {
		bufs = make([][]byte, 0, len(v))
	}
	for _, x := range v {
		bufs = append(bufs, bytesOf(unsafe.Pointer(x.Base), C.size_t(x.Len)))
	}
	return bufs
}

//export vmxgo_tcp_recv
func vmxgo_tcp_recv(fd C.int, iov *C.struct_iovec, n, flags C.int, sig *C.struct_vmx_signals) C.long {
	var arr [maxIovecs][]byte
	got, errno := eng.TCPRecv(int(fd), buffers(iov, n, &arr), int(flags), signals(sig))
	if errno != 0 {
		return -C.long(errno)
	}
	return C.long(got)
}

//export vmxgo_tcp_send
func vmxgo_tcp_send(fd C.int, iov *C.struct_iovec, n, flags C.int, sig *C.struct_vmx_signals) C.long {
	var arr [maxIovecs][]byte
	sent, errno := eng.TCPSend(int(fd), buffers(iov, n, &arr), int(flags), signals(sig))
	if errno != 0 {
		return -C.long(errno)
	}
	return C.long(sent)
}

//export vmxgo_tcp_splice
func vmxgo_tcp_splice(in, out C.int, n C.size_t, flags C.uint, sig *C.struct_vmx_signals) C.long {
	moved, errno := eng.TCPSplice(int(in), int(out), int(min(n, 1<<30)), int(flags), signals(sig))
	if errno != 0 {
		return -C.long(errno)
	}
	return C.long(moved)
}

//export vmxgo_tcp_shutdown
func vmxgo_tcp_shutdown(fd, how C.int) C.long { return -C.long(eng.TCPShutdown(int(fd), int(how))) }

//export vmxgo_tcp_name
func vmxgo_tcp_name(fd, peer C.int, sa *C.struct_sockaddr, alen *C.socklen_t) C.long {
	local, remote, v6, errno := eng.TCPAddrs(int(fd))
	if errno != 0 {
		return -C.long(errno)
	}
	if sa == nil || alen == nil {
		return -C.long(unix.EFAULT)
	}
	if peer != 0 {
		if !remote.IsValid() {
			return -C.long(unix.ENOTCONN) // its connect failed, as the kernel says
		}
		putAddr(sa, alen, remote, v6)
	} else {
		putAddr(sa, alen, local, v6)
	}
	return 0
}

//export vmxgo_tcp_queued
func vmxgo_tcp_queued(fd, out C.int) C.long {
	n, errno := eng.TCPUnread(int(fd), out != 0)
	if errno != 0 {
		return -C.long(errno)
	}
	return C.long(n)
}

// tcpCANameMax is TCP_CA_NAME_MAX (linux/tcp.h): a congestion control
// algorithm's name, its NUL included.
const tcpCANameMax = 16

//export vmxgo_tcp_setsockopt
func vmxgo_tcp_setsockopt(fd, level, name C.int, val unsafe.Pointer, n C.socklen_t) C.long {
	f := int(fd)
	switch {
	case val == nil:
		return -C.long(unix.EFAULT)
	case level == unix.SOL_SOCKET && (name == unix.SO_RCVTIMEO || name == unix.SO_SNDTIMEO):
		if n >= C.socklen_t(unsafe.Sizeof(unix.Timeval{})) {
			eng.TCPSetTimeout(f, name == unix.SO_RCVTIMEO, time.Duration((*unix.Timeval)(val).Nano()))
		}
		return -C.long(engine.ErrPassOS) // the mirror keeps it too, for getsockopt
	case level == unix.SOL_SOCKET && name == unix.SO_LINGER:
		if n < C.socklen_t(unsafe.Sizeof(unix.Linger{})) {
			return -C.long(unix.EINVAL)
		}
		l := (*unix.Linger)(val)
		if c := eng.TCPConnOf(f); c != nil {
			c.SetLinger(l.Onoff != 0, int(l.Linger))
			return 0
		}
		return -C.long(engine.ErrPassOS)
	case level == unix.IPPROTO_TCP && name == unix.TCP_CONGESTION:
		// The kernel reads up to TCP_CA_NAME_MAX-1 bytes, to a NUL.
		b := unsafe.Slice((*byte)(val), min(int(n), tcpCANameMax-1))
		if i := bytes.IndexByte(b, 0); i >= 0 {
			b = b[:i]
		}
		return -C.long(eng.TCPSetCongestion(f, string(b)))
	case n < 1:
		return -C.long(unix.EINVAL)
	}
	return -C.long(eng.TCPSetOption(f, int(level), int(name), optInt(val, n)))
}

//export vmxgo_held_rcvbuf
func vmxgo_held_rcvbuf(fd C.int) C.int { return C.int(eng.HeldRcvBuf(int(fd))) }

//export vmxgo_tcp_getsockopt
func vmxgo_tcp_getsockopt(fd, level, name C.int, val unsafe.Pointer, n *C.socklen_t) C.long {
	f := int(fd)
	if val == nil || n == nil {
		return -C.long(unix.EFAULT)
	}
	c := eng.TCPConnOf(f)
	if c == nil {
		return -C.long(engine.ErrPassOS)
	}
	put := func(p unsafe.Pointer, size uintptr) C.long {
		k := min(uintptr(*n), size)
		copy(unsafe.Slice((*byte)(val), k), unsafe.Slice((*byte)(p), k))
		*n = C.socklen_t(k)
		return 0
	}
	switch {
	case level == unix.IPPROTO_TCP && name == unix.TCP_INFO:
		ti := c.Info()
		return put(unsafe.Pointer(&ti), unsafe.Sizeof(ti))
	case level == unix.SOL_SOCKET && name == unix.SO_LINGER:
		on, secs := c.Linger()
		l := unix.Linger{Linger: int32(secs)}
		if on {
			l.Onoff = 1
		}
		return put(unsafe.Pointer(&l), unsafe.Sizeof(l))
	case level == unix.SOL_SOCKET && (name == unix.SO_RCVTIMEO || name == unix.SO_SNDTIMEO):
		return -C.long(engine.ErrPassOS)
	case level == unix.IPPROTO_TCP && name == unix.TCP_CONGESTION:
		cc, errno := eng.TCPCongestion(f)
		if errno != 0 {
			return -C.long(errno)
		}
		var b [tcpCANameMax]byte // NUL-padded, as the kernel's copy
		copy(b[:tcpCANameMax-1], cc)
		return put(unsafe.Pointer(&b[0]), uintptr(len(b)))
	}
	v, errno := eng.TCPOption(f, int(level), int(name))
	if errno != 0 {
		return -C.long(errno)
	}
	v32 := int32(v)
	return put(unsafe.Pointer(&v32), unsafe.Sizeof(v32))
}

//export vmxgo_tcp_connect
func vmxgo_tcp_connect(fd C.int, sa *C.struct_sockaddr, alen C.socklen_t, sig *C.struct_vmx_signals) C.long {
	if _, mapped := getAddr6(sa, alen); mapped {
		to, ok := getAddr(sa, alen, true)
		if !ok || !to.IsValid() {
			return -C.long(engine.ErrPassOS) // an IPv6 destination
		}
		return -C.long(eng.TCPConnect6(int(fd), to, signals(sig)))
	}
	to, ok := getAddr(sa, alen, false)
	if !ok || !to.IsValid() {
		return -C.long(engine.ErrPassOS)
	}
	return -C.long(eng.TCPConnect(int(fd), to, signals(sig)))
}

//export vmxgo_tcp_connect_wait
func vmxgo_tcp_connect_wait(fd C.int, sig *C.struct_vmx_signals) C.long {
	return -C.long(eng.TCPConnectWait(int(fd), signals(sig)))
}
