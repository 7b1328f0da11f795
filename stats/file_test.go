package stats

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/vmaxdp/vmaxdp/steer"
)

func sample() *Snapshot {
	return &Snapshot{
		Process: Process{PID: os.Getpid(), Program: "sockperf", Cmdline: "sockperf sr -i 198.18.0.2", Version: "dev",
			LogLevel: 3, Poll: Iomux{Calls: 7, RxReadyOffload: 5, PollHit: 6, PollMiss: 1}},
		Sockets: []Socket{
			{FD: 14, Proto: "udp", State: StateOffloaded, Interface: "vx0", Local: "198.18.0.2:11111", Blocking: true,
				Groups: []string{"224.4.1.3"}, Rules: []uint32{0, 3}, RxBytesLimit: 1 << 20,
				Counters: SocketCounters{RxOffloadPackets: 140479898, RxOffloadBytes: 280959796, RxPollHit: 9}},
			{FD: 15, Proto: "udp", State: StateKernel, Reason: "udp_receiver 0.0.0.0:5001: rule /etc/libvmaxdp.conf:3: use os udp_receiver * *:5001"},
		},
		Queues: []Queue{{Interface: "vx0", Queue: 0, Backend: "AF_XDP", XDPMode: "native", RingSize: 2048, FillRing: 2048,
			Counters: QueueCounters{RxPackets: 10, MaxRxBatch: 3}, Statistics: XDPStatistics{RxRingFull: 2}}},
		Programs: []Program{{Interface: "vx0", XDPMode: "native", Counters: steer.ProgCounters{Redirected: 10, Passed: 4},
			Stack: StackCounters{RxFrames: 10, RxDropped: []Drop{{"bad_udp_checksum", 1}}}}},
		Rules: []Rule{{Interface: "vx0", ID: 3, FD: 14, Rule: "3tuple udp 198.18.0.2:11111", Counters: steer.RuleCounters{MatchedPackets: 10, RedirectFailures: 1}}},
	}
}

