//go:build ignore

// nettrace.c: the collectors of nettrace, one BTF-typed tracepoint program
// (tp_btf) per kernel event on the packet path.
//
// Each program filters in the kernel (netns, interface, IPv4 flow), counts
// what passed in probe_stats, then either writes an event to the ring
// buffer (per-event mode) or adds one to its key's count in agg_counts
// (aggregate mode). A failed ring buffer reservation or a full agg_slots is
// counted as lost for that probe and CPU, and the kernel counts the hits it
// skipped because the program was already running on the CPU (the
// program's recursion_misses): nothing is dropped without a counter saying
// so.
//
// Kernel structures are read with plain loads: tp_btf arguments are
// BTF-typed, and the verifier makes each load through them (and through
// the pointers read from them) a single instruction that a fault turns
// into zero. bpf_probe_read_kernel, a helper call each, is kept for packet
// bytes and strings. The field offsets still come from the running
// kernel's BTF (nettrace_types.h).
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "nettrace_types.h"

#define CAP_MAX 128
#define NO_HEADER 0xffff // an unset skb header offset
#define SOFTIRQ_NET_TX 2
#define SOFTIRQ_NET_RX 3

// probe ids: the index of each event in probe_stats and in the trace file.
// probes/probes.go lists the same events in the same order.
enum probe_id {
	PROBE_NETIF_RECEIVE_SKB,
	PROBE_NETIF_RX,
	PROBE_NAPI_POLL,
	PROBE_KFREE_SKB,
	PROBE_CONSUME_SKB,
	PROBE_SKB_COPY_DATAGRAM_IOVEC,
	PROBE_NET_DEV_QUEUE,
	PROBE_NET_DEV_XMIT,
	PROBE_SOFTIRQ_RAISE,
	PROBE_SOFTIRQ_ENTRY,
	PROBE_SOFTIRQ_EXIT,
	PROBE_XDP_EXCEPTION,
	PROBE_XDP_REDIRECT,
	PROBE_XDP_REDIRECT_ERR,
	PROBE_SOCK_RCVQUEUE_FULL,
	PROBE_SOCK_EXCEED_BUF_LIMIT,
	PROBE_UDP_FAIL_QUEUE_RCV_SKB,
	PROBE_MAX,
};

// event_flags
#define EVENT_ETHERNET 1 // data starts at the Ethernet header, else at IPv4

// event is one record of the ring buffer. Events without an skb are
// reserved without the data array.
struct event {
	__u64 ts; // CLOCK_MONOTONIC, ns
	__u64 skb;
	__u64 location; // kfree_skb/consume_skb caller; napi_poll: the napi struct
	__u64 sk;	// the socket the tracepoint names (kfree_skb: rx_sk)
	__u32 pid;
	__u32 tid;
	__u32 cpu;
	__u32 netns;
	__u32 ifindex;
	__u32 len;
	__u32 reason;
	__u16 probe;
	__u16 protocol; // ETH_P_*, host order
	__s32 arg[4];	// probe specific, see probes/probes.go
	char comm[16];
	char dev[16];
	__u16 caplen;
	__u16 flags;
	__u32 pad;
	__u8 data[CAP_MAX];
};

#define EVENT_HEAD_SIZE (sizeof(struct event) - CAP_MAX)

// Keep the record types in BTF for bpf2go: the ring buffer has no value type.
const struct event *unused_event __attribute__((unused));
const enum probe_id unused_probe __attribute__((unused));

struct agg_key {
	__u64 location;
	__u32 netns;
	__u32 ifindex;
	__u32 reason;
	__u16 probe;
	__u16 pad;
};

struct probe_counters {
	__u64 events; // passed the filters
	__u64 lost;   // not recorded: ring buffer full, or agg_slots full
	// Aggregate mode: the key this probe counted last on this CPU and its
	// slot in agg_counts plus one (0: none yet). Consecutive events of a
	// probe mostly share their key, and comparing it here is much cheaper
	// than hashing it.
	struct agg_key last;
	__u32 last_slot;
	__u32 pad;
};

