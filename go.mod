module github.com/vmaxdp/vmaxdp

go 1.26.0

require (
	github.com/cilium/ebpf v0.22.0
	github.com/vishvananda/netlink v1.3.1
	github.com/vishvananda/netns v0.0.5
	golang.org/x/sys v0.49.0
)

require (
	github.com/gopacket/gopacket v1.7.7
	github.com/safchain/ethtool v0.7.0
)

require golang.org/x/net v0.55.0 // indirect
