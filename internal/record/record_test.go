package record_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/record"
	"github.com/vmaxdp/vmaxdp/internal/recordtest"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/probes"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/tracefile"
	"github.com/vmaxdp/vmaxdp/tracefmt"
)

func TestMain(m *testing.M) { os.Exit(testutil.Main(m)) }

type drop struct {
	reason, location string
	flow             tracefmt.Flow
}

// events reads a recording's events of one probe.
func events(t *testing.T, data []byte, probe probes.ID) (*tracefile.Reader, []tracefile.Event, []tracefile.Counters) {
	t.Helper()
	var out []tracefile.Event
	var counters []tracefile.Counters
	r := walk(t, data, func(rec *tracefile.Record, ev *tracefile.Event) {
		switch rec.Type {
		case tracefile.TypeEvent:
			e := *ev
			if probes.ID(e.Probe) == probe {
				e.Data = bytes.Clone(e.Data)
				out = append(out, e)
			}
		case tracefile.TypeCounters:
			var c tracefile.Counters
			if err := rec.Decode(&c); err != nil {
				t.Fatal(err)
			}
			counters = append(counters, c)
		}
	})
	return r, out, counters
}

// walk hands every record of a complete recording to fn, with its event
// for an event record (nil for others).
func walk(t *testing.T, data []byte, fn func(*tracefile.Record, *tracefile.Event)) *tracefile.Reader {
	t.Helper()
	r := mustReader(t, data)
	for {
		rec, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		var ev *tracefile.Event
		if rec.Type == tracefile.TypeEvent {
			ev = r.Event()
		}
		fn(&rec, ev)
	}
	if r.End() == nil {
		t.Fatal("no end record")
	}
	return r
}

func describe(r *tracefile.Reader, e *tracefile.Event) drop {
	d := drop{reason: tracefmt.Reason(r.Meta(), e.Reason)}
	if s, _, ok := r.Symbolize(e.Location); ok {
		d.location = s.Name
	}
	d.flow, _ = tracefmt.DecodeFlow(e)
	return d
}

// Datagrams to a port nobody listens on are dropped by UDP as NO_SOCKET;
// the recording names the reason, the function, and the flow.
func TestNoSocketDrops(t *testing.T) {
	b := testutil.Bed(t, nil)
	const n, port = 50, 9
	data := recordtest.While(t, &record.Options{Probes: probes.Options{
		Probes: recordtest.Select(t, "drops"),
		Filter: probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B), L4Proto: unix.IPPROTO_UDP, DstPort: port},
	}}, func() error { return testutil.SendUDP(b, port, n, 32) })

	r, evs, counters := events(t, data, probes.KfreeSkb)
	if len(evs) != n {
		t.Fatalf("%d kfree_skb events, want %d", len(evs), n)
	}
	want := drop{reason: "NO_SOCKET", location: "__udp4_lib_rcv"}
	for _, e := range evs {
		d := describe(r, &e)
		if d.reason != want.reason || d.location != want.location {
			t.Fatalf("drop %+v, want reason %s at %s", d, want.reason, want.location)
		}
		if d.flow.Proto != unix.IPPROTO_UDP || d.flow.Src.Addr() != b.Addr(testbed.A) || d.flow.Dst != netip.AddrPortFrom(b.Addr(testbed.B), port) {
			t.Fatalf("flow %+v, want udp %s -> %s:%d", d.flow, b.Addr(testbed.A), b.Addr(testbed.B), port)
		}
		if r.Interface(e.Netns, e.Ifindex) != "vmxb" {
			t.Fatalf("interface %d in netns %d is %q, want vmxb", e.Ifindex, e.Netns, r.Interface(e.Netns, e.Ifindex))
		}
	}
	// The counters of the same interval agree: Udp.NoPorts grew by n in b.
	if got := snmpDelta(counters, recordtest.NetnsInode(t, b, testbed.B), "Udp.NoPorts"); got != n {
		t.Errorf("Udp.NoPorts grew by %d in the recording, want %d", got, n)
	}
}

func snmpDelta(cs []tracefile.Counters, netns uint32, name string) uint64 {
	var first, last uint64
	seen := false
	for _, c := range cs {
		if c.Source != "snmp" || c.Netns != netns {
			continue
		}
		if !seen {
			first, seen = c.Values[name], true
		}
		last = c.Values[name]
	}
	return last - first
}

