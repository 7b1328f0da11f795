// Package snapshot reads the counters a trace file carries next to its
// events: interface statistics, ethtool -S, /proc/net/snmp and AF_XDP
// socket statistics per network namespace, /proc/net/softnet_stat, the
// counters vmaxdp's steering programs pin on bpffs, and the counters files
// of the processes running under vmaxdp (their sockets and queues, as
// `vmaxdp stats` shows them). Each source is one tracefile.Counters record,
// so that a report can line them up with the events on one clock.
//
// Sources and their names: netdev, ethtool, snmp, softnet, xsk (the
// kernel's XDP_STATISTICS per AF_XDP socket), vmaxdp (a steering program),
// vmaxdp_socket and vmaxdp_queue (a process's offloaded socket and AF_XDP
// queue, with the counter names of package stats).
//
// It must not keep state between snapshots: deltas are the report's job.
package snapshot

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/safchain/ethtool"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/tracefile"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// Namespace is a network namespace to read counters in.
type Namespace struct {
	Name  string // "" for the recorder's own
	Inode uint32
	h     netns.NsHandle
}

// Namespaces returns the recorder's own network namespace and the named
// ones (ip netns), each once.
func Namespaces() ([]Namespace, error) {
	self, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("own network namespace: %w", err)
	}
	out := []Namespace{{Inode: inode(self), h: self}}
	seen := map[uint32]bool{inode(self): true}
	entries, _ := os.ReadDir("/run/netns")
	for _, e := range entries {
		h, err := netns.GetFromPath(filepath.Join("/run/netns", e.Name()))
		if err != nil {
			continue // removed meanwhile
		}
		if !isNetns(h) {
			// Opened between `ip netns del`'s unmount and its unlink: the
			// mount point, not a namespace.
			h.Close()
			continue
		}
		ino := inode(h)
		if seen[ino] {
			h.Close()
			continue
		}
		seen[ino] = true
		out = append(out, Namespace{Name: e.Name(), Inode: ino, h: h})
	}
	return out, nil
}

// Close releases the namespace handle.
func (n *Namespace) Close() { n.h.Close() }

// isNetns says whether h is a namespace (of the nsfs file system).
func isNetns(h netns.NsHandle) bool {
	var st unix.Statfs_t
	return unix.Fstatfs(int(h), &st) == nil && st.Type == unix.NSFS_MAGIC
}

func inode(h netns.NsHandle) uint32 {
	var st unix.Stat_t
	if unix.Fstat(int(h), &st) != nil {
		return 0
	}
	return uint32(st.Ino)
}

