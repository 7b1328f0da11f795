//go:build ignore

// steer.c: the XDP program that steers the engine's flows to AF_XDP sockets.
//
// It takes from the kernel only what a rule asks for: a packet whose IPv4
// UDP/TCP tuple matches a rule is redirected to the AF_XDP socket of the
// queue it arrived on; everything else (ARP, ICMP, IPv6, fragments, other
// ports, malformed headers, and a rule's packets from a source the kernel
// drops as martian) gets XDP_PASS. Lookups go from the most to the
// least specific rule: 5-tuple, multicast group:port, local addr:port,
// local port on any address.
//
// A TCP rule in handover (RULE_HANDOVER) is one whose listeners are going
// back to the kernel while the user-space stack still holds connections
// they made: a new connection (a SYN) goes to the kernel and the program
// remembers its 5-tuple in handover_flows, so that the rest of it follows;
// every other segment still goes to the stack. A 5-tuple rule marked
// RULE_KERNEL passes its connection to the kernel, which took it over.
//
// A queue with no AF_XDP socket (the channel count just grew, or the queue
// cannot be bound) passes a rule's UDP datagrams to the kernel socket the
// engine keeps bound to the port. TCP cannot go there: the kernel has no
// socket for the stack's connections and would reset them. A new
// connection (its SYN) goes to the kernel's listener, as in a handover,
// and its later segments follow it; a segment of the stack's connections
// is dropped and counted (redirect_failures), and its sender sends it
// again once the queue is served.
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define MAX_RULES 4096
// MAX_CONNS bounds the 5-tuple rules, one for each TCP connection a stack
// serves. Rule ids past MAX_RULES index no rule_stats entry, and their
// rules go uncounted.
#define MAX_CONNS 65536
#define MAX_QUEUES 64

// flow_key is the key of every rule map; fields a rule kind does not use
// are zero. Addresses and ports are in network byte order.
struct flow_key {
	__u32 local_addr;
	__u32 remote_addr;
	__u16 local_port;
	__u16 remote_port;
	__u8 proto;
	__u8 pad[3];
};

enum rule_flags {
	RULE_HANDOVER = 1,
	// RULE_KERNEL: a connection the stack handed to a kernel socket
	// (TCP_REPAIR); its 5-tuple rule passes its segments to the kernel
	// ahead of its listener's rule.
	RULE_KERNEL = 2,
};

struct rule_value {
	__u32 rule_id; // its counters' row in rule_stats
	__u32 flags;   // enum rule_flags
};

struct rule_counters {
	__u64 matched_packets;
	__u64 matched_bytes;
	__u64 redirect_failures; // no AF_XDP socket on the arrival queue: UDP passed, TCP dropped
	__u64 too_long;          // longer than max_frame_len, or in several buffers: UDP passed, TCP dropped
	__u64 pad[4];            // a cache line each: two CPUs counting one rule share none
};

struct prog_counters {
	__u64 passed;
	__u64 redirected;
	__u64 non_ip;
	__u64 fragments;
	__u64 parse_errors;
	__u64 martian_sources; // passed to the kernel, which drops them (martian_source)
};

// max_frame_len is the longest frame an AF_XDP socket of the engine takes
// (its frame size less the kernel's headroom; 0: no limit), set before
// load. A longer frame, or one in several buffers (MTU above a page, with
// this program marked xdp.frags so that it may attach there), would fail
// the redirect and be dropped: it is passed to the kernel socket instead.
volatile const __u32 max_frame_len = 0;

// udp_only, set before load, leaves out TCP: a TCP segment passes to the
// kernel before any lookup, and the verifier, which sees the constant,
// drops the TCP paths unexamined (4-6 ms of every load, against 1).
volatile const __u32 udp_only = 0;

// Sizes, not BTF types: the kernel refuses BTF on an XSKMAP (ENOTSUPP),
// and frees the map it made first with an RCU wait (xsk_map_free), 20 ms
// of every engine's start before cilium/ebpf tried again without.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_QUEUES);
	__uint(key_size, sizeof(__u32));
	__uint(value_size, sizeof(__u32));
} xsks_map SEC(".maps");

#define RULE_MAP(name)                                                          \
	struct {                                                                \
		__uint(type, BPF_MAP_TYPE_HASH);                                \
		__uint(max_entries, MAX_RULES);                                 \
		__type(key, struct flow_key);                                   \
		__type(value, struct rule_value);                               \
	} name SEC(".maps")

// Not preallocated: most stacks hold a few connections, not MAX_CONNS.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_CONNS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct flow_key);
	__type(value, struct rule_value);
} rules_5tuple SEC(".maps");
RULE_MAP(rules_mcast);
RULE_MAP(rules_3tuple);
RULE_MAP(rules_port);

