package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/internal/params"
	"github.com/vmaxdp/vmaxdp/internal/testutil"
	"github.com/vmaxdp/vmaxdp/stats"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// TestRunSetuid: a daemon that gives up root, or chroots, before it opens
// a socket (testdata/dropuser: setuid, setresuid, setreuid to nobody;
// chroot to an empty directory) has its UDP
// socket, its listener's connection and the connection it makes to a
// kernel server offloaded: the engine opened the stack before the drop
// (the log says so) and side B's kernel takes no TCP segment or UDP
// datagram. At exit the program, no longer root, still takes its
// steering program off the interface and removes its counters file.
// Without the engine's step before the drop: "mount bpffs: operation not
// permitted" (after chroot: "statfs /sys/fs/bpf: no such file"), and
// every socket stays on the kernel. A drop that keeps root in the saved
// ID (seteuid; setresuid(-1, UID, 0), FreeRADIUS's) is met the same way:
// the stacks open on the engine's threads, with the effective ID of the
// moment, and FreeRADIUS's sockets all stayed on the kernel.
func TestRunSetuid(t *testing.T) {
	testutil.RequireRoot(t)
	prog := buildC(t, "dropuser")
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		for i, call := range []string{"setuid", "setresuid", "setreuid", "chroot", "seteuid", "suid-down"} {
			t.Run(call, func(t *testing.T) { testSetuid(t, b, prog, call, 11230+10*i) })
		}
	})
}

