// Package peernotify tells the peers of a process's offloaded TCP
// connections that the process is gone, when it ends without closing them:
// SIGKILL, a crash, _exit, or an exec that drops them. The kernel closes a
// dying process's own sockets with a FIN or a reset, but it has no socket
// for a connection netstack served, and the peer of one would wait for
// ever for the next byte. VMA's peer-notification daemon (vmad) does this
// for VMA.
//
// A helper process (`vmaxdp notify-peers`), started once by a process that
// offloads TCP, holds the other end of a Unix socket the process keeps
// open. For each interface's stack the process sends it the steering
// program's 5-tuple rule map, its map of the SYNs that went to the stack,
// and a raw socket of the interface's network namespace. When the socket
// ends (the process died or exec'd) the helper marks every TCP connection
// rule left for the kernel (steer.ReleaseTCPConns), gives the kernel the
// connections netstack held for the process to accept as well
// (steer.ReleaseUnaccepted: they had no rule of their own yet), and sends
// each connection's peer a SYN. A peer
// with the connection open answers it with an ACK (RFC 5961's challenge
// ACK); the kernel, which has no socket for it, answers that with a reset
// whose sequence number is the one the peer's ACK named, and the peer's
// connection ends. The helper sends no reset itself: it does not know the
// sequence numbers netstack had reached.
//
// A clean exit closes the connections first (engine.Shutdown), which
// takes their rules away, and the helper has nothing to do.
//
// And it holds a copy of each stack's XDP link (HoldLink), which it
// closes last, once it has kicked the rings: the process's end then
// leaves the detach to the helper. On a veth the kernel's detach waits
// for two RCU grace periods, 15-20 ms that every exit of a process with
// an open stack took before its parent saw it end.
//
// The helper also holds a copy of each AF_XDP socket of the process's
// stacks (Hold). A send may leave its datagram on the TX ring for a
// coalesced kick (stack.Options.TxKickDelay), and a process killed before
// the kick (SIGKILL, a crash, the OOM killer) took it with it, where the
// kernel sends what a sendto returned for. When the process ends, the
// helper kicks each ring first, then closes its copies, which lets the
// queues be bound again. A stack that closes a queue while the process
// runs asks for its copy back first (the release Hold returns), as the
// kernel keeps a queue bound while any copy of its socket is open.
//
// What this package must not do: run anything per packet or per
// connection in the served process, which sends one message per stack
// and one per queue as it opens and as it closes.
package peernotify

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// Command is the vmaxdp subcommand that runs the helper (Serve).
const Command = "notify-peers"

// ErrNoHelper is returned by Watch when the helper cannot run.
var ErrNoHelper = errors.New("no peer-notification helper")

// SpawnFunc starts path with argv and fd as the new process's fd 3, as a
// process that is not a child of the caller's application, which would
// wait for it (a prefork master's wait(-1) loop) or reap it. It returns
// the new process's id.
type SpawnFunc func(path string, argv []string, fd int) (pid int, err error)

// Notifier is the served process's side: it starts the helper once and
// hands it each stack's connections.
type Notifier struct {
	path  string
	spawn SpawnFunc

	mu  sync.Mutex
	fd  int   // the process's end of the socket; -1 until the helper runs
	err error // why the helper did not start; it is not tried again
}

// New returns a Notifier that starts path (the vmaxdp executable) with
// spawn when Watch is first called.
func New(path string, spawn SpawnFunc) *Notifier {
	return &Notifier{path: path, spawn: spawn, fd: -1}
}

// The kinds of message the process sends the helper, in their first byte.
const (
	msgStack   = 'T' // a stack's TCP maps and raw socket (Watch)
	msgQueue   = 'Q' // an AF_XDP socket to kick when the process ends (Hold)
	msgLink    = 'L' // an XDP link to close when the process ends (HoldLink)
	msgRelease = 'R' // give the AF_XDP socket or link back (their release); answered
	msgReport  = 'S' // VMAXDP_STATS_FILE and the stats file, for a report at an end without one (ReportAtEnd)
	msgWritten = 'W' // the process wrote its report (Written)
)

// running starts the helper if it has not started. Caller holds n.mu.
func (n *Notifier) running() error {
	if n.err == nil && n.fd < 0 {
		n.err = n.start()
	}
	return n.err
}

