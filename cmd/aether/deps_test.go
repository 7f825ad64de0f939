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
