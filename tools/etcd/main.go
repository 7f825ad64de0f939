// Command etcd is the real etcd server, built from the etcd module's own
// main (go.etcd.io/etcd/server/v3/etcdmain) so that "aether bench" can run
// etcd and "etcd grpc-proxy start" as processes of their own. The root
// module go.etcd.io/etcd/v3, whose main this is, is not a dependency the
// module proxy serves; this module is of its own, so it is not part of the
// main module's ./... and its dependencies do not enter the main go.mod.
//
// Build: go build -o /tmp/etcd .
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