// Watch hands the helper conns and syns, the ConnMap and SYNMap of
// ifname's steering program, with a raw socket of the calling thread's
// network namespace (the interface's), starting the helper first.
func (n *Notifier) Watch(ifname string, conns, syns *ebpf.Map) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.running(); err != nil {
		return err
	}
	// IPPROTO_RAW: the helper writes whole IPv4 packets, and the socket
	// receives nothing, so that no queue fills while it waits.
	raw, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return fmt.Errorf("peer notification for %s: raw socket: %w", ifname, err)
	}
	defer unix.Close(raw)
	if err := unix.Sendmsg(n.fd, append([]byte{msgStack}, ifname...), unix.UnixRights(conns.FD(), syns.FD(), raw), nil, 0); err != nil {
		return fmt.Errorf("peer notification for %s: hand the helper its maps: %w", ifname, err)
	}
	return nil
}

// ReportAtEnd hands the helper out, the process's VMAXDP_STATS_FILE, and
// live, the stats file it publishes its counters in (nil when it
// publishes none), starting the helper first. A process that ends without
// writing its own report (Written) writes none: a signal whose default
// action ends it, a crash, SIGKILL, _exit or an exec. The helper then
// writes the report of the sockets and queues of its last snapshot, at
// most a publish interval old, and removes the stats file.
func (n *Notifier) ReportAtEnd(out, live *os.File) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.running(); err != nil {
		return err
	}
	fds := []int{int(out.Fd())}
	if live != nil {
		fds = append(fds, int(live.Fd()))
	}
	if err := unix.Sendmsg(n.fd, []byte{msgReport}, unix.UnixRights(fds...), nil, 0); err != nil {
		return fmt.Errorf("report at the process's end: hand the helper %s: %w", out.Name(), err)
	}
	return nil
}

// Written tells the helper that the process wrote its report itself
// (ReportAtEnd): the helper writes none.
func (n *Notifier) Written() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fd >= 0 {
		unix.Sendmsg(n.fd, []byte{msgWritten}, nil, nil, 0)
	}
}

// releaseWait bounds how long a release waits for the helper's answer.
const releaseWait = time.Second

// Hold hands the helper a copy of fd, the AF_XDP socket of queue name
// ("vmxb/q0"), starting the helper first: if the process ends while the
// socket is open, the helper kicks its TX ring. The release it returns
// takes the copy back, and returns once the helper has closed it; the
// queue's owner calls it before it closes fd. With no helper, Hold says
// why, and its release does nothing.
func (n *Notifier) Hold(name string, fd int) (release func(), err error) {
	return n.hold(msgQueue, name, fd, "queue "+name+": hand the helper its AF_XDP socket")
}

// HoldLink hands the helper a copy of fd, the XDP link of ifname's
// steering program, starting the helper first: when the process ends,
// the helper closes it after the queues, and the kernel detaches the
// program then. The release it returns takes the copy back, and returns
// once the helper has closed it; the program's owner calls it before it
// detaches the link itself. With no helper, HoldLink says why, and its
// release does nothing.
func (n *Notifier) HoldLink(ifname string, fd int) (release func(), err error) {
	return n.hold(msgLink, ifname, fd, "steering program of "+ifname+": hand the helper its XDP link")
}

// hold sends the helper a copy of fd in a message of kind (msgQueue,
// msgLink) naming it name, starting the helper first; the copy's id is
// fd's number in this process. A failed send's error says what failed.
func (n *Notifier) hold(kind byte, name string, fd int, what string) (release func(), err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	none := func() {}
	if err := n.running(); err != nil {
		return none, err
	}
	var id [5]byte
	id[0] = kind
	binary.LittleEndian.PutUint32(id[1:], uint32(fd))
	if err := unix.Sendmsg(n.fd, append(id[:], name...), unix.UnixRights(fd), nil, 0); err != nil {
		return none, fmt.Errorf("%s: %w", what, err)
	}
	return func() { n.release(id) }, nil
}

