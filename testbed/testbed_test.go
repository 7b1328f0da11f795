package testbed_test

import (
	"os"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

func TestUpReplacesAndStaleRemoved(t *testing.T) {
	testutil.RequireRoot(t)
	// A bed named for a pid that no longer exists, as a killed run leaves.
	stale := "t999999999-1"
	b, err := testbed.Up(stale, &testbed.Options{Queues: 2, MTU: 9000})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	t.Cleanup(func() { testbed.Down(stale) })
	o, err := testbed.Open(stale)
	if err != nil {
		t.Fatal(err)
	}
	if o.Queues != 2 || o.MTU != 9000 {
		t.Errorf("bed has %d queues, MTU %d; want 2, 9000", o.Queues, o.MTU)
	}
	o.Close()
	// Up on an existing name replaces it.
	b, err = testbed.Up(stale, nil)
	if err != nil {
		t.Fatalf("up over an existing bed: %v", err)
	}
	b.Close()
	removed, err := testbed.RemoveStale()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, stale) {
		t.Fatalf("RemoveStale removed %v, want %s", removed, stale)
	}
	names, _ := testbed.List()
	if slices.Contains(names, stale) {
		t.Fatal("stale bed still listed")
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []testbed.Options{{Queues: 65}, {MTU: 100}} {
		if _, err := testbed.Up("never", &o); err == nil {
			t.Errorf("Up accepted %+v", o)
		}
	}
	if _, err := testbed.Up("a/b", nil); err == nil {
		t.Error("Up accepted a name with a slash")
	}
}

// A namespace file with no namespace mounted on it, as a creation that
// failed after making the file leaves, is removed with its bed: Down
// failed on it ("invalid argument"), for good.
func TestDownRemovesUnmountedFile(t *testing.T) {
	testutil.RequireRoot(t)
	const name = "t999999998-1"
	b, err := testbed.Up(name, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	t.Cleanup(func() { testbed.Down(name) })
	path := "/var/run/netns/vmx-" + name + "-a"
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := testbed.Down(name); err != nil {
		t.Fatalf("Down with side A's file unmounted: %v", err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("%s still there after Down: %v", path, err)
	}
}