func TestRoundTrip(t *testing.T) {
	in := sample()
	var out Snapshot
	if err := Decode(Encode(nil, in), &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(*in, out) {
		t.Errorf("decoded\n%+v\nwant\n%+v", out, *in)
	}
	if got := out.Rules[0].Redirected(); got != 9 {
		t.Errorf("Redirected = %d, want 9", got)
	}
}

func TestDecodeRefusesDamage(t *testing.T) {
	b := Encode(nil, sample())
	var s Snapshot
	for _, n := range []int{0, 1, 4, 8, len(b) / 2, len(b) - 1} {
		if err := Decode(b[:n], &s); !errors.Is(err, ErrCorrupt) {
			t.Errorf("payload cut to %d of %d bytes: err %v, want ErrCorrupt", n, len(b), err)
		}
	}
	if err := Decode(append(b, 0), &s); !errors.Is(err, ErrCorrupt) {
		t.Errorf("payload with a byte too many: err %v, want ErrCorrupt", err)
	}
}

func TestPublishAllocatesNothing(t *testing.T) {
	w, err := Create(t.TempDir(), os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	s := sample()
	if n := testing.AllocsPerRun(50, func() { w.Publish(s) }); n != 0 {
		t.Errorf("Publish: %v allocs per call, want 0", n)
	}
}

func TestWriterReader(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	fi, err := os.Stat(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: mode %v, want 0600", w.Path(), fi.Mode().Perm())
	}
	r, err := Open(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	var s Snapshot
	if err := r.Read(&s); !errors.Is(err, ErrNotPublished) {
		t.Errorf("before the first Publish: err %v, want ErrNotPublished", err)
	}
	in := sample()
	if err := w.Publish(in); err != nil {
		t.Fatal(err)
	}
	// A shorter snapshot after a longer one: the length word governs.
	short := *in
	short.Sockets = short.Sockets[:1]
	if err := w.Publish(&short); err != nil {
		t.Fatal(err)
	}
	if err := r.Read(&s); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(s, short) {
		t.Errorf("read %+v, want %+v", s, short)
	}
	if !r.Alive() {
		t.Errorf("Alive = false for the running test process")
	}

	// Requests: log level, dump, zero (acknowledged by the writer).
	if err := r.SetLog(5, -1); err != nil {
		t.Fatal(err)
	}
	if err := r.Dump(14, 4); err != nil {
		t.Fatal(err)
	}
	c, err := w.Control()
	if err != nil {
		t.Fatal(err)
	}
	if c.LogLevel != 5 || c.LogDetails != -1 || c.DumpRequest != 1 || c.DumpFD != 14 || c.DumpLevel != 4 {
		t.Errorf("control %+v, want level 5, details -1, dump 1 of fd 14 at 4", c)
	}
	done := make(chan error, 1)
	go func() { done <- r.Zero(2 * time.Second) }()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if c, _ := w.Control(); c.ZeroRequest == 1 {
			w.AckZero(1)
			break
		}
	}
	if err := <-done; err != nil {
		t.Error(err)
	}
	if err := r.Zero(50 * time.Millisecond); err == nil {
		t.Error("Zero returned without the writer's acknowledgement")
	}
}

func TestOpenRefusesOtherFormats(t *testing.T) {
	dir := t.TempDir()
	w, err := Create(dir, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Publish(sample())
	good, err := os.ReadFile(w.Path())
	if err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"magic":   func(b []byte) []byte { b[0] = 'X'; return b },
		"version": func(b []byte) []byte { binary.LittleEndian.PutUint32(b[offVersion:], FormatVersion+1); return b },
		"layout":  func(b []byte) []byte { b[offLayout] ^= 1; return b },
		"short":   func(b []byte) []byte { return b[:20] },
	} {
		p := filepath.Join(dir, "vmaxdp.1.stats")
		if err := os.WriteFile(p, mutate(append([]byte(nil), good...)), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := Open(p); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: err %v, want ErrFormat", name, err)
		}
	}
	// A payload length beyond the file, or a damaged payload: errors.
	for name, mutate := range map[string]func([]byte) []byte{
		"length":  func(b []byte) []byte { binary.LittleEndian.PutUint64(b[offLen:], uint64(len(b))); return b },
		"payload": func(b []byte) []byte { return b[:len(b)-3] },
	} {
		p := filepath.Join(dir, "vmaxdp.2.stats")
		if err := os.WriteFile(p, mutate(append([]byte(nil), good...)), 0o600); err != nil {
			t.Fatal(err)
		}
		r, err := Open(p)
		if err != nil {
			t.Fatal(err)
		}
		var s Snapshot
		if err := r.Read(&s); err == nil {
			t.Errorf("%s: damaged file read without error", name)
		}
		r.Close()
	}
}

func TestListFindsStale(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep(1) to stand in for a process: %v", err)
	}
	pid := cmd.Process.Pid
	w, err := Create(dir, pid)
	if err != nil {
		cmd.Process.Kill()
		t.Fatal(err)
	}
	mine, err := Create(dir, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	os.WriteFile(filepath.Join(dir, "unrelated"), nil, 0o600)
	found, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 2 || !found[0].Alive || !found[1].Alive {
		t.Fatalf("List = %+v, want two live files", found)
	}
	cmd.Process.Kill()
	cmd.Wait()
	found, _ = List(dir)
	for _, f := range found {
		if want := f.PID != pid; f.Alive != want {
			t.Errorf("%s: Alive = %v, want %v", f.Path, f.Alive, want)
		}
	}
	w.Close()
}

func FuzzDecode(f *testing.F) {
	f.Add(Encode(nil, sample()))
	f.Add(Encode(nil, &Snapshot{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Snapshot
		if err := Decode(b, &s); err != nil {
			return
		}
		// What decodes encodes back to the same bytes.
		if again := Encode(nil, &s); string(again) != string(b) {
			// Bools decode only from 0 and 1 and integers are fixed
			// width, so the encoding is canonical.
			t.Fatalf("re-encoding differs: %x vs %x", again, b)
		}
	})
}