// release asks the helper to close its copy of the AF_XDP socket or XDP
// link of id (Hold's or HoldLink's message) and waits, within
// releaseWait, for its answer. A helper that is gone has closed it
// already.
func (n *Notifier) release(id [5]byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fd < 0 {
		return
	}
	id[0] = msgRelease
	if err := unix.Sendmsg(n.fd, id[:], nil, nil, 0); err != nil {
		return
	}
	var ack [5]byte
	for deadline := time.Now().Add(releaseWait); ; {
		left := time.Until(deadline)
		if left <= 0 {
			return
		}
		pfd := []unix.PollFd{{Fd: int32(n.fd), Events: unix.POLLIN}}
		if k, err := unix.Poll(pfd, int(left.Milliseconds())+1); err == unix.EINTR {
			continue
		} else if err != nil || k == 0 {
			return
		}
		k, err := unix.Read(n.fd, ack[:])
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil || k == 0 || ack == id {
			return
		}
	}
}

// Close ends the helper's wait as the process's end would: the stacks
// are closed, and what rules are left are connections to tell of.
func (n *Notifier) Close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fd >= 0 {
		highfd.Close(n.fd)
		n.fd = -1
	}
	if n.err == nil {
		n.err = fmt.Errorf("%w: closed", ErrNoHelper)
	}
}

