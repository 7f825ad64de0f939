package server_test

import (
	"testing"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// The helpers of the process's tests: a registrar on real etcd, dialled
// over real sockets (regtest), and a development CA (meshtest), shared
// with the registrar package's tests.

// waitFor waits for a condition; see package wait.
var waitFor = wait.For

var (
	quietLogger = regtest.QuietLogger
	dial        = regtest.Dial
	ep          = regtest.EP
	register    = regtest.Register
	etcdKey     = regtest.EtcdKey
	metricValue = regtest.MetricValue
	get         = regtest.Get
)

func startRegistrar(t testing.TB, endpoints []string, mut ...func(*server.Config)) *server.Server {
	t.Helper()
	o := server.Config{EtcdEndpoints: endpoints, Options: registrar.Options{ClusterName: "c1", Region: "r1"}}
	for _, m := range mut {
		m(&o)
	}
	return regtest.Start(t, o)
}

func nodeEP(svc, ip, node string) *registryv1.ServiceEndpoint {
	e := ep(svc, ip, 8080)
	e.Node = node
	return e
}
