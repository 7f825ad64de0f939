package edge

import (
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// With --auto-compaction-retention, etcd's own compactor runs against the
// replica: history older than the retention is compacted without anyone
// calling Compact, and the compaction survives a restart. Without one,
// nothing is compacted.
func TestAutoCompactionPeriodic(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s := startServer(t, dir, func(c *Config) {
		c.AutoCompactionMode, c.AutoCompactionRetention = "periodic", time.Second
	})
	c := newClient(t, s)
	ctx := testCtx(t)
	first, err := c.Put(ctx, "k", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "k", "v2"); err != nil {
		t.Fatal(err)
	}
	old := first.Header.Revision
	// etcd's periodic compactor samples every retention/10 and compacts,
	// once a retention has passed, at the revision it sampled then.
	eventually(t, 10*time.Second, "the revision of the first put compacted", func() bool {
		_, err := c.Get(ctx, "k", clientv3.WithRev(old))
		return errors.Is(err, rpctypes.ErrCompacted)
	})
	resp, err := c.Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v2" {
		t.Fatalf("after compaction: %v %v, want k=v2", resp, err)
	}
	closeServer(t, s)

	s2 := startServer(t, dir, nil)
	c2 := newClient(t, s2)
	if _, err := c2.Get(testCtx(t), "k", clientv3.WithRev(old)); !errors.Is(err, rpctypes.ErrCompacted) {
		t.Fatalf("after a restart, revision %d: %v, want compacted", old, err)
	}
}

func TestNoAutoCompactionWithoutRetention(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir(), nil)
	if s.autoCompact != nil {
		t.Fatal("a compactor runs with no retention set")
	}
	c := newClient(t, s)
	ctx := testCtx(t)
	first, err := c.Put(ctx, "k", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "k", "v2"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "k", clientv3.WithRev(first.Header.Revision)); err != nil {
		t.Fatalf("history read with no compaction: %v", err)
	}
}