// start starts the helper. Caller holds n.mu.
func (n *Notifier) start() error {
	if n.path == "" || n.spawn == nil {
		return fmt.Errorf("%w: vmaxdp's executable not found beside the preload library", ErrNoHelper)
	}
	if _, err := os.Stat(n.path); err != nil {
		return fmt.Errorf("%w: %v", ErrNoHelper, err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: socketpair: %v", ErrNoHelper, err)
	}
	argv := []string{n.path, Command, "-pid", fmt.Sprint(os.Getpid())}
	_, err = n.spawn(n.path, argv, fds[1])
	unix.Close(fds[1])
	if err != nil {
		unix.Close(fds[0])
		return fmt.Errorf("%w: start %s: %v", ErrNoHelper, n.path, err)
	}
	// Kept high, and closed in a forked child (highfd), so that only this
	// process's end, or its exec, ends the helper's wait.
	n.fd = highfd.Move(fds[0])
	return nil
}

// stackConns is what the helper was handed for one stack.
type stackConns struct {
	ifname string
	m      *ebpf.Map // the ConnMap
	syns   *ebpf.Map // the SYNMap
	raw    int
	conns  []steer.Rule // released
}

// probeAgain is when a second SYN follows the first, for one lost or
// rate-limited: Linux answers at most one challenge ACK per connection
// every 500 ms (net.ipv4.tcp_invalid_ratelimit).
const probeAgain = 700 * time.Millisecond

// Serve is the helper (`vmaxdp notify-peers`). It takes the stacks, the
// AF_XDP sockets and the XDP links the process pid hands it on conn, and
// gives those sockets and links back as asked, until conn ends; then it
// kicks the TX rings of the sockets it still holds and closes them,
// closes the links, releases the TCP connections left in the stacks and
// sends their peers a SYN, twice, logging to log what it did.
func Serve(conn, pid int, log io.Writer) error {
	var stacks []stackConns
	// By the fd number in the process, which names the copy in a
	// release: unique across both.
	queues := map[uint32]heldQueue{}
	links := map[uint32]int{}
	var report *endReport
	defer func() {
		report.close()
		for _, q := range queues {
			unix.Close(q.fd)
		}
		for _, fd := range links {
			unix.Close(fd)
		}
	}()
	buf, oob := make([]byte, 256), make([]byte, unix.CmsgSpace(3*4))
	for {
		nb, noob, _, _, err := unix.Recvmsg(conn, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("notify-peers: read from process %d: %w", pid, err)
		}
		if nb == 0 && noob == 0 {
			break // the process's end closed
		}
		switch {
		case buf[0] == msgStack:
			s, err := parseStack(buf[1:nb], oob[:noob])
			if err != nil {
				fmt.Fprintf(log, "vmaxdp notify-peers: process %d: %v\n", pid, err)
				continue
			}
			stacks = append(stacks, s)
		case buf[0] == msgQueue && nb >= 5:
			fds, err := rights(oob[:noob], 1)
			if err != nil {
				fmt.Fprintf(log, "vmaxdp notify-peers: process %d: queue %s: %v\n", pid, buf[5:nb], err)
				continue
			}
			queues[binary.LittleEndian.Uint32(buf[1:5])] = heldQueue{name: string(buf[5:nb]), fd: fds[0]}
		case buf[0] == msgLink && nb >= 5:
			fds, err := rights(oob[:noob], 1)
			if err != nil {
				fmt.Fprintf(log, "vmaxdp notify-peers: process %d: XDP link of %s: %v\n", pid, buf[5:nb], err)
				continue
			}
			links[binary.LittleEndian.Uint32(buf[1:5])] = fds[0]
		case buf[0] == msgRelease && nb == 5:
			id := binary.LittleEndian.Uint32(buf[1:5])
			if q, ok := queues[id]; ok {
				unix.Close(q.fd)
				delete(queues, id)
			}
			if fd, ok := links[id]; ok {
				unix.Close(fd)
				delete(links, id)
			}
			unix.Write(conn, buf[:5]) // the process waits for it
		case buf[0] == msgReport && nb == 1:
			r, err := parseReport(oob[:noob])
			if err != nil {
				fmt.Fprintf(log, "vmaxdp notify-peers: process %d: report at its end: %v\n", pid, err)
				continue
			}
			report.close()
			report = r
		case buf[0] == msgWritten && nb == 1:
			report.close()
			report = nil
		default:
			closeRights(oob[:noob])
			fmt.Fprintf(log, "vmaxdp notify-peers: process %d: message of kind %q and %d bytes: not one of ours\n", pid, buf[0], nb)
		}
	}
	// The datagrams first: their receivers wait for them.
	inodes := map[uint64]bool{}
	for _, q := range queues {
		sent, left, err := xsk.FlushTx(q.fd)
		if sent > 0 {
			fmt.Fprintf(log, "vmaxdp: process %d ended with %d datagram(s) on %s's TX ring not sent yet: sent them\n", pid, sent, q.name)
		}
		if left > 0 || err != nil {
			fmt.Fprintf(log, "vmaxdp: process %d ended with %d datagram(s) on %s's TX ring that could not be sent: %v\n", pid, left, q.name, err)
		}
		var st unix.Stat_t
		if unix.Fstat(q.fd, &st) == nil {
			inodes[st.Ino] = true
		}
	}
	if report != nil {
		if err := report.write(pid); err != nil {
			fmt.Fprintf(log, "vmaxdp notify-peers: process %d: report at its end: %v\n", pid, err)
		}
	}
	waitLetGo(pid, inodes, letGoWait)
	for id, q := range queues {
		unix.Close(q.fd)
		delete(queues, id)
	}
	// Then the programs, which the kernel detaches as the last copy of
	// their link closes: what comes after goes to the kernel's sockets,
	// the peers' probes below among it.
	for id, fd := range links {
		unix.Close(fd)
		delete(links, id)
	}
	var conns []steer.Rule
	for i := range stacks {
		s := &stacks[i]
		rs, err := steer.ReleaseTCPConns(s.m)
		if err != nil {
			fmt.Fprintf(log, "vmaxdp notify-peers: process %d: %s: %v\n", pid, s.ifname, err)
		}
		queued, err := steer.ReleaseUnaccepted(s.syns, s.m)
		if err != nil {
			fmt.Fprintf(log, "vmaxdp notify-peers: process %d: %s: connections not accepted yet: %v\n", pid, s.ifname, err)
		}
		rs = append(rs, queued...)
		for _, r := range rs {
			if err := probe(s.raw, r); err != nil {
				fmt.Fprintf(log, "vmaxdp notify-peers: process %d: %s: SYN to %s: %v\n", pid, s.ifname, r.Remote, err)
			}
		}
		s.conns = rs
		conns = append(conns, rs...)
	}
	if len(conns) > 0 {
		fmt.Fprintf(log, "vmaxdp: process %d ended with %d offloaded TCP connection(s) open, which no kernel socket closes: told their peers with a SYN each, which the kernel answers with a reset: %s\n",
			pid, len(conns), summary(conns))
		time.Sleep(probeAgain)
		for _, s := range stacks {
			for _, r := range s.conns {
				probe(s.raw, r) // the first one's errors were said
			}
		}
	}
	return nil
}

// letGoWait bounds how long the helper waits for the process to close
// its own copies of the sockets it holds (waitLetGo).
const letGoWait = time.Second

// waitLetGo waits, within d, until process pid has ended (its pidfd
// says so, once its exit has closed every fd) or holds none of the
// sockets of inodes (the helper's copies of its AF_XDP sockets: it
// exec'd). The last close of an AF_XDP socket and of an XDP link waits
// for RCU grace periods (15-20 ms on a veth for the two); closed after
// the process's own, the helper's copies take them. The engine ends conn
// as it shuts down (exitTCP), before its process's exit closes its fds:
// copies closed at once made the exit's closes the last, and the exit
// took the waits, as without a helper. An exiting process's fd table
// reads empty before its last thread has closed it: only the pidfd
// tells that its closes are done.
func waitLetGo(pid int, inodes map[uint64]bool, d time.Duration) {
	if len(inodes) == 0 {
		return
	}
	pidfd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return // gone already, or no pidfds (Linux before 5.3)
	}
	defer unix.Close(pidfd)
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	for deadline := time.Now().Add(d); time.Now().Before(deadline); {
		pfd := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		if k, err := unix.Poll(pfd, 1); k > 0 || (err != nil && err != unix.EINTR) {
			return
		}
		if exiting(pid) {
			continue // its fds are going: the pidfd tells when they are gone
		}
		if ents, err := os.ReadDir(dir); err == nil && lets(dir, ents, inodes) {
			return
		}
	}
}

