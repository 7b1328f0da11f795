package engine

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/stack"
)

// Cmsg is a set of the ancillary data a socket asked recvmsg for, the
// kinds the engine makes for offloaded datagrams.
type Cmsg uint32

const (
	CmsgPktinfo         Cmsg = 1 << iota // IP_PKTINFO
	CmsgTOS                              // IP_RECVTOS
	CmsgTTL                              // IP_RECVTTL
	CmsgOrigDstAddr                      // IP_RECVORIGDSTADDR
	CmsgTimestamp                        // SO_TIMESTAMP_OLD: SCM_TIMESTAMP
	CmsgTimestampNew                     // SO_TIMESTAMP_NEW
	CmsgTimestampNS                      // SO_TIMESTAMPNS_OLD: SCM_TIMESTAMPNS
	CmsgTimestampNSNew                   // SO_TIMESTAMPNS_NEW
	CmsgTimestamping                     // SO_TIMESTAMPING_OLD, software receive stamps: SCM_TIMESTAMPING
	CmsgTimestampingNew                  // SO_TIMESTAMPING_NEW, the same
	CmsgUDPGRO                           // UDP_GRO: a coalesced datagram's segment size
)

// cmsgStamps are the kinds that need each datagram's arrival time.
const cmsgStamps = CmsgTimestamp | CmsgTimestampNew | CmsgTimestampNS | CmsgTimestampNSNew | CmsgTimestamping | CmsgTimestampingNew

// sockOpt names a socket option.
type sockOpt struct{ level, name int }

// cmsgOptions are the options that ask recvmsg for ancillary data the
// engine makes, with the kind each turns on.
var cmsgOptions = []struct {
	sockOpt
	kind Cmsg
}{
	{sockOpt{unix.IPPROTO_IP, unix.IP_PKTINFO}, CmsgPktinfo},
	{sockOpt{unix.IPPROTO_IP, unix.IP_RECVTOS}, CmsgTOS},
	{sockOpt{unix.IPPROTO_IP, unix.IP_RECVTTL}, CmsgTTL},
	{sockOpt{unix.IPPROTO_IP, unix.IP_RECVORIGDSTADDR}, CmsgOrigDstAddr},
	{sockOpt{unix.SOL_SOCKET, unix.SO_TIMESTAMP_OLD}, CmsgTimestamp},
	{sockOpt{unix.SOL_SOCKET, unix.SO_TIMESTAMP_NEW}, CmsgTimestampNew},
	{sockOpt{unix.SOL_SOCKET, unix.SO_TIMESTAMPNS_OLD}, CmsgTimestampNS},
	{sockOpt{unix.SOL_SOCKET, unix.SO_TIMESTAMPNS_NEW}, CmsgTimestampNSNew},
	// The stack's datagrams come one by one, as the kernel's do when it
	// coalesced nothing (no UDP_GRO message); what the kernel socket
	// takes (loopback, another link) may come coalesced, with its
	// segment size (stack.RecvMeta.GROSize).
	{sockOpt{unix.IPPROTO_UDP, unix.UDP_GRO}, CmsgUDPGRO},
}

// cmsgOption maps a socket option to the ancillary data it turns on.
func cmsgOption(level, name int) (Cmsg, bool) {
	for _, o := range cmsgOptions {
		if o.sockOpt == (sockOpt{level, name}) {
			return o.kind, true
		}
	}
	return 0, false
}

// ipv6CmsgOptions are an AF_INET6 socket's options for ancillary data,
// which the kernel makes for its IPv4 datagrams too (IPV6_PKTINFO with the
// address mapped, ...) and vmaxdp does not.
var ipv6CmsgOptions = map[int]string{
	unix.IPV6_RECVPKTINFO: "IPV6_RECVPKTINFO", unix.IPV6_2292PKTINFO: "IPV6_2292PKTINFO",
	unix.IPV6_RECVHOPLIMIT: "IPV6_RECVHOPLIMIT", unix.IPV6_2292HOPLIMIT: "IPV6_2292HOPLIMIT",
	unix.IPV6_RECVTCLASS: "IPV6_RECVTCLASS", unix.IPV6_RECVORIGDSTADDR: "IPV6_RECVORIGDSTADDR",
	unix.IPV6_RECVRTHDR: "IPV6_RECVRTHDR", unix.IPV6_RECVHOPOPTS: "IPV6_RECVHOPOPTS",
	unix.IPV6_RECVDSTOPTS: "IPV6_RECVDSTOPTS", unix.IPV6_RECVPATHMTU: "IPV6_RECVPATHMTU",
	unix.IPV6_RECVFRAGSIZE: "IPV6_RECVFRAGSIZE", unix.IPV6_2292RTHDR: "IPV6_2292RTHDR",
	unix.IPV6_2292HOPOPTS: "IPV6_2292HOPOPTS", unix.IPV6_2292DSTOPTS: "IPV6_2292DSTOPTS",
}

