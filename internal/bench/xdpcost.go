package bench

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	vbpf "github.com/vmaxdp/vmaxdp/bpf"
	"github.com/vmaxdp/vmaxdp/stack/header"
	"github.com/vmaxdp/vmaxdp/steer"
	"github.com/vmaxdp/vmaxdp/testbed"
)

// XDPCost measures what the steering program costs a packet it passes to
// the kernel, against the empty XDP_PASS program, with BPF_PROG_TEST_RUN:
// the kernel runs each program on the same UDP frame to a port no rule
// names (with a rule installed on another port, as in real use) and
// reports its time per run. Test runs measure the program alone, without
// the noise of the packet path around it. The result's "rates" are runs
// per second: Kernel is vmaxdp_pass, Vmaxdp is vmaxdp_steer; the ratio's
// distance below 1 is the steering overhead.
func XDPCost(_ *testbed.Bed, opts *Options) (Result, error) {
	o := opts.defaults()
	r := Result{Name: "xdpcost", Unit: "runs/s"}
	var objs vbpf.SteerObjects
	if err := vbpf.LoadSteerObjects(&objs, nil); err != nil {
		return r, fmt.Errorf("xdpcost: load: %w", err)
	}
	defer objs.Close()
	k := vbpf.SteerFlowKey{Proto: unix.IPPROTO_UDP, LocalPort: 0x6100}
	if err := objs.RulesPort.Put(k, vbpf.SteerRuleValue{}); err != nil {
		return r, err
	}
	if err := objs.ActivePorts.Put(uint32(97), uint32(1)); err != nil {
		return r, err
	}
	frame := make([]byte, header.UDPHeadersLen+o.Size)
	frame = frame[:header.BuildUDP(frame, &header.UDPFields{
		Src: netip.MustParseAddrPort("198.18.0.1:9"), Dst: netip.MustParseAddrPort("198.18.0.2:7777"), TTL: 64,
	}, o.Size)]
	rate := func(p *ebpf.Program) (float64, error) {
		const repeat = 1_000_000
		best := time.Duration(1<<63 - 1)
		for i := 0; i < 5; i++ { // best of five: the least disturbed run
			ret, d, err := p.Benchmark(frame, repeat, nil)
			if err != nil {
				return 0, fmt.Errorf("xdpcost: test run: %w", err)
			}
			if ret != 2 { // XDP_PASS
				return 0, fmt.Errorf("xdpcost: program returned %d, want XDP_PASS", ret)
			}
			best = min(best, d)
		}
		return float64(time.Second) / float64(best), nil
	}
	var err error
	if r.Kernel, err = rate(objs.VmaxdpPass); err != nil {
		return r, err
	}
	if r.Vmaxdp, err = rate(objs.VmaxdpSteer); err != nil {
		return r, err
	}
	var pc []vbpf.SteerProgCounters
	if err := objs.ProgStats.Lookup(uint32(0), &pc); err != nil {
		return r, err
	}
	if c, _ := steer.ReadProgCounters(objs.ProgStats); c.Redirected != 0 {
		return r, fmt.Errorf("xdpcost: the frame was redirected: %+v", c)
	}
	return r, nil
}
