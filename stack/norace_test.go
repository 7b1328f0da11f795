//go:build !race

package stack_test

const raceEnabled = false
