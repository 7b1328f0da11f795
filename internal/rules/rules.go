// Package rules parses and matches vmaxdp's rules file, which uses the
// syntax of libvma.conf (VMA user manual, 4.1): application-id blocks, each
// followed by first-match "use" statements that choose, per socket role and
// address, whether vmaxdp or the kernel ("os") serves a socket. A libvma.conf
// works unchanged ("vma" means vmaxdp). The package decides; it must not
// touch sockets.
package rules

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path"
	"strconv"
	"strings"
)

// ErrSyntax is wrapped by every parse error.
var ErrSyntax = errors.New("syntax error")

// Transport is who serves a socket.
type Transport int

const (
	Offload Transport = iota // vmaxdp (libvma.conf's "vma")
	OS                       // the kernel
)

func (t Transport) String() string { return [...]string{"vmaxdp", "os"}[t] }

// Role is what a socket does when the decision is taken.
type Role int

const (
	TCPServer Role = iota
	TCPClient
	UDPSender
	UDPReceiver
	UDPConnect
	numRoles
)

var roleNames = [numRoles]string{"tcp_server", "tcp_client", "udp_sender", "udp_receiver", "udp_connect"}

func (r Role) String() string { return roleNames[r] }

// Endpoint matches an address and a port range; the zero prefix and the
// full port range match anything.
type Endpoint struct {
	Prefix         netip.Prefix // invalid: any address
	PortLo, PortHi uint16
}

func (e Endpoint) matches(a netip.AddrPort) bool {
	if e.Prefix.IsValid() && !e.Prefix.Contains(a.Addr()) {
		return false
	}
	return a.Port() >= e.PortLo && a.Port() <= e.PortHi
}

func (e Endpoint) String() string {
	addr := "*"
	if e.Prefix.IsValid() {
		addr = e.Prefix.String()
		if e.Prefix.IsSingleIP() {
			addr = e.Prefix.Addr().String()
		}
	}
	port := "*"
	switch {
	case e.PortLo == 0 && e.PortHi == 65535:
	case e.PortLo == e.PortHi:
		port = strconv.Itoa(int(e.PortLo))
	default:
		port = fmt.Sprintf("%d-%d", e.PortLo, e.PortHi)
	}
	return addr + ":" + port
}

// Rule is one "use" statement.
type Rule struct {
	Transport Transport
	Role      Role
	// First is the endpoint the role is defined by: local for tcp_server
	// and udp_receiver, remote for the others.
	First Endpoint
	// Local is the optional local endpoint of tcp_client and udp_connect.
	Local *Endpoint
	// Where is "file:line".
	Where string
}

func (r Rule) String() string {
	s := fmt.Sprintf("use %s %s %s", r.Transport, r.Role, r.First)
	if r.Local != nil {
		s += ":" + r.Local.String()
	}
	return s
}

type block struct {
	program, id string
	rules       []Rule
}

// Config is a parsed rules file.
type Config struct {
	blocks []block
}

// Load parses the file at name.
func Load(name string) (*Config, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("rules file: %w", err)
	}
	defer f.Close()
	return Parse(f, name)
}

// Parse reads a rules file; name labels errors ("name:line: ...").
func Parse(r io.Reader, name string) (*Config, error) {
	c := &Config{}
	// Statements before any application-id apply to every program.
	cur := block{program: "*", id: "*"}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), 1<<20)
	var errs []error
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		where := fmt.Sprintf("%s:%d", name, n)
		switch f[0] {
		case "application-id":
			if len(f) != 3 {
				errs = append(errs, fmt.Errorf("%s: %w: want application-id <program|*> <id|*>", where, ErrSyntax))
				continue
			}
			if _, err := path.Match(f[1], ""); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w: program pattern %q: %v", where, ErrSyntax, f[1], err))
				continue
			}
			c.blocks = append(c.blocks, cur)
			cur = block{program: f[1], id: f[2]}
		case "use":
			r, err := parseUse(f[1:])
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w: %v", where, ErrSyntax, err))
				continue
			}
			r.Where = where
			cur.rules = append(cur.rules, r)
		default:
			errs = append(errs, fmt.Errorf("%s: %w: unknown statement %q (want application-id or use)", where, ErrSyntax, f[0]))
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", name, err))
	}
	c.blocks = append(c.blocks, cur)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