// A UDP socket that does not read overflows its receive buffer: UDP drops
// with SOCKET_RCVBUFF, and udp_fail_queue_rcv_skb names the same skb with
// -ENOMEM. (UDP queues through __udp_enqueue_schedule_skb, which does not
// fire sock_rcvqueue_full; that event comes from sock_queue_rcv_skb users:
// TestPingSocketQueueFull.)
func TestReceiveBufferOverrun(t *testing.T) {
	b := testutil.Bed(t, nil)
	const port, n = 7000, 200
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	err := b.Do(testbed.B, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		fds = append(fds, fd)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: b.Addr(testbed.B).As4()})
	})
	if err != nil {
		t.Fatal(err)
	}
	data := recordtest.While(t, &record.Options{Probes: probes.Options{
		Probes: recordtest.Select(t, "drops"),
		Filter: probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B), Port: port},
	}}, func() error { return testutil.SendUDP(b, port, n, 1000) })

	r, drops, counters := events(t, data, probes.KfreeSkb)
	_, failed, _ := events(t, data, probes.UdpFailQueueRcvSkb)
	if len(drops) < n/2 {
		t.Fatalf("%d drops of %d datagrams to a socket that does not read", len(drops), n)
	}
	failedSkbs := map[uint64]bool{}
	for _, e := range failed {
		failedSkbs[e.Skb] = true
		if e.Arg[0] != -int32(unix.ENOMEM) {
			t.Fatalf("udp_fail_queue_rcv_skb rc = %d, want -ENOMEM", e.Arg[0])
		}
	}
	for _, e := range drops {
		d := describe(r, &e)
		if d.reason != "SOCKET_RCVBUFF" || d.flow.Dst != netip.AddrPortFrom(b.Addr(testbed.B), port) {
			t.Fatalf("drop %+v, want SOCKET_RCVBUFF to %s:%d", d, b.Addr(testbed.B), port)
		}
		if !failedSkbs[e.Skb] {
			t.Fatalf("drop of skb %#x has no udp_fail_queue_rcv_skb event", e.Skb)
		}
	}
	if got := snmpDelta(counters, recordtest.NetnsInode(t, b, testbed.B), "Udp.RcvbufErrors"); got != uint64(len(drops)) {
		t.Errorf("Udp.RcvbufErrors grew by %d, %d drops recorded", got, len(drops))
	}
}

// A socket queued through sock_queue_rcv_skb that does not read fires
// sock_rcvqueue_full (UDP never does, see TestReceiveBufferOverrun; raw
// sockets check their buffer before they take a copy, silently): an ICMP
// ping socket sends echo requests and never reads the replies. Each event
// names the socket and its SO_RCVBUF, and the kernel drops the same skb
// with SOCKET_RCVBUFF.
func TestPingSocketQueueFull(t *testing.T) {
	b := testutil.Bed(t, nil)
	const n = 200
	if out, err := exec.Command("ip", "netns", "exec", b.NSName(testbed.B), "sysctl", "-qw", "net.ipv4.ping_group_range=0 0").CombinedOutput(); err != nil {
		t.Skipf("ping sockets for root: %v\n%s", err, out)
	}
	var fd int
	err := b.Do(testbed.B, func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP); err != nil {
			return err
		}
		return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 4096)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	data := recordtest.While(t, &record.Options{Probes: probes.Options{
		Probes: recordtest.Select(t, "drops"),
		Filter: probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B), L4Proto: unix.IPPROTO_ICMP},
	}}, func() error {
		echo := []byte{8, 0, 0, 0, 0, 0, 0, 1, 'n', 't'} // the kernel fills id and checksum
		to := &unix.SockaddrInet4{Addr: b.Addr(testbed.A).As4()}
		for i := 0; i < n; i++ {
			echo[7] = byte(i)
			if err := unix.Sendto(fd, echo, 0, to); err != nil {
				return fmt.Errorf("echo request %d: %w", i, err)
			}
		}
		time.Sleep(100 * time.Millisecond) // the last replies
		return nil
	})

	r, full, _ := events(t, data, probes.SockRcvqueueFull)
	_, drops, _ := events(t, data, probes.KfreeSkb)
	if len(full) < n/2 {
		t.Fatalf("%d sock_rcvqueue_full events for %d echo replies to a ping socket that does not read", len(full), n)
	}
	dropped := map[uint64]string{}
	for _, e := range drops {
		dropped[e.Skb] = describe(r, &e).reason
	}
	for _, e := range full {
		d := describe(r, &e)
		if d.flow.Proto != unix.IPPROTO_ICMP || d.flow.Src.Addr() != b.Addr(testbed.A) || e.Sk == 0 || e.Arg[0] <= 0 || e.Arg[2] <= 0 {
			t.Fatalf("sock_rcvqueue_full %+v (sk %#x rcvbuf %d rmem %d truesize %d), want an echo reply from %s and the socket's figures",
				d.flow, e.Sk, e.Arg[0], e.Arg[1], e.Arg[2], b.Addr(testbed.A))
		}
		if reason := dropped[e.Skb]; reason != "SOCKET_RCVBUFF" {
			t.Fatalf("skb %#x: sock_rcvqueue_full, then drop reason %q, want SOCKET_RCVBUFF", e.Skb, reason)
		}
	}
}

