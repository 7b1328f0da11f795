package sysmon

import (
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// busy keeps a goroutine running until stop is called: with every P
// idle, sysmon sleeps in a futex instead of runtime.usleep.
func busy(t *testing.T) {
	var done atomic.Bool
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for end := time.Now().Add(10 * time.Second); !done.Load() && time.Now().Before(end); {
		}
	}()
	t.Cleanup(func() { done.Store(true); <-finished })
}

func TestFindAndBatch(t *testing.T) {
	busy(t)
	tid, err := Find(time.Millisecond, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if tid == unix.Gettid() {
		t.Fatalf("Find named the calling thread %d", tid)
	}
	// Looked at again, it is still in runtime.usleep most of the time.
	in := 0
	for i := 0; i < 20; i++ {
		if inUsleep(tid) {
			in++
		}
		time.Sleep(time.Millisecond)
	}
	if in < 10 {
		t.Fatalf("thread %d was in runtime.usleep in %d of 20 looks", tid, in)
	}
	attr, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		t.Fatal(err)
	}
	if attr.Policy == unix.SCHED_BATCH { // an earlier run of the test (-count)
		if err := Batch(tid); err != nil {
			t.Fatal(err)
		}
		return
	}
	if attr.Policy != unix.SCHED_NORMAL {
		t.Skipf("the test runs with scheduling policy %d; Batch changes SCHED_OTHER only", attr.Policy)
	}
	nice := attr.Nice
	if err := Batch(tid); err != nil {
		t.Fatal(err)
	}
	if err := Batch(tid); err != nil {
		t.Fatalf("twice: %v", err)
	}
	attr, err = unix.SchedGetAttr(tid, 0)
	if err != nil {
		t.Fatal(err)
	}
	if attr.Policy != unix.SCHED_BATCH || attr.Nice != nice {
		t.Fatalf("after Batch: policy %d nice %d, want %d and %d", attr.Policy, attr.Nice, unix.SCHED_BATCH, nice)
	}
	// No other thread of the process changed.
	tids, err := threads()
	if err != nil {
		t.Fatal(err)
	}
	for _, other := range tids {
		if other == tid {
			continue
		}
		if a, err := unix.SchedGetAttr(other, 0); err == nil && a.Policy == unix.SCHED_BATCH {
			t.Errorf("thread %d is SCHED_BATCH too", other)
		}
	}
}

func TestFindTimesOut(t *testing.T) {
	// One look cannot see sysmon the three times Find wants.
	_, err := Find(time.Millisecond, 0)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err %v, want ErrNotFound", err)
	}
}

func TestBatchNoThread(t *testing.T) {
	err := Batch(1 << 30)
	if err == nil {
		t.Fatal("Batch of a thread that does not exist: no error")
	}
	if want := strconv.Itoa(1 << 30); !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not name thread %s", err, want)
	}
}

func TestParseUsleep(t *testing.T) {
	other := reflect.ValueOf(runtime.Gosched).Pointer()
	for _, c := range []struct {
		line string
		want bool
	}{
		{"running", false},
		{"", false},
		{"-1 0x7ffd 0x0", false},
		{fmt.Sprintf("35 0x1 0x0 0x0 0x0 0x0 0x0 0x7ffd0000 %#x", other), false},  // nanosleep, not from runtime.usleep
		{fmt.Sprintf("202 0x1 0x0 0x0 0x0 0x0 0x0 0x7ffd0000 %#x", other), false}, // a futex
		{"35 0x1 0x0 0x0 0x0 0x0 0x0 0x7ffd0000 notanumber", false},
		{"35 0x1 0x0 0x0 0x0 0x0 0x0 0x7ffd0000 0x10", false}, // no Go function there
	} {
		if got := parseUsleep(c.line); got != c.want {
			t.Errorf("parseUsleep(%q) = %v, want %v", c.line, got, c.want)
		}
	}
}
