package engine

import "testing"

// TestResultingUIDs: which calls give up root for good (BeforeSetuid
// opens the stacks then) and which keep it within reach.
func TestResultingUIDs(t *testing.T) {
	for _, c := range []struct {
		call       string
		r, e, s    int
		wr, we, ws int
	}{
		{"setuid", 109, 109, 109, 109, 109, 109},
		{"setresuid", 109, 109, 109, 109, 109, 109},
		{"setresuid", -1, 109, -1, 0, 109, 0},     // effective only: root stays saved
		{"setreuid", 109, 109, -1, 109, 109, 109}, // saved follows effective
		{"setreuid", -1, 109, -1, 0, 109, 109},    // effective differs from real: saved follows
		{"setreuid", -1, 0, -1, 0, 0, 0},
	} {
		r, e, s := resultingUIDs(c.call, c.r, c.e, c.s, 0, 0, 0)
		if r != c.wr || e != c.we || s != c.ws {
			t.Errorf("%s(%d, %d, %d) from root: %d %d %d, want %d %d %d", c.call, c.r, c.e, c.s, r, e, s, c.wr, c.we, c.ws)
		}
	}
}
