package verbs

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/steer"
)

// TestFlowSpecLayout builds each rule kind's flow with FlowSpec and with
// rdma-core's own structs (testdata/flowspec.c, compiled against this
// machine's <infiniband/verbs.h>), and compares them byte for byte.
func TestFlowSpecLayout(t *testing.T) {
	if _, err := os.Stat("/usr/include/infiniband/verbs.h"); err != nil {
		t.Skip("no <infiniband/verbs.h> to check the layout against (make deps installs libibverbs-dev)")
	}
	cc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("no gcc (make deps installs it)")
	}
	prog := filepath.Join(t.TempDir(), "flowspec")
	if out, err := exec.Command(cc, "-Wall", "-Werror", "-o", prog, "testdata/flowspec.c").CombinedOutput(); err != nil {
		t.Fatalf("compile testdata/flowspec.c: %v\n%s", err, out)
	}
	mac := net.HardwareAddr{0x02, 0x5a, 0x11, 0x22, 0x33, 0x44}
	ap := netip.MustParseAddrPort
	cases := []struct {
		rule     steer.Rule
		priority int
	}{
		{steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_UDP, Local: ap("198.18.0.2:7000"), Remote: ap("198.18.0.1:5001")}, priority5Tuple},
		{steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_TCP, Local: ap("198.18.0.2:6379"), Remote: ap("198.18.0.1:40000")}, priority5Tuple},
		{steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: ap("198.18.0.2:53")}, priorityLocal},
		{steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_TCP, Local: ap("198.18.0.2:11211")}, priorityLocal},
		{steer.Rule{Kind: steer.RuleMcast, Proto: unix.IPPROTO_UDP, Local: ap("239.129.3.4:12345")}, priorityLocal},
		{steer.Rule{Kind: steer.RulePort, Proto: unix.IPPROTO_UDP, Local: ap("0.0.0.0:9000")}, priorityPort},
		{steer.Rule{Kind: steer.RulePort, Proto: unix.IPPROTO_TCP, Local: ap("0.0.0.0:80")}, priorityPort},
	}
	var in strings.Builder
	for _, c := range cases {
		remote := c.rule.Remote
		if !remote.IsValid() {
			remote = ap("0.0.0.0:0")
		}
		proto := "udp"
		if c.rule.Proto == unix.IPPROTO_TCP {
			proto = "tcp"
		}
		fmt.Fprintf(&in, "%s %s %s %d %s %d %s 1 %d\n", c.rule.Kind, proto, c.rule.Local.Addr(), c.rule.Local.Port(),
			remote.Addr(), remote.Port(), mac, c.priority)
	}
	cmd := exec.Command(prog)
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("flowspec: %v", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Scan()
	if want := fmt.Sprintf("sizes %d %d %d %d", flowAttrLen, specEthLen, specIPv4Len, specL4Len); sc.Text() != want {
		t.Fatalf("rdma-core's struct sizes: %q, want %q", sc.Text(), want)
	}
	for _, c := range cases {
		if !sc.Scan() {
			t.Fatalf("flowspec printed nothing for %s", c.rule)
		}
		want, err := hex.DecodeString(sc.Text())
		if err != nil {
			t.Fatal(err)
		}
		got, err := FlowSpec(c.rule, 1, mac)
		if err != nil {
			t.Fatalf("%s: %v", c.rule, err)
		}
		if string(got) != string(want) {
			t.Errorf("%s:\n got %x\nwant %x", c.rule, got, want)
		}
	}
}

// TestFlowSpecErrors: what a flow cannot express is refused with the
// rule named.
func TestFlowSpecErrors(t *testing.T) {
	mac := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	ap := netip.MustParseAddrPort
	for _, c := range []struct {
		rule steer.Rule
		port uint8
		mac  net.HardwareAddr
		want string
	}{
		{steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_ICMP, Local: ap("198.18.0.2:53")}, 1, mac, "protocol 1"},
		{steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: ap("198.18.0.2:53")}, 0, mac, "device port 0"},
		{steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: ap("198.18.0.2:53")}, 1, mac[:4], "want 6 bytes"},
		{steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: ap("198.18.0.2:0")}, 1, mac, "local port 0"},
		{steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_UDP, Local: ap("[2001:db8::1]:53"), Remote: ap("198.18.0.1:5")}, 1, mac, "IPv4"},
		{steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: ap("0.0.0.0:53")}, 1, mac, "unicast"},
		{steer.Rule{Kind: steer.RuleMcast, Proto: unix.IPPROTO_UDP, Local: ap("198.18.0.2:53")}, 1, mac, "multicast"},
	} {
		_, err := FlowSpec(c.rule, c.port, c.mac)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.rule.String()) {
			t.Errorf("%s (port %d, mac %v): %v, want an error naming the rule and %q", c.rule, c.port, c.mac, err, c.want)
		}
	}
}
