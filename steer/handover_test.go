package steer_test

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/testbed"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// tcpFrame is an Ethernet frame with a TCP segment from 198.18.0.1:sport
// to 198.18.0.2:dport.
func tcpFrame(t *testing.T, sport, dport uint16, syn, ack bool) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: net.IP{198, 18, 0, 1}, DstIP: net.IP{198, 18, 0, 2}}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(sport), DstPort: layers.TCPPort(dport), SYN: syn, ACK: ack, Window: 1024}
	tcp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, tcp); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// onProgram runs fn in side B of a tuned bed with the steering program
// attached to its link, and fails t on fn's error.
func onProgram(t *testing.T, fn func(p *steer.Program, ifname string) error) {
	t.Helper()
	bed := testutil.Bed(t, nil)
	err := bed.Do(testbed.B, func() error {
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			return err
		}
		defer p.Close()
		return fn(p, bed.Link(testbed.B))
	})
	if err != nil {
		t.Fatal(err)
	}
}

// XDP verdicts.
const (
	xdpDrop     = 1
	xdpPass     = 2
	xdpRedirect = 4
)

// serveQueue registers an AF_XDP socket for the interface's queue q, as a
// stack serving it does: a segment for the stack is then redirected.
func serveQueue(t *testing.T, p *steer.Program, ifname string, q int) {
	t.Helper()
	s, err := xsk.Open(ifname, q, &xsk.Options{NumFrames: 64, NoHugePages: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := p.RegisterQueue(q, s.FD()); err != nil {
		t.Fatal(err)
	}
}

// verdict runs the program on a crafted segment from 198.18.0.1:sport
// to port and returns its XDP verdict.
func verdict(t *testing.T, p *steer.Program, sport, port uint16, syn, ack bool) uint32 {
	t.Helper()
	ret, err := p.Run(tcpFrame(t, sport, port, syn, ack))
	if err != nil {
		t.Fatalf("BPF_PROG_TEST_RUN: %v", err)
	}
	return ret
}

// listenerAndConn adds the rules of a TCP listener on port and of its
// connection from 198.18.0.1:sport (tcpFrame's addresses).
func listenerAndConn(p *steer.Program, port, sport uint16) (listener, conn steer.RuleID, err error) {
	if listener, err = p.AddRule(steer.Rule{Kind: steer.RulePort, Proto: unix.IPPROTO_TCP, Local: netip.AddrPortFrom(netip.Addr{}, port)}); err != nil {
		return 0, 0, err
	}
	conn, err = p.AddRule(steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_TCP,
		Local: netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), port), Remote: netip.AddrPortFrom(netip.MustParseAddr("198.18.0.1"), sport)})
	return listener, conn, err
}

// TestHandover runs the steering program on crafted segments: on a rule
// in handover, a new connection goes to the kernel from its SYN on, the
// connections the stack had still come to it, and once the rule is gone
// nothing of the handover is left to send a later offload's segments to
// the kernel.
func TestHandover(t *testing.T) {
	onProgram(t, func(p *steer.Program, ifname string) error {
		serveQueue(t, p, ifname, 0)
		const port = 8080
		rule := steer.Rule{Kind: steer.RulePort, Proto: unix.IPPROTO_TCP, Local: netip.AddrPortFrom(netip.Addr{}, port)}
		id, err := p.AddRule(rule)
		if err != nil {
			return err
		}
		// toStack says whether the program gave the segment to the rule's
		// socket (redirected, and counted by the rule) rather than to the
		// kernel.
		toStack := func(sport uint16, syn, ack bool) bool {
			t.Helper()
			before, err := p.RuleCounters(id)
			if err != nil {
				t.Fatal(err)
			}
			ret := verdict(t, p, sport, port, syn, ack)
			if ret != xdpPass && ret != xdpRedirect {
				t.Fatalf("verdict %d, want XDP_PASS or XDP_REDIRECT", ret)
			}
			after, err := p.RuleCounters(id)
			if err != nil {
				t.Fatal(err)
			}
			if counted := after.MatchedPackets > before.MatchedPackets; counted != (ret == xdpRedirect) {
				t.Fatalf("verdict %d, counted by the rule %v", ret, counted)
			}
			return ret == xdpRedirect
		}
		const held, fresh = 40000, 40001
		if !toStack(held, false, true) {
			t.Error("before the handover, a segment on the rule did not go to the stack")
		}
		if err := p.Handover(id); err != nil {
			return err
		}
		if toStack(fresh, true, false) {
			t.Error("in handover, a new connection's SYN went to the stack")
		}
		if toStack(fresh, false, true) {
			t.Error("in handover, the rest of a connection the kernel took went to the stack")
		}
		if !toStack(held, false, true) {
			t.Error("in handover, a connection the stack holds lost its segments to the kernel")
		}
		if !toStack(held, true, true) {
			t.Error("in handover, a SYN-ACK for the stack went to the kernel")
		}
		if err := p.RemoveRule(id); err != nil {
			return err
		}
		if n, err := p.HandoverFlows(); err != nil || n != 0 {
			t.Errorf("%d connections left in handover_flows after the rule went (%v)", n, err)
		}
		if id, err = p.AddRule(rule); err != nil {
			return err
		}
		if !toStack(fresh, false, true) {
			t.Error("offloaded again, a 5-tuple the kernel took in the handover before still went to the kernel")
		}
		if err := p.RemoveRule(id); err != nil {
			return err
		}
		if err := p.Handover(id); err == nil {
			t.Error("Handover of a rule not installed succeeded")
		}
		udp, err := p.AddRule(steer.Rule{Kind: steer.RulePort, Proto: unix.IPPROTO_UDP, Local: rule.Local})
		if err != nil {
			return err
		}
		if err := p.Handover(udp); err == nil {
			t.Error("Handover of a UDP rule succeeded")
		}
		return p.RemoveRule(udp)
	})
}

