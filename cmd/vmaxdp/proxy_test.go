package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunTCPHaproxy: Debian's haproxy (not written with vmaxdp in mind)
// as a reverse proxy under vmaxdp: its event loop accepts the clients'
// connections and connects to a kernel HTTP server behind it, so both
// kinds of connection are netstack's in one process, and with option
// splice-auto it splices bodies through pipes it makes (splice on
// netstack's connections is the engine's; strace sees the pipes and no
// splice system call). Kernel clients
// on side A fetch a 1 MB body 200 times, 8 at once on keep-alive
// connections, and post 100 bodies: every answer is intact, and side B's
// kernel takes no TCP segment (neither side of the proxy fell back).
func TestRunTCPHaproxy(t *testing.T) {
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("haproxy"); err != nil {
		t.Skip("haproxy is not installed (make deps installs it)")
	}
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		const front, back = 11290, 11291
		body := bytes.Repeat([]byte("vmaxdp haproxy "), 1<<20/15)
		sum := sha256.Sum256(body)

		// The server behind the proxy: the kernel's, on side A.
		var ln net.Listener
		if err := b.Do(testbed.A, func() (err error) {
			ln, err = net.Listen("tcp4", netip.AddrPortFrom(b.Addr(testbed.A), back).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				n, _ := io.Copy(io.Discard, r.Body)
				fmt.Fprintf(w, "got %d\n", n)
				return
			}
			w.Write(body)
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })

		conf := filepath.Join(t.TempDir(), "haproxy.cfg")
		cfg := fmt.Sprintf(`global
    maxconn 1000
defaults
    mode http
    option splice-auto
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend fe
    bind %s:%d
    default_backend be
backend be
    server s1 %s:%d
`, b.Addr(testbed.B), front, b.Addr(testbed.A), back)
		if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
		p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, tools(t), "run", "--", "haproxy", "-db", "-f", conf)
		p.waitOffloaded(t)

		client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
			MaxIdleConnsPerHost: 8,
			DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
				err = b.Do(testbed.A, func() (err error) {
					c, err = (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
					return err
				})
				return c, err
			},
		}}
		t.Cleanup(client.CloseIdleConnections)
		url := fmt.Sprintf("http://%s:%d/", b.Addr(testbed.B), front)
		// The first request waits until haproxy listens (those tried
		// before reach side B's kernel, which refuses them).
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			r, err := client.Get(url)
			if err == nil {
				io.Copy(io.Discard, r.Body)
				r.Body.Close()
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("haproxy never answered: %v\n%s", err, tail(p.out.String(), 20))
			}
		}
		segs := testutil.SNMPStat(t, b, testbed.B, "Tcp", "InSegs")
		var wg sync.WaitGroup
		errs := make(chan error, 300)
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					r, err := client.Get(url)
					if err != nil {
						errs <- fmt.Errorf("GET %d.%d: %w", w, i, err)
						return
					}
					got, err := io.ReadAll(r.Body)
					r.Body.Close()
					if err != nil || r.StatusCode != http.StatusOK || sha256.Sum256(got) != sum {
						errs <- fmt.Errorf("GET %d.%d: status %d, %d of %d bytes, intact %v, %v", w, i, r.StatusCode, len(got), len(body), sha256.Sum256(got) == sum, err)
						return
					}
				}
				for i := range 12 {
					r, err := client.Post(url, "application/octet-stream", bytes.NewReader(body[:100000+i]))
					if err != nil {
						errs <- fmt.Errorf("POST %d.%d: %w", w, i, err)
						return
					}
					got, _ := io.ReadAll(r.Body)
					r.Body.Close()
					if want := fmt.Sprintf("got %d\n", 100000+i); string(got) != want {
						errs <- fmt.Errorf("POST %d.%d: answer %q, want %q", w, i, got, want)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("haproxy:\n%s", tail(p.out.String(), 20))
		}
		if strings.Contains(p.out.String(), "not offloaded") {
			t.Errorf("a socket stayed on the kernel:\n%s", tail(p.out.String(), 20))
		}
		if n := testutil.SNMPStat(t, b, testbed.B, "Tcp", "InSegs") - segs; n != 0 {
			t.Errorf("side B's kernel took %d TCP segments: one side of the proxy was not offloaded", n)
		}
	})
}
