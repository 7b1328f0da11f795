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

// TestTCPInlineSignatures checks that every netstack function tcpinline.go
// reaches with go:linkname has, in the gVisor go.mod pins, the signature
// tcpinline.go declares for it (a method's receiver as the first
// parameter): the linker does not check them, and a mismatch would
// corrupt memory, not fail the build. The list is tcpinline.go's own
// directives, so a function added there is checked too.
func TestTCPInlineSignatures(t *testing.T) {
	fset := token.NewFileSet()
	ours, err := parser.ParseFile(fset, "tcpinline.go", nil, parser.ParseComments|parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	const pkg = "gvisor.dev/gvisor/pkg/tcpip/transport/tcp."
	names := strings.NewReplacer("tcp.", "", "netstackSegmentQueue", "segmentQueue", "netstackSegment", "segment")
	want := map[string]string{} // gVisor's name ("(*Endpoint).f", "f") -> signature
	for _, d := range ours.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Doc == nil {
			continue
		}
		for _, c := range fn.Doc.List {
			target, ok := strings.CutPrefix(c.Text, "//go:linkname "+fn.Name.Name+" "+pkg)
			if ok {
				// Our declarations name netstack's types tcp.X, and
				// its unexported ones netstackX; its own source, X.
				want[target] = names.Replace(signature(fset, nil, fn.Type))
			}
		}
	}
	if len(want) == 0 {
		t.Fatal("tcpinline.go declares no go:linkname of netstack's tcp package")
	}

	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gvisor.dev/gvisor").Output()
	if err != nil {
		t.Fatalf("go list -m gvisor.dev/gvisor: %v (the module's source is what the signatures are checked against: make deps)", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "pkg", "tcpip", "transport", "tcp")
	pkgs, err := parser.ParseDir(fset, dir, nil, parser.SkipObjectResolution)
	if err != nil {
		t.Fatalf("parse %s: %v", dir, err)
	}
	got := map[string]string{}
	for _, f := range pkgs["tcp"].Files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			name := fn.Name.Name
			var recv ast.Expr
			if fn.Recv != nil {
				recv = fn.Recv.List[0].Type
				name = "(" + printed(fset, recv) + ")." + name
			}
			if _, ok := want[name]; ok {
				got[name] = signature(fset, recv, fn.Type)
			}
		}
	}
	for name, sig := range want {
		if got[name] != sig {
			t.Errorf("gvisor tcp.%s is %q, tcpinline.go declares %q: change its go:linkname declaration with it", name, got[name], sig)
		}
	}
}

// signature is a function's parameter and result types, recv first.
func signature(fset *token.FileSet, recv ast.Expr, ft *ast.FuncType) string {
	var params []string
	if recv != nil {
		params = append(params, printed(fset, recv))
	}
	for _, f := range ft.Params.List {
		for range max(1, len(f.Names)) {
			params = append(params, printed(fset, f.Type))
		}
	}
	var results []string
	if ft.Results != nil {
		for _, f := range ft.Results.List {
			for range max(1, len(f.Names)) {
				results = append(results, printed(fset, f.Type))
			}
		}
	}
	return "(" + strings.Join(params, ", ") + ") (" + strings.Join(results, ", ") + ")"
}

func printed(fset *token.FileSet, e ast.Expr) string {
	var b bytes.Buffer
	printer.Fprint(&b, fset, e)
	return b.String()
}

// TestSegmentQueueFound: the offset of netstack's segment queue in its
// endpoint is found in the gVisor go.mod pins (tcpinline.go); without it
// an event loop's processing builds every ACK again, silently.
func TestSegmentQueueFound(t *testing.T) {
	if segQueueOffset == 0 {
		t.Fatal("tcp.Endpoint has no field segmentQueue of type segmentQueue: read tcpinline.go's owed ACKs again for this gVisor")
	}
}