// Set by user space before loading (spec variables); zero means "any".
const volatile __u32 cfg_netns = 0;
const volatile __u32 cfg_ifindex = 0;
const volatile __u8 cfg_l4proto = 0;
const volatile __u32 cfg_saddr = 0; // network byte order
const volatile __u32 cfg_daddr = 0;
const volatile __u32 cfg_host = 0; // either address
const volatile __u16 cfg_sport = 0; // host order
const volatile __u16 cfg_dport = 0;
const volatile __u16 cfg_port = 0; // either port
const volatile __u8 cfg_aggregate = 0;
const volatile __u32 cfg_caplen = CAP_MAX;
// Wake the reader only once this much is waiting: a wakeup per event costs
// more than the event (irq_work, scheduler). The reader also polls on a
// timer, so a quiet ring is still drained.
const volatile __u64 cfg_wakeup_bytes = 0;
// How often, per CPU, a program looks at how much is waiting.
#define WAKEUP_CHECK_NS 100000

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 24); // resized by user space
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PROBE_MAX);
	__type(key, __u32);
	__type(value, struct probe_counters);
} probe_stats SEC(".maps");

// wakeup_checked: per CPU, when a program last looked at the ring's fill.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} wakeup_checked SEC(".maps");

#define AGG_MAX 16384

// Aggregate mode counts each key in a slot of agg_counts; agg_slots says
// which key owns which slot. Counts never move between maps, so user space
// reading the two maps while programs count sees each count at most late,
// never twice or going back.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, AGG_MAX);
	__type(key, struct agg_key);
	__type(value, __u32);
} agg_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, AGG_MAX);
	__type(key, __u32);
	__type(value, __u64);
} agg_counts SEC(".maps");

// The next free slot of agg_counts; taken only for a key never seen.
__u32 agg_next_slot = 0;

// submit commits e, waking the reader when cfg_wakeup_bytes are waiting.
// The fill is looked at once per WAKEUP_CHECK_NS per CPU, not per event:
// the query costs 20 ns, and while the reader catches up, a wakeup per
// event (what checking every event did) cost 35 ns more. Each busy CPU
// still wakes a reader that lags within WAKEUP_CHECK_NS, a small part of
// what the ring holds beyond the mark.
static __always_inline void submit(struct event *e)
{
	__u64 flags = 0;
	__u32 zero = 0;
	__u64 *checked;

	if (cfg_wakeup_bytes) {
		flags = BPF_RB_NO_WAKEUP;
		checked = bpf_map_lookup_elem(&wakeup_checked, &zero);
		if (checked && e->ts - *checked >= WAKEUP_CHECK_NS) {
			*checked = e->ts;
			if (bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= cfg_wakeup_bytes)
				flags = BPF_RB_FORCE_WAKEUP;
		}
	}
	bpf_ringbuf_submit(e, flags);
}

static __always_inline int flow_filtered(void)
{
	return cfg_l4proto || cfg_saddr || cfg_daddr || cfg_host || cfg_sport || cfg_dport || cfg_port;
}

static __always_inline struct probe_counters *counters(enum probe_id p)
{
	__u32 k = p;
	return bpf_map_lookup_elem(&probe_stats, &k);
}

static __always_inline void count_lost(struct probe_counters *c)
{
	if (c)
		c->lost++;
}