// handover_flows holds the connections the kernel took on a listener's
// rule in handover, or whose SYN came on a queue with no AF_XDP socket
// (their 5-tuple; the value is unused). LRU: a handover lasts seconds,
// its user removes the entries when the rule goes, and a later SYN of the
// same 5-tuple to the stack removes its own.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, __u32);
} handover_flows SEC(".maps");

// stack_syns holds the connections whose SYN went to the stack under a
// listener's rule (their 5-tuple; the value is bpf_ktime_get_ns at the
// SYN). A connection has no 5-tuple rule of its own until the application
// accepts it; if the process dies first, this is where the peer
// notification helper finds its peer. LRU: an entry matters for the
// seconds a connection waits to be accepted.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, __u64);
} stack_syns SEC(".maps");

// active_ports[port] is non-zero while any rule names that local port
// (host byte order). One array lookup lets unsteered traffic skip the four
// hash lookups, which keeps the cost on passed traffic near an empty program.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} active_ports SEC(".maps");

// nr_cpus is the count of possible CPUs, set before load.
volatile const __u32 nr_cpus = 1;

// rule_stats[rule id * nr_cpus + cpu] are a rule's counters on one CPU:
// max_entries is MAX_RULES times nr_cpus, set before load. A plain array,
// not a per-CPU one, whose creation allocates per-CPU memory entry by
// entry (4 ms of every load for 4,096 entries, against 0.2).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RULES);
	__type(key, __u32);
	__type(value, struct rule_counters);
} rule_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct prog_counters);
} prog_stats SEC(".maps");

// arrival_stamps[0] is nonzero once a socket of the engine asks for
// receive timestamps (SO_TIMESTAMP, SO_TIMESTAMPING): from then on each
// frame redirected carries the time it was redirected in XDP metadata
// (struct arrival_meta, just before the frame), as the kernel stamps a
// datagram as it comes off the device; the stack reports it in place of
// the time it took the frame off its ring, later by the wake-up of the
// thread that did.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} arrival_stamps SEC(".maps");

// ARRIVAL_MAGIC marks metadata this program wrote, so that a frame whose
// headroom holds something else (none was written) is told apart.
#define ARRIVAL_MAGIC 0x766d7873

struct arrival_meta {
	__u64 mono_ns; // bpf_ktime_get_ns (CLOCK_MONOTONIC) at redirect
	__u32 magic;   // ARRIVAL_MAGIC
	__u32 pad;
};

// stamp_arrival writes the frame's arrival_meta when arrival_stamps asks.
// The metadata goes with the frame to the AF_XDP socket (copy mode copies
// it too); a driver without metadata room leaves the frame unstamped.
static __always_inline void stamp_arrival(struct xdp_md *ctx)
{
	__u32 zero = 0;
	__u32 *on = bpf_map_lookup_elem(&arrival_stamps, &zero);

	if (!on || !*on)
		return;
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct arrival_meta)))
		return;
	struct arrival_meta *m = (void *)(long)ctx->data_meta;
	if ((void *)(m + 1) > (void *)(long)ctx->data)
		return;
	m->mono_ns = bpf_ktime_get_ns();
	m->magic = ARRIVAL_MAGIC;
	m->pad = 0;
}

struct vlan_hdr {
	__be16 tci;
	__be16 proto;
};

struct l4_ports {
	__be16 source;
	__be16 dest;
};

#define TCP_FLAGS_OFF 13 // the byte of the TCP header with SYN and ACK
#define TCP_SYN 0x02
#define TCP_ACK 0x10

// connection_of is the 5-tuple of a TCP segment's connection, as a
// 5-tuple rule keys it (local first).
static __always_inline struct flow_key connection_of(struct iphdr *ip, struct l4_ports *l4)
{
	struct flow_key fk = {
		.local_addr = ip->daddr,
		.remote_addr = ip->saddr,
		.local_port = l4->dest,
		.remote_port = l4->source,
		.proto = IPPROTO_TCP,
	};
	return fk;
}

// to_kernel_in_handover says whether a TCP segment on a rule in handover
// goes to the kernel: a connection's first SYN, and every later segment
// of a connection that began so.
static __always_inline int to_kernel_in_handover(struct iphdr *ip, struct l4_ports *l4, void *data_end)
{
	__u8 *flags = (__u8 *)l4 + TCP_FLAGS_OFF;
	struct flow_key fk = connection_of(ip, l4);
	__u32 one = 1;

	if ((void *)(flags + 1) > data_end)
		return 1; // a truncated header: the kernel drops and counts it
	if ((*flags & (TCP_SYN | TCP_ACK)) == TCP_SYN) {
		bpf_map_update_elem(&handover_flows, &fk, &one, BPF_ANY);
		return 1;
	}
	return bpf_map_lookup_elem(&handover_flows, &fk) != NULL;
}