// With a ring buffer too small for the burst, events are lost, and every
// lost event is counted: written + lost = seen, per probe.
func TestLossAccounted(t *testing.T) {
	b := testutil.Bed(t, nil)
	data := recordtest.While(t, &record.Options{Probes: probes.Options{
		Probes:   recordtest.Select(t, "rx,tx"),
		Filter:   probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B)},
		RingSize: uint32(os.Getpagesize()),
	}}, func() error {
		// A burst without pauses, so that the recorder falls behind.
		return b.Do(testbed.A, func() error {
			c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: b.Addr(testbed.B).AsSlice(), Port: 9})
			if err != nil {
				return err
			}
			defer c.Close()
			msg := make([]byte, 64)
			for range 5000 {
				if _, err := c.Write(msg); err != nil && !errors.Is(err, syscall.ECONNREFUSED) {
					return err
				}
			}
			return nil
		})
	})
	written := map[uint16]uint64{}
	r := walk(t, data, func(rec *tracefile.Record, ev *tracefile.Event) {
		if rec.Type == tracefile.TypeEvent {
			written[ev.Probe]++
		}
	})
	var lost uint64
	for _, p := range r.End().Probes {
		if p.Events != written[p.Probe]+p.Lost {
			t.Errorf("probe %d: %d seen, %d written + %d lost", p.Probe, p.Events, written[p.Probe], p.Lost)
		}
		lost += p.Lost
	}
	if lost == 0 {
		t.Errorf("no event lost with a %d-byte ring: the test proves nothing", os.Getpagesize())
	}
	var text strings.Builder
	if _, err := tracefmt.Text(&text, mustReader(t, data), nil); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "# LOST ") || !strings.Contains(text.String(), fmt.Sprintf("%d lost", lost)) {
		t.Errorf("script output does not mark the %d lost events", lost)
	}
	// The Perfetto counter tracks end at the same total.
	var trace bytes.Buffer
	if _, err := tracefmt.Perfetto(&trace, mustReader(t, data), nil); err != nil {
		t.Fatal(err)
	}
	var evs []struct {
		Name string `json:"name"`
		Args struct {
			Value uint64 `json:"value"`
		} `json:"args"`
	}
	if err := json.Unmarshal(trace.Bytes(), &evs); err != nil {
		t.Fatal(err)
	}
	last := map[string]uint64{}
	for _, e := range evs {
		if strings.HasPrefix(e.Name, "lost ") {
			last[e.Name] = e.Args.Value
		}
	}
	var tracks uint64
	for _, v := range last {
		tracks += v
	}
	if tracks != lost {
		t.Errorf("Perfetto loss tracks end at %d in all, the file counts %d lost", tracks, lost)
	}
}

// The aggregate mode counts in the kernel what the event mode records.
func TestAggregate(t *testing.T) {
	b := testutil.Bed(t, nil)
	const n, port = 40, 9
	data := recordtest.While(t, &record.Options{Probes: probes.Options{
		Probes:    recordtest.Select(t, "kfree_skb"),
		Filter:    probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B), DstPort: port},
		Aggregate: true,
	}}, func() error { return testutil.SendUDP(b, port, n, 32) })
	var last tracefile.Aggregate
	r := walk(t, data, func(rec *tracefile.Record, ev *tracefile.Event) {
		switch rec.Type {
		case tracefile.TypeEvent:
			t.Fatal("event record in aggregate mode")
		case tracefile.TypeAggregate:
			if err := rec.Decode(&last); err != nil {
				t.Fatal(err)
			}
		}
	})
	var total uint64
	for _, a := range last.Entries {
		if tracefmt.Reason(r.Meta(), a.Reason) != "NO_SOCKET" {
			t.Errorf("aggregate entry %+v: reason %s", a, tracefmt.Reason(r.Meta(), a.Reason))
		}
		total += a.Count
	}
	if total != n {
		t.Errorf("aggregate counted %d drops, want %d", total, n)
	}
}

