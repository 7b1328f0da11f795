package verbs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vmaxdp/vmaxdp/backend"
)

var (
	// ErrNoDevice is returned when no RDMA device backs an interface.
	ErrNoDevice = errors.New("no RDMA device")
	// ErrNoLibrary is returned when libibverbs cannot be loaded.
	ErrNoLibrary = errors.New("libibverbs cannot be loaded")
	// ErrNotSupported is returned for a device the backend cannot drive.
	ErrNotSupported = backend.ErrNotSupported
)

// sysfs is where the kernel's device tree is mounted.
const sysfs = "/sys/class"

// Device is the RDMA device and port behind a network interface.
type Device struct {
	Interface string
	Name      string // as libibverbs names it: mlx5_0
	Port      uint8  // 1-based
}

func (d Device) String() string { return fmt.Sprintf("%s port %d (%s)", d.Name, d.Port, d.Interface) }

// Find returns the RDMA device and port behind ifname: the device of the
// interface's PCI function (device/infiniband), with the port whose GID
// table names the interface; else any device whose GID table does (RoCE
// over other drivers).
func Find(ifname string) (Device, error) {
	netdev := filepath.Join(sysfs, "net", ifname)
	if _, err := os.Stat(netdev); err != nil {
		return Device{}, fmt.Errorf("interface %s: %w", ifname, err)
	}
	byPort := portsNaming(ifname)
	if names, _ := os.ReadDir(filepath.Join(netdev, "device", "infiniband")); len(names) > 0 {
		d := Device{Interface: ifname, Name: names[0].Name(), Port: 1}
		if p, ok := byPort[d.Name]; ok {
			d.Port = p
		} else if b, err := os.ReadFile(filepath.Join(netdev, "dev_port")); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n >= 0 && n < 255 {
				d.Port = uint8(n + 1)
			}
		}
		return d, nil
	}
	devs := make([]string, 0, len(byPort))
	for name := range byPort {
		devs = append(devs, name)
	}
	if len(devs) == 0 {
		return Device{}, fmt.Errorf("interface %s: %w behind it (%s absent, and no port under %s names it)",
			ifname, ErrNoDevice, filepath.Join(netdev, "device", "infiniband"), filepath.Join(sysfs, "infiniband"))
	}
	slices.Sort(devs)
	return Device{Interface: ifname, Name: devs[0], Port: byPort[devs[0]]}, nil
}

// portsNaming maps each RDMA device with a port whose GID table names
// ifname (ports/N/gid_attrs/ndevs/*) to that port.
func portsNaming(ifname string) map[string]uint8 {
	found := map[string]uint8{}
	files, _ := filepath.Glob(filepath.Join(sysfs, "infiniband", "*", "ports", "*", "gid_attrs", "ndevs", "*"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || strings.TrimSpace(string(b)) != ifname {
			continue
		}
		rel, _ := filepath.Rel(filepath.Join(sysfs, "infiniband"), f)
		parts := strings.Split(rel, string(filepath.Separator)) // dev, ports, N, gid_attrs, ndevs, idx
		if n, err := strconv.Atoi(parts[2]); err == nil && n > 0 && n < 256 {
			if _, ok := found[parts[0]]; !ok {
				found[parts[0]] = uint8(n)
			}
		}
	}
	return found
}

// Probe says whether the verbs backend can serve ifname, and if not,
// what is missing: the device behind it (Find), libibverbs, a provider
// that lists the device, or the backend's datapath.
func Probe(ifname string) (Device, error) {
	d, err := Find(ifname)
	if err != nil {
		return d, err
	}
	names, err := Devices()
	if err != nil {
		return d, fmt.Errorf("%s: %w", d, err)
	}
	if !slices.Contains(names, d.Name) {
		return d, fmt.Errorf("%s: libibverbs lists %v, not %s: no provider for its driver (apt-get install ibverbs-providers)", d, names, d.Name)
	}
	return d, fmt.Errorf("%s: raw packet QPs: %w: the verbs datapath is not built yet", d, ErrNotSupported)
}