// exiting says whether process pid's main thread has exited (a zombie
// while other threads still run, the last of which closes the fds): its
// fd table reads empty then.
func exiting(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": the state follows the comm's last ')'.
	i := strings.LastIndexByte(string(b), ')')
	return i >= 0 && i+2 < len(b) && (b[i+2] == 'Z' || b[i+2] == 'X')
}

// lets says whether none of the fds ents of dir (a /proc/PID/fd) is a
// socket of inodes, each read: an fd that cannot be read (the process
// exits) says nothing.
func lets(dir string, ents []os.DirEntry, inodes map[uint64]bool) bool {
	for _, e := range ents {
		l, err := os.Readlink(dir + "/" + e.Name())
		if errors.Is(err, os.ErrNotExist) {
			continue // closed since
		}
		if err != nil {
			return false
		}
		if !strings.HasPrefix(l, "socket:[") {
			continue
		}
		if ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]"), 10, 64); err != nil || inodes[ino] {
			return false
		}
	}
	return true
}

// heldQueue is an AF_XDP socket the helper holds a copy of (Hold).
type heldQueue struct {
	name string
	fd   int
}

// rights reads the want fds of a message's SCM_RIGHTS, closing them all
// when the message carried another count.
func rights(oob []byte, want int) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		return nil, fmt.Errorf("message without its fds (%d control messages: %v)", len(msgs), err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != want {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("message with %d fds, want %d (%v)", len(fds), want, err)
	}
	return fds, nil
}