// TestToKernel: a TCP 5-tuple rule given to the kernel (a connection a
// kernel socket took over) passes its segments to the kernel ahead of the
// port's rule, while the port's other connections still go to the stack;
// FromKernel takes it back.
func TestToKernel(t *testing.T) {
	onProgram(t, func(p *steer.Program, ifname string) error {
		serveQueue(t, p, ifname, 0)
		const port, moved, other = 8081, 40010, 40011
		listener, conn, err := listenerAndConn(p, port, moved)
		if err != nil {
			return err
		}
		// matched says which of the two rules took the segment.
		matched := func(sport uint16) (byConn, byListener bool) {
			t.Helper()
			c0, _ := p.RuleCounters(conn)
			l0, _ := p.RuleCounters(listener)
			if ret := verdict(t, p, sport, port, false, true); ret != xdpPass && ret != xdpRedirect {
				t.Fatalf("verdict %d, want XDP_PASS or XDP_REDIRECT", ret)
			}
			c1, _ := p.RuleCounters(conn)
			l1, _ := p.RuleCounters(listener)
			return c1.MatchedPackets > c0.MatchedPackets, l1.MatchedPackets > l0.MatchedPackets
		}
		if c, l := matched(moved); !c || l {
			t.Errorf("before: the connection's segment matched its rule %v, the listener's %v; want its own", c, l)
		}
		if err := p.ToKernel(conn); err != nil {
			return err
		}
		if c, l := matched(moved); c || l {
			t.Errorf("to the kernel: the connection's segment matched its rule %v, the listener's %v; want neither (passed)", c, l)
		}
		if c, l := matched(other); c || !l {
			t.Errorf("to the kernel: another connection's segment matched the moved rule %v, the listener's %v; want the listener's", c, l)
		}
		if err := p.FromKernel(conn); err != nil {
			return err
		}
		if c, l := matched(moved); !c || l {
			t.Errorf("back from the kernel: the connection's segment matched its rule %v, the listener's %v; want its own", c, l)
		}
		if err := p.ToKernel(listener); err == nil {
			t.Error("ToKernel of a port rule succeeded")
		}
		return nil
	})
}