// kernel_flow says whether a TCP segment on a listener's rule belongs to
// a connection of the kernel's: one it took in a handover
// (to_kernel_in_handover), or one it had before the rule came (a listener
// the process inherited, systemd's socket activation, with the connection
// that started it in the accept queue; a SYN that reached the kernel's
// listener as the rule was being added). The kernel's socket says so: an
// established one, or a handshake under way (a request socket), found by
// bpf_skc_lookup_tcp, whose answer is the listener when the kernel has
// neither. A TIME-WAIT socket does not count: its 5-tuple may be the
// stack's new connection. A SYN goes to the stack: a 5-tuple the kernel
// once had is forgotten.
static __always_inline int kernel_flow(struct xdp_md *ctx, struct iphdr *ip, struct l4_ports *l4, void *data_end)
{
	__u8 *flags = (__u8 *)l4 + TCP_FLAGS_OFF;
	struct flow_key fk = connection_of(ip, l4);

	if ((void *)(flags + 1) > data_end)
		return 0; // a truncated header: the stack drops and counts it
	if ((*flags & (TCP_SYN | TCP_ACK)) == TCP_SYN) {
		bpf_map_delete_elem(&handover_flows, &fk);
		return 0;
	}
	if (bpf_map_lookup_elem(&handover_flows, &fk))
		return 1;
	struct bpf_sock_tuple t = {
		.ipv4 = {.saddr = ip->saddr, .daddr = ip->daddr, .sport = l4->source, .dport = l4->dest},
	};
	struct bpf_sock *sk = bpf_skc_lookup_tcp(ctx, &t, sizeof(t.ipv4), BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	__u32 state = sk->state;
	bpf_sk_release(sk);
	return state != BPF_TCP_LISTEN && state != BPF_TCP_TIME_WAIT;
}

// note_stack_syn remembers a connection's first SYN, going to the stack
// under a listener's rule, in stack_syns.
static __always_inline void note_stack_syn(struct iphdr *ip, struct l4_ports *l4, void *data_end)
{
	__u8 *flags = (__u8 *)l4 + TCP_FLAGS_OFF;

	if ((void *)(flags + 1) > data_end || (*flags & (TCP_SYN | TCP_ACK)) != TCP_SYN)
		return;
	struct flow_key fk = connection_of(ip, l4);
	__u64 now = bpf_ktime_get_ns();
	bpf_map_update_elem(&stack_syns, &fk, &now, BPF_ANY);
}

enum verdict_kind { V_PASS, V_NON_IP, V_FRAGMENT, V_PARSE_ERROR, V_MARTIAN };

static __always_inline int pass(struct prog_counters *ps, enum verdict_kind kind)
{
	if (ps) {
		ps->passed++;
		switch (kind) {
		case V_NON_IP:
			ps->non_ip++;
			break;
		case V_FRAGMENT:
			ps->fragments++;
			break;
		case V_PARSE_ERROR:
			ps->parse_errors++;
			break;
		case V_MARTIAN:
			ps->martian_sources++;
			break;
		default:
			break;
		}
	}
	return XDP_PASS;
}

// martian_source: a source the kernel drops on input whatever its
// rp_filter says (ip_route_input_slow): a group or the limited broadcast
// address, 0.0.0.0 (to an address other than the limited broadcast one,
// which the kernel takes: a DHCP client's), or loopback's 127.0.0.0/8
// (which route_localnet lets in: the kernel applies that itself).
// Steered, the stack would deliver what the kernel drops.
static __always_inline int martian_source(__be32 saddr)
{
	__u32 s = bpf_ntohl(saddr);

	return (s & 0xf0000000) == 0xe0000000 || s == 0xffffffff || s == 0 || (s >> 24) == 127;
}

static __always_inline struct rule_value *lookup(struct flow_key *k, __be32 saddr, __be16 sport)
{
	struct rule_value *v;

	k->remote_addr = saddr;
	k->remote_port = sport;
	v = bpf_map_lookup_elem(&rules_5tuple, k);
	if (v)
		return v;
	k->remote_addr = 0;
	k->remote_port = 0;
	if ((bpf_ntohl(k->local_addr) & 0xf0000000) == 0xe0000000)
		return bpf_map_lookup_elem(&rules_mcast, k);
	v = bpf_map_lookup_elem(&rules_3tuple, k);
	if (v)
		return v;
	k->local_addr = 0;
	return bpf_map_lookup_elem(&rules_port, k);
}

SEC("xdp.frags")
int vmaxdp_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	__u32 zero = 0;
	struct prog_counters *ps = bpf_map_lookup_elem(&prog_stats, &zero);
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct l4_ports *l4;
	__u16 proto;
	void *cur;

	if ((void *)(eth + 1) > data_end)
		return pass(ps, V_PARSE_ERROR);
	proto = eth->h_proto;
	cur = eth + 1;
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		struct vlan_hdr *vh = cur;

		if ((void *)(vh + 1) > data_end)
			return pass(ps, V_PARSE_ERROR);
		proto = vh->proto;
		cur = vh + 1;
	}
	if (proto != bpf_htons(ETH_P_IP))
		return pass(ps, V_NON_IP);

	ip = cur;
	if ((void *)(ip + 1) > data_end)
		return pass(ps, V_PARSE_ERROR);
	if (ip->ihl < 5 || ip->version != 4)
		return pass(ps, V_PARSE_ERROR);
	if (ip->frag_off & bpf_htons(0x3fff)) // MF set or offset != 0
		return pass(ps, V_FRAGMENT);
	if (ip->protocol != IPPROTO_UDP && (udp_only || ip->protocol != IPPROTO_TCP))
		return pass(ps, V_PASS);

	l4 = (void *)ip + ip->ihl * 4;
	if ((void *)(l4 + 1) > data_end)
		return pass(ps, V_PARSE_ERROR);

	__u32 port = bpf_ntohs(l4->dest);
	__u32 *active = bpf_map_lookup_elem(&active_ports, &port);
	if (!active || !*active)
		return pass(ps, V_PASS);

	struct flow_key k = {
		.local_addr = ip->daddr,
		.local_port = l4->dest,
		.proto = ip->protocol,
	};
	struct rule_value *rv = lookup(&k, ip->saddr, l4->source);
	if (!rv || (rv->flags & RULE_KERNEL))
		return pass(ps, V_PASS);
	if (martian_source(ip->saddr))
		return pass(ps, V_MARTIAN);

	struct rule_counters *rs = NULL;
	__u32 cpu = bpf_get_smp_processor_id();
	if (rv->rule_id < MAX_RULES && cpu < nr_cpus) {
		__u32 slot = rv->rule_id * nr_cpus + cpu;
		rs = bpf_map_lookup_elem(&rule_stats, &slot);
	}
	__u64 len = bpf_xdp_get_buff_len(ctx);
	__u32 q = ctx->rx_queue_index;
	int tcp = !udp_only && ip->protocol == IPPROTO_TCP;
	// An engine with no socket on this queue (its channel count just grew,
	// or the queue cannot be bound) must not black-hole the flow.
	int served = bpf_map_lookup_elem(&xsks_map, &q) != NULL;

	// A listener's rule (lookup left no remote port): a new connection
	// goes to the kernel's listener while the rule is in handover or the
	// queue has no socket, and every later segment of a connection that
	// began so follows it there (handover_flows).
	if (tcp && !k.remote_port) {
		if ((rv->flags & RULE_HANDOVER) || !served) {
			if (to_kernel_in_handover(ip, l4, data_end))
				return pass(ps, V_PASS);
		} else if (kernel_flow(ctx, ip, l4, data_end)) {
			return pass(ps, V_PASS);
		}
	}
	if (rs) {
		rs->matched_packets++;
		rs->matched_bytes += len;
	}
	if (len != (__u64)(data_end - data) || (max_frame_len && len > max_frame_len)) {
		if (rs)
			rs->too_long++;
		// The kernel has no socket for the stack's TCP connection: it
		// would answer with a reset. The sender sends it again.
		return tcp ? XDP_DROP : pass(ps, V_PASS);
	}
	if (!served) {
		if (rs)
			rs->redirect_failures++;
		// UDP: the kernel socket the engine keeps bound to the port
		// receives it. TCP, as above: dropped, and sent again.
		return tcp ? XDP_DROP : pass(ps, V_PASS);
	}
	if (tcp && !k.remote_port)
		note_stack_syn(ip, l4, data_end);
	if (ps)
		ps->redirected++;
	stamp_arrival(ctx);
	return bpf_redirect_map(&xsks_map, q, XDP_PASS);
}

// vmaxdp_pass is the baseline the steering program's cost is measured against.
SEC("xdp.frags")
int vmaxdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char __license[] SEC("license") = "Dual BSD/GPL";
