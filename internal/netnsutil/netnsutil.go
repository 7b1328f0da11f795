// Package netnsutil runs code inside a network namespace, and finds links
// there. The kernel binds a socket, a netlink handle or an XDP attachment
// to the namespace of the thread that creates it, so the thread is locked
// and switched for the call and switched back afterwards; a thread that
// cannot be switched back is never returned to the Go runtime's pool.
package netnsutil

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
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

// LinkByName finds a link by name with a dump of h's links (nil: of the
// calling thread's namespace). vishvananda/netlink's LinkByName and
// LinkByIndex ask for an acknowledgement they do not read, and the kernel
// frees the unread one when the socket closes (at once for the package's
// functions, which open a socket per call): a QUEUE_PURGE drop that every
// nettrace recording of that namespace would show.
func LinkByName(h *netlink.Handle, name string) (netlink.Link, error) {
	var links []netlink.Link
	var err error
	if h == nil {
		links, err = netlink.LinkList()
	} else {
		links, err = h.LinkList()
	}
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if l.Attrs().Name == name {
			return l, nil
		}
	}
	return nil, fmt.Errorf("link %s: %w", name, unix.ENODEV)
}

// LinkByIndex finds a link by index with a dump of the calling thread's
// namespace's links (see LinkByName).
func LinkByIndex(index int) (netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		if l.Attrs().Index == index {
			return l, nil
		}
	}
	return nil, fmt.Errorf("link %d: %w", index, unix.ENODEV)
}
