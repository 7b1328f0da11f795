package engine

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stack"
	"github.com/vmaxdp/vmaxdp/stack/header"
)

// txStampsMax bounds a socket's queue of transmit stamps, as the kernel's
// receive buffer bounds its error queue (about 270 stamps without their
// packet in the default 208 KiB).
const txStampsMax = 256

// txStamps is the error queue of an offloaded socket that asked for
// software transmit timestamps (SO_TIMESTAMPING with
// SOF_TIMESTAMPING_TX_SOFTWARE): for each datagram the stack sent, the
// time its frame went on the ring, its SOF_TIMESTAMPING_OPT_ID key
// and, unless SOF_TIMESTAMPING_OPT_TSONLY is on, the frame as it left
// (chrony reads the packet back out of it to match stamp and request),
// which recvmsg with MSG_ERRQUEUE reads as the kernel's sock_extended_err
// and looped packet.
type txStamps struct {
	mu      sync.Mutex
	q       [txStampsMax]txStamp
	head, n int
	key     uint32       // the next datagram's OPT_ID key
	optID   bool         // SOF_TIMESTAMPING_OPT_ID: keys count from when it was set
	report  bool         // SOF_TIMESTAMPING_SOFTWARE: the stamp is reported
	newAPI  bool         // set with SO_TIMESTAMPING_NEW: SCM_TIMESTAMPING_NEW
	all     atomic.Bool  // SOF_TIMESTAMPING_TX_SOFTWARE set on the socket: every send is stamped
	loop    bool         // no SOF_TIMESTAMPING_OPT_TSONLY: the packet comes with its stamp
	optCmsg bool         // SOF_TIMESTAMPING_OPT_CMSG: a looped packet's IP ancillary data too
	queued  atomic.Int32 // n, for pending
}

type txStamp struct {
	at  int64 // unix nanoseconds
	key uint32
	// frame is the looped packet (loop), in a buffer the slot keeps from
	// one stamp to the next.
	frame []byte
}

// push queues a stamp of at (unix nanoseconds) for one datagram sent,
// with its frame when the packet is looped back. It is false when the
// full queue had no room for it.
func (t *txStamps) push(at int64, frame []byte) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	var key uint32 // ee_data: 0 without SOF_TIMESTAMPING_OPT_ID, as the kernel's
	if t.optID {
		key = t.key
		t.key++
	}
	if t.n == txStampsMax {
		return false
	}
	s := &t.q[(t.head+t.n)%txStampsMax]
	s.at, s.key, s.frame = at, key, append(s.frame[:0], frame...)
	t.n++
	t.queued.Store(int32(t.n))
	return true
}

// pop takes the oldest stamp and copies its looped packet into b: n
// bytes, of full, and what the packet's IP ancillary data reports into
// meta (ip: there is a packet). The stamp returned holds no frame.
func (t *txStamps) pop(b []byte, meta *stack.RecvMeta) (st txStamp, n, full int, ip, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return txStamp{}, 0, 0, false, false
	}
	s := &t.q[t.head]
	n, full = copy(b, s.frame), len(s.frame)
	ip = loopedMeta(s.frame, meta)
	st = txStamp{at: s.at, key: s.key}
	t.head = (t.head + 1) % txStampsMax
	t.n--
	t.queued.Store(int32(t.n))
	return st, n, full, ip, true
}

// pending says whether a stamp waits: POLLERR, as the kernel reports a
// socket whose error queue holds one. Without the lock: every scan of a
// multiplexer asks it for each member.
func (t *txStamps) pending() bool { return t.queued.Load() > 0 }

// setTxStamps follows SO_TIMESTAMPING's flags on s: with
// SOF_TIMESTAMPING_TX_SOFTWARE every send is stamped; without, only a
// send whose own ancillary data asks (txQueue), reported as the flags
// say. Caller checked that the engine serves flags.
func setTxStamps(s *Socket, flags int, newAPI bool) {
	s.tsflags.Store(uint32(flags))
	s.tsNew.Store(newAPI)
	t := s.tx.Load()
	if t == nil {
		if flags&unix.SOF_TIMESTAMPING_TX_SOFTWARE == 0 {
			return // made at the first send that asks (txQueue)
		}
		t = new(txStamps)
	}
	t.configure(flags, newAPI)
	s.tx.Store(t)
}

