package etcd

import (
	"errors"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
)

func TestNodeRecordsLiveUnderTheirLease(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})
	ctx := testCtx(t)

	lease, err := s.GrantLease(ctx, 1500*time.Millisecond) // rounds up to 2s
	if err != nil {
		t.Fatal(err)
	}
	n := &registryv1.Node{Name: "n1", Region: "r1", Cluster: "c1", Zone: "z1"}
	rev, err := s.PutNode(ctx, n, lease)
	if err != nil || rev == 0 {
		t.Fatalf("PutNode = %d, %v", rev, err)
	}
	key, _ := registry.NodeIDOf(n).Key()
	got, err := cli.Get(ctx, key)
	if err != nil || len(got.Kvs) != 1 || got.Kvs[0].Lease != lease {
		t.Fatalf("node record %v, %v: not under lease %x", got, err, lease)
	}
	l, err := s.List(ctx)
	if err != nil || len(l.Nodes) != 1 || l.Nodes[0].GetZone() != "z1" {
		t.Fatalf("List nodes = %v, %v", l.Nodes, err)
	}
	ttl, err := s.KeepAliveOnce(ctx, lease)
	if err != nil || ttl != 2*time.Second {
		t.Fatalf("KeepAliveOnce = %v, %v; want the granted 2s", ttl, err)
	}
	remaining, granted, err := s.LeaseTTL(ctx, lease)
	if err != nil || granted != 2*time.Second || remaining <= 0 || remaining > granted {
		t.Fatalf("LeaseTTL = %v of %v, %v", remaining, granted, err)
	}

	revoked, err := s.RevokeLease(ctx, lease)
	if err != nil || revoked <= rev {
		t.Fatalf("RevokeLease = %d, %v", revoked, err)
	}
	if got, _ := cli.Get(ctx, key); len(got.Kvs) != 0 {
		t.Fatal("revoking the lease left the node record")
	}
	if _, err := s.KeepAliveOnce(ctx, lease); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("KeepAliveOnce of a revoked lease: %v, want ErrLeaseNotFound", err)
	}
	if _, _, err := s.LeaseTTL(ctx, lease); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("LeaseTTL of a revoked lease: %v, want ErrLeaseNotFound", err)
	}
	if _, err := s.PutNode(ctx, n, lease); !errors.Is(err, ErrLeaseNotFound) {
		t.Fatalf("PutNode under a revoked lease: %v, want ErrLeaseNotFound", err)
	}
	if r, err := s.RevokeLease(ctx, lease); err != nil || r != 0 {
		t.Fatalf("revoking twice: %d, %v", r, err)
	}
	if _, err := s.PutNode(ctx, &registryv1.Node{Name: "a/b", Region: "r1", Cluster: "c1"}, lease); err == nil {
		t.Fatal("PutNode accepted a bad name")
	}
}
