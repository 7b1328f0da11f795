// Package stats is the counters file each vmaxdp process publishes and
// `vmaxdp stats` reads: a Snapshot of the process's sockets, queues,
// buffer pools, steering programs and rules, written into a file of a
// shared-memory directory (tmpfs) by the process and read by any tool
// without stopping or slowing it.
//
// A counter has one name everywhere: the Go field here, its json tag, the
// Prometheus metric (vmaxdp_<block>_<json name>[_total]) and the views of
// `vmaxdp stats` all derive from the same struct field, and the fields
// copy the names of the counters they publish (stack.SocketCounters,
// xsk.Counters, steer.RuleCounters, steer.ProgCounters).
//
// Fields of the counter structs are counters (they only grow until zeroed)
// unless tagged stats:"gauge" (a high-water mark); the deltas view and the
// Prometheus types follow the tag.
//
// What this package must not do: touch the packet path. The publishing
// process calls Writer.Publish from its own goroutine; nothing here is
// called per packet, and Publish allocates nothing once warm.
package stats

import (
	"iter"
	"reflect"
	"strings"

	"github.com/vmaxdp/vmaxdp/steer"
)

// Snapshot is everything one process publishes.
type Snapshot struct {
	Process  Process   `json:"process"`
	Sockets  []Socket  `json:"sockets"`
	Queues   []Queue   `json:"queues"`
	Programs []Program `json:"programs"`
	Rules    []Rule    `json:"rules"`
}

// Process describes the publishing process.
type Process struct {
	PID        int    `json:"pid"`
	Program    string `json:"program"`
	Cmdline    string `json:"cmdline"`
	Version    string `json:"version"`
	Published  int64  `json:"published_unix_nano"` // when this snapshot was taken
	LogLevel   int    `json:"log_level"`
	LogDetails int    `json:"log_details"`
	// SocketsHidden counts sockets left out by VMAXDP_STATS_FD_NUM.
	SocketsHidden int `json:"sockets_hidden"`
	// CPUUsageStats: VMAXDP_CPU_USAGE_STATS=1, the Iomux PollingNanos count.
	CPUUsageStats bool `json:"cpu_usage_stats"`
	// Select, Poll and Epoll are the multiplexers' counters.
	Select Iomux `json:"select"`
	Poll   Iomux `json:"poll"`
	Epoll  Iomux `json:"epoll"`
}

// Iomux are the counters of one multiplexer (select, poll or epoll_wait)
// over all its calls that watched an offloaded socket.
type Iomux struct {
	Calls          uint64 `json:"calls"`
	RxReadyOS      uint64 `json:"rx_ready_os"`      // kernel fds found readable
	RxReadyOffload uint64 `json:"rx_ready_offload"` // offloaded sockets found readable
	Timeouts       uint64 `json:"timeouts"`
	Errors         uint64 `json:"errors"`
	PollHit        uint64 `json:"poll_hit"`  // calls answered without sleeping
	PollMiss       uint64 `json:"poll_miss"` // calls that slept in the kernel
	// PollingNanos is the time spent polling before answering or
	// sleeping (VMAXDP_CPU_USAGE_STATS=1 only).
	PollingNanos uint64 `json:"polling_nanos"`
}

// Socket state names, as the views print them.
const (
	StateOffloaded = "offloaded"
	StateKernel    = "kernel"    // decided: not offloaded, Reason says why
	StateCandidate = "candidate" // not decided yet (not bound, no send)
)

// Socket is one application socket.
type Socket struct {
	FD        int      `json:"fd"`
	Proto     string   `json:"proto"`
	State     string   `json:"state"`
	Reason    string   `json:"reason,omitempty"` // why it is not offloaded
	Interface string   `json:"ifname,omitempty"`
	Local     string   `json:"local"`
	Remote    string   `json:"remote,omitempty"`
	Blocking  bool     `json:"blocking"`
	Groups    []string `json:"groups,omitempty"`
	// ReusePort: the socket has SO_REUSEPORT; the sockets of the process
	// with it on the same Local are its group, among which the datagrams
	// are spread.
	ReusePort bool     `json:"reuseport,omitempty"`
	Rules     []uint32 `json:"rules,omitempty"` // steering rule ids on Interface
	// RxQueuePackets and RxQueueBytes are the receive queue now.
	RxQueuePackets uint64 `json:"rx_queue_packets"`
	RxQueueBytes   uint64 `json:"rx_queue_bytes"`
	RxBytesLimit   uint64 `json:"rx_bytes_limit"`
	// KernelDrops are the datagrams the socket's kernel socket dropped
	// (SO_MEMINFO's sk_drops): its receive buffer was full while the
	// kernel served it (before its offload, or for good).
	KernelDrops uint64         `json:"kernel_drops"`
	Counters    SocketCounters `json:"counters"`
	// TCP is a TCP socket's state (Proto "tcp").
	TCP TCPSocket `json:"tcp"`
}

