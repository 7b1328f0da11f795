//go:build race

package stack_test

// raceEnabled: the race detector's instrumentation allocates and slows
// every step, so counts of allocations and outcomes that depend on how
// long a step takes are not the build's.
const raceEnabled = true