// configure sets what t makes and reports from SO_TIMESTAMPING's flags.
func (t *txStamps) configure(flags int, newAPI bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	optID := flags&unix.SOF_TIMESTAMPING_OPT_ID != 0
	if optID && !t.optID {
		t.key = 0 // the kernel counts a UDP socket's keys from 0 as OPT_ID comes
	}
	t.optID, t.report, t.newAPI = optID, flags&unix.SOF_TIMESTAMPING_SOFTWARE != 0, newAPI
	t.loop, t.optCmsg = flags&unix.SOF_TIMESTAMPING_OPT_TSONLY == 0, flags&unix.SOF_TIMESTAMPING_OPT_CMSG != 0
	t.all.Store(flags&unix.SOF_TIMESTAMPING_TX_SOFTWARE != 0)
}

// txQueue is s's error queue of transmit stamps, made for a send whose
// ancillary data asks for a stamp (SO_TIMESTAMPING with
// SOF_TIMESTAMPING_TX_SOFTWARE: chrony's server so stamps its answers in
// interleaved mode), reported as the socket's flags say.
func (s *Socket) txQueue() *txStamps {
	if t := s.tx.Load(); t != nil {
		return t
	}
	t := new(txStamps)
	t.configure(int(s.tsflags.Load()), s.tsNew.Load())
	if !s.tx.CompareAndSwap(nil, t) {
		return s.tx.Load()
	}
	return t
}

// looped says whether t's stamps come with their packet.
func (t *txStamps) looped() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.loop
}

// stampSend notes that the stack sent a datagram of fd through c, whose
// transmit stamps t are on, its frame going on the ring at unix
// nanoseconds at (frame: the packet to loop back, nil for none): its send
// is kicked to the device now, the kernel's stamp being taken in the
// driver's transmit, and a multiplexer waiting on the socket (POLLERR) is
// woken. A stamp the full queue has no room for is
// dropped, as the kernel drops it, counted (TxStampDrops, which vmaxdp
// stats shows) and the first is logged.
func (e *Engine) stampSend(fd int, c *stack.UDPConn, t *txStamps, at int64, frame []byte) {
	c.FlushSends()
	if !t.push(at, frame) && c.Counters.TxStampDrops.Add(1) == 1 {
		e.Log.Printf(params.LevelWarning, "fd %d: a transmit timestamp dropped: its error queue holds %d unread (read them with recvmsg and MSG_ERRQUEUE); later drops are not logged", fd, txStampsMax)
	}
	c.Stack().WakeWaiters()
}

// SetSelectErrQueue follows SO_SELECT_ERR_QUEUE: a transmit stamp
// waiting in fd's error queue polls POLLPRI beside POLLERR, so that
// select's exceptfds sees it (chrony waits so).
func (e *Engine) SetSelectErrQueue(fd int, on bool) {
	if s := e.get(fd); s != nil {
		s.selectErr.Store(on)
	}
}

// errQueueEvents are the events a transmit stamp waiting in s's error
// queue adds to a poll of it: POLLERR (EPOLLERR, reported whatever was
// asked for, as the kernel does), and POLLPRI with SO_SELECT_ERR_QUEUE;
// 0 when none waits.
func (s *Socket) errQueueEvents() uint32 {
	if t := s.tx.Load(); t == nil || !t.pending() {
		return 0
	}
	if s.selectErr.Load() {
		return unix.EPOLLERR | unix.EPOLLPRI
	}
	return unix.EPOLLERR
}

// TxStampPending says whether fd's error queue holds a transmit stamp of
// the engine's (POLLERR, EPOLLERR).
func (e *Engine) TxStampPending(fd int) bool {
	if s := e.get(fd); s != nil {
		return s.errQueueEvents() != 0
	}
	return false
}

// ErrQueueMsg is what RecvErrQueue read: N bytes of the looped packet
// into the buffer, of Full; Ctl bytes of ancillary data, CtlCut when some
// did not fit (MSG_CTRUNC).
type ErrQueueMsg struct {
	N, Full, Ctl int
	CtlCut       bool
}

