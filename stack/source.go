package stack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/stack/header"
)

// The source checks the kernel makes on input, which the steering program
// comes before. The kernel drops a packet from one of its own addresses,
// and, with the interface's reverse-path filter on (rp_filter 1, strict,
// or 2, loose: the greater of net.ipv4.conf.all's and the interface's), one
// whose source it would not route back as the mode asks
// (TcpExtIPReversePathFilter). Martian sources are the program's
// (martian_sources). The stack drops and counts (RxSourceRejected) what
// the kernel would drop: with rp_filter off, a source that is an address of
// any interface of the namespace, unless accept_local is on (in all or
// the interface's); on, whatever the kernel's own check refuses. That is
// decided against a copy of the namespace's routes (fib.go), followed at
// every route event, or, where the namespace routes in a way the copy
// does not follow, asked of the kernel once for each new source with an
// input route lookup (RTM_GETROUTE with RTA_IIF, which runs
// fib_validate_source). A verdict is kept for sourceTTL, or until the
// routes change.

const (
	sourceTTL = 10 * time.Second
	sourceMax = 1 << 16 // verdicts kept; all are forgotten when full
	// sourceChecksPerSecond bounds the lookups: past it, a new source is
	// dropped and counted (RxSourceUnchecked), so that a flood from
	// random spoofed sources costs a lookup each only so often.
	sourceChecksPerSecond = 2000
)

// sourceConf is what the kernel's source check reads of the interface's
// settings: rp_filter and accept_local, each of net.ipv4.conf.all and of
// the interface, as files opened in its namespace.
type sourceConf struct {
	rpFilter, acceptLocal [2]int
}

// openSourceConf opens the interface's files in the calling thread's
// namespace (the stack's), at high fds: a file of /proc/sys/net is the
// namespace's it was opened in, and the watcher reads it again from any
// thread without taking a low fd from the application.
func openSourceConf(ifname string) (sourceConf, error) {
	f := sourceConf{rpFilter: [2]int{-1, -1}, acceptLocal: [2]int{-1, -1}}
	for _, set := range []struct {
		fds  *[2]int
		name string
	}{{&f.rpFilter, "rp_filter"}, {&f.acceptLocal, "accept_local"}} {
		for i, conf := range []string{"all", ifname} {
			fd, err := unix.Open("/proc/sys/net/ipv4/conf/"+conf+"/"+set.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				f.close()
				return f, fmt.Errorf("net.ipv4.conf.%s.%s: %w", conf, set.name, err)
			}
			set.fds[i] = highfd.Move(fd)
		}
	}
	return f, nil
}

func (f *sourceConf) close() {
	for _, fds := range []*[2]int{&f.rpFilter, &f.acceptLocal} {
		for i, fd := range fds {
			if fd >= 0 {
				highfd.Close(fd)
				fds[i] = -1
			}
		}
	}
}

// rpMode is the greater of the two rp_filter settings, as the kernel's
// IN_DEV_RPFILTER takes it; 0 when they cannot be read.
func (f *sourceConf) rpMode() int32 { return greatest(f.rpFilter) }

// acceptsLocal is accept_local on in either (IN_DEV_ACCEPT_LOCAL).
func (f *sourceConf) acceptsLocal() bool { return greatest(f.acceptLocal) > 0 }

func greatest(fds [2]int) int32 {
	var m int32
	var b [16]byte
	for _, fd := range fds {
		if fd < 0 {
			continue
		}
		n, err := unix.Pread(fd, b[:], 0)
		if err != nil || n == 0 {
			continue
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(b[:n])))
		if err == nil && int32(v) > m {
			m = int32(v)
		}
	}
	return m
}

// followSourceConf reads the interface's rp_filter and accept_local
// again; a change, or sourceTTL since the verdicts were last forgotten,
// forgets them. The routes are read again if they are due.
func (st *Stack) followSourceConf(now time.Time) {
	m, local := st.srcConf.rpMode(), st.srcConf.acceptsLocal()
	old, oldLocal := st.rpMode.Swap(m), st.acceptLocal.Swap(local)
	if m != old || local != oldLocal {
		slog.Info(fmt.Sprintf("stack %s: rp_filter %d, accept_local %v (were %d, %v): %s", st.ifname, m, local, old, oldLocal, sourceChecksSay(m, local)))
	}
	st.rxMu.Lock()
	if m != old || local != oldLocal || now.Sub(st.sourcesSince) >= sourceTTL {
		clear(st.sources)
		st.sourcesSince = now
	}
	st.rxMu.Unlock()
	st.followFIBIfDue(now)
}

func sourceChecksSay(m int32, acceptLocal bool) string {
	switch {
	case m != 0:
		return "each new source is checked as the kernel checks it"
	case acceptLocal:
		return "sources are not checked"
	}
	return "sources are not checked but for the namespace's own addresses"
}

// sortedAddrs is addrs as big-endian numbers, sorted, for a binary search
// on the receive path.
func sortedAddrs(addrs []netip.Addr) []uint32 {
	v := make([]uint32, 0, len(addrs))
	for _, a := range addrs {
		if a.Is4() {
			b := a.As4()
			v = append(v, binary.BigEndian.Uint32(b[:]))
		}
	}
	slices.Sort(v)
	return slices.Compact(v)
}

