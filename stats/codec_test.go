package stats

import (
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// TestLayoutHash: layoutHash is the hash of Snapshot's layout, every
// field's name, json tag and kind in order. A change of Snapshot fails
// here until the constant is updated.
func TestLayoutHash(t *testing.T) {
	h := fnv.New64a()
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		fmt.Fprintf(h, "%s(", t.Kind())
		switch t.Kind() {
		case reflect.Struct:
			for i := range t.NumField() {
				f := t.Field(i)
				fmt.Fprintf(h, "%s/%s:", f.Name, f.Tag.Get("json"))
				walk(f.Type)
			}
		case reflect.Slice:
			walk(t.Elem())
		}
		h.Write([]byte(")"))
	}
	walk(reflect.TypeFor[Snapshot]())
	if got := h.Sum64(); got != layoutHash {
		t.Fatalf("Snapshot's layout hashes to %#x, layoutHash is %#x: update layoutHash in codec.go (and FormatVersion if old files no longer decode)", got, layoutHash)
	}
}

// TestStartTicks reads the start time (field 22 of /proc/PID/stat) of
// this process and of one whose command name holds spaces and a
// parenthesis, as a whole-file read and a split after the name's last
// ')' find it.
func TestStartTicks(t *testing.T) {
	// The kernel names a process (comm) after the file it executes.
	path, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep")
	}
	link := t.TempDir() + "/a b) c"
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(link, "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	var starts []uint64
	for _, pid := range []int{os.Getpid(), cmd.Process.Pid} {
		got, err := StartTicks(pid)
		if err != nil {
			t.Fatalf("pid %d: %v", pid, err)
		}
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if want, _ := strconv.ParseUint(f[19], 10, 64); got != want || got == 0 {
			t.Errorf("pid %d (%q): start %d, want %d", pid, s[:strings.LastIndexByte(s, ')')+1], got, want)
		}
		starts = append(starts, got)
	}
	// A check the parse above does not share: the child started after
	// this process, and neither after now (USER_HZ is 100 on Linux).
	up, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	secs, err := strconv.ParseFloat(strings.Fields(string(up))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	if now := uint64(secs*100) + 1; starts[1] < starts[0] || starts[1] > now {
		t.Errorf("start ticks: this process %d, its child %d, now %d: want this <= child <= now", starts[0], starts[1], now)
	}
	if _, err := StartTicks(1 << 30); err == nil || !strings.Contains(err.Error(), "/proc/1073741824/stat") {
		t.Errorf("a pid that does not exist: %v, want an error naming its file", err)
	}
}
