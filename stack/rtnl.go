package stack

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/internal/sockdiag"
	"github.com/vmaxdp/vmaxdp/stack/header"
)

// The stack's own rtnetlink queries, on its netlink socket (nlFD), which
// it opened in its namespace at Open and keeps at a high fd: a handle
// opened per query takes the lowest free fd for a moment, from whatever
// goroutine asks (netstack's, the watcher's), while the application may
// be opening one of its own.

// rtAttrs iterates over the rtnetlink attributes in b.
func rtAttrs(b []byte, each func(typ uint16, v []byte)) {
	for len(b) >= unix.SizeofRtAttr {
		l := int(binary.NativeEndian.Uint16(b))
		if l < unix.SizeofRtAttr || l > len(b) {
			return
		}
		each(binary.NativeEndian.Uint16(b[2:])&^unix.NLA_F_NESTED, b[unix.SizeofRtAttr:l])
		b = b[min(len(b), (l+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1)):]
	}
}

// rtAttr appends an rtnetlink attribute to req.
func rtAttr(req []byte, typ uint16, v []byte) []byte {
	l := unix.SizeofRtAttr + len(v)
	a := make([]byte, (l+unix.RTA_ALIGNTO-1)&^(unix.RTA_ALIGNTO-1))
	binary.NativeEndian.PutUint16(a, uint16(l))
	binary.NativeEndian.PutUint16(a[2:], typ)
	copy(a[unix.SizeofRtAttr:], v)
	return append(req, a...)
}

// rtMessage is a request of type typ with flags, a header of hdrLen bytes
// (filled by the caller) and room for attributes.
func rtMessage(typ, flags uint16, hdrLen int) []byte {
	req := make([]byte, unix.SizeofNlMsghdr+hdrLen)
	binary.NativeEndian.PutUint16(req[4:], typ)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|flags)
	return req
}

// routeDump is an rtnetlink dump request of type typ whose header (of
// hdrLen bytes) starts with family.
func routeDump(typ uint16, hdrLen int, family uint8) []byte {
	req := rtMessage(typ, unix.NLM_F_DUMP, hdrLen)
	req[unix.SizeofNlMsghdr] = family
	return req
}