// sourceOKLocked says whether the kernel would take a packet with IPv4
// header ip on the stack's interface, as far as its source goes, and
// counts it when not. Caller holds rxMu.
func (st *Stack) sourceOKLocked(ip header.IPv4) bool {
	if st.rpMode.Load() == 0 {
		if st.acceptLocal.Load() {
			return true
		}
		if p := st.localAddrs.Load(); p != nil {
			if _, own := slices.BinarySearch(*p, binary.BigEndian.Uint32(ip[12:16])); own {
				st.Counters.RxSourceRejected.Add(1)
				return false
			}
		}
		return true
	}
	k := [4]byte(ip[12:16])
	ok, known := st.sources[k]
	if !known {
		if f := st.fib.Load(); f != nil {
			ok = st.copyVerdict(f, ip.Src(), st.rpMode.Load(), st.acceptLocal.Load())
		} else if ok, known = st.askSourceLocked(ip); !known {
			st.Counters.RxSourceUnchecked.Add(1)
			return false
		}
		st.keepVerdictLocked(k, ok)
	}
	if !ok {
		st.Counters.RxSourceRejected.Add(1)
	}
	return ok
}

// copyVerdict is the copy of the routes' verdict on src arriving on the
// stack's interface, under rp_filter mode and acceptLocal.
func (st *Stack) copyVerdict(f *fibCopy, src netip.Addr, mode int32, acceptLocal bool) bool {
	p := st.addrs.Load()
	return f.sourceOK(src, st.ifindex, mode, acceptLocal, p != nil && len(*p) > 0)
}

// askSourceLocked asks the kernel for the verdict on ip's source
// (sourceValid), unless sourceChecksPerSecond have been asked this second
// (asked false). A source the kernel's check fails on is taken. Caller
// holds rxMu.
func (st *Stack) askSourceLocked(ip header.IPv4) (ok, asked bool) {
	now := time.Now().Unix()
	if now != st.checkSecond {
		st.checkSecond, st.checksLeft = now, sourceChecksPerSecond
	}
	if st.checksLeft == 0 {
		return false, false
	}
	st.checksLeft--
	ok, err := st.sourceValid(ip.Src(), ip.Dst())
	if err != nil {
		if !st.sourceErrTold.Swap(true) {
			slog.Warn(fmt.Sprintf("stack %s: the kernel's check of source %v failed: %v; sources it cannot check are taken", st.ifname, ip.Src(), err))
		}
		ok = true // for sourceTTL: not asked again for each packet
	}
	return ok, true
}

// keepVerdictLocked keeps source k's verdict, until sourceTTL or a
// change of the routes forgets it. Caller holds rxMu.
func (st *Stack) keepVerdictLocked(k [4]byte, ok bool) {
	if len(st.sources) >= sourceMax {
		clear(st.sources)
	}
	st.sources[k] = ok
}

// fibEvery is the least time between two reads of the routes: those of
// a host whose routes churn (a routing daemon's) are read ten times a
// second at most.
const fibEvery = 100 * time.Millisecond

// routesChanged notes a route or rule event: the copy of the routes is
// read again now, or at the watcher's next look once fibEvery has passed.
// The watcher's.
func (st *Stack) routesChanged(now time.Time) {
	st.fibStale = true
	st.followFIBIfDue(now)
}

// followFIBIfDue reads the routes again (followFIB) when they changed
// since the last read, fibEvery has passed, and rp_filter is on: with it
// off, the copy is not used, and is read when it is turned on.
func (st *Stack) followFIBIfDue(now time.Time) {
	if st.fibStale && st.rpMode.Load() != 0 && now.Sub(st.fibRead) >= fibEvery {
		st.followFIB(now)
	}
}

// followFIB reads the namespace's routes for the source check (fib.go)
// and forgets the verdicts taken with the old ones.
func (st *Stack) followFIB(now time.Time) {
	st.fibRead, st.fibStale = now, false
	f, err := st.readFIB()
	if err != nil {
		f = nil
		if why := err.Error(); why != st.fibWhy {
			slog.Info(fmt.Sprintf("stack %s: with rp_filter on, each new source is asked of the kernel (one lookup each, at most %d a second): %v", st.ifname, sourceChecksPerSecond, err))
			st.fibWhy = why
		}
	} else if st.fibWhy != "" {
		slog.Info(fmt.Sprintf("stack %s: with rp_filter on, sources are checked against a copy of the routes", st.ifname))
		st.fibWhy = ""
	}
	st.fib.Store(f)
	st.rxMu.Lock()
	clear(st.sources)
	st.sourcesSince = now
	st.rxMu.Unlock()
}

// sourceValid asks the kernel whether it would take a packet from src to
// dst arriving on the stack's interface: its input route lookup, which
// checks the source (fib_validate_source: EXDEV for the reverse-path
// filter, EINVAL for a martian or local one). Another error is returned.
func (st *Stack) sourceValid(src, dst netip.Addr) (bool, error) {
	req := rtMessage(unix.RTM_GETROUTE, 0, unix.SizeofRtMsg)
	rt := req[unix.SizeofNlMsghdr:]
	rt[0], rt[1], rt[2] = unix.AF_INET, 32, 32 // family, dst_len, src_len
	d, s := dst.As4(), src.As4()
	req = rtAttr(req, unix.RTA_DST, d[:])
	req = rtAttr(req, unix.RTA_SRC, s[:])
	var iif [4]byte
	binary.NativeEndian.PutUint32(iif[:], uint32(st.ifindex))
	req = rtAttr(req, unix.RTA_IIF, iif[:])
	_, err := st.rtDo(req)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.EXDEV), errors.Is(err, unix.EINVAL):
		return false, nil
	}
	return false, err
}
