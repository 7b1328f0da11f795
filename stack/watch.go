package stack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/highfd"
	"github.com/vmaxdp/vmaxdp/internal/netnsutil"
	"github.com/vmaxdp/vmaxdp/xsk"
)

// watchEvery is how often the watcher reads the interface's channel count
// when no event came: `ethtool -L` sends no rtnetlink event.
const watchEvery = 1000 // milliseconds

// linkState is what the watcher last saw of the interface.
type linkState struct {
	up    bool
	mtu   int
	addr  netip.Addr   // the first IPv4 address
	addrs []netip.Addr // all of them
	rx    int          // RX queues the interface runs
	local []uint32     // the namespace's IPv4 addresses (sortedAddrs)
}

// startWatch opens a netlink socket subscribed to the link and IPv4
// address events of the stack's namespace, and starts the watcher.
func (st *Stack) startWatch(initial linkState) error {
	var fd int
	err := netnsutil.Do(st.ns, func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
		if err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_LINK | unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV4_ROUTE | unix.RTMGRP_IPV4_RULE})
	})
	if err != nil {
		if fd > 0 {
			unix.Close(fd)
		}
		return fmt.Errorf("watch link events: %w", err)
	}
	fd = highfd.Move(fd)
	st.watchMembers(fd)
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		highfd.Close(fd)
		return fmt.Errorf("watch link events: eventfd: %w", err)
	}
	kick, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		highfd.Close(fd)
		unix.Close(stop)
		return fmt.Errorf("watch shared ports: eventfd: %w", err)
	}
	st.watchStop = highfd.Move(stop)
	st.shareKick = highfd.Move(kick)
	st.watchDone = make(chan struct{})
	go st.watch(fd, initial)
	return nil
}

// stopWatch ends the watcher and waits for it.
func (st *Stack) stopWatch() {
	if st.watchDone == nil {
		return
	}
	one := [8]byte{1}
	unix.Write(st.watchStop, one[:])
	<-st.watchDone
	highfd.Close(st.watchStop)
	highfd.Close(st.shareKick)
	st.shareKick = -1
	st.watchDone = nil
}

// watch follows the interface while the stack runs. On any event of its
// link or addresses it reads the interface again (and every watchEvery its
// channel count):
// a link set down sends through the kernel sockets until it is up again
// (the kernel has dropped its routes, so its error is the application's
// error); a new MTU bounds what the stack sends itself; an address change
// forgets the next hops (their source addresses); more RX queues get an
// AF_XDP socket each; a deleted interface leaves every socket to its
// kernel socket for good. Each change is logged once. Every watchEvery it
// reads the interface's rp_filter too (source.go).
func (st *Stack) watch(fd int, last linkState) {
	defer close(st.watchDone)
	defer highfd.Close(fd)
	buf := make([]byte, 1<<16)
	var idleSince time.Time
	channelsRead := time.Now()
	sharing := false // the stack serves shareable sockets: look at their ports every shareEvery
	for {
		idleSince = st.detachIdle(idleSince)
		pfds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(st.watchStop), Events: unix.POLLIN},
			{Fd: int32(st.shareKick), Events: unix.POLLIN}}
		timeout := watchEvery
		if sharing {
			timeout = shareEvery
		}
		if _, err := unix.Poll(pfds, timeout); err != nil && err != unix.EINTR {
			slog.Warn("stack: link watcher stops", "interface", st.ifname, "err", err)
			return
		}
		if pfds[1].Revents != 0 {
			return
		}
		if pfds[2].Revents != 0 || sharing {
			var n [8]byte
			unix.Read(st.shareKick, n[:])
			sharing = st.checkShared()
		}
		if pfds[0].Revents == 0 {
			// No event: only the channel count can have changed. It is
			// read through the stack's ioctl socket, so the watcher takes
			// no fd from the application.
			if time.Since(channelsRead) < watchEvery*time.Millisecond {
				continue
			}
			channelsRead = time.Now()
			st.followSourceConf(channelsRead)
			if ch, err := xsk.QueueChannels(st.ctlFD, st.ifname, last.rx, last.rx); err == nil && ch.Rx != last.rx && len(st.opts.Queues) == 0 {
				st.followChannels(ch.Rx, last.rx)
				last.rx = ch.Rx
			}
			continue
		}
		link, members, routes := st.drainEvents(fd, buf)
		if routes {
			st.routesChanged(time.Now())
		}
		if members {
			if err := st.readMembers(); err != nil {
				slog.Warn(fmt.Sprintf("stack %s: multicast with IP_MULTICAST_LOOP on goes through the kernel: %v", st.ifname, err))
			}
		}
		if !link {
			continue // events of other links only
		}
		var ok bool
		if last, ok = st.follow(last); !ok {
			return
		}
	}
}

