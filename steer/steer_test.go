package steer_test

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// helperEnv makes the test binary act as an engine that attaches and then
// waits to be killed (see TestStaleStateAfterSIGKILL): "interface", or
// "interface detach" to detach its program as an engine with no rule
// does (TestBusyWhileDetached), or "interface try" to say "busy" where
// the interface is busy rather than fail (TestAttachRace).
const helperEnv = "VMAXDP_STEER_TEST_HELPER"

// keepForEnv makes the test binary attach in a namespace, give up root
// or chroot, and close (see TestKeepForSetuid): "namespace interface
// setuid|DIR".
const keepForEnv = "VMAXDP_STEER_TEST_KEEPFOR"

func TestMain(m *testing.M) {
	if v := os.Getenv(keepForEnv); v != "" {
		if err := keepForHelper(strings.Fields(v)); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("closed")
		os.Exit(0)
	}
	if v := strings.Fields(os.Getenv(helperEnv)); len(v) > 0 {
		var opts *steer.Options
		if slices.Contains(v, "hold") {
			// As the preload engine's helper does: another process holds
			// a copy of the link, here for holdFor after it was made.
			opts = &steer.Options{OnLink: func(fd int) func() {
				if d, err := unix.Dup(fd); err == nil {
					f := os.NewFile(uintptr(d), "link")
					holder := exec.Command("sleep", fmt.Sprint(holdFor.Seconds()))
					holder.ExtraFiles = []*os.File{f}
					holder.Start()
					f.Close()
				}
				return func() {}
			}}
		}
		p, err := steer.Attach(v[0], opts)
		if err != nil {
			if slices.Contains(v, "try") && errors.Is(err, steer.ErrBusy) {
				fmt.Println("busy")
				os.Exit(0)
			}
			fmt.Println("error:", err)
			os.Exit(1)
		}
		id, _ := p.AddRule(steer.Rule{Kind: steer.RulePort, Proto: unix.IPPROTO_UDP, Local: netip.AddrPortFrom(netip.Addr{}, 4242)})
		if slices.Contains(v, "detach") {
			p.RemoveRule(id)
			if did, err := p.Detach(); !did || err != nil {
				fmt.Println("error: detach:", did, err)
				os.Exit(1)
			}
		}
		fmt.Println("ready")
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(testutil.Main(m))
}

func TestForeignProgramNotReplaced(t *testing.T) {
	bed := testutil.Bed(t, nil)
	err := bed.Do(testbed.B, func() error {
		prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
			Name: "foreign_pass", Type: ebpf.XDP, License: "GPL",
			Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()},
		})
		if err != nil {
			return err
		}
		defer prog.Close()
		l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex(t, bed.Link(testbed.B))})
		if err != nil {
			return err
		}
		defer l.Close()
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err == nil {
			p.Close()
			return errors.New("Attach replaced a foreign XDP program")
		}
		if !errors.Is(err, steer.ErrForeignProgram) || !strings.Contains(err.Error(), "foreign_pass") {
			return fmt.Errorf("want ErrForeignProgram naming foreign_pass, got: %w", err)
		}
		t.Log(err)
		// The foreign program is still there.
		info, err := l.Info()
		if err != nil {
			return err
		}
		if x := info.XDP(); x == nil || x.Ifindex == 0 {
			return errors.New("foreign program detached")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// startHelper starts the test binary as a helper engine on side B of
// bed, in mode (helperEnv, after the interface), and returns it with its
// output; it is killed with the test.
func startHelper(t *testing.T, bed *testbed.Bed, mode string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	return startHelperBy(t, bed, mode, "ip", "netns", "exec", bed.NSName(testbed.B))
}

// startHelperBy is startHelper with the command that enters side B's
// namespace (launcher).
func startHelperBy(t *testing.T, bed *testbed.Bed, mode string, launcher ...string) (*exec.Cmd, *bufio.Reader) {
	t.Helper()
	cmd := exec.Command(launcher[0], append(launcher[1:], os.Args[0], "-test.run=^$")...)
	cmd.Env = append(os.Environ(), helperEnv+"="+strings.TrimSpace(bed.Link(testbed.B)+" "+mode))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, bufio.NewReader(out)
}

// helperLine is the helper's next line of output.
func helperLine(out *bufio.Reader) string {
	line, _ := out.ReadString('\n')
	return strings.TrimSpace(line)
}

// attachBeside attaches on side B (call it there) beside the live
// helper engine pid, and wants ErrBusy naming it.
func attachBeside(bed *testbed.Bed, pid int) error {
	p, err := steer.Attach(bed.Link(testbed.B), nil)
	if want := fmt.Sprintf("pid %d ", pid); !errors.Is(err, steer.ErrBusy) || !strings.Contains(err.Error(), want) {
		if p != nil {
			p.Close()
		}
		return fmt.Errorf("attach beside a live engine: want ErrBusy naming %q, got %v", want, err)
	}
	return nil
}

func TestStaleStateAfterSIGKILL(t *testing.T) {
	bed := testutil.Bed(t, nil)
	cmd, out := startHelper(t, bed, "")
	if line := helperLine(out); line != "ready" {
		t.Fatalf("helper engine: %q", line)
	}
	err := bed.Do(testbed.B, func() error {
		// While the owner lives, the interface is busy.
		if err := attachBeside(bed, cmd.Process.Pid); err != nil {
			return err
		}
		cmd.Process.Signal(unix.SIGKILL)
		cmd.Wait()
		// Its pinned program is still attached; the next engine cleans it.
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			return fmt.Errorf("attach after SIGKILL: %w", err)
		}
		defer p.Close()
		if n := len(p.Rules()); n != 0 {
			return fmt.Errorf("%d rules of the dead engine survived", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// holdFor is how long the helper engine's "hold" mode has another
// process hold its link.
const holdFor = 500 * time.Millisecond

// TestAttachWaitsForHolders: a dead engine's program that another process
// still holds for a moment (its helper, which lets the link go once it
// has kicked the rings) does not keep the next engine off the interface:
// Attach waits for the holder, where it used to fail with ErrBusy at once
// (the next process of a loop that ran one after another stayed on the
// kernel).
func TestAttachWaitsForHolders(t *testing.T) {
	bed := testutil.Bed(t, nil)
	cmd, out := startHelper(t, bed, "hold")
	if line := helperLine(out); line != "ready" {
		t.Fatalf("helper engine: %q", line)
	}
	cmd.Process.Signal(unix.SIGKILL)
	cmd.Wait()
	err := bed.Do(testbed.B, func() error {
		start := time.Now()
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			return fmt.Errorf("attach while the dead engine's link is held: %w", err)
		}
		defer p.Close()
		t.Logf("attached after %v", time.Since(start).Round(time.Millisecond))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestStaleCleanupSparesOtherNamespaces: the clean-up of a dead engine's
// program detaches that program only, not a live engine's on the other
// end of the veth, whose interface has the same ifindex in its own
// namespace (a fresh namespace's first link is 2 in both). Before, the
// clean-up detached the first XDP bpf_link of the host with that ifindex:
// the live one, when it was the older (a kernel-stack client under
// vmaxdp, run twice from one shell, took the server's program off its
// interface on the other side). The dead engine runs in this test's
// mount namespace (nsenter, not ip netns exec, whose mount namespace
// would end with it and take its pins along), so its pinned program
// outlives it, as a program's does when its shell lives on.
func TestStaleCleanupSparesOtherNamespaces(t *testing.T) {
	bed := testutil.Bed(t, nil)
	var live *steer.Program
	if err := bed.Do(testbed.A, func() (err error) {
		live, err = steer.Attach(bed.Link(testbed.A), nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	liveID := testutil.XDPProgram(t, bed, testbed.A)
	if a, b := testutil.Ifindex(t, bed, testbed.A), testutil.Ifindex(t, bed, testbed.B); a != b {
		t.Logf("the two ends have ifindexes %d and %d: the test shows less", a, b)
	}
	cmd, out := startHelperBy(t, bed, "", "nsenter", "--net=/run/netns/"+bed.NSName(testbed.B))
	if line := helperLine(out); line != "ready" {
		t.Fatalf("helper engine: %q", line)
	}
	cmd.Process.Signal(unix.SIGKILL)
	cmd.Wait()
	if testutil.XDPProgram(t, bed, testbed.B) == 0 {
		t.Fatal("the dead engine's program went with it: the test shows nothing")
	}
	err := bed.Do(testbed.B, func() error {
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			return fmt.Errorf("attach after SIGKILL: %w", err)
		}
		return p.Close()
	})
	if err != nil {
		t.Error(err)
	}
	if id := testutil.XDPProgram(t, bed, testbed.A); id != liveID {
		t.Errorf("side A's live program (id %d) is off its interface (id %d there now) after the clean-up on side B", liveID, id)
	}
}

// TestBusyWhileDetached: an engine whose program is off the interface,
// as it is while the engine has no rule (Detach), still owns it: another
// engine gets ErrBusy naming it, and gets the interface once it dies.
func TestBusyWhileDetached(t *testing.T) {
	bed := testutil.Bed(t, nil)
	cmd, out := startHelper(t, bed, "detach")
	if line := helperLine(out); line != "ready" {
		t.Fatalf("helper engine: %q", line)
	}
	if id := testutil.XDPProgram(t, bed, testbed.B); id != 0 {
		t.Fatalf("the helper's program is still attached (id %d)", id)
	}
	err := bed.Do(testbed.B, func() error {
		if err := attachBeside(bed, cmd.Process.Pid); err != nil {
			return fmt.Errorf("with no program attached: %w", err)
		}
		cmd.Process.Kill()
		cmd.Wait()
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			return fmt.Errorf("attach after the owner died: %w", err)
		}
		return p.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestAttachRace: engines that start at once on one interface: one gets
// it, and each of the others gets ErrBusy (it used to find the interface
// free as well and fail at the attach with "file exists", its clean-up
// removing the pins under the winner's name).
func TestAttachRace(t *testing.T) {
	bed := testutil.Bed(t, nil)
	const engines = 4
	var outs []*bufio.Reader
	for range engines {
		_, out := startHelper(t, bed, "try")
		outs = append(outs, out)
	}
	got := map[string]int{}
	for i, out := range outs {
		line := helperLine(out)
		got[line]++
		if line != "ready" && line != "busy" {
			t.Errorf("engine %d: %q", i, line)
		}
	}
	if got["ready"] != 1 || got["busy"] != engines-1 {
		t.Errorf("%d engines attached and %d found the interface busy, want 1 and %d", got["ready"], got["busy"], engines-1)
	}
}

// TestExitingRemovesLockFile: an engine that exits without Close (the
// preload library's) removes its lock file and its pins first, its
// program still attached; a Close after that leaves the lock file
// another engine may have made at the path since.
func TestExitingRemovesLockFile(t *testing.T) {
	bed := testutil.Bed(t, nil)
	err := bed.Do(testbed.B, func() error {
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			return err
		}
		lock := filepath.Join(steer.DefaultLockDir, filepath.Base(p.PinDir())+".lock")
		if _, err := os.Stat(lock); err != nil {
			p.Close()
			return fmt.Errorf("no lock file while attached: %w", err)
		}
		p.Exiting()
		if _, err := os.Stat(lock); !errors.Is(err, os.ErrNotExist) {
			p.Close()
			return fmt.Errorf("lock file %s left by Exiting: %v", lock, err)
		}
		// The pins go too; the program stays attached by the process's
		// own fds, and goes with them.
		if _, err := os.Stat(p.PinDir()); !errors.Is(err, os.ErrNotExist) {
			p.Close()
			return fmt.Errorf("pin directory %s left by Exiting: %v", p.PinDir(), err)
		}
		if testutil.XDPProgram(t, bed, testbed.B) == 0 {
			p.Close()
			return errors.New("the program left the interface at Exiting, before the process ended")
		}
		if err := os.WriteFile(lock, nil, 0o600); err != nil {
			p.Close()
			return err
		}
		defer os.Remove(lock)
		if err := p.Close(); err != nil {
			return err
		}
		if _, err := os.Stat(lock); err != nil {
			return fmt.Errorf("Close removed the next engine's lock file: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	bed := testutil.Bed(t, nil)
	err := bed.Do(testbed.B, func() error {
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			return err
		}
		dir := p.PinDir()
		if _, err := os.Stat(dir + "/rule_stats"); err != nil {
			return fmt.Errorf("counters not pinned: %w", err)
		}
		if err := p.Close(); err != nil {
			return err
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("pins left in %s", dir)
		}
		// Nothing attached any more: a foreign program attaches freely.
		p2, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			return fmt.Errorf("re-attach: %w", err)
		}
		return p2.Close()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestKeepForSetuid: a program readied with KeepFor stays attached with
// no rule, and its process, once it has given up root (setuid) or
// chrooted, still removes its pins and takes it off the interface at
// Close; the pin directory goes too when it stayed root. It runs in a
// helper process that keeps the test's mount namespace, where bpffs and
// the pin directory are root's (mode 0700): without KeepFor, Close fails
// there ("permission denied", "no such file or directory") and leaves
// the program attached by its pinned link.
func TestKeepForSetuid(t *testing.T) {
	bed := testutil.Bed(t, nil)
	for _, how := range []string{"setuid", t.TempDir()} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), keepForEnv+"="+bed.NSName(testbed.B)+" "+bed.Link(testbed.B)+" "+how)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "closed" {
			t.Fatalf("helper (%s): %v\n%s", how, err, out)
		}
		if id := testutil.XDPProgram(t, bed, testbed.B); id != 0 {
			t.Fatalf("helper (%s): program id %d still attached after Close", how, id)
		}
		err = bed.Do(testbed.B, func() error {
			l, err := netlink.LinkByName(bed.Link(testbed.B))
			if err != nil {
				return err
			}
			ino, err := netnsInode()
			if err != nil {
				return err
			}
			dir := filepath.Join(steer.DefaultPinDir, steer.PinDirName(ino, l.Attrs().Index))
			left, err := os.ReadDir(dir)
			switch {
			case err != nil && !errors.Is(err, os.ErrNotExist):
				return err
			case len(left) > 0:
				return fmt.Errorf("pins left in %s: %v", dir, left)
			case err == nil && how != "setuid":
				return fmt.Errorf("%s left behind by a process that stayed root", dir)
			}
			os.Remove(dir) // empty, in root's directory
			return nil
		})
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
	}
}

// keepForHelper attaches in the named namespace, readies the program for
// uid 65534 and becomes it, or for a chroot to the directory named, and
// closes the program.
func keepForHelper(args []string) error {
	if len(args) != 3 {
		return fmt.Errorf("want namespace, interface and setuid or a directory, got %q", args)
	}
	runtime.LockOSThread() // the namespace is this thread's
	ns, err := netns.GetFromName(args[0])
	if err != nil {
		return err
	}
	if err := netns.Set(ns); err != nil {
		return err
	}
	p, err := steer.Attach(args[1], nil)
	if err != nil {
		return err
	}
	uid := 65534
	if args[2] != "setuid" {
		uid = -1
	}
	if err := p.KeepFor(uid); err != nil {
		return err
	}
	if uid < 0 {
		if err := syscall.Chroot(args[2]); err != nil {
			return fmt.Errorf("chroot: %w", err)
		}
	} else if err := syscall.Setuid(uid); err != nil {
		return fmt.Errorf("setuid: %w", err)
	}
	if did, err := p.Detach(); did || err != nil {
		return fmt.Errorf("Detach of a kept program: %v %v", did, err)
	}
	return p.Close()
}

func netnsInode() (uint32, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return 0, err
	}
	return uint32(st.Ino), nil
}

func TestRuleValidation(t *testing.T) {
	bed := testutil.Bed(t, nil)
	bed.Do(testbed.B, func() error {
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		bad := []steer.Rule{
			{Kind: steer.RulePort, Proto: unix.IPPROTO_ICMP, Local: netip.MustParseAddrPort("0.0.0.0:1")},
			{Kind: steer.RulePort, Proto: unix.IPPROTO_UDP, Local: netip.MustParseAddrPort("0.0.0.0:0")},
			{Kind: steer.RuleMcast, Proto: unix.IPPROTO_UDP, Local: netip.MustParseAddrPort("198.18.0.2:5")},
			{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: netip.MustParseAddrPort("0.0.0.0:5")},
		}
		for _, r := range bad {
			if _, err := p.AddRule(r); err == nil {
				t.Errorf("rule %s accepted", r)
			}
		}
		r := steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: netip.MustParseAddrPort("198.18.0.2:5")}
		id, err := p.AddRule(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := p.AddRule(r); err == nil {
			t.Error("duplicate rule accepted")
		}
		return p.RemoveRule(id)
	})
}

func ifindex(t *testing.T, name string) int {
	t.Helper()
	var ifr *unix.Ifreq
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFINDEX, ifr); err != nil {
		t.Fatal(err)
	}
	return int(ifr.Uint32())
}

// TestRemoveNetnsPins: a namespace's pins go, every interface's, and
// another namespace's and whatever is not a pin directory stay.
func TestRemoveNetnsPins(t *testing.T) {
	dir := t.TempDir()
	names := []string{steer.PinDirName(7, 2), steer.PinDirName(7, 5), steer.PinDirName(8, 2), "7_x", "other"}
	for _, n := range names {
		if err := os.MkdirAll(filepath.Join(dir, n, "link"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := steer.RemoveNetnsPins(dir, 7); err != nil {
		t.Fatal(err)
	}
	var left []string
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if want := []string{"7_x", steer.PinDirName(8, 2), "other"}; !slices.Equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}
	if err := steer.RemoveNetnsPins(filepath.Join(dir, "absent"), 7); err != nil {
		t.Fatalf("no pin directory: %v", err)
	}
}

// TestRemoveNetnsLocks: a namespace's lock files go, but one an engine
// holds, another namespace's and whatever is not a lock file.
func TestRemoveNetnsLocks(t *testing.T) {
	dir := t.TempDir()
	names := []string{steer.PinDirName(7, 2) + ".lock", steer.PinDirName(7, 5) + ".lock", steer.PinDirName(8, 2) + ".lock", "7_2", "other.lock"}
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	held, err := os.Open(filepath.Join(dir, steer.PinDirName(7, 5)+".lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if err := unix.Flock(int(held.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	if err := steer.RemoveNetnsLocks(dir, 7); err != nil {
		t.Fatal(err)
	}
	var left []string
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		left = append(left, e.Name())
	}
	if want := []string{"7_2", steer.PinDirName(7, 5) + ".lock", steer.PinDirName(8, 2) + ".lock", "other.lock"}; !slices.Equal(left, want) {
		t.Fatalf("left %v, want %v", left, want)
	}
	if err := steer.RemoveNetnsLocks(filepath.Join(dir, "absent"), 7); err != nil {
		t.Fatalf("no lock directory: %v", err)
	}
}

func TestPinDirName(t *testing.T) {
	name := steer.PinDirName(4026532246, 7)
	if ns, idx, ok := steer.ParsePinDirName(name); !ok || ns != 4026532246 || idx != 7 {
		t.Fatalf("ParsePinDirName(%q) = %d %d %v", name, ns, idx, ok)
	}
	for _, bad := range []string{"", "4026532246", "x_7", "1_y", "1_-2", "99999999999_1"} {
		if _, _, ok := steer.ParsePinDirName(bad); ok {
			t.Errorf("ParsePinDirName(%q) accepted", bad)
		}
	}
}

// lowFDs lists the fds below highfd's floor that this process holds, with
// what each is.
func lowFDs(t *testing.T) map[int]string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	fds := map[int]string{}
	for _, e := range ents {
		var fd int
		if _, err := fmt.Sscan(e.Name(), &fd); err != nil || fd >= highfd.Floor() {
			continue
		}
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			fds[fd] = l
		}
	}
	return fds
}

// TestAttachKeepsNoLowFD: once attached, the program keeps none of its
// fds (program, link, maps) below highfd's floor, where they would sit on
// the application's next numbers and be closed by its closefrom. Before,
// the arrival_stamps map stayed where the loader put it.
func TestAttachKeepsNoLowFD(t *testing.T) {
	bed := testutil.Bed(t, &testbed.Options{Plain: true})
	if highfd.Floor() == 0 {
		t.Skip("the fd limit is too low for highfd's range")
	}
	err := bed.Do(testbed.B, func() error {
		before := lowFDs(t)
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			return err
		}
		defer p.Close()
		for fd, what := range lowFDs(t) {
			if _, had := before[fd]; !had && strings.HasPrefix(what, "anon_inode:") {
				t.Errorf("fd %d (%s) kept below the floor, %d", fd, what, highfd.Floor())
			}
		}
		return nil
	})
	testutil.SkipIfNotSupported(t, err)
	if err != nil {
		t.Fatal(err)
	}
}

// TestUDPOnly: a program attached for UDP alone holds its TCP maps at one
// entry (preallocated LRU maps: 3 ms each at 65,536) and refuses TCP
// rules; UDP rules work as ever.
func TestUDPOnly(t *testing.T) {
	bed := testutil.Bed(t, nil)
	bed.Do(testbed.B, func() error {
		var verified [2]uint64
		for i, udpOnly := range []bool{false, true} {
			p, err := steer.Attach(bed.Link(testbed.B), &steer.Options{UDPOnly: udpOnly})
			if err != nil {
				t.Fatal(err)
			}
			if verified[i], err = p.VerifiedInstructions(); err != nil {
				t.Logf("verified instructions not told: %v", err)
			}
			want := uint32(65536)
			if udpOnly {
				want = 1
			}
			if got := p.SYNMap().MaxEntries(); got != want {
				t.Errorf("UDPOnly %v: stack_syns holds %d entries, want %d", udpOnly, got, want)
			}
			tcp := steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_TCP, Local: netip.MustParseAddrPort("198.18.0.2:80")}
			id, err := p.AddRule(tcp)
			switch {
			case udpOnly && !errors.Is(err, errors.ErrUnsupported):
				t.Errorf("UDPOnly: TCP rule: %v, want ErrUnsupported", err)
			case !udpOnly && err != nil:
				t.Errorf("TCP rule: %v", err)
			case !udpOnly:
				p.RemoveRule(id)
			}
			udp := steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: netip.MustParseAddrPort("198.18.0.2:5")}
			if id, err := p.AddRule(udp); err != nil {
				t.Errorf("UDPOnly %v: UDP rule: %v", udpOnly, err)
			} else {
				p.RemoveRule(id)
			}
			p.Close()
		}
		// The TCP paths left unexamined: the verifier's work, most of the
		// load's, shrinks (2,681 instructions to 800).
		if verified[0] > 0 && verified[1] > 0 && verified[1] > verified[0]/2 {
			t.Errorf("UDPOnly: the verifier processed %d instructions, want under half of the %d with TCP", verified[1], verified[0])
		}
		return nil
	})
}

// TestRuleCountersPerCPU: a rule's counters are its rows' sum over the
// CPUs that counted, apart from the next rule's; both reads (one rule,
// and the batch of every rule) agree, and ZeroCounters clears every row.
func TestRuleCountersPerCPU(t *testing.T) {
	var cpus unix.CPUSet
	if err := unix.SchedGetaffinity(0, &cpus); err != nil {
		t.Fatal(err)
	}
	bed := testutil.Bed(t, nil)
	err := bed.Do(testbed.B, func() error {
		p, err := steer.Attach(bed.Link(testbed.B), &steer.Options{UDPOnly: true})
		if err != nil {
			return err
		}
		defer p.Close()
		var ids []steer.RuleID
		for _, port := range []string{"5", "6"} {
			id, err := p.AddRule(steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: netip.MustParseAddrPort("198.18.0.2:" + port)})
			if err != nil {
				return err
			}
			ids = append(ids, id)
		}
		// bed.Do holds its thread, which each CPU's runs are pinned to.
		defer unix.SchedSetaffinity(0, &cpus)
		frame := udpFrame(t, 7, 5)
		want := uint64(0)
		for cpu := range 1024 {
			if !cpus.IsSet(cpu) {
				continue
			}
			var one unix.CPUSet
			one.Set(cpu)
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				return err
			}
			for range cpu + 1 {
				if _, err := p.Run(frame); err != nil {
					return err
				}
				want++
			}
		}
		c, err := p.RuleCounters(ids[0])
		if err != nil {
			return err
		}
		if c.MatchedPackets != want || c.MatchedBytes != want*uint64(len(frame)) {
			t.Errorf("rule on port 5: %+v, want %d packets of %d bytes over %d CPUs", c, want, len(frame), cpus.Count())
		}
		snaps, err := p.RuleSnapshots()
		if err != nil {
			return err
		}
		for _, s := range snaps {
			got := s.Counters.MatchedPackets
			if (s.ID == ids[0] && got != want) || (s.ID == ids[1] && got != 0) {
				t.Errorf("batch read: rule %s: %d packets, want %d on port 5 and none on port 6", s.Rule, got, want)
			}
		}
		if err := p.ZeroCounters(); err != nil {
			return err
		}
		if c, err := p.RuleCounters(ids[0]); err != nil || c != (steer.RuleCounters{}) {
			t.Errorf("after ZeroCounters: %+v, %v", c, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// udpFrame is an Ethernet frame with a UDP datagram from 198.18.0.1:sport
// to 198.18.0.2:dport.
func udpFrame(t *testing.T, sport, dport uint16) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP{198, 18, 0, 1}, DstIP: net.IP{198, 18, 0, 2}}
	udp := &layers.UDP{SrcPort: layers.UDPPort(sport), DstPort: layers.UDPPort(dport)}
	udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, udp, gopacket.Payload("ping")); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
