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

// The core must stay pure: it decides, the edge shell does the I/O and the
// storage package the disk. Whatever the core could reach of the network,
// the disk, the clock or a goroutine would make its answers depend on them,
// and replay would stop being exact. These tests hold it to that.

const (
	module  = "github.com/aethermesh/aether"
	corePkg = module + "/edge/internal/core"
)

// forbiddenImport reports why the core may not import path directly ("" if
// it may): the network, the disk, the system, randomness, logging, and the
// parts of etcd that are a server, a client or a database. The etcd API
// packages (request and response types, error values) are its vocabulary.
func forbiddenImport(path string) string {
	for _, p := range []string{"net", "os", "io/fs", "io/ioutil", "syscall", "path/filepath", "crypto/rand", "math/rand", "log", "google.golang.org/grpc"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return "does I/O (network, disk, system, randomness or logging)"
		}
	}
	return ""
}

// checkDeps returns the violations in the direct imports and the whole
// dependency list. The whole list necessarily holds os and syscall (fmt,
// time), and grpc's status package (rpctypes' errors are gRPC statuses), so
// for it only etcd's server, client and storage and this module's other
// packages are checked: that is where a store or a loop would come in.
func checkDeps(imports, deps []string) []string {
	var bad []string
	for _, p := range imports {
		if why := forbiddenImport(p); why != "" {
			bad = append(bad, "imports "+p+": "+why)
		}
	}
	for _, p := range deps {
		switch {
		case strings.HasPrefix(p, "go.etcd.io/etcd/server/"), strings.HasPrefix(p, "go.etcd.io/etcd/client/"),
			strings.HasPrefix(p, "go.etcd.io/bbolt"), strings.HasPrefix(p, "go.etcd.io/raft"):
			bad = append(bad, "depends on "+p+": a server, client or database")
		case strings.HasPrefix(p, module+"/") && p != corePkg:
			bad = append(bad, "depends on "+p+": the core stands alone")
		}
	}
	return bad
}

// clockCalls are the time functions that read or wait on the clock;
// time.Time and time.Duration values are fine: "now" is an argument.
var clockCalls = map[string]bool{
	"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true,
	"Tick": true, "NewTimer": true, "NewTicker": true, "AfterFunc": true,
}

// impurities returns where the Go source src (named name) reads or waits
// on the clock, under whatever name it imports package time, or starts a
// goroutine.
func impurities(fset *token.FileSet, name string, src any) ([]string, error) {
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var local, bad []string
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
		switch n := n.(type) {
		case *ast.GoStmt:
			bad = append(bad, fset.Position(n.Pos()).String()+": go statement")
		case *ast.SelectorExpr:
			if x, ok := n.X.(*ast.Ident); ok && clockCalls[n.Sel.Name] {
				for _, l := range local {
					if x.Name == l {
						bad = append(bad, fset.Position(n.Pos()).String()+": time."+n.Sel.Name)
					}
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
	imports := goList(t, "-f", `{{join .Imports " "}}`, corePkg)
	deps := goList(t, "-deps", corePkg)
	if len(deps) < len(imports) || len(imports) == 0 {
		t.Fatalf("go list found %d imports and %d deps: not the core package", len(imports), len(deps))
	}
	for _, v := range checkDeps(imports, deps) {
		t.Error(v)
	}
}

func TestCoreReadsNoClockStartsNoGoroutine(t *testing.T) {
	t.Parallel()
	files := goList(t, "-f", `{{range .GoFiles}}{{$.Dir}}/{{.}} {{end}}`, corePkg)
	if len(files) < 5 {
		t.Fatalf("found only %d source files", len(files))
	}
	fset := token.NewFileSet()
	for _, f := range files {
		bad, err := impurities(fset, f, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range bad {
			t.Errorf("%s: take the time as an argument; leave goroutines to the shell", filepath.Base(b))
		}
	}
}

// The checks catch what they are for: a test that could not fail would
// prove nothing.
func TestPurityChecksCatchViolations(t *testing.T) {
	if bad := checkDeps(
		[]string{"fmt", "net/http", "os", "time", "go.etcd.io/etcd/api/v3/mvccpb"},
		[]string{"fmt", "go.etcd.io/etcd/server/v3/mvcc", "go.etcd.io/bbolt", module + "/edge/internal/storage", "go.etcd.io/etcd/api/v3/mvccpb"},
	); len(bad) != 5 {
		t.Errorf("checkDeps found %d violations, want 5 (net/http and os imported; etcd's server, bbolt and storage depended on): %q", len(bad), bad)
	}
	if bad := checkDeps([]string{"fmt", "time", "crypto/sha256", "go.etcd.io/etcd/api/v3/v3rpc/rpctypes"},
		[]string{"os", "syscall", "google.golang.org/grpc/status", corePkg}); len(bad) != 0 {
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
	go f(time.Time{})
}
`
	bad, err := impurities(token.NewFileSet(), "p.go", src)
	if err != nil {
		t.Fatal(err)
	}
	if len(bad) != 3 {
		t.Fatalf("found %q, want time.Now, time.After and the go statement", bad)
	}
}
