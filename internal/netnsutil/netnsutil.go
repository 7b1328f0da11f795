// Package netnsutil runs code inside a network namespace. The kernel binds
// a socket, a netlink handle or an XDP attachment to the namespace of the
// thread that creates it, so the thread is locked and switched for the call
// and switched back afterwards; a thread that cannot be switched back is
// never returned to the Go runtime's pool.
package netnsutil

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

// Do runs fn on an OS thread in the network namespace ns.
func Do(ns netns.NsHandle, fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cur, err := netns.Get()
	if err != nil {
		return fmt.Errorf("current network namespace: %w", err)
	}
	defer cur.Close()
	if cur.Equal(ns) {
		return fn()
	}
	if err := netns.Set(ns); err != nil {
		return fmt.Errorf("enter network namespace: %w", err)
	}
	ferr := fn()
	if err := netns.Set(cur); err != nil {
		// Locked once more than unlocked: the thread exits with the goroutine.
		runtime.LockOSThread()
		return errors.Join(ferr, fmt.Errorf("leave network namespace: %w", err))
	}
	return ferr
}