// TestUnservedQueue: on a queue with no AF_XDP socket (the channel count
// just grew, or the queue cannot be bound), a segment of the stack's TCP
// connection is dropped and counted, not passed to the kernel, which has
// no socket for it and would reset the connection; a new connection's SYN
// goes to the kernel's listener, and the rest of that connection follows
// it there once the queue is served; a later SYN of the same 5-tuple
// goes to the stack again.
func TestUnservedQueue(t *testing.T) {
	onProgram(t, func(p *steer.Program, ifname string) error {
		const port, held, fresh = 8082, 40020, 40021
		listener, conn, err := listenerAndConn(p, port, held)
		if err != nil {
			return err
		}
		run := func(sport uint16, syn, ack bool) uint32 { t.Helper(); return verdict(t, p, sport, port, syn, ack) }
		if v := run(held, false, true); v != xdpDrop {
			t.Errorf("unserved queue: a segment of the stack's connection got verdict %d, want XDP_DROP", v)
		}
		if c, _ := p.RuleCounters(conn); c.RedirectFailures != 1 {
			t.Errorf("the dropped segment was counted %d times as a redirect failure, want 1", c.RedirectFailures)
		}
		if v := run(fresh, true, false); v != xdpPass {
			t.Errorf("unserved queue: a new connection's SYN got verdict %d, want XDP_PASS (the kernel's listener)", v)
		}
		serveQueue(t, p, ifname, 0)
		if v := run(fresh, false, true); v != xdpPass {
			t.Errorf("served again: the rest of a connection the kernel took got verdict %d, want XDP_PASS", v)
		}
		if v := run(held, false, true); v != xdpRedirect {
			t.Errorf("served again: a segment of the stack's connection got verdict %d, want XDP_REDIRECT", v)
		}
		if v := run(fresh, true, false); v != xdpRedirect {
			t.Errorf("served: a new SYN of a 5-tuple the kernel once had got verdict %d, want XDP_REDIRECT", v)
		}
		if v := run(fresh, false, true); v != xdpRedirect {
			t.Errorf("served: the rest of that connection got verdict %d, want XDP_REDIRECT (the stack's now)", v)
		}
		if l, _ := p.RuleCounters(listener); l.RedirectFailures != 0 {
			t.Errorf("the listener's rule counted %d redirect failures for segments passed to the kernel's listener", l.RedirectFailures)
		}
		return nil
	})
}

// TestReleaseTCPConns: once the process whose stack served a program's
// queues is gone (no AF_XDP socket on them), a segment of one of its TCP
// connections is dropped; ReleaseTCPConns, as the peer-notification
// helper calls it, marks that connection's rule for the kernel, which
// then gets the segment (and resets the connection), and leaves the
// other rules as they were: a connection already the kernel's, a UDP
// 5-tuple, the listener's port.
func TestReleaseTCPConns(t *testing.T) {
	onProgram(t, func(p *steer.Program, ifname string) error {
		const port, live, moved = 8082, 40020, 40021
		_, conn, err := listenerAndConn(p, port, live)
		if err != nil {
			return err
		}
		kernel, err := p.AddRule(steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_TCP,
			Local: netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), port), Remote: netip.AddrPortFrom(netip.MustParseAddr("198.18.0.1"), moved)})
		if err != nil {
			return err
		}
		if err := p.ToKernel(kernel); err != nil {
			return err
		}
		if _, err := p.AddRule(steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_UDP,
			Local: netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), port), Remote: netip.AddrPortFrom(netip.MustParseAddr("198.18.0.1"), live)}); err != nil {
			return err
		}
		if ret := verdict(t, p, live, port, false, true); ret != xdpDrop {
			t.Errorf("before: verdict %d for the connection's segment, want XDP_DROP (no socket on the queue)", ret)
		}
		got, err := steer.ReleaseTCPConns(p.ConnMap())
		if err != nil {
			return err
		}
		want := p.Rules()[conn]
		if len(got) != 1 || got[0] != want {
			t.Errorf("released %v, want [%v]", got, want)
		}
		c0, _ := p.RuleCounters(conn)
		if ret := verdict(t, p, live, port, false, true); ret != xdpPass {
			t.Errorf("after: verdict %d for the connection's segment, want XDP_PASS", ret)
		}
		if c1, _ := p.RuleCounters(conn); c1.MatchedPackets != c0.MatchedPackets {
			t.Errorf("after: the released rule still counts the segment as steered")
		}
		if again, err := steer.ReleaseTCPConns(p.ConnMap()); err != nil || len(again) != 0 {
			t.Errorf("a second release: %v, %v; want none", again, err)
		}
		return nil
	})
}

