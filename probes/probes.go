package probes

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/vmaxdp/vmaxdp/bpf"
)

// ID numbers a probe: Event.Probe in the trace file and the index of
// probe_stats in bpf/nettrace.c.
type ID uint16

// Probe IDs, in bpf/nettrace.c's enum probe_id order.
const (
	NetifReceiveSkb      = ID(bpf.NettraceProbeIdPROBE_NETIF_RECEIVE_SKB)
	NetifRx              = ID(bpf.NettraceProbeIdPROBE_NETIF_RX)
	NapiPoll             = ID(bpf.NettraceProbeIdPROBE_NAPI_POLL)
	KfreeSkb             = ID(bpf.NettraceProbeIdPROBE_KFREE_SKB)
	ConsumeSkb           = ID(bpf.NettraceProbeIdPROBE_CONSUME_SKB)
	SkbCopyDatagramIovec = ID(bpf.NettraceProbeIdPROBE_SKB_COPY_DATAGRAM_IOVEC)
	NetDevQueue          = ID(bpf.NettraceProbeIdPROBE_NET_DEV_QUEUE)
	NetDevXmit           = ID(bpf.NettraceProbeIdPROBE_NET_DEV_XMIT)
	SoftirqRaise         = ID(bpf.NettraceProbeIdPROBE_SOFTIRQ_RAISE)
	SoftirqEntry         = ID(bpf.NettraceProbeIdPROBE_SOFTIRQ_ENTRY)
	SoftirqExit          = ID(bpf.NettraceProbeIdPROBE_SOFTIRQ_EXIT)
	XdpException         = ID(bpf.NettraceProbeIdPROBE_XDP_EXCEPTION)
	XdpRedirect          = ID(bpf.NettraceProbeIdPROBE_XDP_REDIRECT)
	XdpRedirectErr       = ID(bpf.NettraceProbeIdPROBE_XDP_REDIRECT_ERR)
	SockRcvqueueFull     = ID(bpf.NettraceProbeIdPROBE_SOCK_RCVQUEUE_FULL)
	SockExceedBufLimit   = ID(bpf.NettraceProbeIdPROBE_SOCK_EXCEED_BUF_LIMIT)
	UdpFailQueueRcvSkb   = ID(bpf.NettraceProbeIdPROBE_UDP_FAIL_QUEUE_RCV_SKB)
)

// Probe describes one collector.
type Probe struct {
	ID ID
	// Name is the tracepoint as perf names it, "skb:kfree_skb".
	Name string
	// Program is the function in bpf/nettrace.c.
	Program string
	// Args are the tracepoint's arguments as nettrace.c reads them, by BTF
	// type name ("*sk_buff", "int", "enum skb_drop_reason"); "*" is any
	// pointer. The running kernel must agree.
	Args []string
	// Groups this probe belongs to, besides "all".
	Groups []string
}

// Event returns the tracepoint's name without its system: "kfree_skb".
func (p *Probe) Event() string {
	_, e, _ := strings.Cut(p.Name, ":")
	return e
}

// All lists every probe, in ID order.
var All = []Probe{
	{NetifReceiveSkb, "net:netif_receive_skb", "netif_receive_skb", []string{"*sk_buff"}, []string{"rx"}},
	{NetifRx, "net:netif_rx", "netif_rx", []string{"*sk_buff"}, []string{"rx"}},
	{NapiPoll, "napi:napi_poll", "napi_poll", []string{"*napi_struct", "int", "int"}, []string{"napi", "rx"}},
	{KfreeSkb, "skb:kfree_skb", "kfree_skb", []string{"*sk_buff", "*", "enum skb_drop_reason", "*sock"}, []string{"drops", "rx", "tx"}},
	{ConsumeSkb, "skb:consume_skb", "consume_skb", []string{"*sk_buff", "*"}, []string{"rx", "tx"}},
	{SkbCopyDatagramIovec, "skb:skb_copy_datagram_iovec", "skb_copy_datagram_iovec", []string{"*sk_buff", "int"}, []string{"rx"}},
	{NetDevQueue, "net:net_dev_queue", "net_dev_queue", []string{"*sk_buff"}, []string{"tx"}},
	{NetDevXmit, "net:net_dev_xmit", "net_dev_xmit", []string{"*sk_buff", "int", "*net_device", "unsigned int"}, []string{"tx"}},
	{SoftirqRaise, "irq:softirq_raise", "softirq_raise", []string{"unsigned int"}, []string{"napi"}},
	{SoftirqEntry, "irq:softirq_entry", "softirq_entry", []string{"unsigned int"}, []string{"napi"}},
	{SoftirqExit, "irq:softirq_exit", "softirq_exit", []string{"unsigned int"}, []string{"napi"}},
	{XdpException, "xdp:xdp_exception", "xdp_exception", []string{"*net_device", "*bpf_prog", "unsigned int"}, []string{"drops", "xdp"}},
	{XdpRedirect, "xdp:xdp_redirect", "xdp_redirect_ok", []string{"*net_device", "*bpf_prog", "*", "int", "enum bpf_map_type", "unsigned int", "unsigned int"}, []string{"xdp"}},
	{XdpRedirectErr, "xdp:xdp_redirect_err", "xdp_redirect_err", []string{"*net_device", "*bpf_prog", "*", "int", "enum bpf_map_type", "unsigned int", "unsigned int"}, []string{"drops", "xdp"}},
	{SockRcvqueueFull, "sock:sock_rcvqueue_full", "sock_rcvqueue_full", []string{"*sock", "*sk_buff"}, []string{"drops"}},
	{SockExceedBufLimit, "sock:sock_exceed_buf_limit", "sock_exceed_buf_limit", []string{"*sock", "*proto", "long int", "int"}, []string{"drops"}},
	{UdpFailQueueRcvSkb, "udp:udp_fail_queue_rcv_skb", "udp_fail_queue_rcv_skb", []string{"int", "*sock", "*sk_buff"}, []string{"drops"}},
}

// Groups lists the named groups of -e.
func Groups() []string {
	set := map[string]bool{"all": true}
	for _, p := range All {
		for _, g := range p.Groups {
			set[g] = true
		}
	}
	gs := make([]string, 0, len(set))
	for g := range set {
		gs = append(gs, g)
	}
	sort.Strings(gs)
	return gs
}

// ByID returns the probe with id, or nil.
func ByID(id ID) *Probe {
	if int(id) < len(All) {
		return &All[id]
	}
	return nil
}

// Select resolves a comma-separated list of groups and events ("drops",
// "rx,napi", "skb:kfree_skb", "kfree_skb") to probes, in ID order.
func Select(spec string) ([]*Probe, error) {
	var sel []*Probe
	add := func(p *Probe) {
		if !slices.Contains(sel, p) {
			sel = append(sel, p)
		}
	}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		found := false
		for i := range All {
			p := &All[i]
			if item == "all" || slices.Contains(p.Groups, item) || item == p.Name || item == p.Event() {
				add(p)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown event or group %q (groups: %s; events: see nettrace list)", item, strings.Join(Groups(), ", "))
		}
	}
	if len(sel) == 0 {
		return nil, fmt.Errorf("no events selected")
	}
	slices.SortFunc(sel, func(a, b *Probe) int { return int(a.ID) - int(b.ID) })
	return sel, nil
}
