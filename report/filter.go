package report

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vmaxdp/vmaxdp/tracefmt"
)

// Filter selects what a report looks at, after the fact. --time and --cpu
// select every event; --dev also selects NAPI polls; --flow and --reason
// select packets (drops and stages). Counter snapshots are selected by time
// and device only.
type Filter struct {
	Dev     string          // interface name
	Flow    *FlowFilter     // nil: any
	Reasons map[string]bool // drop reason names, upper case; nil: any
	CPUs    map[uint32]bool // nil: any
	// From and To bound event times, relative to the start of the
	// recording; To == 0 means the end.
	From, To time.Duration
}

// FlowFilter matches IPv4 flows; zero fields match anything.
type FlowFilter struct {
	Proto            uint8
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
}

func (f *FlowFilter) match(fl *tracefmt.Flow) bool {
	return (f.Proto == 0 || f.Proto == fl.Proto) &&
		(!f.Src.IsValid() || f.Src == fl.Src.Addr()) && (!f.Dst.IsValid() || f.Dst == fl.Dst.Addr()) &&
		(f.SrcPort == 0 || f.SrcPort == fl.Src.Port()) && (f.DstPort == 0 || f.DstPort == fl.Dst.Port())
}

func (f *FlowFilter) String() string {
	side := func(a netip.Addr, p uint16) string {
		s := "*"
		if a.IsValid() {
			s = a.String()
		}
		if p != 0 {
			s += ":" + strconv.Itoa(int(p))
		}
		return s
	}
	s := side(f.Src, f.SrcPort) + ">" + side(f.Dst, f.DstPort)
	if f.Proto != 0 {
		s = tracefmt.ProtoName(f.Proto) + " " + s
	}
	return s
}

// ParseFlow reads "[PROTO ]SRC[:PORT]>DST[:PORT]", where PROTO is udp, tcp
// or icmp and an address may be "*" or empty for any: "udp
// 198.18.0.1>198.18.0.2:9", ">*:9", "198.18.0.1>".
func ParseFlow(s string) (*FlowFilter, error) {
	var f FlowFilter
	s = strings.TrimSpace(s)
	if proto, rest, ok := strings.Cut(s, " "); ok {
		switch strings.ToLower(proto) {
		case "udp":
			f.Proto = 17
		case "tcp":
			f.Proto = 6
		case "icmp":
			f.Proto = 1
		default:
			return nil, fmt.Errorf("flow %q: protocol %q is not udp, tcp or icmp", s, proto)
		}
		s = strings.TrimSpace(rest)
	}
	src, dst, ok := strings.Cut(s, ">")
	if !ok {
		return nil, fmt.Errorf("flow %q: want [PROTO ]SRC[:PORT]>DST[:PORT]", s)
	}
	var err error
	if f.Src, f.SrcPort, err = parseSide(src); err != nil {
		return nil, fmt.Errorf("flow %q: source: %w", s, err)
	}
	if f.Dst, f.DstPort, err = parseSide(dst); err != nil {
		return nil, fmt.Errorf("flow %q: destination: %w", s, err)
	}
	return &f, nil
}

func parseSide(s string) (netip.Addr, uint16, error) {
	s = strings.TrimSpace(s)
	host, port, hasPort := strings.Cut(s, ":")
	var a netip.Addr
	if host != "" && host != "*" {
		var err error
		if a, err = netip.ParseAddr(host); err != nil || !a.Is4() {
			return a, 0, fmt.Errorf("%q is not an IPv4 address", host)
		}
	}
	if !hasPort || port == "*" || port == "" {
		return a, 0, nil
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return a, 0, fmt.Errorf("port %q is not in 1..65535", port)
	}
	return a, uint16(p), nil
}

// ParseTime reads "FROM,TO": offsets from the start of the recording in
// seconds ("1.5") or as Go durations ("1500ms"); either may be empty.
func ParseTime(s string) (from, to time.Duration, err error) {
	a, b, ok := strings.Cut(s, ",")
	if !ok {
		return 0, 0, fmt.Errorf("time %q: want FROM,TO (seconds from the start; either may be empty)", s)
	}
	if from, err = parseOffset(a); err != nil {
		return 0, 0, fmt.Errorf("time %q: from: %w", s, err)
	}
	if to, err = parseOffset(b); err != nil {
		return 0, 0, fmt.Errorf("time %q: to: %w", s, err)
	}
	if to != 0 && to <= from {
		return 0, 0, fmt.Errorf("time %q: the end is not after the start", s)
	}
	return from, to, nil
}

func parseOffset(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return d, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f > 1e9 {
		return 0, fmt.Errorf("%q is not a non-negative number of seconds or a duration", s)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// ParseCPUs reads a CPU list: "0,2-3".
func ParseCPUs(s string) (map[uint32]bool, error) {
	out := map[uint32]bool{}
	for _, item := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(item), "-")
		a, err := strconv.ParseUint(lo, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %q is not a CPU number", s, lo)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 10, 16); err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, item)
			}
		}
		for c := a; c <= b; c++ {
			out[uint32(c)] = true
		}
	}
	return out, nil
}

// ParseReasons reads a comma-separated list of drop reason names.
func ParseReasons(s string) map[string]bool {
	out := map[string]bool{}
	for _, r := range strings.Split(s, ",") {
		if r = strings.ToUpper(strings.TrimSpace(r)); r != "" {
			out[r] = true
		}
	}
	return out
}

func (f *Filter) String() string {
	var parts []string
	if f.Dev != "" {
		parts = append(parts, "dev "+f.Dev)
	}
	if f.Flow != nil {
		parts = append(parts, "flow "+f.Flow.String())
	}
	if len(f.Reasons) > 0 {
		parts = append(parts, "reason "+strings.Join(slices.Sorted(maps.Keys(f.Reasons)), ","))
	}
	if len(f.CPUs) > 0 {
		var cs []string
		for _, c := range slices.Sorted(maps.Keys(f.CPUs)) {
			cs = append(cs, strconv.Itoa(int(c)))
		}
		parts = append(parts, "cpu "+strings.Join(cs, ","))
	}
	if f.From != 0 || f.To != 0 {
		to := "end"
		if f.To != 0 {
			to = f.To.String()
		}
		parts = append(parts, fmt.Sprintf("time %s to %s", f.From, to))
	}
	return strings.Join(parts, "; ")
}