// TestConnRules: a stack serves more TCP connections than it has rule
// ids with counters. 5-tuple rules past MaxRules-countedReserve get ids
// without counters (which read zero) and still steer their segments;
// rules of the other kinds still find the ids kept for them; every id
// comes back on removal.
func TestConnRules(t *testing.T) {
	onProgram(t, func(p *steer.Program, ifname string) error {
		serveQueue(t, p, ifname, 0)
		const port, conns, probe = 8083, steer.MaxRules + 1000, 50000
		local := netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), port)
		conn := func(remote netip.AddrPort) steer.Rule {
			return steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_TCP, Local: local, Remote: remote}
		}
		var ids []steer.RuleID
		for i := range conns {
			id, err := p.AddRule(conn(netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(100 + i>>8), byte(i)}), 40000)))
			if err != nil {
				return fmt.Errorf("connection %d: %w", i, err)
			}
			ids = append(ids, id)
		}
		last, err := p.AddRule(conn(netip.AddrPortFrom(netip.MustParseAddr("198.18.0.1"), probe)))
		if err != nil {
			return err
		}
		ids = append(ids, last)
		if last < steer.MaxRules {
			t.Errorf("the last connection's rule has id %d: all %d have counters, none are kept for the other kinds", last, conns+1)
		}
		if c, err := p.RuleCounters(last); err != nil || c != (steer.RuleCounters{}) {
			t.Errorf("counters of a rule without any: %+v, %v; want zero, nil", c, err)
		}
		if v := verdict(t, p, probe, port, false, true); v != xdpRedirect {
			t.Errorf("a segment of a connection whose rule has no counters: verdict %d, want XDP_REDIRECT", v)
		}
		udp, err := p.AddRule(steer.Rule{Kind: steer.Rule3Tuple, Proto: unix.IPPROTO_UDP, Local: local})
		if err != nil {
			return fmt.Errorf("a 3-tuple rule after %d connections: %w", conns+1, err)
		}
		for _, id := range append(ids, udp) {
			if err := p.RemoveRule(id); err != nil {
				return err
			}
		}
		if n := p.RuleCount(); n != 0 {
			t.Errorf("%d rules left after removing all", n)
		}
		return nil
	})
}

// TestRuleSnapshots checks the batch read of every rule's counters
// against the lookups of one rule at a time, with rules that matched and
// rules that did not, counted and uncounted.
func TestRuleSnapshots(t *testing.T) {
	onProgram(t, func(p *steer.Program, ifname string) error {
		serveQueue(t, p, ifname, 0)
		const port, sport, uncounted = 8084, 50001, 50002
		listener, conn, err := listenerAndConn(p, port, sport)
		if err != nil {
			return err
		}
		for range 3 {
			if v := verdict(t, p, sport, port, false, true); v != xdpRedirect {
				t.Fatalf("a segment of the connection: verdict %d, want XDP_REDIRECT", v)
			}
		}
		verdict(t, p, uncounted, port, true, false) // the listener's
		snaps, err := p.RuleSnapshots()
		if err != nil {
			return err
		}
		if len(snaps) != 2 || snaps[0].ID != min(listener, conn) || snaps[1].ID != max(listener, conn) {
			t.Fatalf("snapshots %+v: want rules %d and %d, by id", snaps, listener, conn)
		}
		for _, s := range snaps {
			one, err := p.RuleCounters(s.ID)
			if err != nil {
				return err
			}
			if s.Counters != one {
				t.Errorf("rule %d (%s): batch %+v, one by one %+v", s.ID, s.Rule, s.Counters, one)
			}
			want := uint64(1)
			if s.ID == conn {
				want = 3
			}
			if s.Counters.MatchedPackets != want {
				t.Errorf("rule %d (%s): %d packets matched, want %d", s.ID, s.Rule, s.Counters.MatchedPackets, want)
			}
		}
		for _, id := range []steer.RuleID{listener, conn} {
			if err := p.RemoveRule(id); err != nil {
				return err
			}
		}
		if snaps, err := p.RuleSnapshots(); err != nil || len(snaps) != 0 {
			t.Errorf("snapshots with no rule installed: %+v, %v", snaps, err)
		}
		return nil
	})
}