// rtDo sends req (its length set here) and returns the payload of the
// answer: the one message a get answers with, or nil for an ack.
func (st *Stack) rtDo(req []byte) ([]byte, error) {
	st.nlMu.Lock()
	defer st.nlMu.Unlock()
	if st.nlFD < 0 {
		return nil, fmt.Errorf("rtnetlink: %w", ErrClosed)
	}
	st.nlSeq++
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint32(req[8:], st.nlSeq)
	if err := unix.Sendto(st.nlFD, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("rtnetlink: send: %w", err)
	}
	for {
		n, _, err := unix.Recvfrom(st.nlFD, st.nlBuf, 0)
		if err != nil {
			return nil, fmt.Errorf("rtnetlink: receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(st.nlBuf[:n])
		if err != nil {
			return nil, fmt.Errorf("rtnetlink: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != st.nlSeq {
				continue // an answer to an earlier request that gave up
			}
			if m.Header.Type == unix.NLMSG_ERROR {
				if len(m.Data) >= 4 {
					if e := unix.Errno(-int32(binary.NativeEndian.Uint32(m.Data))); e != 0 {
						return nil, e
					}
				}
				return nil, nil
			}
			return append([]byte(nil), m.Data...), nil
		}
	}
}

// rtDump is sockdiag.Dump on the stack's netlink socket.
func (st *Stack) rtDump(req []byte, each func(data []byte)) error {
	st.nlMu.Lock()
	defer st.nlMu.Unlock()
	if st.nlFD < 0 {
		return fmt.Errorf("rtnetlink: %w", ErrClosed)
	}
	st.nlSeq++
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint32(req[8:], st.nlSeq)
	return sockdiag.Dump(st.nlFD, req, st.nlBuf, each)
}

// rtRoute is what the kernel's route to dst says.
type rtRoute struct {
	oif       int
	local     bool // RTN_LOCAL: dst is this host's
	broadcast bool // RTN_BROADCAST: dst is a subnet's broadcast address
	gw, src   netip.Addr
}

// routeGet asks the kernel for its route to dst (through the stack's
// interface, for a multicast group, as the kernel wants an output
// interface there).
func (st *Stack) routeGet(dst netip.Addr) (rtRoute, error) {
	req := rtMessage(unix.RTM_GETROUTE, 0, unix.SizeofRtMsg)
	rt := req[unix.SizeofNlMsghdr:]
	rt[0], rt[1] = unix.AF_INET, 32 // family, dst_len
	a := dst.As4()
	req = rtAttr(req, unix.RTA_DST, a[:])
	if dst.IsMulticast() {
		var oif [4]byte
		binary.NativeEndian.PutUint32(oif[:], uint32(st.ifindex))
		req = rtAttr(req, unix.RTA_OIF, oif[:])
	}
	data, err := st.rtDo(req)
	if err != nil {
		return rtRoute{}, err
	}
	if len(data) < unix.SizeofRtMsg {
		return rtRoute{}, fmt.Errorf("rtnetlink: short route answer")
	}
	r := rtRoute{local: data[7] == unix.RTN_LOCAL, broadcast: data[7] == unix.RTN_BROADCAST}
	rtAttrs(data[unix.SizeofRtMsg:], func(typ uint16, v []byte) {
		switch {
		case typ == unix.RTA_OIF && len(v) >= 4:
			r.oif = int(binary.NativeEndian.Uint32(v))
		case typ == unix.RTA_GATEWAY && len(v) == 4:
			r.gw = netip.AddrFrom4([4]byte(v))
		case typ == unix.RTA_PREFSRC && len(v) == 4:
			r.src = netip.AddrFrom4([4]byte(v))
		}
	})
	return r, nil
}

// neighbourNow returns hop's MAC from the kernel's neighbour table when
// the kernel has a usable entry for it; failed says the kernel has given
// up on hop (NUD_FAILED: its ARP requests went unanswered).
func (st *Stack) neighbourNow(hop netip.Addr) (mac header.MAC, ok, failed bool) {
	const usable = unix.NUD_REACHABLE | unix.NUD_STALE | unix.NUD_DELAY | unix.NUD_PROBE | unix.NUD_PERMANENT | unix.NUD_NOARP
	req := rtMessage(unix.RTM_GETNEIGH, unix.NLM_F_DUMP, unix.SizeofNdMsg)
	req[unix.SizeofNlMsghdr] = unix.AF_INET
	err := st.rtDump(req, func(data []byte) {
		if ok || failed || len(data) < unix.SizeofNdMsg || int(int32(binary.NativeEndian.Uint32(data[4:]))) != st.ifindex {
			return
		}
		state := binary.NativeEndian.Uint16(data[8:])
		var ip netip.Addr
		var ll []byte
		rtAttrs(data[unix.SizeofNdMsg:], func(typ uint16, v []byte) {
			switch {
			case typ == unix.NDA_DST && len(v) == 4:
				ip = netip.AddrFrom4([4]byte(v))
			case typ == unix.NDA_LLADDR:
				ll = v
			}
		})
		switch {
		case ip != hop:
		case state&usable != 0 && len(ll) == 6:
			mac, ok = header.MAC(ll), true
		case state&unix.NUD_FAILED != 0:
			failed = true
		}
	})
	if err != nil {
		return mac, false, false
	}
	return mac, ok, failed
}

// neighbourUse asks the kernel to resolve hop (NTF_USE: it sends its ARP
// request, as its own first packet to that neighbour would).
func (st *Stack) neighbourUse(hop netip.Addr) error {
	req := rtMessage(unix.RTM_NEWNEIGH, unix.NLM_F_CREATE|unix.NLM_F_REPLACE|unix.NLM_F_ACK, unix.SizeofNdMsg)
	nd := req[unix.SizeofNlMsghdr:]
	nd[0] = unix.AF_INET
	binary.NativeEndian.PutUint32(nd[4:], uint32(st.ifindex))
	nd[10] = unix.NTF_USE
	a := hop.As4()
	req = rtAttr(req, unix.NDA_DST, a[:])
	_, err := st.rtDo(req)
	return err
}
