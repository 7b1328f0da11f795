// Package bpf holds the eBPF programs of vmaxdp, compiled by bpf2go.
//
// The compiled objects (*_bpfel.o) and their Go bindings are committed so
// that a plain `go build` needs no clang; `make generate` rebuilds them and
// `make check-generate` fails when the committed output is stale. This
// package only loads specs: attaching, pinning and reading counters belong
// to the packages that own those objects (steer/ for the steering program).
package bpf

//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc ${BPF_CLANG} -cflags ${BPF_CFLAGS} -target bpfel -type flow_key -type rule_value -type rule_counters -type prog_counters Steer steer.c
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc ${BPF_CLANG} -cflags ${BPF_CFLAGS} -target bpfel -type event -type probe_counters -type agg_key Nettrace nettrace.c
