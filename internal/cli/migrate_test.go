package cli

import (
	"context"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

func TestMigrateFromLegacy(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ep := &registryv1.ServiceEndpoint{Service: "pay", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1", Region: "eu", Cluster: "c1",
		Ports: []*registryv1.Port{{Name: "http", Port: 80}}}
	b, _ := proto.Marshal(ep)
	if _, err := cli.Put(context.Background(), "/aether/services/pay/protocols/http1/endpoints/10.0.0.1", string(b)); err != nil {
		t.Fatal(err)
	}
	ends := "--etcd-endpoints=" + strings.Join(etcd.Endpoints(), ",")

	res := runCLI(t, nil, nil, "migrate", "--from-legacy", ends, "--dry-run")
	if res.err != nil || !strings.Contains(res.stdout, "dry run: would migrate 1 of 1 legacy endpoints") {
		t.Fatalf("dry run: %v\n%s", res.err, res.stdout)
	}
	if r, _ := cli.Get(context.Background(), "/aether/v1/", clientv3.WithPrefix(), clientv3.WithCountOnly()); r.Count != 0 {
		t.Fatal("dry run wrote v1 keys")
	}
	res = runCLI(t, nil, nil, "migrate", "--from-legacy", ends)
	if res.err != nil || !strings.Contains(res.stdout, "migrated 1 of 1 legacy endpoints (0 already in schema v1), 1 legacy keys deleted") {
		t.Fatalf("real run: %v\n%s", res.err, res.stdout)
	}
	if r, _ := cli.Get(context.Background(), "/aether/v1/regions/eu/clusters/c1/services/pay/protocols/http1/endpoints/10.0.0.1"); len(r.Kvs) != 1 {
		t.Fatal("v1 key missing after migration")
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", ends}, "--from-legacy is required"},
		{[]string{"migrate", "--from-legacy"}, "--etcd-endpoints is required"},
	} {
		if res := runCLI(t, nil, nil, tc.args...); res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, res.err, tc.want)
		}
	}
}