// foreignCmsgOptions are the IPv4 and socket-level options whose
// ancillary data or behaviour the engine does not make for offloaded
// datagrams.
var foreignCmsgOptions = []struct {
	sockOpt
	what string
}{
	{sockOpt{unix.SOL_SOCKET, unix.SO_RXQ_OVFL}, "SO_RXQ_OVFL"},
	{sockOpt{unix.SOL_SOCKET, unix.SO_PASSSEC}, "SO_PASSSEC"},
	{sockOpt{unix.IPPROTO_IP, unix.IP_RECVOPTS}, "IP_RECVOPTS"},
	{sockOpt{unix.IPPROTO_IP, unix.IP_RETOPTS}, "IP_RETOPTS"},
	{sockOpt{unix.IPPROTO_IP, unix.IP_PASSSEC}, "IP_PASSSEC"},
	{sockOpt{unix.IPPROTO_IP, unix.IP_CHECKSUM}, "IP_CHECKSUM"},
	{sockOpt{unix.IPPROTO_IP, unix.IP_RECVFRAGSIZE}, "IP_RECVFRAGSIZE"},
}

// foreignCmsgOption names an option whose ancillary data or behaviour the
// engine does not make for offloaded datagrams (foreignCmsgOptions, and
// AF_INET6's); a socket that turns one on is served by the kernel ("" for
// any other option).
func foreignCmsgOption(level, name int) string {
	if level == unix.IPPROTO_IPV6 {
		return ipv6CmsgOptions[name]
	}
	for _, o := range foreignCmsgOptions {
		if o.sockOpt == (sockOpt{level, name}) {
			return o.what
		}
	}
	return ""
}

// intOptions are the int options of a UDP socket the engine follows, with
// what following one takes. halved: getsockopt reads back twice what was
// set.
var intOptions = []struct {
	sockOpt
	halved bool
	follow func(e *Engine, fd, v int)
}{
	{sockOpt{unix.SOL_SOCKET, unix.SO_RCVBUF}, true, func(e *Engine, fd, v int) { e.SetRcvBuf(fd, v) }},
	{sockOpt{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE}, false, func(e *Engine, fd, v int) { e.SetRcvBuf(fd, v) }},
	{sockOpt{unix.IPPROTO_IP, unix.IP_TTL}, false, func(e *Engine, fd, v int) { e.SetTTL(fd, v, false) }},
	{sockOpt{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL}, false, func(e *Engine, fd, v int) { e.SetTTL(fd, v, true) }},
	{sockOpt{unix.IPPROTO_IP, unix.IP_TOS}, false, func(e *Engine, fd, v int) { e.SetTOS(fd, v) }},
	{sockOpt{unix.IPPROTO_IP, unix.IP_MTU_DISCOVER}, false, func(e *Engine, fd, v int) { e.SetPMTUDisc(fd, v) }},
	{sockOpt{unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP}, false, func(e *Engine, fd, v int) { e.SetMulticastLoop(fd, v != 0) }},
	{sockOpt{unix.IPPROTO_UDP, unix.UDP_CORK}, false, func(e *Engine, fd, v int) { e.SetCork(fd, v != 0) }},
	{sockOpt{unix.IPPROTO_UDP, unix.UDP_SEGMENT}, false, func(e *Engine, fd, v int) { e.SetSegment(fd, v) }},
	{sockOpt{unix.SOL_SOCKET, unix.SO_SELECT_ERR_QUEUE}, false, func(e *Engine, fd, v int) { e.SetSelectErrQueue(fd, v != 0) }},
}

