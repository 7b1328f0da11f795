// Package probes loads and runs nettrace's eBPF collectors on the kernel's
// packet path (bpf/nettrace.c) and hands their raw events to a caller.
//
// Collectors attach as BTF-typed tracepoints (tp_btf): they are cheap,
// stable across releases, and their arguments and the kernel structures
// they read are relocated against the running kernel's BTF. Before loading,
// each tracepoint's argument list is checked against BTF, so that a kernel
// whose tracepoint changed gets a clear "not attached" note instead of
// wrong fields. kprobes and fentry are feature-probed once and reported
// when absent.
//
// The package must not format or store events: tracefile/ owns the file
// format, and internal/record the recording pipeline.
package probes
