package main

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// backlogReader asks for a 4 MB receive buffer (8 MB reported), binds,
// waits until the file argv[3] exists, then reads what its socket holds
// without blocking and prints how many datagrams it got.
const backlogReader = `
import os, socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind((sys.argv[1], int(sys.argv[2])))
while not os.path.exists(sys.argv[3]):
    time.sleep(0.01)
n = 0
while True:
    try:
        s.recv(2048, socket.MSG_DONTWAIT)
    except BlockingIOError:
        break
    n += 1
print("got", n, flush=True)
`

// backlogSender sends argv[3] datagrams of 200 bytes, 100 a millisecond.
const backlogSender = `
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(int(sys.argv[3])):
    s.sendto(b"x" * 200, (sys.argv[1], int(sys.argv[2])))
    if i % 100 == 99:
        time.sleep(0.001)
`

// TestRunBacklog: a reader that falls behind a burst holds, under
// vmaxdp, at least what a kernel socket of its SO_RCVBUF holds. Before,
// a socket held at most the queue's 2,048 receive frames, where the
// kernel's 8 MB buffer holds 6,553 datagrams of 200 bytes, and the queue
// dropped the rest for every socket on it (rx_fill_ring_empty_descs).
// The reader sleeps through the burst, so only the progress engine
// drains the rings; an offloaded reader's kernel takes no datagram.
func TestRunBacklog(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	vmaxdp := tools(t)
	const n, port = 10000, 7717
	testutil.EachBedParallel(t, nil, func(t *testing.T, b *testbed.Bed) {
		srv := b.Addr(testbed.B).String()
		laddr := netip.AddrPortFrom(b.Addr(testbed.B), port)
		got := map[bool]int{}
		for _, under := range []bool{false, true} {
			dir := t.TempDir()
			gofile := filepath.Join(dir, "go")
			argv := []string{"python3", "-c", backlogReader, srv, strconv.Itoa(port), gofile}
			if under {
				argv = append([]string{vmaxdp, "run", "--"}, argv...)
			}
			in := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
			r := startReceiver(t, b, 30*time.Second, under, laddr, netip.Addr{}, argv...)
			s := startFor(t, b, testbed.A, 20*time.Second, nil, "python3", "-c", backlogSender, srv, strconv.Itoa(port), strconv.Itoa(n))
			if err := s.exited(); err != nil {
				t.Fatalf("sender: %v\n%s", err, tail(s.out.String(), 20))
			}
			time.Sleep(100 * time.Millisecond) // the last frames reach the queue
			if err := os.WriteFile(gofile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := r.exited(); err != nil {
				t.Fatalf("reader (under vmaxdp: %v): %v\n%s", under, err, tail(r.out.String(), 20))
			}
			m := regexp.MustCompile(`got (\d+)`).FindStringSubmatch(r.out.String())
			if m == nil {
				t.Fatalf("reader (under vmaxdp: %v) said no count\n%s", under, tail(r.out.String(), 20))
			}
			got[under], _ = strconv.Atoi(m[1])
			if k := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - in; under && k != 0 {
				t.Errorf("side B's kernel received %d datagrams: the reader's socket was not offloaded", k)
			}
		}
		t.Logf("of %d datagrams the reader held %d on the kernel, %d under vmaxdp", n, got[false], got[true])
		if got[true] < got[false] {
			t.Errorf("under vmaxdp the reader held %d of %d datagrams, the kernel's socket %d", got[true], n, got[false])
		}
	})
}