// detachIdle takes the steering program off the interface once the stack
// has had no rule for a second (steer.Program.Detach: an attached program
// slows the kernel's own traffic on veth); the next socket attaches it
// again. It returns since when the stack has had no rule (zero: it has).
func (st *Stack) detachIdle(since time.Time) time.Time {
	if st.prog.RuleCount() > 0 {
		return time.Time{}
	}
	now := time.Now()
	if since.IsZero() {
		return now
	}
	if now.Sub(since) >= idleDetach {
		if did, err := st.prog.Detach(); err != nil {
			slog.Warn("stack: detach idle steering program", "interface", st.ifname, "err", err)
		} else if did {
			slog.Debug(fmt.Sprintf("stack %s: no socket steered for %v: steering program detached until the next one", st.ifname, idleDetach))
		}
	}
	return since
}

// idleDetach is how long the stack has no rule before it detaches its
// steering program.
const idleDetach = time.Second

// drainEvents reads the pending events and says whether one concerns the
// stack's interface or the namespace's addresses (link), the interface's
// multicast memberships (members), or the namespace's IPv4 routes or
// rules (routes); all when the socket lost events, as it must then be
// assumed it did.
func (st *Stack) drainEvents(fd int, buf []byte) (link, members, routes bool) {
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EAGAIN {
			return link, members, routes
		}
		if err != nil {
			return true, st.mcMembers.Load() != nil, true // ENOBUFS: events lost
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return true, st.mcMembers.Load() != nil, true
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.RTM_NEWLINK, unix.RTM_DELLINK:
				if len(m.Data) >= unix.SizeofIfInfomsg && int((*unix.IfInfomsg)(ptr(m.Data)).Index) == st.ifindex {
					link = true
				}
			case unix.RTM_NEWADDR, unix.RTM_DELADDR:
				link = true // any interface's: the sources the kernel refuses
			case unix.RTM_NEWROUTE, unix.RTM_DELROUTE, unix.RTM_NEWRULE, unix.RTM_DELRULE:
				routes = true
			case rtmNewMulticast, rtmDelMulticast:
				if _, ok := memberOf(m.Data, st.ifindex); ok {
					members = true
				}
			}
		}
	}
}

// follow reads the interface and acts on what changed since last; it
// returns false once the interface is gone.
func (st *Stack) follow(last linkState) (linkState, bool) {
	now, err := st.readLink()
	if errors.Is(err, unix.ENODEV) {
		reason := fmt.Sprintf("interface %s was deleted", st.ifname)
		st.kernelOnly.Store(&reason)
		st.gone.Store(true)
		st.wakeAll()
		slog.Warn(fmt.Sprintf("stack %s: %s: its sockets are served by their kernel sockets from now on", st.ifname, reason))
		return last, false
	}
	if err != nil {
		slog.Warn("stack: read interface", "interface", st.ifname, "err", err)
		return last, true
	}
	if now.up != last.up {
		if now.up {
			st.kernelOnly.Store(nil)
			st.forgetHops()
			slog.Info(fmt.Sprintf("stack %s: interface up: offloaded traffic resumes", st.ifname))
		} else {
			reason := fmt.Sprintf("interface %s is down", st.ifname)
			st.kernelOnly.Store(&reason)
			slog.Warn(fmt.Sprintf("stack %s: %s: sends go through the kernel sockets until it is up", st.ifname, reason))
		}
	}
	if now.mtu != last.mtu {
		st.setMTU(now.mtu)
		slog.Info(fmt.Sprintf("stack %s: MTU %d (was %d)", st.ifname, now.mtu, last.mtu))
		if now.mtu < last.mtu {
			st.shrinkMSS()
		}
	}
	if !slices.Equal(now.addrs, last.addrs) {
		st.addrs.Store(&now.addrs)
	}
	if !slices.Equal(now.local, last.local) {
		st.localAddrs.Store(&now.local)
	}
	if now.addr != last.addr {
		st.forgetHops()
		if now.addr.IsValid() {
			st.addr.Store(&now.addr)
			slog.Info(fmt.Sprintf("stack %s: first IPv4 address now %v", st.ifname, now.addr))
		} else {
			slog.Warn(fmt.Sprintf("stack %s: no IPv4 address any more: the kernel delivers nothing to its sockets until one is added", st.ifname))
		}
	}
	if now.rx != last.rx && len(st.opts.Queues) == 0 {
		st.followChannels(now.rx, last.rx)
	}
	return now, true
}