func parseUse(f []string) (Rule, error) {
	var r Rule
	if len(f) != 3 {
		return r, errors.New("want use <vmaxdp|vma|os> <role> <address|*>:<port|*>[:...]")
	}
	switch f[0] {
	case "vmaxdp", "vma":
		r.Transport = Offload
	case "os":
		r.Transport = OS
	default:
		return r, fmt.Errorf("transport %q: want vmaxdp, vma or os", f[0])
	}
	role := -1
	for i, n := range roleNames {
		if n == f[1] {
			role = i
		}
	}
	if role < 0 {
		return r, fmt.Errorf("role %q: want one of %s", f[1], strings.Join(roleNames[:], ", "))
	}
	r.Role = Role(role)
	parts := strings.Split(f[2], ":")
	pairs := 1
	if r.Role == TCPClient || r.Role == UDPConnect {
		pairs = 2
	}
	if len(parts) != 2 && !(pairs == 2 && len(parts) == 4) {
		return r, fmt.Errorf("%s %q: want address:port%s", r.Role, f[2], map[int]string{1: "", 2: "[:local-address:local-port]"}[pairs])
	}
	var err error
	if r.First, err = parseEndpoint(parts[0], parts[1]); err != nil {
		return r, err
	}
	if len(parts) == 4 {
		l, err := parseEndpoint(parts[2], parts[3])
		if err != nil {
			return r, err
		}
		r.Local = &l
	}
	return r, nil
}

func parseEndpoint(addr, port string) (Endpoint, error) {
	e := Endpoint{PortLo: 0, PortHi: 65535}
	if addr != "*" {
		if strings.Contains(addr, "/") {
			p, err := netip.ParsePrefix(addr)
			if err != nil || !p.Addr().Is4() {
				return e, fmt.Errorf("address %q: want IPv4 address[/prefix] or *", addr)
			}
			e.Prefix = p.Masked()
		} else {
			a, err := netip.ParseAddr(addr)
			if err != nil || !a.Is4() {
				return e, fmt.Errorf("address %q: want IPv4 address[/prefix] or *", addr)
			}
			e.Prefix = netip.PrefixFrom(a, 32)
		}
	}
	if port != "*" {
		lo, hi, ranged := strings.Cut(port, "-")
		l, err1 := strconv.ParseUint(lo, 10, 16)
		h := l
		var err2 error
		if ranged {
			h, err2 = strconv.ParseUint(hi, 10, 16)
		}
		if err1 != nil || err2 != nil || l == 0 || h < l {
			return e, fmt.Errorf("port %q: want 1-65535, a range lo-hi or *", port)
		}
		e.PortLo, e.PortHi = uint16(l), uint16(h)
	}
	return e, nil
}

// Offloads says whether a rule for program (its base name) under
// application id appID may offload a socket.
func (c *Config) Offloads(program, appID string) bool {
	if c == nil {
		return false
	}
	program = path.Base(program)
	for _, b := range c.blocks {
		if m, _ := path.Match(b.program, program); !m || b.id != "*" && b.id != appID {
			continue
		}
		for _, r := range b.rules {
			if r.Transport != OS {
				return true
			}
		}
	}
	return false
}

// Decide returns the first rule that applies to a socket of program (its
// base name) under application id appID, in role, with the given local
// and remote addresses (zero when unknown). ok is false when no rule
// applies.
func (c *Config) Decide(program, appID string, role Role, local, remote netip.AddrPort) (Rule, bool) {
	if c == nil {
		return Rule{}, false
	}
	program = path.Base(program)
	for _, b := range c.blocks {
		if m, _ := path.Match(b.program, program); !m {
			continue
		}
		if b.id != "*" && b.id != appID {
			continue
		}
		for _, r := range b.rules {
			if r.Role != role {
				continue
			}
			first := remote
			if role == TCPServer || role == UDPReceiver {
				first = local
			}
			if !r.First.matches(first) {
				continue
			}
			if r.Local != nil && !r.Local.matches(local) {
				continue
			}
			return r, true
		}
	}
	return Rule{}, false
}