// pass_flow applies the IPv4 flow filters to the packet's network header. Packets
// that are not IPv4 never match a flow filter.
static __always_inline int pass_flow(struct sk_buff *skb)
{
	struct iphdr ip;
	__u16 ports[2] = {};

	if (!flow_filtered())
		return 1;
	unsigned char *head = skb->head;
	__u16 nh = skb->network_header;
	if (nh == NO_HEADER || bpf_ntohs(skb->protocol) != ETH_P_IP)
		return 0;
	if (bpf_probe_read_kernel(&ip, sizeof(ip), head + nh))
		return 0;
	if (cfg_l4proto && ip.protocol != cfg_l4proto)
		return 0;
	if (cfg_saddr && ip.saddr != cfg_saddr)
		return 0;
	if (cfg_daddr && ip.daddr != cfg_daddr)
		return 0;
	if (cfg_host && ip.saddr != cfg_host && ip.daddr != cfg_host)
		return 0;
	if (!cfg_sport && !cfg_dport && !cfg_port)
		return 1;
	if (ip.protocol != IPPROTO_UDP && ip.protocol != IPPROTO_TCP)
		return 0;
	if (bpf_probe_read_kernel(ports, sizeof(ports), head + nh + ip.ihl * 4))
		return 0;
	__u16 sport = bpf_ntohs(ports[0]), dport = bpf_ntohs(ports[1]);
	if (cfg_sport && sport != cfg_sport)
		return 0;
	if (cfg_dport && dport != cfg_dport)
		return 0;
	if (cfg_port && sport != cfg_port && dport != cfg_port)
		return 0;
	return 1;
}

// kernel_ptr says whether p can be a kernel pointer (the top half of the
// address space). Once UDP queues a datagram, skb->dev holds its
// dev_scratch (truesize, length, flags) instead: a load through that
// non-canonical value takes a general protection fault, which the
// exception table turns into zero but which costs microseconds, on every
// consume_skb of a received datagram.
static __always_inline int kernel_ptr(const void *p)
{
	return (unsigned long)p >> 56 == 0xff;
}

// copy_name copies the device name with two plain loads (IFNAMSIZ is 16)
// where bpf_probe_read_kernel_str would cost a helper call per event.
static __always_inline void copy_name(char dst[16], struct net_device *dev)
{
	__u64 *d = (__u64 *)dst;

	d[0] = *(__u64 *)&dev->name[0];
	d[1] = *(__u64 *)&dev->name[8];
}

static __always_inline __u32 dev_netns(struct net_device *dev)
{
	struct net *net = dev->nd_net.net; // __rcu: may be NULL to the verifier

	return net ? net->ns.inum : 0;
}

static __always_inline __u32 sk_netns(struct sock *sk)
{
	if (!sk) // the verifier wants pointers that may be NULL checked
		return 0;
	struct net *net = sk->__sk_common.skc_net.net;

	return net ? net->ns.inum : 0;
}

// pass_where applies the netns and interface filters.
static __always_inline int pass_where(__u32 netns, __u32 ifindex)
{
	if (cfg_netns && netns != cfg_netns)
		return 0;
	if (cfg_ifindex && ifindex != cfg_ifindex)
		return 0;
	return 1;
}

// fill_task reads the task's ids and comm with plain loads, as copy_name
// does, where bpf_get_current_pid_tgid and bpf_get_current_comm were a
// helper call each (about 5 ns per event together).
static __always_inline void fill_task(struct event *e, enum probe_id p)
{
	struct task_struct *t = bpf_get_current_task_btf();
	__u64 *comm = (__u64 *)e->comm;

	e->ts = bpf_ktime_get_ns();
	e->probe = p;
	e->pid = t->tgid;
	e->tid = t->pid;
	e->cpu = bpf_get_smp_processor_id();
	comm[0] = *(__u64 *)&t->comm[0];
	comm[1] = *(__u64 *)&t->comm[8];
}

// agg_slot returns the slot of k in agg_counts, taking a free one for a key
// seen for the first time, or -1 when agg_counts is full.
static __always_inline long agg_slot(struct agg_key *k)
{
	__u32 *s = bpf_map_lookup_elem(&agg_slots, k);
	if (s)
		return *s;
	// Looked at before taking one, so that a full agg_counts does not
	// count agg_next_slot up at every event until it wraps to slots in use.
	if (agg_next_slot >= AGG_MAX)
		return -1;
	__u32 slot = __sync_fetch_and_add(&agg_next_slot, 1);
	if (slot >= AGG_MAX)
		return -1;
	if (!bpf_map_update_elem(&agg_slots, k, &slot, BPF_NOEXIST))
		return slot;
	// Another CPU inserted the key meanwhile (slot stays unused), or
	// agg_slots is full.
	s = bpf_map_lookup_elem(&agg_slots, k);
	return s ? *s : -1;
}

