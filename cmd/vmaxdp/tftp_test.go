package main

import (
	"bytes"
	"crypto/rand"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunTFTP: tftpd-hpa and tftp-hpa, a file server of another kind. In
// listen mode in.tftpd forks a child for each request, and the child
// opens a socket on a new port, connects it to the client and sends the
// file 512 bytes at a time, each block waiting for its ACK; the client
// reads them on the one unconnected socket it sent the request from. The
// server, the client or both under vmaxdp, the other on the kernel: a
// 4 MiB file arrives intact. The server's children go through the kernel
// (a forked child's sockets do) and its log says so; an offloaded
// client's kernel takes at most the blocks that came before its stack
// opened (715 of 8,193 by hand).
func TestRunTFTP(t *testing.T) {
	testutil.RequireRoot(t)
	requirePrograms(t, "tftpd-hpa tftp-hpa", "in.tftpd", "tftp")
	vmaxdp := tools(t)
	root := t.TempDir()
	data := make([]byte, 4<<20)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(root, "f.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	const blocks = 4<<20/512 + 1 // and the empty last one
	testutil.EachBedParallel(t, nil, func(t *testing.T, b *testbed.Bed) {
		for _, tc := range []struct {
			name           string
			server, client bool
		}{
			{"server", true, false},
			{"client", false, true},
			{"both", true, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				laddr := netip.AddrPortFrom(b.Addr(testbed.B), 69)
				srv := []string{"in.tftpd", "-L", "-s", root, "-a", laddr.String()}
				out := filepath.Join(t.TempDir(), "got.bin")
				cli := []string{"tftp", "-m", "binary", laddr.Addr().String(), "-c", "get", "f.bin", out}
				if tc.server {
					srv = append([]string{vmaxdp, "run", "--"}, srv...)
				}
				if tc.client {
					cli = append([]string{vmaxdp, "run", "--"}, cli...)
				}
				in := testutil.SNMPStat(t, b, testbed.A, "Udp", "InDatagrams")
				s := startReceiver(t, b, 30*time.Second, tc.server, laddr, netip.Addr{}, srv...)
				start := time.Now()
				c := startFor(t, b, testbed.A, 20*time.Second, nil, cli...)
				err := c.exited()
				took := time.Since(start)
				got, rerr := os.ReadFile(out)
				if err != nil || rerr != nil || !bytes.Equal(got, data) {
					t.Fatalf("tftp: %v; %d of %d bytes arrived intact or not at all (%v)\n%s\nin.tftpd:\n%s",
						err, len(got), len(data), rerr, tail(c.out.String(), 15), tail(s.out.String(), 15))
				}
				kernelIn := testutil.SNMPStat(t, b, testbed.A, "Udp", "InDatagrams") - in
				t.Logf("4 MiB in %v; side A's kernel received %d UDP datagrams", took.Round(time.Millisecond), kernelIn)
				if tc.server {
					s.wantSaid(t, "fork: a child of this process (forked, not exec'd) uses the sockets it opens through the kernel")
				}
				if tc.client {
					c.wantSaid(t, "offloaded on "+b.Link(testbed.A)+" (udp_receiver")
					if kernelIn > blocks/2 {
						t.Errorf("side A's kernel received %d of the %d blocks: the client's socket was not offloaded", kernelIn, blocks)
					}
				}
				s.stop()
			})
		}
	})
}
