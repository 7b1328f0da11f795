package stack

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// inNS runs fn on a thread in the network namespace ns, so that the
// sockets fn creates belong to the stack's namespace whichever thread
// the caller runs on.
func inNS(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cur, err := netns.Get()
	if err != nil {
		return fmt.Errorf("current namespace: %w", err)
	}
	defer cur.Close()
	if cur.Equal(ns) {
		return fn()
	}
	if err := netns.Set(ns); err != nil {
		return fmt.Errorf("enter namespace: %w", err)
	}
	ferr := fn()
	if err := netns.Set(cur); err != nil {
		runtime.LockOSThread() // never reuse a thread left in the wrong namespace
		return errors.Join(ferr, fmt.Errorf("leave namespace: %w", err))
	}
	return ferr
}