// In aggregate mode every event a probe counted is in exactly one
// aggregate entry, however often consecutive events change key: the last
// aggregates, per probe, add up to the events the End record counts, less
// those lost. No filter, so that every namespace's traffic mixes keys.
func TestAggregateMatchesProbeCounts(t *testing.T) {
	b := testutil.Bed(t, nil)
	data := recordtest.While(t, &record.Options{Probes: probes.Options{
		Probes:    recordtest.Select(t, "netif_receive_skb,napi_poll,kfree_skb,consume_skb"),
		Aggregate: true,
	}}, func() error { return testutil.SendUDP(b, 9, 500, 32) })
	var last tracefile.Aggregate
	r := walk(t, data, func(rec *tracefile.Record, ev *tracefile.Event) {
		if rec.Type == tracefile.TypeAggregate {
			if err := rec.Decode(&last); err != nil {
				t.Fatal(err)
			}
		}
	})
	counted, keys := map[uint16]uint64{}, map[uint16]int{}
	for _, a := range last.Entries {
		counted[a.Probe] += a.Count
		keys[a.Probe]++
	}
	if r.End() == nil {
		t.Fatal("no end record")
	}
	for _, p := range r.End().Probes {
		name := probes.ByID(probes.ID(p.Probe)).Name
		if p.Events == 0 {
			t.Errorf("%s counted no events", name)
		}
		if got, want := counted[p.Probe], p.Events-p.Lost; got != want {
			t.Errorf("%s: aggregates sum to %d over %d keys, the probe counted %d events and %d lost", name, got, keys[p.Probe], p.Events, p.Lost)
		}
		t.Logf("%s: %d events in %d keys, %d lost", name, counted[p.Probe], keys[p.Probe], p.Lost)
	}
}

// Drops whose key changes at every event (alternately on the veth and on
// loopback in the same namespace, so on the same CPU) are each counted
// under their own key: the kernel's one-key cache must not count an event
// under the key before it.
func TestAggregateAlternatingKeys(t *testing.T) {
	b := testutil.Bed(t, nil)
	const n, port = 100, 9
	// Unconnected sockets: a connected one would take the ICMP error of
	// one datagram as the result of the next write, which is not sent.
	listen := func(s testbed.Side) *net.UDPConn {
		var c *net.UDPConn
		err := b.Do(s, func() (err error) {
			c, err = net.ListenUDP("udp4", nil)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	veth, lo := listen(testbed.A), listen(testbed.B)
	to := map[*net.UDPConn]*net.UDPAddr{
		veth: net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(testbed.B), port)),
		lo:   net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)),
	}
	data := recordtest.While(t, &record.Options{Probes: probes.Options{
		Probes:    recordtest.Select(t, "kfree_skb"),
		Filter:    probes.Filter{Netns: recordtest.NetnsInode(t, b, testbed.B), DstPort: port},
		Aggregate: true,
	}}, func() error {
		msg := make([]byte, 32)
		for range n {
			for _, c := range []*net.UDPConn{veth, lo} {
				if _, err := c.WriteToUDP(msg, to[c]); err != nil {
					return err
				}
			}
			time.Sleep(200 * time.Microsecond)
		}
		return nil
	})
	var last tracefile.Aggregate
	r := walk(t, data, func(rec *tracefile.Record, ev *tracefile.Event) {
		if rec.Type == tracefile.TypeAggregate {
			if err := rec.Decode(&last); err != nil {
				t.Fatal(err)
			}
		}
	})
	byIf := map[uint32]uint64{}
	for _, a := range last.Entries {
		if tracefmt.Reason(r.Meta(), a.Reason) != "NO_SOCKET" {
			t.Errorf("aggregate entry %+v: reason %s", a, tracefmt.Reason(r.Meta(), a.Reason))
		}
		byIf[a.Ifindex] += a.Count
	}
	var vethIndex int
	if err := b.Do(testbed.B, func() error {
		i, err := net.InterfaceByName(b.Link(testbed.B))
		if err == nil {
			vethIndex = i.Index
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if byIf[uint32(vethIndex)] != n || byIf[1] != n || len(byIf) != 2 {
		t.Errorf("drops by ifindex %v, want %d on %s (%d) and %d on lo (1)", byIf, n, b.Link(testbed.B), vethIndex, n)
	}
}

func mustReader(t *testing.T, data []byte) *tracefile.Reader {
	r, err := tracefile.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return r
}
