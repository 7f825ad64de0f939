//go:build tools

// Package tools pins the real etcdctl (go.etcd.io/etcd/etcdctl/v3) that
// "aether bench" builds to compare the replicator with "etcdctl
// make-mirror". It is a module of its own, so it is not part of the main
// module's ./... and its dependencies do not enter the main go.mod.
//
// Build: go build -o /tmp/etcdctl go.etcd.io/etcd/etcdctl/v3
package tools

import _ "go.etcd.io/etcd/etcdctl/v3"
