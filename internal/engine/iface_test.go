package engine

import (
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestIfaceCacheFollowsRoutes: the interface the kernel routes a
// destination through is looked up once per ifaceTTL, and a route that
// moves to another interface is followed within it; once a thread has
// entered another namespace (NetnsMoved), a thread there gets that
// namespace's answer, not a cached one.
func TestIfaceCacheFollowsRoutes(t *testing.T) {
	bed := testutil.Bed(t, nil)
	dst := netip.MustParseAddr("198.19.7.7")
	ipIn := func(side testbed.Side, args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", append([]string{"-n", bed.NSName(side)}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	ip := func(args ...string) { t.Helper(); ipIn(testbed.B, args...) }
	// A second interface in side B, for the route to move to.
	ip("link", "add", "vmxq0", "type", "veth", "peer", "name", "vmxq1")
	ip("addr", "add", "198.19.6.1/24", "dev", "vmxq0")
	ip("link", "set", "vmxq0", "up")
	ip("link", "set", "vmxq1", "up")
	ip("route", "add", dst.String()+"/32", "dev", bed.Link(testbed.B))
	ipIn(testbed.A, "route", "add", dst.String()+"/32", "dev", bed.Link(testbed.A))
	e := &Engine{}
	lookup := func(side testbed.Side) (name string) {
		t.Helper()
		if err := bed.Do(side, func() (err error) {
			name, err = e.ifaces.lookup(dst, false)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return name
	}
	looked := time.Now()
	if got := lookup(testbed.B); got != bed.Link(testbed.B) {
		t.Fatalf("route to %s through %s, want %s", dst, got, bed.Link(testbed.B))
	}
	ip("route", "replace", dst.String()+"/32", "dev", "vmxq0")
	// A loaded machine may take longer than ifaceTTL to get here.
	if got := lookup(testbed.B); time.Since(looked) < ifaceTTL && got != bed.Link(testbed.B) {
		t.Errorf("within ifaceTTL: %s, want the cached %s", got, bed.Link(testbed.B))
	}
	time.Sleep(ifaceTTL + 20*time.Millisecond)
	if got := lookup(testbed.B); got != "vmxq0" {
		t.Errorf("after ifaceTTL: %s, want vmxq0, where the route moved", got)
	}
	e.NetnsMoved()
	if got := lookup(testbed.B); got != "vmxq0" {
		t.Errorf("per namespace: %s from side B, want vmxq0", got)
	}
	if got := lookup(testbed.A); got != bed.Link(testbed.A) {
		t.Errorf("per namespace: %s from side A, want %s (its own route)", got, bed.Link(testbed.A))
	}
}
