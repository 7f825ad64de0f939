//go:build tools

// Package tools pins etcd's own conformance suite, the tests/common package
// of go.etcd.io/etcd/tests/v3 v3.7.3, so run.sh can compile its test binary
// (go test -c -tags e2e) from this module. A package's tests are not part of
// its importers' module graph, so the packages its _test.go files import
// are imported here too, so that go.mod and go.sum hold them. It is a module
// of its own, so none of this enters the main go.mod.
package tools

import (
	_ "github.com/google/go-cmp/cmp"
	_ "github.com/stretchr/testify/assert"
	_ "github.com/stretchr/testify/require"
	_ "go.etcd.io/etcd/server/v3/etcdserver"
	_ "go.etcd.io/etcd/server/v3/etcdserver/txn"
	_ "go.etcd.io/etcd/server/v3/storage/mvcc/testutil"
	_ "go.etcd.io/etcd/tests/v3/common"
	_ "go.etcd.io/etcd/tests/v3/framework"
	_ "go.etcd.io/etcd/tests/v3/framework/config"
	_ "go.etcd.io/etcd/tests/v3/framework/e2e"
	_ "go.etcd.io/etcd/tests/v3/framework/integration"
	_ "go.etcd.io/etcd/tests/v3/framework/interfaces"
	_ "go.etcd.io/etcd/tests/v3/framework/testutils"
)