// SetIntOption follows an int option (intOptions) that the kernel socket
// fd took with value v, and says whether the engine follows it. One list
// serves setsockopt and the replay of an inherited socket's options
// (inheritedUDP), so that an option the engine starts to follow is
// followed both ways.
func (e *Engine) SetIntOption(fd, level, name, v int) bool {
	for _, o := range intOptions {
		if o.sockOpt == (sockOpt{level, name}) {
			o.follow(e, fd, v)
			return true
		}
	}
	return false
}

// SetCmsgOption follows a socket option that asks recvmsg for ancillary
// data (on: its value is not zero). The kinds the engine makes are noted
// for recvmsg; a socket that turns on one it does not make goes back to
// the kernel, which makes it.
func (e *Engine) SetCmsgOption(fd, level, name int, on bool) {
	s := e.get(fd)
	if s == nil {
		return
	}
	if opt := foreignCmsgOption(level, name); opt != "" {
		if on {
			e.toKernel(s, fmt.Sprintf("option %s asks for what the kernel sees of each datagram, which vmaxdp does not make", opt))
		}
		return
	}
	k, ok := cmsgOption(level, name)
	if !ok {
		return
	}
	var set Cmsg
	if on {
		set = k
	}
	setCmsg(s, k, set)
}

// setCmsg turns the kinds in mask of s's ancillary data to those in set.
func setCmsg(s *Socket, mask, set Cmsg) {
	for {
		old := s.cmsg.Load()
		if s.cmsg.CompareAndSwap(old, old&^uint32(mask)|uint32(set&mask)) {
			break
		}
	}
	if c := s.conn.Load(); c != nil {
		c.SetRecvStamp(s.wantsStamps())
	}
}

// wantsStamps says whether s's datagrams need their arrival time: for
// ancillary data, or for SIOCGSTAMP.
func (s *Socket) wantsStamps() bool {
	return Cmsg(s.cmsg.Load())&cmsgStamps != 0 || s.ioctlStamp.Load()
}

// timestampingServed are the SO_TIMESTAMPING flags the engine serves:
// software receive and transmit stamps (generated, and reported), and the
// options that shape them. SOF_TIMESTAMPING_OPT_RX_FILTER (1<<17) has no
// name in x/sys/unix.
const (
	optRxFilter        = 1 << 17
	timestampingServed = unix.SOF_TIMESTAMPING_RX_SOFTWARE | unix.SOF_TIMESTAMPING_TX_SOFTWARE | unix.SOF_TIMESTAMPING_SOFTWARE |
		unix.SOF_TIMESTAMPING_OPT_ID | unix.SOF_TIMESTAMPING_OPT_CMSG | unix.SOF_TIMESTAMPING_OPT_TSONLY | optRxFilter
)

// SetTimestamping follows SO_TIMESTAMPING (flags; newLayout: set as
// SO_TIMESTAMPING_NEW). A socket that asks for software receive stamps
// gets SCM_TIMESTAMPING with the time its datagram came off the ring in
// its first timespec, as the kernel's has the time it came off the
// device, and the other two zero. One that asks for software transmit
// stamps gets them in its error queue, with the packet looped back unless
// SOF_TIMESTAMPING_OPT_TSONLY is on (errqueue.go). One that asks for
// hardware or scheduler stamps, or an AF_INET6 socket that asks for
// transmit stamps, goes back to the kernel, which makes them, with the
// flags named in the reason. As the
// kernel, it reports a received datagram's software stamp when
// SOF_TIMESTAMPING_SOFTWARE is on and either SOF_TIMESTAMPING_RX_SOFTWARE
// is too or SOF_TIMESTAMPING_OPT_RX_FILTER is off.
func (e *Engine) SetTimestamping(fd, flags int, newLayout bool) {
	s := e.get(fd)
	if s == nil {
		return
	}
	if extra := flags &^ timestampingServed; extra != 0 {
		e.toKernel(s, fmt.Sprintf("option SO_TIMESTAMPING asks for hardware or scheduler timestamps (flags %#x), which vmaxdp does not make", extra))
		return
	}
	if flags&unix.SOF_TIMESTAMPING_TX_SOFTWARE != 0 && s.v6 {
		e.toKernel(s, "option SO_TIMESTAMPING asks an AF_INET6 socket for transmit timestamps, whose error queue speaks IPv6 (IPV6_RECVERR), which vmaxdp does not make")
		return
	}
	var set Cmsg
	if flags&unix.SOF_TIMESTAMPING_SOFTWARE != 0 && (flags&unix.SOF_TIMESTAMPING_RX_SOFTWARE != 0 || flags&optRxFilter == 0) {
		set = CmsgTimestamping
		if newLayout {
			set = CmsgTimestampingNew
		}
	}
	setCmsg(s, CmsgTimestamping|CmsgTimestampingNew, set)
	setTxStamps(s, flags, newLayout)
}

