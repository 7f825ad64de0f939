package etcd

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/backendtest"
	"github.com/aethermesh/aether/internal/testutil/etcdcluster"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

var _ backend.Full = (*Store)(nil)

// conformanceFactory serves the suite's stores from one etcd: each is
// fresh because every key (registry, node records, tombstones) is deleted
// first, while the revision carries on from the last test's, which the
// suite must not mind.
func conformanceFactory(cli *clientv3.Client) backendtest.Factory {
	return backendtest.Factory{
		New: func(t backendtest.T) backend.Store {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := cli.Delete(ctx, "\x00", clientv3.WithFromKey()); err != nil {
				t.Fatalf("wiping etcd for a fresh store: %v", err)
			}
			return New(cli, Options{})
		},
		Compact: func(t backendtest.T, _ backend.Store, rev int64) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
				t.Fatalf("compact at %d: %v", rev, err)
			}
		},
	}
}

func TestConformanceEmbedded(t *testing.T) {
	etcd := etcdtest.Start(t)
	backendtest.RunAll(t, conformanceFactory(etcd.Client(t)))
}

func TestConformanceThreeMembers(t *testing.T) {
	cl := etcdcluster.Start(t, 3)
	backendtest.RunAll(t, conformanceFactory(etcdtest.NewClient(t, cl.Endpoints()...)))
}