// TestKernelConnectionUnderListenerRule gives a listener's rule to a port
// on which the kernel already has a connection (a listener the process
// inherited, with the connection that started it waiting to be
// accepted): the connection's segments stay the kernel's, and it carries
// data both ways after the rule came, while a SYN of the same 5-tuple and
// a segment of a connection the kernel does not have go to the stack.
func TestKernelConnectionUnderListenerRule(t *testing.T) {
	bed := testutil.Bed(t, nil)
	const port = 8085
	var (
		ln     net.Listener
		client net.Conn
	)
	if err := bed.Do(testbed.B, func() (err error) {
		ln, err = net.Listen("tcp4", fmt.Sprintf("%s:%d", bed.Addr(testbed.B), port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := bed.Do(testbed.A, func() (err error) {
		client, err = net.DialTimeout("tcp4", fmt.Sprintf("%s:%d", bed.Addr(testbed.B), port), 2*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	sport := uint16(client.LocalAddr().(*net.TCPAddr).Port)
	err := bed.Do(testbed.B, func() error {
		p, err := steer.Attach(bed.Link(testbed.B), nil)
		if err != nil {
			return err
		}
		defer p.Close()
		serveQueue(t, p, bed.Link(testbed.B), 0)
		if _, err := p.AddRule(steer.Rule{Kind: steer.RulePort, Proto: unix.IPPROTO_TCP, Local: netip.AddrPortFrom(netip.Addr{}, port)}); err != nil {
			return err
		}
		for _, c := range []struct {
			what     string
			sport    uint16
			syn, ack bool
			want     uint32
		}{
			{"a segment of the kernel's connection", sport, false, true, xdpPass},
			{"a segment of a connection the kernel does not have", sport + 1, false, true, xdpRedirect},
			{"a SYN of the kernel connection's 5-tuple", sport, true, false, xdpRedirect},
		} {
			if v := verdict(t, p, c.sport, port, c.syn, c.ack); v != c.want {
				t.Errorf("%s: verdict %d, want %d", c.what, v, c.want)
			}
		}
		// The connection, accepted only now, carries data both ways.
		server, err := ln.Accept()
		if err != nil {
			return err
		}
		defer server.Close()
		deadline := time.Now().Add(3 * time.Second)
		server.SetDeadline(deadline)
		client.SetDeadline(deadline)
		for _, dir := range []struct {
			from, to net.Conn
			what     string
		}{{client, server, "client to server"}, {server, client, "server to client"}} {
			if _, err := dir.from.Write([]byte("after the rule")); err != nil {
				return fmt.Errorf("%s: %w", dir.what, err)
			}
			buf := make([]byte, 64)
			n, err := dir.to.Read(buf)
			if err != nil || string(buf[:n]) != "after the rule" {
				return fmt.Errorf("%s: read %q, %v", dir.what, buf[:n], err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestReleaseUnaccepted: connections whose SYN went to the stack under a
// listener's rule and that have no rule of their own (netstack held them
// for the application to accept) get a rule for the kernel once the
// process is gone, so that their peers' segments reach the kernel, which
// resets them; one accepted meanwhile (its rule then tells of it, to
// ReleaseTCPConns) and closed is not told of.
func TestReleaseUnaccepted(t *testing.T) {
	onProgram(t, func(p *steer.Program, ifname string) error {
		serveQueue(t, p, ifname, 0)
		const port, queued, accepted = 8086, 40030, 40031
		if _, err := p.AddRule(steer.Rule{Kind: steer.RulePort, Proto: unix.IPPROTO_TCP, Local: netip.AddrPortFrom(netip.Addr{}, port)}); err != nil {
			return err
		}
		for _, sport := range []uint16{queued, accepted} {
			if v := verdict(t, p, sport, port, true, false); v != xdpRedirect {
				t.Fatalf("SYN from port %d: verdict %d, want XDP_REDIRECT", sport, v)
			}
		}
		local := netip.AddrPortFrom(netip.MustParseAddr("198.18.0.2"), port)
		conn := func(sport uint16) steer.Rule {
			return steer.Rule{Kind: steer.Rule5Tuple, Proto: unix.IPPROTO_TCP, Local: local, Remote: netip.AddrPortFrom(netip.MustParseAddr("198.18.0.1"), sport)}
		}
		// Accepted, then closed: its rule came and went.
		id, err := p.AddRule(conn(accepted))
		if err != nil {
			return err
		}
		if err := p.RemoveRule(id); err != nil {
			return err
		}
		if v := verdict(t, p, queued, port, false, true); v != xdpRedirect {
			t.Errorf("before: verdict %d for the queued connection's segment, want XDP_REDIRECT", v)
		}
		got, err := steer.ReleaseUnaccepted(p.SYNMap(), p.ConnMap())
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0] != conn(queued) {
			t.Errorf("released %v, want [%v]", got, conn(queued))
		}
		if v := verdict(t, p, queued, port, false, true); v != xdpPass {
			t.Errorf("after: verdict %d for the queued connection's segment, want XDP_PASS", v)
		}
		if again, err := steer.ReleaseUnaccepted(p.SYNMap(), p.ConnMap()); err != nil || len(again) != 0 {
			t.Errorf("a second release: %v, %v; want none", again, err)
		}
		return nil
	})
}
