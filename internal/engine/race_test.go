//go:build race

package engine

// raceEnabled: the race detector's instrumentation allocates: counts of
// allocations are not the build's.
const raceEnabled = true
