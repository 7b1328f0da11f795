package engine

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/stack"
)

// txStampsMax bounds a socket's queue of transmit stamps, as the kernel's
// receive buffer bounds its error queue (about 270 stamps without their
// packet in the default 208 KiB).
const txStampsMax = 256

// txStamps is the error queue of an offloaded socket that asked for
// software transmit timestamps without the packet looped back
// (SO_TIMESTAMPING with SOF_TIMESTAMPING_TX_SOFTWARE and
// SOF_TIMESTAMPING_OPT_TSONLY): for each datagram the stack sent, the
// time its send was kicked to the device and its SOF_TIMESTAMPING_OPT_ID
// key, which recvmsg with MSG_ERRQUEUE reads as the kernel's
// sock_extended_err.
type txStamps struct {
	mu      sync.Mutex
	q       [txStampsMax]txStamp
	head, n int
	key     uint32       // the next datagram's OPT_ID key
	optID   bool         // SOF_TIMESTAMPING_OPT_ID: keys count from when it was set
	report  bool         // SOF_TIMESTAMPING_SOFTWARE: the stamp is reported
	newAPI  bool         // set with SO_TIMESTAMPING_NEW: SCM_TIMESTAMPING_NEW
	dropped uint64       // stamps the full queue had no room for
	queued  atomic.Int32 // n, for pending
}

type txStamp struct {
	at  int64 // unix nanoseconds
	key uint32
}

// push queues a stamp of now for one datagram sent. It returns the
// stamps dropped so far: the first drop is logged.
func (t *txStamps) push(now int64) (dropped uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	key := t.key
	if t.optID {
		t.key++
	}
	if t.n == txStampsMax {
		t.dropped++
		return t.dropped
	}
	t.q[(t.head+t.n)%txStampsMax] = txStamp{at: now, key: key}
	t.n++
	t.queued.Store(int32(t.n))
	return t.dropped
}

// pop takes the oldest stamp.
func (t *txStamps) pop() (txStamp, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == 0 {
		return txStamp{}, false
	}
	s := t.q[t.head]
	t.head = (t.head + 1) % txStampsMax
	t.n--
	t.queued.Store(int32(t.n))
	return s, true
}

// pending says whether a stamp waits: POLLERR, as the kernel reports a
// socket whose error queue holds one. Without the lock: every scan of a
// multiplexer asks it for each member.
func (t *txStamps) pending() bool { return t.queued.Load() > 0 }

// setTxStamps follows SO_TIMESTAMPING's transmit flags on s (TX_SOFTWARE
// with OPT_TSONLY; flags without TX_SOFTWARE turn them off). Caller
// checked that the engine serves flags.
func setTxStamps(s *Socket, flags int, newAPI bool) {
	if flags&unix.SOF_TIMESTAMPING_TX_SOFTWARE == 0 {
		s.tx.Store(nil)
		return
	}
	t := s.tx.Load()
	if t == nil {
		t = new(txStamps)
	}
	t.mu.Lock()
	optID := flags&unix.SOF_TIMESTAMPING_OPT_ID != 0
	if optID && !t.optID {
		t.key = 0 // the kernel counts a UDP socket's keys from 0 as OPT_ID comes
	}
	t.optID, t.report, t.newAPI = optID, flags&unix.SOF_TIMESTAMPING_SOFTWARE != 0, newAPI
	t.mu.Unlock()
	s.tx.Store(t)
}

// stampSend notes that the stack sent a datagram of fd through c, whose
// transmit stamps t are on: its send is kicked to the device now, as the
// kernel stamps in the driver's transmit, and a multiplexer waiting on
// the socket (POLLERR) is woken. A stamp the full queue has no room for
// is dropped, as the kernel drops it, and the first is logged.
func (e *Engine) stampSend(fd int, c *stack.UDPConn, t *txStamps) {
	now := time.Now().UnixNano()
	c.FlushSends()
	if t.push(now) == 1 {
		e.Log.Printf(params.LevelWarning, "fd %d: a transmit timestamp dropped: its error queue holds %d unread (read them with recvmsg and MSG_ERRQUEUE); later drops are not logged", fd, txStampsMax)
	}
	c.Stack().WakeWaiters()
}

// TxStampPending says whether fd's error queue holds a transmit stamp of
// the engine's (POLLERR, EPOLLERR).
func (e *Engine) TxStampPending(fd int) bool {
	if s := e.get(fd); s != nil {
		if t := s.tx.Load(); t != nil {
			return t.pending()
		}
	}
	return false
}

// RecvErrQueue serves recvmsg with MSG_ERRQUEUE on fd from the engine's
// transmit stamps: it writes into ctl the ancillary data the kernel
// writes for a stamp without its packet (the socket's SCM_TIMESTAMP or
// SCM_TIMESTAMPNS if it asked for them, SCM_TIMESTAMPING with the stamp
// in its first timespec when SOF_TIMESTAMPING_SOFTWARE is on, then
// IP_RECVERR: ENOMSG, SO_EE_ORIGIN_TIMESTAMPING, SCM_TSTAMP_SND, the key,
// no offender). ok is false when it holds none: the kernel socket's
// error queue is next (an ICMP error, or EAGAIN).
func (e *Engine) RecvErrQueue(fd int, ctl []byte) (used int, cut, ok bool) {
	s := e.get(fd)
	if s == nil {
		return 0, false, false
	}
	t := s.tx.Load()
	if t == nil {
		return 0, false, false
	}
	st, ok := t.pop()
	if !ok {
		return 0, false, false
	}
	t.mu.Lock()
	report, newAPI := t.report, t.newAPI
	t.mu.Unlock()
	cm := Cmsg(s.cmsg.Load()) & (CmsgTimestamp | CmsgTimestampNew | CmsgTimestampNS | CmsgTimestampNSNew)
	if report {
		cm |= CmsgTimestamping
		if newAPI {
			cm = cm&^CmsgTimestamping | CmsgTimestampingNew
		}
	}
	used, cut = PutCmsgs(ctl, cm, &stack.RecvMeta{Stamp: st.at})
	// struct sock_extended_err, then the offender's struct sockaddr_in
	// (zero: a stamp has none).
	var ee [32]byte
	binary.NativeEndian.PutUint32(ee[0:], uint32(unix.ENOMSG))
	ee[4] = unix.SO_EE_ORIGIN_TIMESTAMPING
	binary.NativeEndian.PutUint32(ee[8:], unix.SCM_TSTAMP_SND)
	binary.NativeEndian.PutUint32(ee[12:], st.key)
	n, c := putCmsg(ctl, used, unix.IPPROTO_IP, unix.IP_RECVERR, ee[:])
	return n, cut || c, true
}
