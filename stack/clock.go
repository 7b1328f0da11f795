package stack

import (
	"fmt"
	"math"
	"time"

	"golang.org/x/sys/unix"
)

// monoEpoch is monoNow's zero.
var monoEpoch = time.Now()

// monoNow reads the monotonic clock, in nanoseconds since the package
// loaded, for the ages and expiries the per-packet paths compare
// (deferred kicks, cached next hops): one clock read where time.Now
// makes two (24 against 43 ns here), and no step when the wall clock is
// set.
func monoNow() int64 { return int64(time.Since(monoEpoch)) }

// kernelMono relates Go's clock readings to CLOCK_MONOTONIC, the clock of
// bpf_ktime_get_ns, which stamps a frame's arrival (steer.c): Go's
// monotonic readings come from the same clock, so that base, a reading
// taken when CLOCK_MONOTONIC read mono, places every later one.
type kernelMono struct {
	base time.Time
	mono int64
}

// calibrateMono pairs a Go reading with CLOCK_MONOTONIC, from the
// closest of a few tries: within half a system call's time.
func calibrateMono() (kernelMono, error) {
	var best kernelMono
	span := time.Duration(math.MaxInt64)
	var err error
	for range 8 {
		var ts unix.Timespec
		t := time.Now()
		if err = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			continue
		}
		if d := time.Since(t); d < span {
			span, best = d, kernelMono{base: t.Add(d / 2), mono: ts.Nano()}
		}
	}
	if best.base.IsZero() {
		return best, fmt.Errorf("clock_gettime(CLOCK_MONOTONIC): %w", err)
	}
	return best, nil
}

// at is CLOCK_MONOTONIC's nanoseconds at Go's reading t.
func (k *kernelMono) at(t time.Time) int64 { return k.mono + int64(t.Sub(k.base)) }