func testSetuid(t *testing.T, b *testbed.Bed, prog, call string, port int) {
	const nobody = 65534
	addrA, addrB := b.Addr(testbed.A), b.Addr(testbed.B)
	var echo net.Listener
	if err := b.Do(testbed.A, func() (err error) {
		echo, err = net.Listen("tcp4", netip.AddrPortFrom(addrA, uint16(port+2)).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		c, err := echo.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.CopyN(c, c, 4)
	}()
	tcpSegs := testutil.SNMPStat(t, b, testbed.B, "Tcp", "InSegs")
	udpIn := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")

	arg, said := strconv.Itoa(nobody), call+"("+strconv.Itoa(nobody)+") gives up root"
	switch call {
	case "chroot":
		arg = t.TempDir()
		said = "chroot(" + arg + ") hides bpffs, /proc and /sys"
	case "seteuid":
		said = "seteuid(" + arg + ") drops root for now"
	case "suid-down":
		said = "setresuid(" + arg + ") drops root for now"
	}
	p := startC(t, b, prog, []string{"VMAXDP_TCP=1"}, call, arg, addrB.String(), addrA.String(), strconv.Itoa(port))
	if err := p.waitFor("ready"); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	p.waitOffloaded(t)
	err := b.Do(testbed.A, func() error {
		u, err := net.Dial("udp4", netip.AddrPortFrom(addrB, uint16(port)).String())
		if err != nil {
			return err
		}
		defer u.Close()
		if err := exchange(u, "datagram"); err != nil {
			return fmt.Errorf("udp: %w", err)
		}
		c, err := dialRetry(netip.AddrPortFrom(addrB, uint16(port+1)).String(), p)
		if err != nil {
			return fmt.Errorf("tcp: %w", err)
		}
		defer c.Close()
		return exchange(c, "stream")
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	p.wait(t, b, "dropped", "udp", "tcp-server", "tcp-client")
	p.wantSaid(t, said+", which opening a stack needs: opened beforehand the stacks of "+b.Link(testbed.B))
	if n := testutil.SNMPStat(t, b, testbed.B, "Tcp", "InSegs") - tcpSegs; n != 0 {
		t.Errorf("side B's kernel took %d TCP segments: a connection stayed on the kernel", n)
	}
	if n := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - udpIn; n != 0 {
		t.Errorf("side B's kernel took %d UDP datagrams: the socket stayed on the kernel", n)
	}
	wantCleanExit(t, b, p.pid)
}

// wantCleanExit checks that the process pid, gone, took its steering
// program off side B's interface and removed its counters file.
func wantCleanExit(t *testing.T, b *testbed.Bed, pid int) {
	t.Helper()
	if id := testutil.XDPProgram(t, b, testbed.B); id != 0 {
		t.Errorf("program id %d still attached to %s after the process exited", id, b.Link(testbed.B))
	}
	file := filepath.Join(params.Defaults().StatsDir, stats.FileName(pid))
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there after the process exited (%v)", file, err)
	}
}

// exchange writes msg on c and wants it back within 5 s.
func exchange(c net.Conn, msg string) error {
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		return err
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != msg {
		return fmt.Errorf("sent %q, got %q back", msg, buf)
	}
	return nil
}

// dialRetry connects to addr once p says it listens.
func dialRetry(addr string, p *cProgram) (net.Conn, error) {
	if err := p.waitFor("listening"); err != nil {
		return nil, err
	}
	return net.DialTimeout("tcp4", addr, 5*time.Second)
}

// TestRunMosquittoDropsRoot: Debian's mosquitto (not written with vmaxdp
// in mind) started as root becomes user mosquitto before it opens its
// listener. Under vmaxdp its listener is offloaded all the same: kernel
// clients on side A publish and subscribe through it, every message
// arrives, side B's kernel takes no TCP segment, and the broker's exit
// leaves neither its steering program nor its counters file behind.
func TestRunMosquittoDropsRoot(t *testing.T) {
	testutil.RequireRoot(t)
	for _, prog := range []string{"mosquitto", "mosquitto_pub", "mosquitto_sub"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("%s is not installed (make deps installs mosquitto and mosquitto-clients)", prog)
		}
	}
	testutil.EachBed(t, nil, func(t *testing.T, b *testbed.Bed) {
		const port, msgs = 11280, 300
		conf := filepath.Join(t.TempDir(), "mosquitto.conf")
		if err := os.WriteFile(conf, fmt.Appendf(nil, "listener %d %s\nallow_anonymous true\nlog_type all\n", port, b.Addr(testbed.B)), 0o644); err != nil {
			t.Fatal(err)
		}
		segs := testutil.SNMPStat(t, b, testbed.B, "Tcp", "InSegs")
		p := startArgv(t, b, []string{"VMAXDP_TCP=1"}, tools(t), "run", "--", "mosquitto", "-c", conf)
		if err := p.waitFor("running"); err != nil {
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		host, ns := b.Addr(testbed.B).String(), b.NSName(testbed.A)
		sub := exec.Command("timeout", "15", "ip", "netns", "exec", ns, "mosquitto_sub", "-h", host, "-p", strconv.Itoa(port),
			"-t", "vmx/#", "-q", "1", "-C", strconv.Itoa(msgs))
		var got strings.Builder
		sub.Stdout = &got
		if err := sub.Start(); err != nil {
			t.Fatal(err)
		}
		// The subscription is in place once the broker says so.
		if err := p.waitFor("Sending SUBACK"); err != nil {
			sub.Process.Kill()
			sub.Wait()
			t.Fatalf("%v\n%s", err, p.out.String())
		}
		lines := make([]string, msgs)
		for i := range lines {
			lines[i] = strconv.Itoa(i)
		}
		pub := exec.Command("timeout", "15", "ip", "netns", "exec", ns, "mosquitto_pub", "-h", host, "-p", strconv.Itoa(port),
			"-t", "vmx/x", "-q", "1", "-l")
		pub.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
		if out, err := pub.CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_pub: %v\n%s", err, out)
		}
		if err := sub.Wait(); err != nil {
			t.Errorf("mosquitto_sub: %v after %d lines", err, strings.Count(got.String(), "\n"))
		}
		if got.String() != strings.Join(lines, "\n")+"\n" {
			t.Errorf("the subscriber got %d of %d messages", strings.Count(got.String(), "\n"), msgs)
		}
		p.wantSaid(t, "gives up root, which opening a stack needs: opened beforehand the stacks of "+b.Link(testbed.B))
		if strings.Contains(p.out.String(), "not offloaded") {
			t.Errorf("a socket stayed on the kernel:\n%s", tail(p.out.String(), 30))
		}
		if n := testutil.SNMPStat(t, b, testbed.B, "Tcp", "InSegs") - segs; n != 0 {
			t.Errorf("side B's kernel took %d TCP segments: the listener's connections were not offloaded", n)
		}
		syscall.Kill(p.pid, syscall.SIGTERM)
		if err := p.exited(); err != nil {
			t.Errorf("mosquitto: %v\n%s", err, tail(p.out.String(), 20))
		}
		wantCleanExit(t, b, p.pid)
	})
}

// TestRunFreeRADIUS: FreeRADIUS 3.2 (Debian's, its own configuration, a
// client and a user added), started as root, drops to its user for now
// (setresuid(-1, freerad, 0)) and takes root back only around its binds.
// Under vmaxdp its RADIUS authentication socket is offloaded all the
// same: radclient on side A gets every Access-Accept, and side B's kernel
// takes no UDP datagram. Before, the stacks opened with the effective ID
// of the moment, and every socket stayed on the kernel.
func TestRunFreeRADIUS(t *testing.T) {
	testutil.RequireRoot(t)
	for _, prog := range []string{"freeradius", "radclient"} {
		if _, err := exec.LookPath(prog); err != nil {
			t.Skipf("%s is not installed (make deps installs freeradius and freeradius-utils)", prog)
		}
	}
	const system, requests = "/etc/freeradius/3.0", 200
	if _, err := os.Stat(system); err != nil {
		t.Skipf("FreeRADIUS's configuration: %v", err)
	}
	b := testutil.Bed(t, &testbed.Options{Plain: true}) // as ip link add makes it
	// A copy of the configuration that the server, once it is user
	// freerad, may still read.
	conf := filepath.Join(t.TempDir(), "raddb")
	if out, err := exec.Command("cp", "-a", system, conf).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	for dir := filepath.Dir(conf); dir != os.TempDir() && dir != "/"; dir = filepath.Dir(dir) {
		os.Chmod(dir, 0o755) // t.TempDir's are root's alone
	}
	client := fmt.Sprintf("\nclient bed {\n\tipaddr = %s\n\tsecret = testing123\n}\n", testbed.Prefix)
	users := filepath.Join(conf, "mods-config", "files", "authorize")
	old, err := os.ReadFile(users)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(users, append([]byte("bob Cleartext-Password := \"hello\"\n"), old...), 0o640); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(conf, "clients.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(client)
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	udpIn := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams")
	// Once running, freeradius points its stderr, where vmaxdp logs, at
	// /dev/null.
	logFile := filepath.Join(t.TempDir(), "vmaxdp.log")
	p := startArgv(t, b, []string{"VMAXDP_TRACELEVEL=4", "VMAXDP_LOG_FILE=" + logFile}, tools(t), "run", "--", "freeradius", "-f", "-l", "stdout", "-d", conf)
	if err := p.waitFor("Ready to process requests"); err != nil {
		t.Fatalf("%v\n%s", err, p.out.String())
	}
	reqs := filepath.Join(t.TempDir(), "requests")
	if err := os.WriteFile(reqs, []byte(strings.Repeat("User-Name = \"bob\"\nUser-Password = \"hello\"\n\n", requests)), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("timeout", "30", "ip", "netns", "exec", b.NSName(testbed.A), "radclient", "-f", reqs, "-p", "20", "-r", "1", "-t", "3",
		netip.AddrPortFrom(b.Addr(testbed.B), 1812).String(), "auth", "testing123").CombinedOutput()
	if n := strings.Count(string(out), "Received Access-Accept"); err != nil || n != requests {
		t.Errorf("radclient: %v: %d of %d accepted\n%s", err, n, requests, tail(string(out), 10))
	}
	log, _ := os.ReadFile(logFile)
	for _, want := range []string{"drops root for now, which opening a stack needs: opened beforehand the stacks of " + b.Link(testbed.B),
		"offloaded on " + b.Link(testbed.B) + " (udp_receiver 0.0.0.0:1812"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("vmaxdp's log lacks %q:\n%s", want, tail(string(log), 30))
		}
	}
	if n := testutil.SNMPStat(t, b, testbed.B, "Udp", "InDatagrams") - udpIn; n != 0 {
		t.Errorf("side B's kernel took %d UDP datagrams: the RADIUS socket was not offloaded", n)
	}
	syscall.Kill(p.pid, syscall.SIGTERM)
	if err := p.exited(); err != nil {
		t.Errorf("freeradius: %v\n%s", err, tail(p.out.String(), 20))
	}
}
