package stack

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestTCPInlineSignatures checks that the netstack functions tcpinline.go
// reaches with go:linkname have, in the gVisor go.mod pins, the
// signatures it declares: the linker does not check them, and a mismatch
// would corrupt memory, not fail the build.
func TestTCPInlineSignatures(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gvisor.dev/gvisor").Output()
	if err != nil {
		t.Skipf("go list -m gvisor.dev/gvisor: %v (the module's source is needed)", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "pkg", "tcpip", "transport", "tcp")
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", dir, err)
	}
	want := map[string]string{
		"(*Endpoint).handleSegmentsLocked":     "func() tcpip.Error",
		"(*Endpoint).resetConnectionLocked":    "func(err tcpip.Error)",
		"(*Endpoint).drainClosingSegmentQueue": "func()",
		"startTimeWait":                        "func(ep *Endpoint)",
	}
	got := map[string]string{}
	for _, f := range pkgs["tcp"].Files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			name := fn.Name.Name
			if fn.Recv != nil {
				var b bytes.Buffer
				printer.Fprint(&b, fset, fn.Recv.List[0].Type)
				name = "(" + b.String() + ")." + name
			}
			if _, ok := want[name]; !ok {
				continue
			}
			var b bytes.Buffer
			printer.Fprint(&b, fset, fn.Type)
			got[name] = b.String()
		}
	}
	for name, sig := range want {
		if got[name] != sig {
			t.Errorf("gvisor tcp.%s is %q, tcpinline.go declares %q: change the go:linkname declarations with it", name, got[name], sig)
		}
	}
}
