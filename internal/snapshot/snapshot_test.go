package snapshot

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/steer"
)

const snmp = `Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 100
Udp: InDatagrams NoPorts InErrors RcvbufErrors
Udp: 10 3 2 2
`

func TestParseSNMP(t *testing.T) {
	v, err := ParseSNMP([]byte(snmp))
	if err != nil {
		t.Fatal(err)
	}
	if v["Udp.NoPorts"] != 3 || v["Ip.InReceives"] != 100 || v["Udp.RcvbufErrors"] != 2 {
		t.Fatalf("got %v", v)
	}
	if _, err := ParseSNMP([]byte("Udp: InDatagrams NoPorts\nUdp: 1\n")); err == nil {
		t.Fatal("short value line accepted")
	}
}

func TestParseSoftnet(t *testing.T) {
	// Two CPUs as Linux 6.18 prints them: 15 columns, the CPU in the 13th.
	recs, err := ParseSoftnet(5, []byte("0000000a 00000001 00000002 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n"+
		"09f72b77 00000000 0000003a 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000000 00000000 00000001 00000000 00000000\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 || recs[0].Device != "cpu0" || recs[0].Values["processed"] != 10 || recs[0].Values["dropped"] != 1 || recs[0].Values["time_squeeze"] != 2 {
		t.Fatalf("got %+v", recs)
	}
	if recs[1].Device != "cpu1" || recs[1].Values["received_rps"] != 3 || recs[1].Values["time_squeeze"] != 0x3a {
		t.Fatalf("second CPU: got %+v", recs[1])
	}
	if _, err := ParseSoftnet(0, []byte("zz yy xx\n")); err == nil {
		t.Fatal("non-hex accepted")
	}
}

// Every CPU of this machine gets a record of its own.
func TestSoftnetThisMachine(t *testing.T) {
	b, err := os.ReadFile("/proc/net/softnet_stat")
	if err != nil {
		t.Skipf("no /proc/net/softnet_stat: %v", err)
	}
	recs, err := ParseSoftnet(0, b)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		if seen[r.Device] {
			t.Fatalf("%s twice in %q", r.Device, b)
		}
		seen[r.Device] = true
	}
}

func FuzzParsers(f *testing.F) {
	f.Add([]byte(snmp))
	f.Add([]byte("0000000a 00000001 00000002\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseSNMP(b)
		_, _ = ParseSoftnet(0, b)
	})
}

// A steering program whose namespace the recorder did not enter is named
// from its engine's counters file: the pin directory there gives its
// namespace and ifindex.
func TestSteeringNamedFromStatsFile(t *testing.T) {
	dir := t.TempDir()
	w, err := stats.Create(dir, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	const netns, ifindex = 4026599999, 7
	snap := &stats.Snapshot{Programs: []stats.Program{{Interface: "vmxq", Netns: netns,
		PinDir: filepath.Join(steer.DefaultPinDir, steer.PinDirName(netns, ifindex))}}}
	if err := w.Publish(snap); err != nil {
		t.Fatal(err)
	}
	_, names, err := processes(1, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := []string{linkName(nil, names, netns, 7), linkName(nil, names, netns, 8)}; !slices.Equal(got, []string{"vmxq", "ifindex 8"}) {
		t.Errorf("devices %q, want the steering program on ifindex 7 named vmxq and the one on 8 left as is", got)
	}
}

// A file left at a namespace's name while `ip netns del` removes it (the
// unmounted mount point) is not taken for a namespace.
func TestIsNetns(t *testing.T) {
	self, err := netns.Get()
	if err != nil {
		t.Skipf("own network namespace: %v", err)
	}
	defer self.Close()
	if !isNetns(self) {
		t.Errorf("own network namespace not taken for one")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "vmx-gone"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if isNetns(netns.NsHandle(f.Fd())) {
		t.Errorf("a plain file taken for a network namespace")
	}
}
