package migrate

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
)

func legacyPut(t *testing.T, cli *clientv3.Client, key string, ep *registryv1.ServiceEndpoint) {
	t.Helper()
	b, err := proto.Marshal(ep)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(context.Background(), key, string(b)); err != nil {
		t.Fatal(err)
	}
}

func count(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	r, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Count
}

func legacyEP(svc, ip, region, cluster string) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: ip, Region: region, Cluster: cluster,
		Ports: []*registryv1.Port{{Name: "grpc", Port: 9090}}, State: registryv1.State_STATE_SERVING, Weight: 1}
}

func TestDryRunThenRealRun(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Overlapping IPs in two clusters: the reason the origin must be in the key.
	legacyPut(t, cli, "/aether/services/pay/protocols/grpc/endpoints/10.0.0.1", legacyEP("pay", "10.0.0.1", "eu", "c1"))
	legacyPut(t, cli, "/aether/services/web/protocols/grpc/endpoints/10.0.0.2", legacyEP("web", "10.0.0.2", "us", "c9"))

	var out bytes.Buffer
	rep, err := FromLegacy(ctx, cli, true, &out)
	if err != nil || rep.Legacy != 2 || rep.Copied != 2 || rep.Deleted != 2 {
		t.Fatalf("dry run: %+v, %v", rep, err)
	}
	if count(t, cli, registry.Root) != 0 || count(t, cli, LegacyPrefix) != 2 {
		t.Fatal("a dry run wrote something")
	}
	if !strings.Contains(out.String(), "would copy /aether/services/pay/protocols/grpc/endpoints/10.0.0.1 -> /aether/v1/regions/eu/clusters/c1/services/pay/protocols/grpc/endpoints/10.0.0.1") {
		t.Fatalf("dry run output:\n%s", out.String())
	}

	out.Reset()
	rep, err = FromLegacy(ctx, cli, false, &out)
	if err != nil || rep.Copied != 2 || rep.Deleted != 2 {
		t.Fatalf("real run: %+v, %v\n%s", rep, err, out.String())
	}
	if count(t, cli, LegacyPrefix) != 0 {
		t.Fatal("legacy keys left")
	}
	k, _ := registry.EndpointID{Region: "us", Cluster: "c9", Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, IP: "10.0.0.2"}.Key()
	got, err := cli.Get(ctx, k)
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("v1 key %s: %v %v", k, got, err)
	}
	if ep, err := registry.DecodeEndpoint(k, got.Kvs[0].Value); err != nil || ep.Ports[0].Port != 9090 {
		t.Fatalf("v1 value: %v %v", ep, err)
	}
	// Running again finds nothing to do.
	if rep, err := FromLegacy(ctx, cli, false, &out); err != nil || rep.Legacy != 0 || rep.Copied != 0 {
		t.Fatalf("second run: %+v, %v", rep, err)
	}
}

func TestUnplaceableEntryStopsBeforeAnyWrite(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	legacyPut(t, cli, "/aether/services/pay/protocols/grpc/endpoints/10.0.0.1", legacyEP("pay", "10.0.0.1", "eu", "c1"))
	legacyPut(t, cli, "/aether/services/pay/protocols/grpc/endpoints/10.0.0.3", legacyEP("pay", "10.0.0.3", "", ""))     // no origin
	legacyPut(t, cli, "/aether/services/pay/protocols/grpc/endpoints/10.0.0.4", legacyEP("pay", "10.0.0.5", "eu", "c1")) // key/value disagree
	if _, err := cli.Put(ctx, "/aether/services/junk", "x"); err != nil {
		t.Fatal(err)
	}
	_, err := FromLegacy(ctx, cli, false, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "3 legacy entries cannot be placed") || !strings.Contains(err.Error(), "carries no origin") || !strings.Contains(err.Error(), "nothing was written") {
		t.Fatalf("err = %v", err)
	}
	if count(t, cli, registry.Root) != 0 || count(t, cli, LegacyPrefix) != 4 {
		t.Fatal("an unplaceable entry still led to writes or deletes")
	}
}
