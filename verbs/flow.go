package verbs

import (
	"encoding/binary"
	"fmt"
	"net"

	"golang.org/x/sys/unix"

	"github.com/vmaxdp/vmaxdp/steer"
)

// The flow specification types and layouts of rdma-core's
// <infiniband/verbs.h> (struct ibv_flow_attr and the ibv_flow_spec_*
// that follow it). Header fields are in host order, match values in
// network order. TestFlowSpecLayout checks every byte against the
// header with a C compiler.
const (
	flowAttrNormal = 0x0 // IBV_FLOW_ATTR_NORMAL

	specEth  = 0x20 // IBV_FLOW_SPEC_ETH
	specIPv4 = 0x30 // IBV_FLOW_SPEC_IPV4
	specTCP  = 0x40 // IBV_FLOW_SPEC_TCP
	specUDP  = 0x41 // IBV_FLOW_SPEC_UDP

	flowAttrLen = 20 // sizeof(struct ibv_flow_attr)
	specEthLen  = 40 // sizeof(struct ibv_flow_spec_eth)
	specIPv4Len = 24 // sizeof(struct ibv_flow_spec_ipv4)
	specL4Len   = 16 // sizeof(struct ibv_flow_spec_tcp_udp)

	// FlowLen is the length of every flow FlowSpec builds: the
	// attribute and its Ethernet, IPv4 and TCP or UDP specifications.
	FlowLen = flowAttrLen + specEthLen + specIPv4Len + specL4Len
)

// Flow priorities: a lower value wins, so that a connection's 5-tuple
// takes its packets from a listener's address and port, and that from a
// port rule, as the XDP program looks its maps up in that order.
const (
	priority5Tuple = 0
	priorityLocal  = 1 // 3-tuple and multicast group
	priorityPort   = 2
)

// FlowSpec encodes r as the argument of ibv_create_flow for the device
// port port (1-based) of an interface whose MAC is mac: a normal flow
// with Ethernet (destination MAC and IPv4 EtherType), IPv4 and TCP or UDP
// specifications. A unicast rule matches mac; a multicast one the
// group's MAC (01:00:5e and the group's low 23 bits).
func FlowSpec(r steer.Rule, port uint8, mac net.HardwareAddr) ([]byte, error) {
	var l4 uint32
	switch r.Proto {
	case unix.IPPROTO_UDP:
		l4 = specUDP
	case unix.IPPROTO_TCP:
		l4 = specTCP
	default:
		return nil, fmt.Errorf("flow for rule %s: protocol %d: want UDP or TCP", r, r.Proto)
	}
	if port == 0 {
		return nil, fmt.Errorf("flow for rule %s: device port 0 (ports count from 1)", r)
	}
	if len(mac) != 6 {
		return nil, fmt.Errorf("flow for rule %s: MAC %v: want 6 bytes", r, mac)
	}
	if r.Local.Port() == 0 {
		return nil, fmt.Errorf("flow for rule %s: local port 0", r)
	}
	local, remote := r.Local.Addr(), r.Remote.Addr()
	dst := [6]byte(mac)
	var localIP, remoteIP, localMask, remoteMask [4]byte
	var remotePort, remotePortMask uint16
	priority := uint16(priorityLocal)
	switch r.Kind {
	case steer.Rule5Tuple:
		if !local.Is4() || !remote.Is4() {
			return nil, fmt.Errorf("flow for rule %s: a 5-tuple needs IPv4 local and remote addresses", r)
		}
		localIP, localMask = local.As4(), [4]byte{0xff, 0xff, 0xff, 0xff}
		remoteIP, remoteMask = remote.As4(), [4]byte{0xff, 0xff, 0xff, 0xff}
		remotePort, remotePortMask = r.Remote.Port(), 0xffff
		priority = priority5Tuple
	case steer.Rule3Tuple:
		if !local.Is4() || local.IsMulticast() || local.IsUnspecified() {
			return nil, fmt.Errorf("flow for rule %s: needs an IPv4 unicast local address", r)
		}
		localIP, localMask = local.As4(), [4]byte{0xff, 0xff, 0xff, 0xff}
	case steer.RuleMcast:
		if !local.Is4() || !local.IsMulticast() {
			return nil, fmt.Errorf("flow for rule %s: not an IPv4 multicast group", r)
		}
		localIP, localMask = local.As4(), [4]byte{0xff, 0xff, 0xff, 0xff}
		dst = [6]byte{0x01, 0x00, 0x5e, localIP[1] & 0x7f, localIP[2], localIP[3]}
	case steer.RulePort:
		priority = priorityPort
	default:
		return nil, fmt.Errorf("flow for rule %s: kind %d unknown", r, r.Kind)
	}
	ne, be := binary.NativeEndian, binary.BigEndian
	b := make([]byte, FlowLen)

	// struct ibv_flow_attr
	ne.PutUint32(b[4:], flowAttrNormal)
	ne.PutUint16(b[8:], FlowLen)
	ne.PutUint16(b[10:], priority)
	b[12] = 3 // num_of_specs
	b[13] = port

	// struct ibv_flow_spec_eth: val and mask are struct
	// ibv_flow_eth_filter (dst_mac, src_mac, ether_type, vlan_tag).
	s := b[flowAttrLen:]
	ne.PutUint32(s[0:], specEth)
	ne.PutUint16(s[4:], specEthLen)
	copy(s[6:12], dst[:])
	be.PutUint16(s[18:], unix.ETH_P_IP)
	copy(s[22:28], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	be.PutUint16(s[34:], 0xffff)

	// struct ibv_flow_spec_ipv4: val and mask are struct
	// ibv_flow_ipv4_filter (src_ip, dst_ip).
	s = s[specEthLen:]
	ne.PutUint32(s[0:], specIPv4)
	ne.PutUint16(s[4:], specIPv4Len)
	copy(s[8:12], remoteIP[:])
	copy(s[12:16], localIP[:])
	copy(s[16:20], remoteMask[:])
	copy(s[20:24], localMask[:])

	// struct ibv_flow_spec_tcp_udp: val and mask are struct
	// ibv_flow_tcp_udp_filter (dst_port, src_port).
	s = s[specIPv4Len:]
	ne.PutUint32(s[0:], l4)
	ne.PutUint16(s[4:], specL4Len)
	be.PutUint16(s[6:], r.Local.Port())
	be.PutUint16(s[8:], remotePort)
	be.PutUint16(s[10:], 0xffff)
	be.PutUint16(s[12:], remotePortMask)
	return b, nil
}
