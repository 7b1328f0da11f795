package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stack"
)

// What setuid() and chroot() do to the engine. A stack opens with root's
// powers and the whole file system: it mounts bpffs, attaches the steering
// program, makes AF_XDP sockets, reads /proc and /sys, and pins its maps
// where only root reaches them. A daemon that gives up
// root before it opens its sockets (mosquitto; any server of a port above
// 1024 that drops to its own user first) would see every socket stay on
// the kernel with "operation not permitted". So, just before the process
// gives up root for good, the engine opens the stack of every interface
// a socket may be served on (up, with an IPv4 address), keeps their
// steering programs attached while they have no rule (they could not be
// attached again), and hands their pins to the new user, who must still
// remove them at exit (steer.Program.KeepFor), as it does its counters
// file. A chroot is met the same way, for the same user.

// BeforeSetuid runs in the thread about to set the process's real,
// effective and saved user IDs to r, eu and s (-1: unchanged) with call
// (setuid, seteuid, setreuid, setresuid). It does its work once, when the
// process is root and the call leaves the effective ID elsewhere: for
// good, or for now, with root kept in the real or saved ID. The process
// may take root back around its own privileged calls (FreeRADIUS binds
// so), but a stack opens later, on the engine's threads, which have the
// effective ID of the moment: FreeRADIUS's sockets all stayed on the
// kernel (mount bpffs: operation not permitted).
func (e *Engine) BeforeSetuid(call string, r, eu, s int) {
	cr, ce, cs := unix.Getresuid()
	if ce != 0 {
		return
	}
	nr, ne, ns := resultingUIDs(call, r, eu, s, cr, ce, cs)
	if ne == 0 || !e.setuid.CompareAndSwap(nil, &setuidNote{call: call, uid: ne}) {
		return
	}
	what := fmt.Sprintf("%s(%d) gives up root", call, ne)
	if nr == 0 || ns == 0 {
		what = fmt.Sprintf("%s(%d) drops root for now", call, ne)
	}
	e.confine(what, ne)
}

// BeforeChroot runs in the thread about to chroot to dir. A chroot hides
// what a stack needs to open (bpffs, /proc, /sys) and to remove its pins
// at exit: as for setuid, the stacks open before, and their pins and the
// counters file stay reachable through open directories. Once, while root
// (no one else may chroot).
func (e *Engine) BeforeChroot(dir string) {
	if unix.Geteuid() != 0 || !e.chroot.CompareAndSwap(false, true) {
		return
	}
	e.confine(fmt.Sprintf("chroot(%s) hides bpffs, /proc and /sys", dir), -1)
}

// confine opens, before the process confines itself (what, for the log),
// the stacks it could not open after, and readies every stack for uid
// (-1: the same user) and for paths it will no longer reach.
func (e *Engine) confine(what string, uid int) {
	if e.pub != nil && e.pub.w != nil && uid >= 0 {
		if err := e.pub.w.Chown(uid); err != nil {
			e.Log.Printf(params.LevelWarning, "%s: %v: the file stays behind at exit", what, err)
		}
	}
	if !e.p.OffloadedSockets && !e.rules.Offloads(e.program, e.p.ApplicationID) {
		return
	}
	names, err := stack.IPv4Interfaces()
	if err != nil {
		e.Log.Printf(params.LevelWarning, "%s, which opening a stack needs, and the interfaces could not be listed: %v; sockets opened from now on stay on the kernel", what, err)
		return
	}
	e.preparing.Store(true)
	for _, name := range names {
		e.mu.Lock()
		_, busy := e.opening[name]
		if e.stacks[name] != nil || e.stackErr[name] != nil || busy {
			e.mu.Unlock()
			continue
		}
		h, err := e.beginOpen(name)
		if err == nil {
			if e.opening == nil {
				e.opening = map[string][]pendingAdopt{}
			}
			e.opening[name] = nil
		}
		e.mu.Unlock()
		if err != nil {
			e.Log.Printf(params.LevelWarning, "%s: %v", what, err)
			continue
		}
		e.openStack(name, h)
	}
	e.opens.Wait() // those other threads began open as root
	e.preparing.Store(false)
	e.mu.Lock()
	stacks := maps.Clone(e.stacks)
	var failed []string
	for _, name := range names {
		if err := e.stackErr[name]; err != nil {
			failed = append(failed, fmt.Sprintf("%s (%v)", name, err))
		}
	}
	e.mu.Unlock()
	var ready []string
	for _, name := range slices.Sorted(maps.Keys(stacks)) {
		if err := stacks[name].Program().KeepFor(uid); err != nil {
			e.Log.Printf(params.LevelWarning, "%s: %v: the stack may stop serving once it has no socket, and leave its pins behind", what, err)
		}
		ready = append(ready, name)
	}
	msg := fmt.Sprintf("%s, which opening a stack needs: opened beforehand the stacks of %s", what, listOr(ready, "no interface"))
	if len(failed) > 0 {
		msg += "; not " + strings.Join(failed, ", ")
	}
	e.Log.Printf(params.LevelInfo, "%s; sockets on an interface that comes later stay on the kernel", msg)
}

// setuidNote is the call that made the process give up root.
type setuidNote struct {
	call string
	uid  int
}

// afterConfine explains an error opening a stack in a process that is no
// longer root (a stack on an interface that came after BeforeSetuid, or
// a process started as another user) or that chrooted. Only a refusal (EPERM, EACCES) or a path not found is such:
// an interface no stack serves (lo) says its own reason alone.
func (e *Engine) afterConfine(err error) error {
	if !errors.Is(err, fs.ErrPermission) && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var how string
	switch uid := unix.Geteuid(); {
	case e.setuid.Load() != nil && uid != 0:
		n := e.setuid.Load()
		how = fmt.Sprintf("the process gave up root with %s(%d)", n.call, n.uid)
	case uid != 0:
		how = fmt.Sprintf("the process runs as uid %d", uid)
	case e.chroot.Load():
		how = "the process chrooted"
	default:
		return err
	}
	return fmt.Errorf("%s, and a stack needs root and the whole file system to open (open a socket on the interface before that): %w", how, err)
}

// resultingUIDs applies call's arguments (-1: unchanged) to the current
// IDs as the kernel does for a privileged caller.
func resultingUIDs(call string, r, e, s, cr, ce, cs int) (int, int, int) {
	pick := func(v, cur int) int {
		if v == -1 {
			return cur
		}
		return v
	}
	switch call {
	case "setuid": // as root: all three
		return e, e, e
	case "setreuid":
		nr, ne := pick(r, cr), pick(e, ce)
		ns := cs
		if r != -1 || (e != -1 && e != cr) {
			ns = ne
		}
		return nr, ne, ns
	}
	return pick(r, cr), pick(e, ce), pick(s, cs)
}

// listOr joins names, or says none.
func listOr(names []string, none string) string {
	if len(names) == 0 {
		return none
	}
	return strings.Join(names, ", ")
}
