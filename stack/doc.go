// Package stack is vmaxdp's user-space network stack: Ethernet, IPv4 and
// UDP over the packet queues of package backend, with sockets in the style
// of package net, and TCP through gVisor's netstack on the same queues.
//
// A Stack serves one interface. It attaches the steering program (package
// steer) and opens one backend queue per interface queue; every socket adds
// a steering rule for its flow, so the XDP program hands the stack exactly
// the packets its sockets want and the kernel keeps everything else.
//
// Each socket also holds a kernel UDP socket bound to the same address and
// port. It reserves the port, and it receives what the XDP path never sees
// (fragments, which the kernel reassembles; loopback; other interfaces) and
// what the stack cannot send itself (destinations behind other interfaces,
// datagrams larger than the MTU): the socket reads and writes it too, so no
// datagram is lost by taking the fast path.
//
// TCP is gVisor's netstack (tcplink.go; listeners and dialing in tcp.go;
// connections in tcpconn.go, as net.Conn and with the kernel's calls for
// the engine): the stack is its link, handing it the TCP packets its
// rules bring (a listener's address:port, each connection's 5-tuple) and
// sending its packets with the next hop's Ethernet header. A listener
// listens in the kernel too, for connections that come another way; a
// connection the stack opens holds its port in a kernel socket. A closed
// connection keeps its rule until netstack is done with it, so that the
// peer's last segments never meet the kernel.
// While TCP sockets exist, goroutines parked in Go's netpoller drain the
// queues for them. An established connection can move to a kernel socket
// (tcprepair.go: TCP_REPAIR), for a forked child to share it.
//
// Transmit kicks are coalesced (kick.go, Options.TxKickDelay).
//
// Concurrency: one receive lock serialises the receive side of all queues
// and the receive queues of all sockets; each queue has a transmit lock.
// Any goroutine that reads a socket drives the receive side itself (there
// is no background poller, as in VMA), so a datagram travels from the RX
// ring to the reader's buffer on the reader's thread. Sockets are safe for
// concurrent use. The receive and send paths allocate nothing.
//
// What this package must not do: touch a packet the steering program did
// not hand it, or drop one without counting it.
package stack
