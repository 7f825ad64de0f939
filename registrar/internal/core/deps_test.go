package core

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The core must stay pure: it decides, the registrar's shell does the
// I/O. Whatever the core could reach of the network, the disk, the store or
// the clock would make its rules depend on them again, and its scenario
// scripts would stop being exact. These tests hold it to that.

const module = "github.com/aethermesh/aether"

// forbiddenImport reports why the core may not import path directly
// ("" when it may). The network, the disk, the system, randomness and the
// RPC stack are I/O; etcd is one particular store, which the core knows
// only through the neutral contract (package backend).
func forbiddenImport(path string) string {
	for _, p := range []string{"net", "os", "io/fs", "io/ioutil", "syscall", "path/filepath", "crypto/rand", "math/rand", "log", "google.golang.org/grpc", "go.etcd.io"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return "does I/O (network, disk, system, randomness or logging)"
		}
	}
	return ""
}

// allowedModulePackage reports whether the core may depend, at any depth,
// on this module's package path: the API messages, the neutral backend
// contract and the registry's rules, none of which does I/O.
func allowedModulePackage(path string) bool {
	switch {
	case path == module+"/backend", path == module+"/registry",
		strings.HasPrefix(path, module+"/api/"),
		path == module+"/registrar/internal/core":
		return true
	}
	return false
}

// checkDeps returns the violations in a package's direct imports and its
// whole dependency list. The whole list necessarily holds os, syscall and
// net (fmt opens os.Stdout, time reads zoneinfo files, the API package
// carries the gRPC service stubs), so for it only etcd and this module's
// other packages are checked: those are where a store or a loop would
// come in.
func checkDeps(imports, deps []string) []string {
	var bad []string
	for _, p := range imports {
		if why := forbiddenImport(p); why != "" {
			bad = append(bad, "imports "+p+": "+why)
		}
	}
	for _, p := range deps {
		switch {
		case strings.HasPrefix(p, "go.etcd.io/"):
			bad = append(bad, "depends on "+p+": etcd is a backend, reached only through package backend")
		case strings.HasPrefix(p, module+"/") && !allowedModulePackage(p):
			bad = append(bad, "depends on "+p+": not the API, the backend contract or the registry")
		}
	}
	return bad
}

// clockCalls are the time package's functions that read or wait on the
// clock. time.Time and time.Duration values are fine: the planners take
// "now" as an argument.
var clockCalls = map[string]bool{
	"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
	"Tick": true, "NewTimer": true, "NewTicker": true, "AfterFunc": true,
}

// clockUses returns where the Go source src (named name) reads or waits on
// the clock through package time, under whatever name it imports it.
func clockUses(fset *token.FileSet, name string, src any) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var local []string // the names package time goes by in this file
	var bad []string
	for _, im := range f.Imports {
		if p, _ := strconv.Unquote(im.Path.Value); p == "time" {
			switch {
			case im.Name == nil:
				local = append(local, "time")
			case im.Name.Name == ".":
				bad = append(bad, fset.Position(im.Pos()).String()+": dot-import of time")
			case im.Name.Name != "_":
				local = append(local, im.Name.Name)
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok || !clockCalls[sel.Sel.Name] {
			return true
		}
		if x, ok := sel.X.(*ast.Ident); ok {
			for _, l := range local {
				if x.Name == l {
					bad = append(bad, fset.Position(sel.Pos()).String()+": time."+sel.Sel.Name)
				}
			}
		}
		return true
	})
	return bad, nil
}

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			t.Fatalf("go list %v: %v\n%s", args, err, ee.Stderr)
		}
		t.Fatalf("go list %v: %v", args, err)
	}
	return strings.Fields(string(out))
}

func TestCoreImportsNoIO(t *testing.T) {
	t.Parallel()
	const pkg = module + "/registrar/internal/core"
	imports := goList(t, "-f", `{{join .Imports " "}}`, pkg)
	deps := goList(t, "-deps", pkg)
	if len(deps) < len(imports) || len(imports) == 0 {
		t.Fatalf("go list found %d imports and %d deps: not the core package", len(imports), len(deps))
	}
	for _, v := range checkDeps(imports, deps) {
		t.Error(v)
	}
}

func TestCoreReadsNoClock(t *testing.T) {
	t.Parallel()
	files := goList(t, "-f", `{{range .GoFiles}}{{$.Dir}}/{{.}} {{end}}`, module+"/registrar/internal/core")
	if len(files) < 5 {
		t.Fatalf("found only %d source files", len(files))
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		bad, err := clockUses(fset, f, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bad {
			t.Errorf("%s reads the clock: take the time as an argument", filepath.Base(b))
		}
	}
}

// The checks themselves catch what they are for: a test that could not
// fail would prove nothing.
func TestPurityChecksCatchViolations(t *testing.T) {
	if bad := checkDeps(
		[]string{"fmt", "net/http", "os", "time", "go.etcd.io/etcd/client/v3"},
		[]string{"fmt", "go.etcd.io/etcd/client/v3", module + "/backend/etcd", module + "/backend", module + "/api/registry/v1"},
	); len(bad) != 5 {
		t.Errorf("checkDeps found %d violations, want 5 (net/http, os and etcd imported; etcd and backend/etcd depended on): %q", len(bad), bad)
	}
	if bad := checkDeps([]string{"fmt", "time", module + "/backend"}, []string{"os", "syscall", "net", module + "/backend", module + "/registry"}); len(bad) != 0 {
		t.Errorf("checkDeps refused a clean package: %q", bad)
	}
	const src = `package p

import (
	"time"
	clock "time"
)

var d = time.Second // a value: fine

func f(now time.Time) time.Time { return now.Add(d) } // fine

func g() {
	_ = time.Now()
	<-clock.After(d)
	t := clock.NewTimer(d)
	_ = t
	_ = time.Since(time.Time{})
}
`
	bad, err := clockUses(token.NewFileSet(), "p.go", src)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"time.Now", "time.After", "time.NewTimer", "time.Since"}; len(bad) != len(want) {
		t.Fatalf("clockUses found %q, want the %d calls %q", bad, len(want), want)
	}
	dot, err := clockUses(token.NewFileSet(), "q.go", "package q\n\nimport . \"time\"\n\nvar _ = Second\n")
	if err != nil || len(dot) != 1 {
		t.Fatalf("dot-import of time: %q, %v; want it reported", dot, err)
	}
}
