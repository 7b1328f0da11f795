package rules

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

const sample = `# libvma.conf from the VMA user manual, 4.1.3, and more
use os udp_receiver *:9999             # before any application-id: every program
application-id tcp-lat B1
use vma tcp_client 192.168.1.0/24:*:*:*
use os tcp_server *:5001
application-id sock* *
use os udp_sender 198.18.0.0/15:11000-11009
use vmaxdp udp_connect 198.18.0.2:11111:198.18.0.1:*
use os udp_receiver 198.18.0.2:*
`

func ap(s string) netip.AddrPort {
	if s == "" {
		return netip.AddrPort{}
	}
	return netip.MustParseAddrPort(s)
}

func TestDecide(t *testing.T) {
	c, err := Parse(strings.NewReader(sample), "libvma.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		prog, id      string
		role          Role
		local, remote string
		want          string // "" = no rule
	}{
		{"/usr/bin/anything", "x", UDPReceiver, "0.0.0.0:9999", "", "libvma.conf:2"},
		{"tcp-lat", "B1", TCPClient, "10.0.0.1:4000", "192.168.1.7:80", "libvma.conf:4"},
		{"tcp-lat", "other", TCPClient, "10.0.0.1:4000", "192.168.1.7:80", ""},
		{"tcp-lat", "B1", TCPServer, "0.0.0.0:5001", "", "libvma.conf:5"},
		{"sockperf", "VMAXDP_DEFAULT_APPLICATION_ID", UDPSender, "0.0.0.0:5000", "198.19.3.4:11005", "libvma.conf:7"},
		{"sockperf", "", UDPSender, "0.0.0.0:5000", "198.19.3.4:11010", ""},
		{"sockperf", "", UDPConnect, "198.18.0.1:4000", "198.18.0.2:11111", "libvma.conf:8"},
		{"sockperf", "", UDPConnect, "198.18.0.3:4000", "198.18.0.2:11111", ""},
		{"sockperf", "", UDPReceiver, "198.18.0.2:11111", "", "libvma.conf:9"},
		{"iperf", "", UDPReceiver, "198.18.0.2:11111", "", ""},
	} {
		r, ok := c.Decide(tc.prog, tc.id, tc.role, ap(tc.local), ap(tc.remote))
		if got := map[bool]string{true: r.Where}[ok]; got != tc.want {
			t.Errorf("%s/%s %s %s>%s: rule %q (%s), want %q", tc.prog, tc.id, tc.role, tc.local, tc.remote, got, r, tc.want)
		}
	}
	if r, _ := c.Decide("sockperf", "", UDPSender, ap("0.0.0.0:1"), ap("198.18.0.1:11001")); r.String() != "use os udp_sender 198.18.0.0/15:11000-11009" {
		t.Errorf("String() = %q", r)
	}
}

// TestOffloads: whether any rule may offload a socket of the program,
// which decides whether a process giving up root opens its stacks first.
func TestOffloads(t *testing.T) {
	c, err := Parse(strings.NewReader(sample), "libvma.conf")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		prog, id string
		want     bool
	}{
		{"tcp-lat", "B1", true},
		{"tcp-lat", "other", false},
		{"/usr/bin/sockperf", "", true},
		{"iperf", "", false},
	} {
		if got := c.Offloads(tc.prog, tc.id); got != tc.want {
			t.Errorf("Offloads(%q, %q) = %v, want %v", tc.prog, tc.id, got, tc.want)
		}
	}
	if (*Config)(nil).Offloads("x", "") {
		t.Error("no rules file offloads something")
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"use", "want use <vmaxdp|vma|os>"},
		{"use fast udp_receiver *:1", `transport "fast"`},
		{"use os udp_rx *:1", `role "udp_rx"`},
		{"use os udp_receiver 1.2.3.4", `want address:port`},
		{"use os udp_receiver 1.2.3.400:1", `address "1.2.3.400"`},
		{"use os udp_receiver 1.2.3.4/33:1", `address "1.2.3.4/33"`},
		{"use os udp_receiver ::1:1", `want address:port`},
		{"use os udp_receiver *:0", `port "0"`},
		{"use os udp_receiver *:70000", `port "70000"`},
		{"use os udp_receiver *:9-3", `port "9-3"`},
		{"use os udp_sender *:1:*:*", `want address:port`},
		{"application-id onlyone", "want application-id"},
		{"application-id [ *", "program pattern"},
		{"offload everything", `unknown statement "offload"`},
	} {
		_, err := Parse(strings.NewReader("# ok\n"+tc.line+"\n"), "f.conf")
		if !errors.Is(err, ErrSyntax) || !strings.Contains(err.Error(), "f.conf:2: ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want f.conf:2 and %q", tc.line, err, tc.want)
		}
	}
	// Every bad line is reported, not just the first.
	_, err := Parse(strings.NewReader("bad one\nuse os udp_receiver *:1\nbad two\n"), "f")
	if err == nil || !strings.Contains(err.Error(), "f:1:") || !strings.Contains(err.Error(), "f:3:") {
		t.Errorf("two bad lines: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(sample)
	f.Add("use os udp_receiver 1.2.3.4/8:1-2\napplication-id a? *\n")
	f.Fuzz(func(t *testing.T, text string) {
		c, err := Parse(strings.NewReader(text), "fuzz")
		if err != nil {
			if !errors.Is(err, ErrSyntax) && !strings.Contains(err.Error(), "token too long") {
				t.Fatalf("error without ErrSyntax: %v", err)
			}
			return
		}
		for _, role := range []Role{TCPServer, TCPClient, UDPSender, UDPReceiver, UDPConnect} {
			if r, ok := c.Decide("prog", "id", role, ap("1.2.3.4:5"), ap("6.7.8.9:10")); ok {
				_ = r.String()
				if !strings.HasPrefix(r.Where, "fuzz:") {
					t.Fatalf("rule without its line: %+v", r)
				}
			}
		}
	})
}