// Offloaded says whether vmaxdp serves the socket.
func (s *Socket) Offloaded() bool { return s.State == StateOffloaded }

// SocketCounters are stack.SocketCounters, field for field.
type SocketCounters struct {
	RxOffloadPackets  uint64 `json:"rx_offload_packets"`
	RxOffloadBytes    uint64 `json:"rx_offload_bytes"`
	RxOSPackets       uint64 `json:"rx_os_packets"`
	RxOSBytes         uint64 `json:"rx_os_bytes"`
	RxQueueDrops      uint64 `json:"rx_queue_drops"`
	RxQueueDropBytes  uint64 `json:"rx_queue_drop_bytes"`
	RxFiltered        uint64 `json:"rx_filtered"`
	RxSourceFiltered  uint64 `json:"rx_source_filtered"`
	RxEagain          uint64 `json:"rx_eagain"`
	RxErrors          uint64 `json:"rx_errors"`
	RxPollHit         uint64 `json:"rx_poll_hit"`
	RxPollMiss        uint64 `json:"rx_poll_miss"`
	RxQueueBytesMax   uint64 `json:"rx_queue_bytes_max" stats:"gauge"`
	RxQueuePacketsMax uint64 `json:"rx_queue_packets_max" stats:"gauge"`
	TxOffloadPackets  uint64 `json:"tx_offload_packets"`
	TxOffloadBytes    uint64 `json:"tx_offload_bytes"`
	TxOSPackets       uint64 `json:"tx_os_packets"`
	TxOSBytes         uint64 `json:"tx_os_bytes"`
	TxNoBufs          uint64 `json:"tx_no_bufs"`
	TxErrors          uint64 `json:"tx_errors"`
	TxStampDrops      uint64 `json:"tx_stamp_drops"`
}

// Queue is one AF_XDP socket: one interface queue, its rings and its
// UMEM's two buffer pools (VMA's RING, CQ and BUFFER_POOL blocks).
type Queue struct {
	Interface string `json:"ifname"`
	Queue     int    `json:"queue"`
	Backend   string `json:"backend"`  // AF_XDP (VMAXDP_BACKEND)
	XDPMode   string `json:"xdp_mode"` // native or generic
	ZeroCopy  bool   `json:"zero_copy"`
	RingSize  uint64 `json:"ring_size"` // entries of each ring
	// Ring occupancy now.
	RxRing         uint64 `json:"rx_ring"`
	TxRing         uint64 `json:"tx_ring"`
	FillRing       uint64 `json:"fill_ring"`
	CompletionRing uint64 `json:"completion_ring"`
	// Buffer pools: the RX pool's free frames are those on the fill ring.
	RxPoolSize uint64 `json:"rx_pool_size"`
	RxPoolFree uint64 `json:"rx_pool_free"`
	TxPoolSize uint64 `json:"tx_pool_size"`
	TxPoolFree uint64 `json:"tx_pool_free"`
	// StatisticsError is why XDP_STATISTICS could not be read ("": read).
	StatisticsError string        `json:"statistics_error,omitempty"`
	Counters        QueueCounters `json:"counters"`
	Statistics      XDPStatistics `json:"xdp_statistics"`
}

// QueueCounters are xsk.Counters, field for field.
type QueueCounters struct {
	RxPackets   uint64 `json:"rx_packets"`
	TxPackets   uint64 `json:"tx_packets"`
	RxWakeups   uint64 `json:"rx_wakeups"`
	TxWakeups   uint64 `json:"tx_wakeups"`
	TxKickErrs  uint64 `json:"tx_kick_errs"`
	TxBacklog   uint64 `json:"tx_backlog"`
	TxDeferred  uint64 `json:"tx_deferred"`
	MaxRxBatch  uint64 `json:"max_rx_batch" stats:"gauge"`
	TxNoBufs    uint64 `json:"tx_no_bufs"`
	FillNoSpace uint64 `json:"fill_no_space"`
}