// Cmsg is the ancillary data fd's receives report.
func (e *Engine) Cmsg(fd int) Cmsg {
	if s := e.get(fd); s != nil {
		return Cmsg(s.cmsg.Load())
	}
	return 0
}

// PutCmsgs writes into b the ancillary data of kinds cm for a datagram
// that meta describes, in the order the kernel writes them (timestamps,
// then UDP_GRO, IP_PKTINFO, IP_TTL, IP_TOS, IP_ORIGDSTADDR). It returns the bytes
// used and whether some did not fit (MSG_CTRUNC). It does not allocate.
func PutCmsgs(b []byte, cm Cmsg, meta *stack.RecvMeta) (used int, cut bool) {
	put := func(level, typ int32, data []byte) {
		var c bool
		used, c = putCmsg(b, used, level, typ, data)
		cut = cut || c
	}
	var buf [48]byte // the largest: struct scm_timestamping
	if cm&(CmsgTimestamp|CmsgTimestampNew) != 0 {
		tv := unix.NsecToTimeval(meta.Stamp)
		binary.NativeEndian.PutUint64(buf[0:], uint64(tv.Sec))
		binary.NativeEndian.PutUint64(buf[8:], uint64(tv.Usec))
		typ := int32(unix.SO_TIMESTAMP_OLD)
		if cm&CmsgTimestampNew != 0 {
			typ = unix.SO_TIMESTAMP_NEW
		}
		put(unix.SOL_SOCKET, typ, buf[:16])
	}
	if cm&(CmsgTimestampNS|CmsgTimestampNSNew) != 0 {
		binary.NativeEndian.PutUint64(buf[0:], uint64(meta.Stamp/1e9))
		binary.NativeEndian.PutUint64(buf[8:], uint64(meta.Stamp%1e9))
		typ := int32(unix.SO_TIMESTAMPNS_OLD)
		if cm&CmsgTimestampNSNew != 0 {
			typ = unix.SO_TIMESTAMPNS_NEW
		}
		put(unix.SOL_SOCKET, typ, buf[:16])
	}
	if cm&(CmsgTimestamping|CmsgTimestampingNew) != 0 {
		clear(buf[:])
		binary.NativeEndian.PutUint64(buf[0:], uint64(meta.Stamp/1e9))
		binary.NativeEndian.PutUint64(buf[8:], uint64(meta.Stamp%1e9))
		typ := int32(unix.SO_TIMESTAMPING_OLD)
		if cm&CmsgTimestampingNew != 0 {
			typ = unix.SO_TIMESTAMPING_NEW
		}
		put(unix.SOL_SOCKET, typ, buf[:48])
	}
	if cm&CmsgUDPGRO != 0 && meta.GROSize > 0 {
		binary.NativeEndian.PutUint32(buf[0:], uint32(meta.GROSize))
		put(unix.IPPROTO_UDP, unix.UDP_GRO, buf[:4])
	}
	if cm&CmsgPktinfo != 0 {
		binary.NativeEndian.PutUint32(buf[0:], uint32(meta.Ifindex))
		spec, dst := meta.SpecDst.As4(), meta.Dst.Addr().As4()
		copy(buf[4:8], spec[:])
		copy(buf[8:12], dst[:])
		put(unix.IPPROTO_IP, unix.IP_PKTINFO, buf[:unix.SizeofInet4Pktinfo])
	}
	if cm&CmsgTTL != 0 {
		binary.NativeEndian.PutUint32(buf[0:], uint32(meta.TTL))
		put(unix.IPPROTO_IP, unix.IP_TTL, buf[:4])
	}
	if cm&CmsgTOS != 0 {
		buf[0] = meta.TOS
		put(unix.IPPROTO_IP, unix.IP_TOS, buf[:1])
	}
	if cm&CmsgOrigDstAddr != 0 {
		clear(buf[:])
		binary.NativeEndian.PutUint16(buf[0:], unix.AF_INET)
		binary.BigEndian.PutUint16(buf[2:], meta.Dst.Port())
		a := meta.Dst.Addr().As4()
		copy(buf[4:8], a[:])
		put(unix.IPPROTO_IP, unix.IP_ORIGDSTADDR, buf[:unix.SizeofSockaddrInet4])
	}
	return used, cut
}

