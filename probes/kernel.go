package probes

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// ErrNotSupported: the kernel lacks what a collector needs.
var ErrNotSupported = errors.New("not supported by this kernel")

var kernelBTF = sync.OnceValues(btf.LoadKernelSpec)

// checkArgs compares a tracepoint's arguments in the kernel's BTF with what
// nettrace.c reads.
func checkArgs(p *Probe) error {
	spec, err := kernelBTF()
	if err != nil {
		return fmt.Errorf("kernel BTF: %w", err)
	}
	var td *btf.Typedef
	if err := spec.TypeByName("btf_trace_"+p.Event(), &td); err != nil {
		return fmt.Errorf("%s: no such tracepoint in the kernel's BTF: %w", p.Name, ErrNotSupported)
	}
	ptr, ok := td.Type.(*btf.Pointer)
	if !ok {
		return fmt.Errorf("%s: btf_trace_%s is %s, not a function pointer", p.Name, p.Event(), td.Type)
	}
	fp, ok := ptr.Target.(*btf.FuncProto)
	if !ok {
		return fmt.Errorf("%s: btf_trace_%s points to %s, not a function", p.Name, p.Event(), ptr.Target)
	}
	// The first parameter is the tracepoint's private data.
	var have []string
	for _, param := range fp.Params[1:] {
		have = append(have, typeName(param.Type))
	}
	if len(have) < len(p.Args) {
		return fmt.Errorf("%s: the kernel passes (%s), nettrace reads (%s): %w", p.Name, strings.Join(have, ", "), strings.Join(p.Args, ", "), ErrNotSupported)
	}
	for i, want := range p.Args {
		if want == "*" && strings.HasPrefix(have[i], "*") || want == have[i] {
			continue
		}
		return fmt.Errorf("%s: argument %d is %s in the kernel, nettrace reads %s: %w", p.Name, i+1, have[i], want, ErrNotSupported)
	}
	return nil
}

// typeName names a BTF type the way Probe.Args does.
func typeName(t btf.Type) string {
	t = btf.UnderlyingType(btf.QualifiedType(t))
	switch t := t.(type) {
	case *btf.Pointer:
		target := btf.QualifiedType(t.Target)
		if td, ok := target.(*btf.Typedef); ok {
			return "*" + td.Name
		}
		return "*" + target.TypeName()
	case *btf.Enum:
		return "enum " + t.Name
	}
	return t.TypeName()
}

// DropReasons returns the kernel's drop-reason names by value, from BTF
// (enum skb_drop_reason) or else from the kfree_skb tracepoint's format
// file, and which of the two it used.
func DropReasons() (map[uint32]string, string, error) {
	if spec, err := kernelBTF(); err == nil {
		var e *btf.Enum
		if err := spec.TypeByName("skb_drop_reason", &e); err == nil {
			names := make(map[uint32]string, len(e.Values))
			for _, v := range e.Values {
				name, ok := strings.CutPrefix(v.Name, "SKB_DROP_REASON_")
				if !ok || strings.HasPrefix(name, "SUBSYS_") {
					continue
				}
				names[uint32(v.Value)] = name
			}
			return names, "btf", nil
		}
	}
	return dropReasonsTracefs()
}

var symbolicEntry = regexp.MustCompile(`\{\s*(\d+),\s*"([A-Z0-9_]+)"\s*\}`)

func dropReasonsTracefs() (map[uint32]string, string, error) {
	path := TracefsDir() + "/events/skb/kfree_skb/format"
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("drop reasons: no BTF enum skb_drop_reason and %w", err)
	}
	names := make(map[uint32]string)
	for _, m := range symbolicEntry.FindAllStringSubmatch(string(b), -1) {
		v, err := strconv.ParseUint(m[1], 10, 32)
		if err != nil {
			continue
		}
		names[uint32(v)] = m[2]
	}
	if len(names) == 0 {
		return nil, "", fmt.Errorf("drop reasons: %s has no reason table", path)
	}
	return names, "tracefs", nil
}

// TracefsDir returns where tracefs is mounted, mounting it at
// /sys/kernel/tracing when it is absent.
func TracefsDir() string {
	for _, d := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		if _, err := os.Stat(d + "/events"); err == nil {
			return d
		}
	}
	mountTracefs()
	return "/sys/kernel/tracing"
}

// Features reports, once per process, which attach methods the kernel
// offers besides tracepoints.
type Features struct {
	Kprobe error // nil when kprobes work
	Fentry error // nil when fentry programs load
}

// Probe the features once: they do not change while we run.
var features = sync.OnceValue(func() Features {
	var f Features
	if _, err := os.Stat("/sys/bus/event_source/devices/kprobe/type"); err != nil {
		f.Kprobe = fmt.Errorf("kprobes: no kprobe PMU (CONFIG_KPROBES off?): %w", ErrNotSupported)
	}
	f.Fentry = probeFentry()
	return f
})

// KernelFeatures returns the cached feature probes.
func KernelFeatures() Features { return features() }

// probeFentry loads a do-nothing fentry program on netif_receive_skb.
func probeFentry() error {
	prog, err := ebpf.NewProgramWithOptions(&ebpf.ProgramSpec{
		Type:         ebpf.Tracing,
		AttachType:   ebpf.AttachTraceFEntry,
		AttachTo:     "netif_receive_skb",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
		License:      "GPL",
	}, ebpf.ProgramOptions{LogDisabled: true})
	if err != nil {
		return fmt.Errorf("fentry: loading refused (%v): %w", err, ErrNotSupported)
	}
	prog.Close()
	return nil
}

// mountTracefs mounts tracefs where the kernel documents it; a failure
// shows later as a missing events directory, named with its path.
func mountTracefs() {
	_ = unix.Mount("nodev", "/sys/kernel/tracing", "tracefs", 0, "")
}