// XDPStatistics is the kernel's XDP_STATISTICS under its field names.
type XDPStatistics struct {
	RxDropped            uint64 `json:"rx_dropped"`
	RxInvalidDescs       uint64 `json:"rx_invalid_descs"`
	TxInvalidDescs       uint64 `json:"tx_invalid_descs"`
	RxRingFull           uint64 `json:"rx_ring_full"`
	RxFillRingEmptyDescs uint64 `json:"rx_fill_ring_empty_descs"`
	TxRingEmptyDescs     uint64 `json:"tx_ring_empty_descs"`
}

// Program is the steering program of one interface and the stack behind it.
type Program struct {
	Interface string `json:"ifname"`
	// Netns is the inode number of the interface's network namespace.
	Netns   uint32 `json:"netns"`
	XDPMode string `json:"xdp_mode"`
	PinDir  string `json:"pin_dir"`
	// CountersError is why the BPF counters could not be read ("": read).
	CountersError string             `json:"counters_error,omitempty"`
	Counters      steer.ProgCounters `json:"counters"`
	Stack         StackCounters      `json:"stack"`
	// TCP are the TCP counters of the interface's netstack, zero while
	// no TCP socket made it (HasTCP false).
	HasTCP bool        `json:"has_tcp"`
	TCP    TCPCounters `json:"tcp"`
}

// TCPCounters are stack.TCPCounters (the link's) then
// stack.NetstackCounters (netstack's own), field for field.
type TCPCounters struct {
	RxSegments  uint64 `json:"rx_segments"`
	TxSegments  uint64 `json:"tx_segments"`
	TxDropped   uint64 `json:"tx_dropped"`
	DrainErrors uint64 `json:"drain_errors"`
	// AcksCarried: netstack's bare ACKs not sent, a segment with data of
	// the same connection carrying the acknowledgement.
	AcksCarried uint64 `json:"acks_carried"`
	// AcksDelayed: netstack's bare ACKs that left when their hold was
	// over, no segment of the connection carrying them.
	AcksDelayed uint64 `json:"acks_delayed"`
	// RxInline: segments netstack processed on the thread of a receive
	// that polled for them, without waking its processor goroutine.
	RxInline uint64 `json:"rx_inline"`
	// RxDrained: frames the drain goroutines took from the rings, no
	// application thread polling them.
	RxDrained uint64 `json:"rx_drained"`
	// DrainWakeups: the drain goroutines woken by Go's netpoller for
	// their queues' frames, each a Go thread woken.
	DrainWakeups uint64 `json:"drain_wakeups"`
	// RxMerged: segments GRO merged into the one before them, so that
	// netstack processed one packet for the run (rx_segments less
	// rx_merged in all).
	RxMerged uint64 `json:"rx_merged"`
	// RxDirect: packets handed straight to their connection, past
	// netstack's IP layer and demuxer.
	RxDirect              uint64 `json:"rx_direct"`
	ActiveOpens           uint64 `json:"active_opens"`
	PassiveOpens          uint64 `json:"passive_opens"`
	CurrentEstablished    uint64 `json:"current_established" stats:"gauge"`
	EstablishedResets     uint64 `json:"established_resets"`
	EstablishedTimedout   uint64 `json:"established_timedout"`
	FailedConnects        uint64 `json:"failed_connects"`
	ListenOverflowSynDrop uint64 `json:"listen_overflow_syn_drop"`
	ListenOverflowAckDrop uint64 `json:"listen_overflow_ack_drop"`
	// SynCookiesSent: SYNs answered with a SYN cookie, a listener's
	// half-open connections being too many (a SYN flood).
	SynCookiesSent          uint64 `json:"syn_cookies_sent"`
	ValidSegmentsReceived   uint64 `json:"valid_segments_received"`
	InvalidSegmentsReceived uint64 `json:"invalid_segments_received"`
	ChecksumErrors          uint64 `json:"checksum_errors"`
	// SegmentsSent: the segments netstack made, the bare ACKs the link
	// did not send (acks_carried) included; tx_segments are those that
	// left. A socket's own count (TCP_INFO, its Tx packets) leaves out
	// its carried ACKs.
	SegmentsSent      uint64 `json:"segments_sent"`
	SegmentSendErrors uint64 `json:"segment_send_errors"`
	ResetsSent        uint64 `json:"resets_sent"`
	ResetsReceived    uint64 `json:"resets_received"`
	Retransmits       uint64 `json:"retransmits"`
	Timeouts          uint64 `json:"timeouts"`
}