// putCmsg writes a control message of level, typ and data into b at used,
// as the kernel's put_cmsg does, and returns where the next one goes; cut
// when b had no room for it (MSG_CTRUNC), which is then left out.
func putCmsg(b []byte, used int, level, typ int32, data []byte) (int, bool) {
	if used+unix.CmsgLen(len(data)) > len(b) {
		return used, true
	}
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[used]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[used+unix.CmsgLen(0):], data)
	return min(used+unix.CmsgSpace(len(data)), len(b)), false
}

// SendCmsg is what a sendmsg's ancillary data asks of a send the engine
// serves.
type SendCmsg struct {
	// Src is IP_PKTINFO's ipi_spec_dst, the address a DNS server answers
	// from; zero: the socket's own.
	Src netip.Addr
	// StampSet: an SO_TIMESTAMPING message gave this send's transmit
	// stamp flags, which Stamp says (SOF_TIMESTAMPING_TX_SOFTWARE, or
	// none), in place of the socket's.
	Stamp, StampSet bool
	// SegmentSet: a UDP_SEGMENT message gave this send's segment size
	// (UDP GSO; 0: none), Segment, in place of the socket's.
	Segment    int
	SegmentSet bool
}

// meta is what the stack's send takes of m.
func (m *SendCmsg) meta() stack.SendMeta {
	return stack.SendMeta{Src: m.Src, Segment: m.Segment, SegmentSet: m.SegmentSet}
}

// ParseSendCmsg reads the ancillary data of a sendmsg, and says whether
// the engine can send it at all: IP_PKTINFO is served for ifindex, the
// socket's interface (0: any), SO_TIMESTAMPING for software transmit
// stamps (or none), and UDP_SEGMENT. Anything else is the kernel's:
// other flags, which it makes or refuses, a UDP_SEGMENT of another
// length than a __u16's, which it refuses, and every other kind.
func ParseSendCmsg(ctl []byte, ifindex int) (m SendCmsg, ok bool) {
	for len(ctl) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&ctl[0]))
		if h.Len < unix.SizeofCmsghdr || h.Len > uint64(len(ctl)) {
			return m, false
		}
		data := ctl[unix.CmsgLen(0):h.Len]
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			pi := (*unix.Inet4Pktinfo)(unsafe.Pointer(&data[0]))
			if pi.Ifindex != 0 && int(pi.Ifindex) != ifindex {
				return m, false
			}
			m.Src = netip.AddrFrom4(pi.Spec_dst)
		case h.Level == unix.SOL_SOCKET && (h.Type == unix.SO_TIMESTAMPING_OLD || h.Type == unix.SO_TIMESTAMPING_NEW) && len(data) >= 4:
			flags := binary.NativeEndian.Uint32(data)
			if flags&^unix.SOF_TIMESTAMPING_TX_SOFTWARE != 0 {
				return m, false
			}
			m.Stamp, m.StampSet = flags != 0, true
		case h.Level == unix.IPPROTO_UDP && h.Type == unix.UDP_SEGMENT && len(data) == 2:
			m.Segment, m.SegmentSet = int(binary.NativeEndian.Uint16(data)), true
		default:
			return m, false
		}
		next := unix.CmsgSpace(len(data))
		if next >= len(ctl) {
			break
		}
		ctl = ctl[next:]
	}
	return m, true
}

// Ifindex is the index of the interface serving fd (0: none).
func (e *Engine) Ifindex(fd int) int {
	if c := e.Conn(fd); c != nil {
		return c.Stack().Ifindex()
	}
	return 0
}
