// Package sysmon keeps the Go runtime's system monitor thread (sysmon) from
// preempting the application's threads when it wakes up.
//
// Inside an application, each thread that calls the engine holds one of
// Go's Ps while it is back in its own C code, and the goroutine it runs
// there never passes through Go's scheduler. After 10 ms of that, sysmon
// takes the P back at each of its ticks, and every P it takes sets its
// tick back to 20 us: a thread that polls its socket has its P taken
// hundreds of times a second. Each tick is a thread wake-up, and on a busy
// machine the kernel gives the waking sysmon the CPU of a polling thread
// at once (wake-up preemption): sockperf's ping-pong under vmaxdp, both
// CPUs of this machine polling, had a p99 of 14-23 us against the
// kernel's 5-7 us, with sysmon waking about 770 times a second.
//
// SCHED_BATCH takes away only the wake-up preemption: the thread keeps
// its weight, runs at once on an idle CPU, and on a busy one at one of
// the scheduler's ticks (1-4 ms apart, by the kernel's HZ), when Go's
// sysmon duties (taking Ps from threads blocked in system calls, the
// network poll of a busy process) still get done. No other thread of the
// process is changed here; but a thread inherits its creator's policy,
// and sysmon creates Go's new threads, so a caller must give those back
// SCHED_OTHER (the preload library does, in its pthread_create).
//
// Go does not say which thread sysmon is. It is the one that sleeps in
// runtime.usleep (nanosleep) whenever it is looked at: Find reads each
// thread's current system call and user program counter from
// /proc/self/task/TID/syscall, and names the thread seen there three
// times. Other Go threads sleep there for microseconds at most.
//
// The delay has its cost: a goroutine that waits for sysmon to take a P
// from a thread blocked in a system call waits for a tick too (unbound
// with two threads under vmaxdp lost 5-15% of its queries a second), so
// batching is the caller's choice. Find opens /proc files, each for a
// moment on the lowest free fd: it must not run beside an application
// thread that may open its own.
package sysmon

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNotFound is Find's when no thread was seen in runtime.usleep often
// enough: sysmon sleeps deeper (in a futex) while every P is idle.
var ErrNotFound = errors.New("no thread seen sleeping in runtime.usleep")

// seen is how many looks must find a thread in runtime.usleep.
const seen = 3

// Find returns the thread ID of this process's sysmon, looking until
// timeout (an interval of 0: looking without pause). A look reads every
// thread's system call until one is seen in runtime.usleep, then only the
// threads seen there; a look that sees none doubles the wait before the
// next (from interval, up to maxWait), so that a process of many threads
// whose sysmon sleeps deeper pays little.
func Find(interval, timeout time.Duration) (int, error) {
	self := unix.Gettid()
	hits := map[int]int{}
	end := time.Now().Add(timeout)
	wait := interval
	for {
		tids := make([]int, 0, len(hits))
		for tid := range hits {
			tids = append(tids, tid)
		}
		if len(tids) == 0 {
			var err error
			if tids, err = threads(); err != nil {
				return 0, err
			}
		}
		found := false
		for _, tid := range tids {
			if tid == self || !inUsleep(tid) {
				continue
			}
			found = true
			hits[tid]++
			if hits[tid] >= seen {
				return tid, nil
			}
		}
		if found {
			wait = interval
		} else {
			clear(hits) // look at every thread again
			wait = min(2*wait, maxWait)
		}
		if time.Now().Add(wait).After(end) {
			return 0, fmt.Errorf("find sysmon: %w in %v", ErrNotFound, timeout)
		}
		time.Sleep(wait)
	}
}

// maxWait bounds Find's wait between looks.
const maxWait = 250 * time.Millisecond

func threads() ([]int, error) {
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("find sysmon: %w", err)
	}
	tids := make([]int, 0, len(ents))
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// inUsleep says whether thread tid is in nanosleep, called from
// runtime.usleep. The file holds "NR arg1 ... arg6 SP PC" while the thread
// is blocked in a system call ("running" otherwise).
func inUsleep(tid int) bool {
	b, err := os.ReadFile("/proc/self/task/" + strconv.Itoa(tid) + "/syscall")
	if err != nil {
		return false // the thread ended
	}
	return parseUsleep(string(b))
}

func parseUsleep(s string) bool {
	f := strings.Fields(s)
	if len(f) != 9 || f[0] != strconv.Itoa(unix.SYS_NANOSLEEP) {
		return false
	}
	pc, err := strconv.ParseUint(f[8], 0, 64)
	if err != nil {
		return false
	}
	fn := runtime.FuncForPC(uintptr(pc))
	return fn != nil && strings.TrimSuffix(fn.Name(), ".abi0") == "runtime.usleep"
}

// Batch sets thread tid's policy to SCHED_BATCH, keeping its nice value,
// when it is SCHED_OTHER; a thread with any other policy (real-time,
// inherited from an application thread that has it) is left as it is,
// with an error that says so.
func Batch(tid int) error {
	attr, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return fmt.Errorf("thread %d: sched_getattr: %w", tid, err)
	}
	switch attr.Policy {
	case unix.SCHED_BATCH:
		return nil
	case unix.SCHED_NORMAL:
	default:
		return fmt.Errorf("thread %d: scheduling policy %d is not SCHED_OTHER: left as it is", tid, attr.Policy)
	}
	attr.Policy = unix.SCHED_BATCH
	if err := unix.SchedSetAttr(tid, attr, 0); err != nil {
		return fmt.Errorf("thread %d: sched_setattr SCHED_BATCH: %w", tid, err)
	}
	return nil
}