// Take reads every source at time now (CLOCK_MONOTONIC ns), the counters
// files of vmaxdp processes in statsDir ("": none). A source that cannot be
// read is skipped and named in the returned error; the records that could
// be read are returned either way.
func Take(now uint64, nss []Namespace, statsDir string) ([]tracefile.Counters, error) {
	var out []tracefile.Counters
	var errs []error
	for i := range nss {
		recs, err := namespace(now, &nss[i])
		out = append(out, recs...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	if c, err := softnet(now); err != nil {
		errs = append(errs, err)
	} else {
		out = append(out, c...)
	}
	var names map[[2]uint32]string
	if statsDir != "" {
		var recs []tracefile.Counters
		var err error
		recs, names, err = processes(now, statsDir, out)
		out = append(out, recs...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	recs, err := vmaxdp(now, nss, names)
	out = append(out, recs...)
	if err != nil {
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// processes reads the counters files of the live vmaxdp processes in dir:
// a vmaxdp_socket record per offloaded socket (Device
// "<ifname>/udp <local>[><remote>] pid <pid> fd <fd>"), a vmaxdp_queue
// record per AF_XDP queue ("<ifname>/q<queue>"), and the queue's
// XDP_STATISTICS as an xsk record where have holds none for it: the
// process reads them with getsockopt, which needs no sock_diag. names maps
// each steering program's namespace and ifindex (from its pin directory)
// to its interface's name.
func processes(now uint64, dir string, have []tracefile.Counters) (_ []tracefile.Counters, names map[[2]uint32]string, _ error) {
	found, err := stats.List(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil
		}
		return nil, nil, err
	}
	names = map[[2]uint32]string{}
	type queueKey struct {
		netns uint32
		dev   string
	}
	xskHave := map[queueKey]bool{}
	for _, c := range have {
		if c.Source == "xsk" {
			xskHave[queueKey{c.Netns, c.Device}] = true
		}
	}
	var out []tracefile.Counters
	var errs []error
	var snap stats.Snapshot
	for _, f := range found {
		if f.Err != nil || !f.Alive {
			continue // another build's file, or a process gone
		}
		r, err := stats.Open(f.Path)
		if err != nil {
			continue // gone since List
		}
		err = r.Read(&snap)
		r.Close()
		if errors.Is(err, stats.ErrNotPublished) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		netnsOf := map[string]uint32{} // by interface: its stack's namespace
		for i := range snap.Programs {
			pr := &snap.Programs[i]
			netnsOf[pr.Interface] = pr.Netns
			if netns, ifindex, ok := steer.ParsePinDirName(filepath.Base(pr.PinDir)); ok {
				names[[2]uint32{netns, uint32(ifindex)}] = pr.Interface
			}
		}
		for i := range snap.Sockets {
			sk := &snap.Sockets[i]
			if !sk.Offloaded() {
				continue
			}
			flow := sk.Local
			if sk.Remote != "" {
				flow += ">" + sk.Remote
			}
			out = append(out, tracefile.Counters{Time: now, Source: "vmaxdp_socket", Netns: netnsOf[sk.Interface],
				Device: fmt.Sprintf("%s/%s %s pid %d fd %d", sk.Interface, sk.Proto, flow, f.PID, sk.FD), Values: stats.FieldMap(&sk.Counters)})
		}
		for i := range snap.Queues {
			q := &snap.Queues[i]
			dev, netns := q.Interface+"/q"+strconv.Itoa(q.Queue), netnsOf[q.Interface]
			out = append(out, tracefile.Counters{Time: now, Source: "vmaxdp_queue", Netns: netns, Device: dev, Values: stats.FieldMap(&q.Counters)})
			if q.StatisticsError == "" && !xskHave[queueKey{netns, dev}] {
				out = append(out, tracefile.Counters{Time: now, Source: "xsk", Netns: netns, Device: dev, Values: stats.FieldMap(&q.Statistics)})
			}
		}
	}
	return out, names, errors.Join(errs...)
}

func namespace(now uint64, ns *Namespace) ([]tracefile.Counters, error) {
	var out []tracefile.Counters
	where := "own netns"
	if ns.Name != "" {
		where = "netns " + ns.Name
	}
	err := netnsutil.Do(ns.h, func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list links: %w", err)
		}
		et, etErr := ethtool.NewEthtool()
		if etErr == nil {
			defer et.Close()
		}
		for _, l := range links {
			a := l.Attrs()
			if a.Statistics != nil {
				out = append(out, tracefile.Counters{Time: now, Source: "netdev", Netns: ns.Inode, Device: a.Name, Values: netdevValues(a.Statistics)})
			}
			if etErr != nil || a.Name == "lo" {
				continue
			}
			if st, err := et.Stats(a.Name); err == nil && len(st) > 0 {
				out = append(out, tracefile.Counters{Time: now, Source: "ethtool", Netns: ns.Inode, Device: a.Name, Values: st})
			}
		}
		out = append(out, xskCounters(now, ns.Inode, links)...)
		b, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		vals, err := ParseSNMP(b)
		if err != nil {
			return fmt.Errorf("/proc/net/snmp: %w", err)
		}
		out = append(out, tracefile.Counters{Time: now, Source: "snmp", Netns: ns.Inode, Values: vals})
		return nil
	})
	if err != nil {
		return out, fmt.Errorf("%s: %w", where, err)
	}
	return out, nil
}

// xskCounters reads the XDP_STATISTICS of every AF_XDP socket of the
// namespace through sock_diag, one record per queue with Device
// "<ifname>/q<queue>". Kernels without CONFIG_XDP_SOCKETS_DIAG give none:
// the report then relies on xdp_redirect_err events.
func xskCounters(now uint64, netns uint32, links []netlink.Link) []tracefile.Counters {
	socks, err := xsk.Sockets()
	if err != nil {
		return nil
	}
	var out []tracefile.Counters
	for _, s := range socks {
		if s.Ifindex == 0 {
			continue // not bound yet
		}
		name := strconv.Itoa(s.Ifindex)
		for _, l := range links {
			if l.Attrs().Index == s.Ifindex {
				name = l.Attrs().Name
			}
		}
		out = append(out, tracefile.Counters{Time: now, Source: "xsk", Netns: netns, Device: name + "/q" + strconv.Itoa(s.Queue), Values: xsk.StatisticsMap(&s.Stats)})
	}
	return out
}

func netdevValues(s *netlink.LinkStatistics) map[string]uint64 {
	return map[string]uint64{
		"rx_packets": s.RxPackets, "tx_packets": s.TxPackets,
		"rx_bytes": s.RxBytes, "tx_bytes": s.TxBytes,
		"rx_errors": s.RxErrors, "tx_errors": s.TxErrors,
		"rx_dropped": s.RxDropped, "tx_dropped": s.TxDropped,
		"multicast": s.Multicast, "collisions": s.Collisions,
		"rx_length_errors": s.RxLengthErrors, "rx_over_errors": s.RxOverErrors,
		"rx_crc_errors": s.RxCrcErrors, "rx_frame_errors": s.RxFrameErrors,
		"rx_fifo_errors": s.RxFifoErrors, "rx_missed_errors": s.RxMissedErrors,
		"tx_aborted_errors": s.TxAbortedErrors, "tx_carrier_errors": s.TxCarrierErrors,
		"tx_fifo_errors": s.TxFifoErrors, "tx_heartbeat_errors": s.TxHeartbeatErrors,
		"tx_window_errors": s.TxWindowErrors,
	}
}

// ParseSNMP reads /proc/net/snmp's header/value line pairs into
// "Proto.Field" counters ("Udp.NoPorts"). Negative values (Tcp.MaxConn) are
// left out: counters are unsigned.
func ParseSNMP(b []byte) (map[string]uint64, error) {
	out := make(map[string]uint64)
	sc := bufio.NewScanner(bytes.NewReader(b))
	line := 0
	for sc.Scan() {
		line++
		head := strings.Fields(sc.Text())
		if !sc.Scan() {
			return nil, fmt.Errorf("line %d: header without values", line)
		}
		line++
		vals := strings.Fields(sc.Text())
		if len(head) == 0 || len(head) != len(vals) || head[0] != vals[0] {
			return nil, fmt.Errorf("line %d: %d values for %d names", line, len(vals), len(head))
		}
		proto := strings.TrimSuffix(head[0], ":")
		for i := 1; i < len(head); i++ {
			v, err := strconv.ParseUint(vals[i], 10, 64)
			if err != nil {
				continue
			}
			out[proto+"."+head[i]] = v
		}
	}
	return out, sc.Err()
}

// softnetFields names /proc/net/softnet_stat's columns (hex, one row per
// CPU), as net/core/net-procfs.c prints them: columns are only ever
// appended (backlog_len and cpu in 5.10, the two queue lengths in 6.x), so
// older kernels simply have fewer.
var softnetFields = []string{"processed", "dropped", "time_squeeze", "", "", "", "", "", "cpu_collision", "received_rps", "flow_limit_count", "backlog_len", "cpu", "input_qlen", "process_qlen"}

func softnet(now uint64) ([]tracefile.Counters, error) {
	b, err := os.ReadFile("/proc/net/softnet_stat")
	if err != nil {
		return nil, err
	}
	recs, err := ParseSoftnet(now, b)
	if err != nil {
		return nil, fmt.Errorf("/proc/net/softnet_stat: %w", err)
	}
	return recs, nil
}

// ParseSoftnet reads /proc/net/softnet_stat, one record per CPU with
// Device "cpuN".
func ParseSoftnet(now uint64, b []byte) ([]tracefile.Counters, error) {
	var out []tracefile.Counters
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("line %d: %d columns, want at least 3", i+1, len(f))
		}
		vals := make(map[string]uint64)
		cpu := i
		for j, s := range f {
			if j >= len(softnetFields) || softnetFields[j] == "" {
				continue
			}
			v, err := strconv.ParseUint(s, 16, 64)
			if err != nil {
				return nil, fmt.Errorf("line %d column %d: %q: %w", i+1, j+1, s, err)
			}
			if softnetFields[j] == "cpu" {
				cpu = int(v)
				continue
			}
			vals[softnetFields[j]] = v
		}
		out = append(out, tracefile.Counters{Time: now, Source: "softnet", Device: "cpu" + strconv.Itoa(cpu), Values: vals})
	}
	return out, nil
}

// vmaxdp reads the program counters of every steering program pinned under
// steer.DefaultPinDir, each named by its namespace and interface as the
// other sources are (see linkName).
func vmaxdp(now uint64, nss []Namespace, names map[[2]uint32]string) ([]tracefile.Counters, error) {
	dirs, err := os.ReadDir(steer.DefaultPinDir)
	if err != nil {
		return nil, nil // no vmaxdp engine has run here
	}
	var out []tracefile.Counters
	var errs []error
	for _, d := range dirs {
		netns, ifindex, ok := steer.ParsePinDirName(d.Name())
		if !ok {
			continue
		}
		path := filepath.Join(steer.DefaultPinDir, d.Name(), "prog_stats")
		m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
		if errors.Is(err, os.ErrNotExist) {
			continue // that engine closed since ReadDir
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		c, err := steer.ReadProgCounters(m)
		m.Close()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		out = append(out, tracefile.Counters{Time: now, Source: "vmaxdp", Netns: netns, Device: linkName(nss, names, netns, ifindex), Values: map[string]uint64{
			"passed": c.Passed, "redirected": c.Redirected, "non_ip": c.NonIP, "fragments": c.Fragments, "parse_errors": c.ParseErrors, "martian_sources": c.MartianSources,
		}})
	}
	return out, errors.Join(errs...)
}

// linkName names interface ifindex of the namespace with inode netns:
// as the namespace calls it when it is among nss, else as its engine's
// counters file does (names, from processes), else "ifindex N".
func linkName(nss []Namespace, names map[[2]uint32]string, netns uint32, ifindex int) string {
	name, ok := names[[2]uint32{netns, uint32(ifindex)}]
	if !ok {
		name = "ifindex " + strconv.Itoa(ifindex)
	}
	for i := range nss {
		if nss[i].Inode != netns {
			continue
		}
		netnsutil.Do(nss[i].h, func() error {
			// A dump (net), not netlink.LinkByIndex, which leaves an
			// unread acknowledgement to be purged in the namespace
			// being recorded.
			if ifi, err := net.InterfaceByIndex(ifindex); err == nil {
				name = ifi.Name
			}
			return nil
		})
	}
	return name
}