static __always_inline void aggregate(enum probe_id p, struct probe_counters *c, __u32 netns, __u32 ifindex,
				      __u32 reason, __u64 location)
{
	if (!c)
		return;
	struct agg_key *last = &c->last;
	__u32 slot = c->last_slot - 1;
	// A probe runs at most once at a time on a CPU (the kernel does not
	// nest a program in itself), so its cache entry needs no lock.
	if (!c->last_slot || last->location != location || last->netns != netns || last->ifindex != ifindex ||
	    last->reason != reason) {
		struct agg_key k = {.location = location, .netns = netns, .ifindex = ifindex, .reason = reason, .probe = p};
		long s = agg_slot(&k);
		if (s < 0) {
			c->lost++;
			return;
		}
		slot = s;
		*last = k;
		c->last_slot = slot + 1;
	}
	__u64 *v = bpf_map_lookup_elem(&agg_counts, &slot);
	if (v)
		(*v)++;
	else
		c->lost++;
}

// skb_event filters and records an event about skb. The caller fills the
// probe-specific fields of the returned event and submits it; NULL means
// filtered out, aggregated, or lost (and counted).
static __always_inline struct event *skb_event(enum probe_id p, struct sk_buff *skb, __u32 reason, __u64 location)
{
	struct net_device *dev = skb->dev;
	__u32 ifindex = 0, netns = 0;

	if (!kernel_ptr(dev))
		dev = NULL;
	if (dev) {
		ifindex = dev->ifindex;
		netns = dev_netns(dev);
	} else {
		netns = sk_netns(skb->sk);
	}
	if (!pass_where(netns, ifindex))
		return NULL;

	if (!pass_flow(skb))
		return NULL;

	struct probe_counters *c = counters(p);
	if (c)
		c->events++;
	if (cfg_aggregate) {
		aggregate(p, c, netns, ifindex, reason, location);
		return NULL;
	}

	struct event *e = bpf_ringbuf_reserve(&events, sizeof(struct event), 0);
	if (!e) {
		count_lost(c);
		return NULL;
	}
	fill_task(e, p);
	e->sk = 0;
	e->skb = (__u64)skb;
	e->location = location;
	e->reason = reason;
	e->netns = netns;
	e->ifindex = ifindex;
	e->len = skb->len;
	e->protocol = bpf_ntohs(skb->protocol);
	e->arg[0] = e->arg[1] = e->arg[2] = e->arg[3] = 0;
	e->pad = 0;
	if (dev)
		copy_name(e->dev, dev);
	else
		e->dev[0] = 0;

	// Capture from the Ethernet header when the skb has one, else from the
	// network header; never past the linear data.
	unsigned char *head = skb->head;
	__u16 nh = skb->network_header;
	__u16 mh = skb->mac_header;
	unsigned char *data = skb->data;
	__u32 headlen = e->len - skb->data_len;
	unsigned char *start = 0;
	e->flags = 0;
	if (mh != NO_HEADER) {
		start = head + mh;
		e->flags = EVENT_ETHERNET;
	} else if (nh != NO_HEADER && e->protocol == ETH_P_IP) {
		start = head + nh; // e.g. a local packet freed before it got a MAC header
	}
	__u32 n = 0;
	if (start && data + headlen > start)
		n = data + headlen - start;
	if (n > cfg_caplen)
		n = cfg_caplen;
	if (n > CAP_MAX)
		n = CAP_MAX;
	e->caplen = 0;
	if (n && !bpf_probe_read_kernel(e->data, n, start))
		e->caplen = n;
	return e;
}