// TCPSocket is a TCP socket's protocol state.
type TCPSocket struct {
	// State is the TCP state (ESTABLISHED, LISTEN, ...).
	State string `json:"state,omitempty"`
	// RTTMicros is the smoothed round-trip time, in microseconds. On a
	// connection netstack serves it is netstack's estimate, which the
	// timestamps option measures in milliseconds: 1000 at least on a
	// path of tens of microseconds (a granularity, not the time).
	RTTMicros uint64 `json:"rtt_us" stats:"gauge"`
	// Retransmits counts the connection's retransmitted segments.
	Retransmits uint64 `json:"retransmits"`
	// RecvQueue is the bytes received and not yet read (SIOCINQ).
	RecvQueue uint64 `json:"recv_queue" stats:"gauge"`
	// SendQueue is the bytes written and not yet acknowledged by the
	// peer, sent or not (SIOCOUTQ).
	SendQueue uint64 `json:"send_queue" stats:"gauge"`
	// Backlog is a listener's backlog (listen's argument), Accepted the
	// connections it handed to accept.
	Backlog  uint64 `json:"backlog" stats:"gauge"`
	Accepted uint64 `json:"accepted"`
}

// StackCounters are stack.Counters: frames that reached no socket.
type StackCounters struct {
	RxFrames        uint64 `json:"rx_frames"`
	RxNoSocket      uint64 `json:"rx_no_socket"`
	NeighUnresolved uint64 `json:"neigh_unresolved"`
	// RxProgressFrames: frames the progress engine drained while no
	// receive polled.
	RxProgressFrames uint64 `json:"rx_progress_frames"`
	// RxPartialChecksum: datagrams delivered with a partial UDP checksum
	// (from this host's kernel over a veth with TX checksum offload on).
	RxPartialChecksum uint64 `json:"rx_partial_checksum"`
	// RxSourceRejected: datagrams and TCP segments dropped for a source
	// the kernel would refuse (its own address; with rp_filter on, what
	// its reverse-path check refuses); RxSourceUnchecked: those from a new
	// source past the checks a second allows.
	RxSourceRejected  uint64 `json:"rx_source_rejected"`
	RxSourceUnchecked uint64 `json:"rx_source_unchecked"`
	// RxSpilled: datagrams copied out of their frames because sockets
	// held half of their queue's receive frames (a reader behind).
	RxSpilled uint64 `json:"rx_spilled"`
	// RxDropped counts the frames the parser dropped, by reason
	// (header.Result names).
	RxDropped []Drop `json:"rx_dropped"`
}

// Drop is a count of frames dropped for one reason.
type Drop struct {
	Reason  string `json:"reason"`
	Packets uint64 `json:"packets"`
}

// Rule is one steering rule.
type Rule struct {
	Interface string `json:"ifname"`
	ID        uint32 `json:"id"`
	FD        int    `json:"fd"` // the socket that installed it
	Rule      string `json:"rule"`
	// CountersError is why the BPF counters could not be read ("": read).
	CountersError string             `json:"counters_error,omitempty"`
	Counters      steer.RuleCounters `json:"counters"`
}

// Redirected is how many matched packets reached the AF_XDP socket.
func (r *Rule) Redirected() uint64 {
	missed := r.Counters.RedirectFailures + r.Counters.TooLong
	return r.Counters.MatchedPackets - min(missed, r.Counters.MatchedPackets)
}

// Field is one counter of a counter struct, under its one name.
type Field struct {
	Name   string // the json name: the counter's name everywhere
	GoName string
	Value  uint64
	Gauge  bool // a high-water mark, not a counter
}

// Fields lists the counters of the counter struct v points to
// (SocketCounters, QueueCounters, XDPStatistics, steer.RuleCounters...).
func Fields(v any) iter.Seq[Field] {
	return func(yield func(Field) bool) {
		rv := reflect.ValueOf(v).Elem()
		for i := range rv.NumField() {
			sf := rv.Type().Field(i)
			f := Field{Name: strings.Split(sf.Tag.Get("json"), ",")[0], GoName: sf.Name, Value: rv.Field(i).Uint(), Gauge: sf.Tag.Get("stats") == "gauge"}
			if !yield(f) {
				return
			}
		}
	}
}

// FieldMap is Fields as a map from name to value.
func FieldMap(v any) map[string]uint64 {
	m := map[string]uint64{}
	for f := range Fields(v) {
		m[f.Name] = f.Value
	}
	return m
}
