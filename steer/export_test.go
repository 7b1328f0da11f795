package steer

import (
	"github.com/cilium/ebpf"

	vbpf "github.com/vmaxdp/vmaxdp/bpf"
)

// Run runs the attached program on one frame (BPF_PROG_TEST_RUN) and
// returns its XDP verdict.
func (p *Program) Run(frame []byte) (uint32, error) {
	return p.prog.Run(&ebpf.RunOptions{Data: frame})
}

// HandoverFlows counts the entries of handover_flows.
func (p *Program) HandoverFlows() (int, error) {
	var (
		k vbpf.SteerFlowKey
		v uint32
		n int
	)
	it := p.objs.HandoverFlows.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n, it.Err()
}

// VerifiedInstructions is how many instructions the verifier processed
// as it loaded the attached program.
func (p *Program) VerifiedInstructions() (uint64, error) {
	info, err := p.prog.Info()
	if err != nil {
		return 0, err
	}
	n, ok := info.VerifiedInstructions()
	if !ok {
		return 0, ebpf.ErrNotSupported
	}
	return uint64(n), nil
}
