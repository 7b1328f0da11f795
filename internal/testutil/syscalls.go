package testutil

import (
	"encoding/binary"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ThreadSyscalls counts the calling thread's entries into the system call
// name (its syscalls:sys_enter_ tracepoint) from now on, and returns what
// reads the count. It locks the calling goroutine to its thread until the
// test ends, and skips the test when tracefs or perf events are missing.
func ThreadSyscalls(tb testing.TB, name string) func() uint64 {
	tb.Helper()
	RequireRoot(tb)
	raw, err := os.ReadFile("/sys/kernel/tracing/events/syscalls/sys_enter_" + name + "/id")
	if err != nil {
		tb.Skipf("no tracepoint for %s to count its calls: %v", name, err)
	}
	id, err := strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		tb.Fatalf("tracepoint id of sys_enter_%s: %v", name, err)
	}
	runtime.LockOSThread()
	tb.Cleanup(runtime.UnlockOSThread)
	attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_TRACEPOINT, Config: id, Size: uint32(unsafe.Sizeof(unix.PerfEventAttr{}))}
	fd, err := unix.PerfEventOpen(&attr, 0, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		tb.Skipf("perf_event_open on sys_enter_%s: %v", name, err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return func() uint64 {
		var b [8]byte
		if n, err := unix.Read(fd, b[:]); err != nil || n != len(b) {
			tb.Fatalf("read the count of sys_enter_%s: %d bytes, %v", name, n, err)
		}
		return binary.NativeEndian.Uint64(b[:])
	}
}
