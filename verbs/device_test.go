package verbs

import (
	"errors"
	"os"
	"strings"
	"testing"
)

// TestFindNoDevice: on an interface no RDMA device backs (this machine
// has none), Find and Probe say so, naming the interface and where they
// looked; a missing interface is named too.
func TestFindNoDevice(t *testing.T) {
	for _, fn := range []func(string) (Device, error){Find, Probe} {
		_, err := fn("lo")
		if !errors.Is(err, ErrNoDevice) {
			if err == nil {
				t.Skip("an RDMA device backs lo on this machine")
			}
			t.Fatalf("lo: %v, want ErrNoDevice", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "interface lo") || !strings.Contains(msg, "/sys/class/net/lo/device/infiniband") {
			t.Errorf("lo: %q, want the interface and the sysfs paths looked at", msg)
		}
		_, err = fn("vmx-no-such0")
		if !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "vmx-no-such0") {
			t.Errorf("a missing interface: %v, want an error naming it that wraps os.ErrNotExist", err)
		}
	}
}

// TestDevices loads this machine's libibverbs, when installed, and lists
// its devices; on a kernel without RDMA (this one) it says so.
func TestDevices(t *testing.T) {
	if _, err := os.Stat("/usr/lib/x86_64-linux-gnu/libibverbs.so.1"); err != nil {
		if _, err := Devices(); !errors.Is(err, ErrNoLibrary) {
			t.Errorf("without libibverbs: %v, want ErrNoLibrary", err)
		}
		t.Skip("libibverbs is not installed (make deps installs it)")
	}
	names, err := Devices()
	if _, serr := os.Stat("/sys/class/infiniband_verbs"); serr != nil {
		// The kernel has no RDMA subsystem: libibverbs says ENOSYS.
		if !errors.Is(err, ErrNoDevice) || !strings.Contains(err.Error(), "no RDMA support") {
			t.Fatalf("a kernel without RDMA: %v, want ErrNoDevice saying so", err)
		}
		t.Logf("libibverbs loaded: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("libibverbs lists %d devices: %v", len(names), names)
}
