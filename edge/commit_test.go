package edge

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/edge/internal/core"
)

// Changes merged from peers wait for company before their fsync
// (Config.PeerCommitDelay), and a local write ends the wait. With a delay
// of an hour, b persists a's changes only when hurried: reads meanwhile
// serve b's durable revision (they neither wait the hour nor see what is
// not durable), everything merged shares one batch, and b's own write
// takes it to disk with its own.
func TestPeerChangesWaitUntilHurried(t *testing.T) {
	c := newTestCluster(t, []string{"a", "b"}, nil)
	c.mod = func(name string, cfg *Config) {
		cfg.PeerCommitDelay = -1
		if name == "b" {
			cfg.PeerCommitDelay = time.Hour
		}
	}
	a, b := c.start("a"), c.start("b")
	ctx := testCtx(t)
	ca, cb := newClient(t, a), newClient(t, b)
	batches := func() (n, changes float64) {
		mfs, err := b.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "aether_edge_commit_batch_changes" {
				h := mf.GetMetric()[0].GetHistogram()
				return float64(h.GetSampleCount()), h.GetSampleSum()
			}
		}
		t.Fatal("no aether_edge_commit_batch_changes")
		return 0, 0
	}
	n0, ch0 := batches()

	for i, k := range []string{"k1", "k2", "k3", "k4", "k5"} {
		if _, err := ca.Put(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
		// Each arrives in its own push: b applied it before a writes the
		// next.
		eventually(t, 10*time.Second, "b to apply "+k, func() bool { return heldChanges(b) == uint64(i+1) })
	}
	if got := total(b.sync.log.durableVector()); got != 0 {
		t.Fatalf("b made %d of a's changes durable without being hurried", got)
	}
	resp, err := cb.Get(ctx, "k", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 || resp.Header.Revision != 1 {
		t.Fatalf("b serves %d keys at revision %d while none is durable, want 0 at 1", len(resp.Kvs), resp.Header.Revision)
	}
	if _, err := cb.Put(ctx, "own", "v"); err != nil {
		t.Fatal(err)
	}
	if got := total(b.sync.log.durableVector()); got != 6 {
		t.Fatalf("after b's own write, %d changes are durable at b, want 6", got)
	}
	n1, ch1 := batches()
	if n1-n0 != 1 || ch1-ch0 != 6 {
		t.Errorf("b persisted a's 5 changes and its own in %.0f batches of %.0f changes, want 1 of 6", n1-n0, ch1-ch0)
	}
	resp, err = cb.Get(ctx, "k", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 5 {
		t.Fatalf("b serves %d of a's keys once durable, want 5", len(resp.Kvs))
	}
	// a hears b hold them only now (b acks what is durable).
	eventually(t, 10*time.Second, "a to learn b holds its changes", func() bool {
		return a.sync.byID[b.MemberID()].state().holds(core.ReplicaID(a.MemberID()), 5)
	})
}

// Without anything to hurry it, a batch of peer changes is persisted once
// the delay has passed.
func TestPeerChangesPersistAfterTheDelay(t *testing.T) {
	c := newTestCluster(t, []string{"a", "b"}, nil)
	c.mod = func(name string, cfg *Config) { cfg.PeerCommitDelay = 50 * time.Millisecond }
	a, b := c.start("a"), c.start("b")
	if _, err := newClient(t, a).Put(testCtx(t), "k", "v"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "b to make a's change durable unprompted", func() bool {
		return total(b.sync.log.durableVector()) == 1
	})
}
