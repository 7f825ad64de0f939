package main

import (
	"os/exec"
	"strings"
	"testing"
)

// testutilRoot is the tree of packages written only for tests: they start
// embedded servers, skip hardening and may panic on misuse, so nothing that
// ships may link them.
const testutilRoot = "github.com/aethermesh/aether/internal/testutil"

// testOnlyDeps returns the packages under testutilRoot that pkg links,
// as the go command resolves them for a build (test files excluded).
func testOnlyDeps(t *testing.T, pkg string) []string {
	t.Helper()
	// go test puts its own GOROOT/bin first in the PATH of the test binary,
	// so this is the same toolchain that built the test.
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
	}
	var found []string
	for _, p := range strings.Fields(string(out)) {
		if p == testutilRoot || strings.HasPrefix(p, testutilRoot+"/") {
			found = append(found, p)
		}
	}
	return found
}

// The shipping binary includes the benchmark harness, which partitions etcd
// through a fault proxy at run time; a harness helper put back under
// internal/testutil would pull test-only code into the binary.
func TestBinaryLinksNoTestOnlyPackage(t *testing.T) {
	if found := testOnlyDeps(t, "."); len(found) > 0 {
		t.Fatalf("cmd/aether links test-only packages: %v", found)
	}
}

// The check must see a test-only package when one is linked: a package links
// itself, so listing regtest must report regtest.
func TestTestOnlyDepsCatchesALinkedTestutilPackage(t *testing.T) {
	found := testOnlyDeps(t, testutilRoot+"/regtest")
	want := testutilRoot + "/regtest"
	for _, p := range found {
		if p == want {
			return
		}
	}
	t.Fatalf("testOnlyDeps(regtest) = %v, want it to include %s", found, want)
}

// module is this module's path.
const module = "github.com/aethermesh/aether"

// etcdRoots are etcd's client and server: the packages only the etcd
// backend and the composition root above it may link. Everything below
// the root (the replica, its gRPC adapter, the core, the client, the
// agent) speaks package backend, so a second backend replaces etcd by
// adding a package rather than by untangling imports.
var etcdRoots = []string{"go.etcd.io/etcd/client/v3", "go.etcd.io/etcd/server/v3"}

// etcdAllowed are the module's subtrees that may link etcdRoots: the etcd
// backend, the composition root, the binary and its command line (which
// start the root), the benchmark harness and the disruption battery and
// end-to-end tests (which start processes and disturb their etcd), the
// tools, the test utilities, and the edge store, which is an etcd server
// itself: it serves etcd's Lock and Election services through etcd's own
// v3lock/v3election packages (written against clientv3 over an in-process
// adapter) and takes etcd's id and URL helpers, while its core links only
// etcd's API protos (edge/internal/core's own deps test says so).
var etcdAllowed = []string{
	"backend/etcd", "server", "cmd/aether", "internal/cli", "edge",
	"bench", "disruption", "e2e", "tools", "internal/testutil",
}

// importGraph is each package the module's packages link, with its direct
// imports, as `go list -deps` resolves them for a build (test files
// excluded: a test may start an etcd), and the module's own packages as
// `go list ./...` lists them.
func importGraph(t *testing.T) (imports map[string][]string, pkgs []string) {
	t.Helper()
	run := func(args ...string) string {
		out, err := exec.Command("go", args...).Output()
		if err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	imports = map[string][]string{}
	for _, line := range strings.Split(run("list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", module+"/..."), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			imports[f[0]] = f[1:]
		}
	}
	return imports, strings.Fields(run("list", module+"/..."))
}

// etcdViolations returns, for each of pkgs outside etcdAllowed that links
// one of etcdRoots, the chain of imports through which it does, so the
// message names the import to cut.
func etcdViolations(imports map[string][]string, pkgs []string) []string {
	var bad []string
	for _, p := range pkgs {
		if underAny(strings.TrimPrefix(strings.TrimPrefix(p, module), "/"), etcdAllowed) {
			continue
		}
		// Breadth first, so that the chain reported is a shortest one.
		via := map[string]string{p: ""}
		queue := []string{p}
		for len(queue) > 0 {
			cur := queue[0]
			queue = queue[1:]
			if underAny(cur, etcdRoots) {
				chain := []string{cur}
				for at := via[cur]; at != ""; at = via[at] {
					chain = append([]string{at}, chain...)
				}
				bad = append(bad, strings.Join(chain, " -> "))
				break
			}
			for _, next := range imports[cur] {
				if _, seen := via[next]; !seen {
					via[next] = cur
					queue = append(queue, next)
				}
			}
		}
	}
	return bad
}

// underAny reports whether path is one of roots or inside one of them
// (by whole path elements: backend/etcdx is not under backend/etcd).
func underAny(path string, roots []string) bool {
	for _, r := range roots {
		if path == r || strings.HasPrefix(path, r+"/") {
			return true
		}
	}
	return false
}

// Only the etcd backend and the composition root above it link etcd's
// client or server.
func TestOnlyTheEtcdBackendAndTheRootLinkEtcd(t *testing.T) {
	imports, pkgs := importGraph(t)
	if len(pkgs) == 0 || imports[module+"/registrar"] == nil {
		t.Fatalf("go list found no packages of %s (%d listed)", module, len(pkgs))
	}
	for _, v := range etcdViolations(imports, pkgs) {
		t.Errorf("links etcd below the composition root: %s", v)
	}
}

// The check must see a violation: a replica that imports the replicator
// again (as it did to report replication status) links etcd's client, and
// is reported with the chain; the root importing the same is not.
func TestEtcdViolationsCatchesALinkedEtcdClient(t *testing.T) {
	imports := map[string][]string{
		module + "/registrar":                   {module + "/backend", module + "/backend/etcd/replicator"},
		module + "/backend":                     nil,
		module + "/backend/etcd/replicator":     {"go.etcd.io/etcd/client/v3/concurrency"},
		"go.etcd.io/etcd/client/v3/concurrency": {"go.etcd.io/etcd/client/v3"},
		module + "/server":                      {module + "/registrar", "go.etcd.io/etcd/server/v3/embed"},
		module + "/backend/etcdx":               {"go.etcd.io/etcd/client/v3"},
	}
	pkgs := []string{module + "/registrar", module + "/backend", module + "/backend/etcd/replicator", module + "/server", module + "/backend/etcdx"}
	got := etcdViolations(imports, pkgs)
	want := []string{
		module + "/registrar -> " + module + "/backend/etcd/replicator -> go.etcd.io/etcd/client/v3/concurrency",
		module + "/backend/etcdx -> go.etcd.io/etcd/client/v3",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("etcdViolations =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
