package stack

import (
	"net/netip"
	"time"
)

// CallsInside is how many calls are using c's descriptors now.
func CallsInside(c *UDPConn) int64 { return c.use.Load() &^ useClosing }

// ExpireNextHops makes every cached next hop expired, as 30 s later.
func ExpireNextHops(st *Stack) {
	st.hops.mu.Lock()
	defer st.hops.mu.Unlock()
	m := map[netip.Addr]nextHop{}
	for k, v := range *st.hops.m.Load() {
		v.expires = time.Now().UnixNano() - 1
		m[k] = v
	}
	st.hops.m.Store(&m)
}

// WaitNextHopRefreshes waits for the background next-hop lookups.
func WaitNextHopRefreshes(st *Stack) { st.hops.refreshes.Wait() }