// RecvErrQueue serves recvmsg with MSG_ERRQUEUE on fd from the engine's
// transmit stamps. Into b it copies the packet looped back (none with
// SOF_TIMESTAMPING_OPT_TSONLY); into ctl the ancillary data the kernel
// writes for a stamp: the socket's SCM_TIMESTAMP or SCM_TIMESTAMPNS if
// it asked for them, SCM_TIMESTAMPING with the stamp in its first
// timespec when SOF_TIMESTAMPING_SOFTWARE is on, for a looped packet with
// SOF_TIMESTAMPING_OPT_CMSG the IP ancillary data the socket asked for
// (IP_PKTINFO with the interface and the packet's source and
// destination, ...), then IP_RECVERR: ENOMSG, SO_EE_ORIGIN_TIMESTAMPING,
// SCM_TSTAMP_SND, the key, and as offender the packet's source with
// SOF_TIMESTAMPING_OPT_CMSG. ok is false when it holds none: the kernel
// socket's error queue is next (an ICMP error, or EAGAIN). It does not
// allocate.
func (e *Engine) RecvErrQueue(fd int, b, ctl []byte) (m ErrQueueMsg, ok bool) {
	s := e.get(fd)
	if s == nil {
		return m, false
	}
	t := s.tx.Load()
	if t == nil {
		return m, false
	}
	var meta stack.RecvMeta
	st, n, full, ip, ok := t.pop(b, &meta)
	if !ok {
		return m, false
	}
	m.N, m.Full, meta.Stamp = n, full, st.at
	t.mu.Lock()
	report, newAPI, optCmsg := t.report, t.newAPI, t.optCmsg
	t.mu.Unlock()
	sock := Cmsg(s.cmsg.Load())
	cm := sock & (CmsgTimestamp | CmsgTimestampNew | CmsgTimestampNS | CmsgTimestampNSNew)
	if report {
		cm |= CmsgTimestamping
		if newAPI {
			cm = cm&^CmsgTimestamping | CmsgTimestampingNew
		}
	}
	// struct sock_extended_err, then the offender's struct sockaddr_in.
	var ee [32]byte
	if ip && optCmsg {
		cm |= sock & (CmsgPktinfo | CmsgTTL | CmsgTOS | CmsgOrigDstAddr)
		if c := s.conn.Load(); c != nil {
			meta.Ifindex = c.Stack().Ifindex()
		}
		binary.NativeEndian.PutUint16(ee[16:], unix.AF_INET)
		src := meta.SpecDst.As4()
		copy(ee[20:24], src[:])
	}
	m.Ctl, m.CtlCut = PutCmsgs(ctl, cm, &meta)
	binary.NativeEndian.PutUint32(ee[0:], uint32(unix.ENOMSG))
	ee[4] = unix.SO_EE_ORIGIN_TIMESTAMPING
	binary.NativeEndian.PutUint32(ee[8:], unix.SCM_TSTAMP_SND)
	binary.NativeEndian.PutUint32(ee[12:], st.key)
	var cut bool
	m.Ctl, cut = putCmsg(ctl, m.Ctl, unix.IPPROTO_IP, unix.IP_RECVERR, ee[:])
	m.CtlCut = m.CtlCut || cut
	return m, true
}

// loopedMeta reads into m what the IP ancillary data of a looped packet
// reports: its destination, its source as the address a reply leaves
// from (ipi_spec_dst, as the kernel reports it for a packet it sent), its
// TTL and TOS. It is false for no packet (OPT_TSONLY).
func loopedMeta(frame []byte, m *stack.RecvMeta) bool {
	if len(frame) < header.UDPHeadersLen {
		return false
	}
	ip := header.IPv4(frame[header.EthernetLen:])
	if ip.HeaderLen() < header.IPv4MinLen || len(ip) < ip.HeaderLen()+header.UDPLen {
		return false
	}
	udp := header.UDP(ip[ip.HeaderLen():])
	m.Dst, m.SpecDst, m.TOS, m.TTL = netip.AddrPortFrom(ip.Dst(), udp.DstPort()), ip.Src(), ip[1], ip.TTL()
	return true
}
