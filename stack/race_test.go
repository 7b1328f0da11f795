//go:build race

package stack_test

// raceEnabled: the race detector's instrumentation allocates, so counts
// of allocations are not the build's.
const raceEnabled = true
