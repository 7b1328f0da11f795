package testbed_test

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
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

// A bridged bed: each side routes to Hub's address through the gateway;
// Open finds the Hub again, and Down removes it.
func TestBridged(t *testing.T) {
	testutil.RequireRoot(t)
	const name = "t999999997-1"
	b, err := testbed.Up(name, &testbed.Options{Bridged: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Down() })
	if !b.Plain || b.Queues != 1 {
		t.Errorf("bridged bed: plain %v, %d queues running; want plain, 1", b.Plain, b.Queues)
	}
	for _, s := range []testbed.Side{testbed.A, testbed.B} {
		err := b.Do(s, func() error {
			rs, err := netlink.RouteGet(b.Addr(testbed.Hub).AsSlice())
			if err != nil {
				return err
			}
			if len(rs) != 1 || !rs[0].Gw.Equal(testbed.Gateway.AsSlice()) || !rs[0].Src.Equal(b.Addr(s).AsSlice()) {
				return fmt.Errorf("routes to %v: %v; want one through %v from %v", b.Addr(testbed.Hub), rs, testbed.Gateway, b.Addr(s))
			}
			return nil
		})
		if err != nil {
			t.Errorf("side %v: %v", s, err)
		}
	}
	o, err := testbed.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	if !o.Bridged {
		t.Error("Open did not find the Hub")
	}
	o.Close()
	if err := testbed.Down(name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/var/run/netns/vmx-" + name + "-h"); !os.IsNotExist(err) {
		t.Errorf("Hub's namespace still there after Down: %v", err)
	}
}