// plain_event filters and records an event without an skb.
// Events without a device (softirq) have netns and ifindex 0: a netns or
// interface filter leaves them out, so that a filtered recording stays
// small on a busy machine.
static __always_inline struct event *plain_event(enum probe_id p, struct net_device *dev, __u32 netns, __u64 location)
{
	__u32 ifindex = 0;

	if (dev) {
		ifindex = dev->ifindex;
		netns = dev_netns(dev);
	}
	if (!pass_where(netns, ifindex))
		return NULL;

	struct probe_counters *c = counters(p);
	if (c)
		c->events++;
	if (cfg_aggregate) {
		aggregate(p, c, netns, ifindex, 0, location);
		return NULL;
	}

	struct event *e = bpf_ringbuf_reserve(&events, EVENT_HEAD_SIZE, 0);
	if (!e) {
		count_lost(c);
		return NULL;
	}
	fill_task(e, p);
	e->sk = 0;
	e->skb = 0;
	e->location = location;
	e->reason = 0;
	e->netns = netns;
	e->ifindex = ifindex;
	e->len = 0;
	e->protocol = 0;
	e->arg[0] = e->arg[1] = e->arg[2] = e->arg[3] = 0;
	e->caplen = 0;
	e->flags = 0;
	e->pad = 0;
	if (dev)
		copy_name(e->dev, dev);
	else
		e->dev[0] = 0;
	return e;
}

