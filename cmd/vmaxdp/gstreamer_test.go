package main

import (
	"net/netip"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunGStreamer: an RTP audio stream between two GStreamer pipelines
// (gst-launch-1.0, the media framework's own tool), the way media
// servers and telephony send one: 100 packets a second of L16 audio,
// rtpL16pay into udpsink on side A, udpsrc through the jitter buffer
// into rtpL16depay on side B. udpsink sends from a thread of its
// pipeline with sendmmsg, on an IPv4 socket it binds to port 0 beside an
// IPv6 one, both SO_REUSEADDR and SO_REUSEPORT; with auto-multicast it
// joins the group it sends to; udpsrc waits in GLib's poll beside a
// cancellation eventfd. Unicast and multicast, with the receiver, the
// sender or both under vmaxdp and the other side on the kernel: every
// packet arrives (udpsrc stops after the count, so a loss leaves the
// receiver waiting), the side under vmaxdp says its socket is offloaded,
// and its kernel's UDP counters take at most the packet or two sent
// before the sender's stack opened. A sender with IP_MULTICAST_LOOP on
// (udpsink's default) is a member of its own group: its packets go
// through the kernel, for the member's copy, and its log says so and
// what to change.
func TestRunGStreamer(t *testing.T) {
	testutil.RequireRoot(t)
	requirePrograms(t, "gstreamer1.0-tools gstreamer1.0-plugins-good", "gst-launch-1.0", "gst-inspect-1.0")
	for _, e := range []string{"udpsrc", "udpsink", "rtpL16pay", "rtpL16depay", "rtpjitterbuffer", "audiotestsrc"} {
		if err := exec.Command("gst-inspect-1.0", "--exists", e).Run(); err != nil {
			t.Skipf("GStreamer element %s is missing (make deps installs gstreamer1.0-plugins-good): %v", e, err)
		}
	}
	vmaxdp := tools(t)
	const packets, port = 150, uint16(5004)
	group := netip.MustParseAddr("239.1.1.5")
	testutil.EachBedParallel(t, nil, func(t *testing.T, b *testbed.Bed) {
		for _, tc := range []struct {
			name      string
			rxUnder   bool
			txUnder   bool
			multicast bool
			loop      bool // the sender's IP_MULTICAST_LOOP: its packets go through the kernel
		}{
			{name: "unicast/receiver", rxUnder: true},
			{name: "unicast/sender", txUnder: true},
			{name: "unicast/both", rxUnder: true, txUnder: true},
			{name: "multicast/receiver", rxUnder: true, multicast: true},
			{name: "multicast/sender", txUnder: true, multicast: true},
			{name: "multicast/both", rxUnder: true, txUnder: true, multicast: true},
			{name: "multicast/sender-loop", txUnder: true, multicast: true, loop: true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				dst := b.Addr(testbed.B).String()
				var rxGroup netip.Addr // the group the receiver joins, if any
				rx := []string{"gst-launch-1.0", "-q", "udpsrc", "port=" + strconv.Itoa(int(port)), "num-buffers=" + strconv.Itoa(packets)}
				tx := []string{"gst-launch-1.0", "-q", "audiotestsrc", "is-live=true", "num-buffers=" + strconv.Itoa(packets), "samplesperbuffer=80",
					"!", "audio/x-raw,rate=8000,channels=1,format=S16BE", "!", "rtpL16pay", "!", "udpsink", "port=" + strconv.Itoa(int(port))}
				if tc.multicast {
					dst, rxGroup = group.String(), group
					rx = append(rx, "address="+group.String(), "multicast-iface="+b.Link(testbed.B))
					tx = append(tx, "multicast-iface="+b.Link(testbed.A), "loop="+strconv.FormatBool(tc.loop))
				}
				rx = append(rx, "caps=application/x-rtp,media=audio,clock-rate=8000,encoding-name=L16,channels=1,payload=96",
					"!", "rtpjitterbuffer", "!", "rtpL16depay", "!", "fakesink")
				tx = append(tx, "host="+dst)
				if tc.rxUnder {
					rx = append([]string{vmaxdp, "run", "--"}, rx...)
				}
				if tc.txUnder {
					tx = append([]string{vmaxdp, "run", "--"}, tx...)
				}
				rxIn := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
				txOut := testutil.SNMPStat(t, b, testbed.A, "Udp", "OutDatagrams")
				r := startReceiver(t, b, 20*time.Second, tc.rxUnder, netip.AddrPortFrom(netip.IPv4Unspecified(), port), rxGroup, rx...)
				s := startFor(t, b, testbed.A, 20*time.Second, nil, tx...)
				if err := s.exited(); err != nil {
					t.Fatalf("sender: %v\n%s", err, tail(s.out.String(), 20))
				}
				if err := r.exited(); err != nil {
					t.Fatalf("receiver (%d packets sent): %v: it did not get them all\n%s", packets, err, tail(r.out.String(), 20))
				}
				in := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - rxIn
				out := testutil.SNMPStat(t, b, testbed.A, "Udp", "OutDatagrams") - txOut
				t.Logf("%d packets: side B's kernel received %d, side A's sent %d", packets, in, out)
				if tc.rxUnder && in != 0 {
					t.Errorf("side B's kernel received %d UDP datagrams: the receiver's socket was offloaded before the stream began", in)
				}
				if !tc.rxUnder && in < packets {
					t.Errorf("side B's kernel received %d UDP datagrams, want %d", in, packets)
				}
				switch {
				case tc.loop:
					if out < packets {
						t.Errorf("side A's kernel sent %d UDP datagrams, want all %d (the kernel gives the looped copy)", out, packets)
					}
					s.wantSaid(t, "multicast to "+group.String()+" goes through the kernel while a socket of this host is a member of the group")
				case tc.txUnder:
					s.wantSaid(t, "offloaded on "+b.Link(testbed.A))
					if out > 3 {
						t.Errorf("side A's kernel sent %d UDP datagrams of %d: the sender was not offloaded\n%s", out, packets, tail(s.out.String(), 20))
					}
				}
			})
		}
	})
}
