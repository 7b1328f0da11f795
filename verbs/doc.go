// Package verbs is the groundwork of vmaxdp's second backend: RDMA verbs
// raw packet queue pairs with hardware flow rules, the way VMA runs on
// ConnectX NICs. It finds the RDMA device and port behind a network
// interface (sysfs), loads rdma-core's libibverbs, and encodes steering
// rules as ibv_create_flow specifications.
//
// libibverbs is loaded at run time (dlopen), not linked: the preload
// library goes into every program run under vmaxdp, and one binary must
// run on machines with and without rdma-core. A machine without it, or
// without a device, costs a few sysfs reads: the library is opened only
// once sysfs shows a device behind the interface.
//
// The datapath (protection domain, memory region over the frame pool,
// completion queue and channel, raw packet QP) is not written yet: Probe
// reports ErrNotSupported for a device it finds. Nothing here has run on
// RDMA hardware in this project's CI, which has none.
package verbs