#define SKB_PROG(name, p)                                     \
	SEC("tp_btf/" #name)                                  \
	int BPF_PROG(name, struct sk_buff *skb)               \
	{                                                     \
		struct event *e = skb_event(p, skb, 0, 0);    \
		if (e)                                        \
			submit(e);                    \
		return 0;                                     \
	}

SKB_PROG(netif_receive_skb, PROBE_NETIF_RECEIVE_SKB)
SKB_PROG(netif_rx, PROBE_NETIF_RX)
SKB_PROG(net_dev_queue, PROBE_NET_DEV_QUEUE)

SEC("tp_btf/napi_poll")
int BPF_PROG(napi_poll, struct napi_struct *napi, int work, int budget)
{
	struct event *e = plain_event(PROBE_NAPI_POLL, napi->dev, 0, (__u64)napi);
	if (!e)
		return 0;
	e->arg[0] = work;
	e->arg[1] = budget;
	submit(e);
	return 0;
}

SEC("tp_btf/kfree_skb")
int BPF_PROG(kfree_skb, struct sk_buff *skb, void *location, unsigned int reason, struct sock *rx_sk)
{
	struct event *e = skb_event(PROBE_KFREE_SKB, skb, reason, (__u64)location);
	if (!e)
		return 0;
	e->sk = (__u64)rx_sk;
	submit(e);
	return 0;
}

SEC("tp_btf/consume_skb")
int BPF_PROG(consume_skb, struct sk_buff *skb, void *location)
{
	struct event *e = skb_event(PROBE_CONSUME_SKB, skb, 0, (__u64)location);
	if (e)
		submit(e);
	return 0;
}

SEC("tp_btf/skb_copy_datagram_iovec")
int BPF_PROG(skb_copy_datagram_iovec, struct sk_buff *skb, int len)
{
	struct event *e = skb_event(PROBE_SKB_COPY_DATAGRAM_IOVEC, skb, 0, 0);
	if (!e)
		return 0;
	e->arg[0] = len;
	submit(e);
	return 0;
}

SEC("tp_btf/net_dev_xmit")
int BPF_PROG(net_dev_xmit, struct sk_buff *skb, int rc, struct net_device *dev, unsigned int len)
{
	// The skb may be freed once the driver took it: read only what the
	// tracepoint passes, as the kernel's own trace event does. Without the
	// packet a flow filter cannot match.
	if (flow_filtered())
		return 0;
	struct event *e = plain_event(PROBE_NET_DEV_XMIT, dev, 0, 0);
	if (!e)
		return 0;
	e->skb = (__u64)skb;
	e->len = len;
	e->arg[0] = rc;
	submit(e);
	return 0;
}

static __always_inline int softirq(enum probe_id p, unsigned int vec)
{
	if (vec != SOFTIRQ_NET_RX && vec != SOFTIRQ_NET_TX)
		return 0;
	struct event *e = plain_event(p, NULL, 0, 0);
	if (!e)
		return 0;
	e->arg[0] = vec;
	submit(e);
	return 0;
}

SEC("tp_btf/softirq_raise")
int BPF_PROG(softirq_raise, unsigned int vec)
{
	return softirq(PROBE_SOFTIRQ_RAISE, vec);
}

SEC("tp_btf/softirq_entry")
int BPF_PROG(softirq_entry, unsigned int vec)
{
	return softirq(PROBE_SOFTIRQ_ENTRY, vec);
}

SEC("tp_btf/softirq_exit")
int BPF_PROG(softirq_exit, unsigned int vec)
{
	return softirq(PROBE_SOFTIRQ_EXIT, vec);
}

SEC("tp_btf/xdp_exception")
int BPF_PROG(xdp_exception, struct net_device *dev, struct bpf_prog *xdp, __u32 act)
{
	struct event *e = plain_event(PROBE_XDP_EXCEPTION, dev, 0, 0);
	if (!e)
		return 0;
	e->arg[0] = xdp ? xdp->aux->id : 0;
	e->arg[1] = act;
	submit(e);
	return 0;
}

static __always_inline int xdp_redirect(enum probe_id p, struct net_device *dev, struct bpf_prog *xdp, int err,
					__u32 map_id, __u32 index)
{
	struct event *e = plain_event(p, dev, 0, 0);
	if (!e)
		return 0;
	e->arg[0] = xdp ? xdp->aux->id : 0;
	e->arg[1] = err;
	e->arg[2] = map_id;
	e->arg[3] = index;
	submit(e);
	return 0;
}

SEC("tp_btf/xdp_redirect")
int BPF_PROG(xdp_redirect_ok, struct net_device *dev, struct bpf_prog *xdp, void *tgt, int err, int map_type,
	     __u32 map_id, __u32 index)
{
	return xdp_redirect(PROBE_XDP_REDIRECT, dev, xdp, err, map_id, index);
}

SEC("tp_btf/xdp_redirect_err")
int BPF_PROG(xdp_redirect_err, struct net_device *dev, struct bpf_prog *xdp, void *tgt, int err, int map_type,
	     __u32 map_id, __u32 index)
{
	return xdp_redirect(PROBE_XDP_REDIRECT_ERR, dev, xdp, err, map_id, index);
}

SEC("tp_btf/sock_rcvqueue_full")
int BPF_PROG(sock_rcvqueue_full, struct sock *sk, struct sk_buff *skb)
{
	struct event *e = skb_event(PROBE_SOCK_RCVQUEUE_FULL, skb, 0, 0);
	if (!e)
		return 0;
	e->sk = (__u64)sk;
	if (sk) {
		e->arg[0] = sk->sk_rcvbuf;
		e->arg[1] = sk->sk_backlog.rmem_alloc.counter;
	}
	e->arg[2] = skb->truesize;
	if (!e->netns)
		e->netns = sk_netns(sk);
	submit(e);
	return 0;
}

SEC("tp_btf/sock_exceed_buf_limit")
int BPF_PROG(sock_exceed_buf_limit, struct sock *sk, struct proto *prot, long allocated, int kind)
{
	if (flow_filtered())
		return 0;
	struct event *e = plain_event(PROBE_SOCK_EXCEED_BUF_LIMIT, NULL, sk_netns(sk), 0);
	if (!e)
		return 0;
	e->sk = (__u64)sk;
	e->arg[0] = kind;
	e->arg[1] = allocated;
	e->arg[2] = sk ? sk->sk_rcvbuf : 0;
	submit(e);
	return 0;
}

SEC("tp_btf/udp_fail_queue_rcv_skb")
int BPF_PROG(udp_fail_queue_rcv_skb, int rc, struct sock *sk, struct sk_buff *skb)
{
	struct event *e = skb_event(PROBE_UDP_FAIL_QUEUE_RCV_SKB, skb, 0, 0);
	if (!e)
		return 0;
	e->sk = (__u64)sk;
	e->arg[0] = rc;
	/* what `nettrace report` needs to say which SO_RCVBUF to raise */
	if (sk) {
		e->arg[1] = sk->sk_rcvbuf;
		e->arg[2] = sk->sk_backlog.rmem_alloc.counter;
	}
	submit(e);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