// closeRights closes the fds a message carried.
func closeRights(oob []byte) {
	msgs, _ := unix.ParseSocketControlMessage(oob)
	for i := range msgs {
		fds, _ := unix.ParseUnixRights(&msgs[i])
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

// endReport is what ReportAtEnd handed the helper.
type endReport struct {
	out  *os.File // VMAXDP_STATS_FILE, opened for appending
	live *os.File // the stats file; nil when the process published none
}

// parseReport reads the fds of one message of ReportAtEnd.
func parseReport(oob []byte) (*endReport, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		closeRights(oob)
		return nil, fmt.Errorf("message without its fds (%d control messages: %v)", len(msgs), err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) < 1 || len(fds) > 2 {
		closeRights(oob)
		return nil, fmt.Errorf("message with %d fds, want 1 or 2 (%v)", len(fds), err)
	}
	r := &endReport{out: os.NewFile(uintptr(fds[0]), "VMAXDP_STATS_FILE")}
	if len(fds) == 2 {
		r.live = os.NewFile(uintptr(fds[1]), "stats file")
	}
	return r, nil
}

func (r *endReport) close() {
	if r == nil {
		return
	}
	r.out.Close()
	if r.live != nil {
		r.live.Close()
	}
}

// write appends to VMAXDP_STATS_FILE the report of the sockets and
// queues in the last snapshot process pid published, which ended without
// writing its own, and removes its stats file if no process of that pid
// made another since (an exec).
func (r *endReport) write(pid int) error {
	ended := fmt.Sprintf("vmaxdp: process %d ended without writing its report (a signal, a crash, _exit or exec)", pid)
	var b strings.Builder
	switch snap, err := r.lastSnapshot(); {
	case r.live == nil:
		fmt.Fprintf(&b, "%s, and published no counters (%sSTATS_DIR is empty): none to write\n", ended, params.Prefix)
	case err != nil:
		fmt.Fprintf(&b, "%s, and its last counters cannot be read: %v\n", ended, err)
	default:
		fmt.Fprintf(&b, "%s: its %d socket(s) as %s last published them, at %s\n", ended, len(snap.Sockets), snap.Process.Program,
			time.Unix(0, snap.Process.Published).Format("15:04:05.000"))
		stats.WriteEndReport(&b, snap)
	}
	if _, err := r.out.WriteString(b.String()); err != nil {
		return err
	}
	if r.live != nil {
		removeStale(r.live, stats.FileName(pid))
	}
	return nil
}

// lastSnapshot reads the last snapshot in the stats file; nil, nil
// without one.
func (r *endReport) lastSnapshot() (*stats.Snapshot, error) {
	if r.live == nil {
		return nil, nil
	}
	rd, err := stats.Open(fmt.Sprintf("/proc/self/fd/%d", r.live.Fd()))
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	var snap stats.Snapshot
	return &snap, rd.Read(&snap)
}

// removeStale removes the stats file live from its directory, the one
// its link of name is in, if that link is still live's (an exec'd
// program's engine replaces it with its own).
func removeStale(live *os.File, name string) {
	var held, named unix.Stat_t
	if unix.Fstat(int(live.Fd()), &held) != nil || held.Nlink == 0 {
		return
	}
	target, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", live.Fd()))
	if err != nil || filepath.Base(target) != name {
		return
	}
	if unix.Stat(target, &named) == nil && named.Ino == held.Ino && named.Dev == held.Dev {
		os.Remove(target)
	}
}

// parseStack reads one message of Watch, past its kind.
func parseStack(b, oob []byte) (stackConns, error) {
	fds, err := rights(oob, 3)
	if err != nil {
		return stackConns{}, err
	}
	m, err := ebpf.NewMapFromFD(fds[0])
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return stackConns{}, fmt.Errorf("%s: rule map: %w", b, err)
	}
	syns, err := ebpf.NewMapFromFD(fds[1])
	if err != nil {
		m.Close()
		unix.Close(fds[1])
		unix.Close(fds[2])
		return stackConns{}, fmt.Errorf("%s: SYN map: %w", b, err)
	}
	return stackConns{ifname: string(b), m: m, syns: syns, raw: fds[2]}, nil
}

// probe sends the peer of r (a TCP 5-tuple rule: Local is this host's
// end) a SYN from the connection's address and port, with a sequence
// number of no meaning.
func probe(raw int, r steer.Rule) error {
	var pkt [header.IPv4MinLen + header.TCPMinLen]byte
	header.IPv4(pkt[:]).Encode(header.IPv4Fields{TotalLen: uint16(len(pkt)), TTL: 64, Protocol: header.ProtocolTCP,
		Src: r.Local.Addr(), Dst: r.Remote.Addr()})
	header.TCP(pkt[header.IPv4MinLen:]).Encode(header.TCPFields{SrcPort: r.Local.Port(), DstPort: r.Remote.Port(),
		Seq: rand.Uint32(), Flags: header.TCPFlagSyn, Window: 4096, Src: r.Local.Addr(), Dst: r.Remote.Addr()})
	return unix.Sendto(raw, pkt[:], 0, &unix.SockaddrInet4{Addr: r.Remote.Addr().As4()})
}

// summary names the first connections of conns.
func summary(conns []steer.Rule) string {
	const most = 8
	var b strings.Builder
	for i, r := range conns {
		if i == most {
			fmt.Fprintf(&b, " and %d more", len(conns)-most)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s<-%s", r.Local, r.Remote)
	}
	return b.String()
}
