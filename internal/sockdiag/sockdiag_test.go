package sockdiag

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOwnerOldest: a socket held by this process and by a child started
// later (as the helper that outlives a process holds its AF_XDP sockets)
// is this process's.
func TestOwnerOldest(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	var st unix.Stat_t
	if err := unix.Fstat(fds[0], &st); err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "5")
	child.ExtraFiles = []*os.File{os.NewFile(uintptr(fds[0]), "pair")}
	if err := child.Start(); err != nil {
		t.Skipf("no sleep(1) to hold the copy: %v", err)
	}
	defer func() { child.Process.Kill(); child.Wait() }()
	// The child holds its copy once it runs sleep.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if l, err := os.Readlink("/proc/" + strconv.Itoa(child.Process.Pid) + "/fd/3"); err == nil && l != "" {
			if comm, _ := os.ReadFile("/proc/" + strconv.Itoa(child.Process.Pid) + "/comm"); string(comm) == "sleep\n" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the child never held its copy")
		}
	}
	pid, fd, _ := Owner(st.Ino)
	if pid != os.Getpid() || fd != fds[0] {
		t.Errorf("Owner: pid %d fd %d, want this process's (%d) fd %d, not the child's (%d)", pid, fd, os.Getpid(), fds[0], child.Process.Pid)
	}
}

// TestOldestByNumber: of the holders the glob lists as text, the lowest
// pid, which the text's first is not.
func TestOldestByNumber(t *testing.T) {
	pid, fd := oldest([]string{"/proc/10003/fd/5", "/proc/9999/fd/7", "/proc/99999/fd/2"})
	if pid != 9999 || fd != 7 {
		t.Errorf("oldest: pid %d fd %d, want 9999 and 7", pid, fd)
	}
}