// followChannels serves the queues the interface runs now. The kernel
// refuses to lower the channel count below a queue an AF_XDP socket is
// bound to, so only growth happens while the stack runs.
func (st *Stack) followChannels(rx, was int) {
	err := netnsutil.Do(st.ns, func() error {
		ch, err := xsk.QueueChannels(st.ctlFD, st.ifname, rx, rx)
		if err != nil {
			return err
		}
		return st.openQueues(firstQueues(ch.Rx), ch)
	})
	served := len(st.queueList())
	if err != nil {
		slog.Warn(fmt.Sprintf("stack %s: %d RX queues now (was %d); %d served: %v", st.ifname, rx, was, served, err))
		return
	}
	for _, u := range st.UnservedQueues() {
		slog.Warn(fmt.Sprintf("stack %s: %v: its datagrams reach the sockets through the kernel", st.ifname, u))
	}
	slog.Info(fmt.Sprintf("stack %s: %d RX queues now (was %d); %d served", st.ifname, rx, was, served))
	// Sleepers poll the queues they saw when they went to sleep.
	st.wakeAll()
}

// readLink reads the interface's state in the stack's namespace; the
// error wraps unix.ENODEV when the interface is gone.
// readLink reads the interface's flags, MTU, queues and IPv4 addresses
// through the stack's own netlink socket, kept at a high fd since Open:
// one opened here took the lowest free fd for a moment, on the watcher's
// goroutine, while the application could be opening one of its own (an
// XDP attach is a link event: a server's epoll fd took 5 where the kernel
// run gave it 4, and every accept after it moved).
func (st *Stack) readLink() (linkState, error) {
	var s linkState
	found := false
	var numRx, numTx int
	err := st.rtDump(routeDump(unix.RTM_GETLINK, unix.SizeofIfInfomsg, unix.AF_UNSPEC), func(data []byte) {
		if len(data) < unix.SizeofIfInfomsg || int((*unix.IfInfomsg)(ptr(data)).Index) != st.ifindex {
			return
		}
		found = true
		s.up = (*unix.IfInfomsg)(ptr(data)).Flags&unix.IFF_UP != 0
		attrs, _ := syscall.ParseNetlinkRouteAttr(&syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.RTM_NEWLINK}, Data: data})
		for _, a := range attrs {
			if len(a.Value) < 4 {
				continue
			}
			v := int(binary.NativeEndian.Uint32(a.Value))
			switch a.Attr.Type {
			case unix.IFLA_MTU:
				s.mtu = v
			case unix.IFLA_NUM_RX_QUEUES:
				numRx = v
			case unix.IFLA_NUM_TX_QUEUES:
				numTx = v
			}
		}
	})
	if err != nil {
		return s, fmt.Errorf("interface %d: %w", st.ifindex, err)
	}
	if !found {
		return s, fmt.Errorf("interface %d: %w", st.ifindex, unix.ENODEV)
	}
	var local []netip.Addr
	err = st.dumpAddrs(func(index int, a netip.Addr) {
		local = append(local, a)
		if index == st.ifindex {
			s.addrs = append(s.addrs, a)
		}
	})
	if err != nil {
		return s, fmt.Errorf("interface %d addresses: %w", st.ifindex, err)
	}
	s.local = sortedAddrs(local)
	if len(s.addrs) > 0 {
		s.addr = s.addrs[0]
	}
	ch, err := xsk.QueueChannels(st.ctlFD, st.ifname, numRx, numTx)
	if err != nil {
		return s, err
	}
	s.rx = ch.Rx
	return s, nil
}

// dumpAddrs calls each with every IPv4 address of the namespace and its
// interface's index.
func (st *Stack) dumpAddrs(each func(index int, a netip.Addr)) error {
	return st.rtDump(routeDump(unix.RTM_GETADDR, unix.SizeofIfAddrmsg, unix.AF_INET), func(data []byte) {
		if len(data) < unix.SizeofIfAddrmsg {
			return
		}
		attrs, _ := syscall.ParseNetlinkRouteAttr(&syscall.NetlinkMessage{Header: syscall.NlMsghdr{Type: unix.RTM_NEWADDR}, Data: data})
		var local, address netip.Addr
		for _, a := range attrs {
			if x, ok := netip.AddrFromSlice(a.Value); ok && x.Is4() {
				switch a.Attr.Type {
				case unix.IFA_LOCAL:
					local = x
				case unix.IFA_ADDRESS:
					address = x
				}
			}
		}
		if !local.IsValid() {
			local = address // the local address, as netlink's own AddrList takes it
		}
		if local.IsValid() {
			each(int((*unix.IfAddrmsg)(ptr(data)).Index), local)
		}
	})
}

// forgetHops drops every cached next hop: routes or source addresses
// changed.
func (st *Stack) forgetHops() {
	st.hops.mu.Lock()
	defer st.hops.mu.Unlock()
	st.hops.m.Store(nil)
}

// wakeAll wakes every sleeping receive and multiplexer, so that each looks
// again at what it should poll.
func (st *Stack) wakeAll() {
	st.mu.Lock()
	conns := make([]*UDPConn, 0, len(st.conns))
	for c := range st.conns {
		conns = append(conns, c)
	}
	st.mu.Unlock()
	st.rxMu.Lock()
	for _, c := range conns {
		c.wake()
	}
	st.rxMu.Unlock()
	st.wakeMux()
}

func ptr(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }
