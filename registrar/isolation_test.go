package registrar

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"

	etcdstore "github.com/aethermesh/aether/backend/etcd"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registry"
)

// Defence in depth behind the API's size bounds: a write etcd refuses
// whatever happens (here, larger than etcd's request limit, put in the
// snapshot past the API as a bug or an older version might) is isolated,
// and every other write still persists within a few flush intervals,
// instead of failing every flush behind it.
func TestRefusedWriteIsIsolated(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	r, err := New(Options{ClusterName: "c", Region: "r", WriteBatchInterval: 20 * time.Millisecond, SyncInterval: time.Hour}, etcdstore.New(cli, etcdstore.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
			defer ccancel()
			_ = r.Close(cctx)
		}
	})
	huge := mkEP(t, "web", "10.0.0.1")
	huge.Metadata = map[string]string{"blob": strings.Repeat("x", 1600<<10)} // over etcd's 1.5 MiB
	r.mu.Lock()
	stored, eff, err := r.st.Register(huge, r.now())
	r.act(eff)
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	for i := 2; i <= 21; i++ {
		if _, _, err := r.Register(mkEP(t, "web", fmt.Sprintf("10.0.0.%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	// The flush's outcomes are recorded once the whole batch is settled,
	// a moment after etcd holds the 20.
	wait.For(t, "the 20 ordinary writes in etcd and the flush settled", 10*time.Second, func() bool {
		resp, err := cli.Get(ctx, registry.Root, clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 20 && r.PersistenceStatus().Pending == 1
	})
	st := r.PersistenceStatus()
	if st.Pending != 1 || len(st.Isolated) != 1 || !strings.Contains(st.Isolated[0].Key, "10.0.0.1") || !strings.Contains(st.Isolated[0].Reason, "too large") {
		t.Fatalf("status %+v: want the oversized write isolated, named, with etcd's reason", st)
	}
	var m dto.Metric
	if err := r.metrics.writesRefused.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 1 {
		t.Fatalf("registrar_writes_refused_total = %v, want 1", got)
	}
	// The snapshot keeps serving it meanwhile, and a wait for it says why
	// it is not persisted.
	if eps, _, _ := r.List([]string{"web"}); len(eps) != 21 {
		t.Fatal("the isolated write left the snapshot")
	}
	err = r.WaitPersisted(ctx, registry.IDOf(huge), stored.Stamp)
	if !errors.Is(err, errRefused) || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("waiting for the refused write: %v, want errRefused naming the reason", err)
	}
	// A newer write of the key replaces it and persists.
	if _, _, err := r.Register(mkEP(t, "web", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the replacement persisted", 10*time.Second, func() bool {
		st := r.PersistenceStatus()
		return st.Pending == 0 && len(st.Isolated) == 0
	})
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer ccancel()
	closed = true
	if err := r.Close(cctx); err != nil {
		t.Fatalf("close: %v", err)
	}
}
