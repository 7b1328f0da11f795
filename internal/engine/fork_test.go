package engine

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestForkKeepAndClaim plays the parent's side of a fork with the child's
// claim written as the preload library writes it: an offloaded UDP socket
// that no poll, select or epoll waited for goes back to the kernel at the
// fork; one that a poll waited for is kept (its ForkPage slot reads
// forkKept and it stays offloaded after Forked); a claim (the child's pid
// in the slot, Seq bumped, a futex wake) hands it to the kernel and sets
// the slot to 0, which the child waits for.
func TestForkKeepAndClaim(t *testing.T) {
	bed, e, polled := offloaded(t, 9414, true)
	plain := socketB(t, bed, e, true)
	if err := bindB(bed, e, plain, 9415); err != nil {
		t.Fatal(err)
	}
	if st := settled(e, plain); st != StateOffloaded {
		t.Fatalf("second socket: state %d, want offloaded", st)
	}
	pfds := []unix.PollFd{{Fd: int32(polled), Events: unix.POLLIN}}
	if _, errno := e.Poll(MuxPoll, pfds, 0, nil, nil); errno != 0 {
		t.Fatalf("poll: %v", errno)
	}
	t.Cleanup(e.stopClaims)

	e.Forking()
	p := e.ForkPage()
	if p == nil {
		t.Fatal("no fork page after Forking")
	}
	if got := atomic.LoadInt32(&p.FD[polled]); got != forkKept {
		t.Errorf("polled socket's slot: %d, want %d (kept)", got, forkKept)
	}
	if got := atomic.LoadInt32(&p.FD[plain]); got != 0 {
		t.Errorf("unpolled socket's slot: %d, want 0", got)
	}
	e.Forked()
	if st := e.State(plain); st != StateKernel {
		t.Errorf("unpolled socket after the fork: state %d, want the kernel's", st)
	}
	if st := e.State(polled); st != StateOffloaded {
		t.Fatalf("polled socket after the fork: state %d, want offloaded", st)
	}

	const child = 424242
	if !atomic.CompareAndSwapInt32(&p.FD[polled], forkKept, child) {
		t.Fatal("the slot could not be claimed")
	}
	atomic.AddUint32(&p.Seq, 1)
	futexWake(&p.Seq)
	deadline := time.Now().Add(5 * time.Second)
	for atomic.LoadInt32(&p.FD[polled]) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the claim was not answered in 5 s (slot %d)", atomic.LoadInt32(&p.FD[polled]))
		}
		futexWait(&p.FD[polled], child, 100*time.Millisecond)
	}
	if st := e.State(polled); st != StateKernel {
		t.Errorf("claimed socket: state %d, want the kernel's", st)
	}
	if r := e.Reason(polled); r == "" || !strings.Contains(r, "used by process 424242, a child of fork") {
		t.Errorf("claimed socket's reason: %q", r)
	}
}
