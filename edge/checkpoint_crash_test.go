package edge_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/edge/internal/storage"
)

// TestCheckpointCrashKill9: `aether edge` checkpointing every 100 changes
// (with --history-gc, so a lone member's checkpoints delete all but the
// changes since the last one) is killed with SIGKILL at random points of a
// write load, several times over, each restart from whatever checkpoint
// and records the kill left. After each: every put acknowledged in any
// round is there at its revision; the history is one put per revision
// with nothing lost or repeated; the log on disk was cut (checkpoints
// happened and deleted records). At the end HashKV and every key survive
// one more kill without writes.
func TestCheckpointCrashKill9(t *testing.T) {
	bin := aetherBinary(t)
	rng := seededRand(t)
	dataDir := filepath.Join(t.TempDir(), "crash.etcd")
	flags := []string{"--history-gc", "--checkpoint-changes", "100"}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	var acked []ackedPut
	const rounds = 4
	for round := 0; round < rounds; round++ {
		p := startEdge(t, bin, dataDir, flags...)
		c := newClient(t, p.url)
		verifyAcked(ctx, t, c, acked)
		killAt := len(acked) + 300 + rng.IntN(1200)
		acked = append(acked, loadUntilKilled(ctx, t, p, c, round, killAt-len(acked))...)
		c.Close()

		l, err := storage.Open(dataDir)
		if err != nil {
			t.Fatal(err)
		}
		cp, ok, err := l.LastCheckpoint()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		if _, err := l.Load(func(storage.Record) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if !ok || cp.KeepFrom <= 1 || n >= len(acked) {
			t.Fatalf("round %d: %d puts acknowledged, checkpoint %v at %d keeping from %d, %d records stored: the log was not cut", round, len(acked), ok, cp.Index, cp.KeepFrom, n)
		}
		t.Logf("round %d: killed after %d acknowledged puts in all; checkpoint at %d keeping from %d, %d records on disk", round, len(acked), cp.Index, cp.KeepFrom, n)
	}

	p := startEdge(t, bin, dataDir, flags...)
	c := newClient(t, p.url)
	maxRev := verifyAcked(ctx, t, c, acked)
	head, err := c.Get(ctx, "k/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if head.Header.Revision < maxRev {
		t.Fatalf("recovered revision %d is before the acknowledged revision %d", head.Header.Revision, maxRev)
	}
	history := watchUntil(t, ctx, c, 2, head.Header.Revision)
	for i, ev := range history {
		if want := int64(i + 2); ev.Kv.ModRevision != want || ev.Type != mvccpb.PUT {
			t.Fatalf("history event %d: %v at revision %d, want a put at %d", i, ev.Type, ev.Kv.ModRevision, want)
		}
	}
	hash1, err := c.HashKV(ctx, p.url, 0)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	p.kill(t)
	p = startEdge(t, bin, dataDir, flags...)
	c = newClient(t, p.url)
	hash2, err := c.HashKV(ctx, p.url, 0)
	if err != nil {
		t.Fatal(err)
	}
	if hash1.Hash != hash2.Hash || hash1.Header.Revision != hash2.Header.Revision {
		t.Fatalf("HashKV %d at %d before a restart without writes, %d at %d after", hash1.Hash, hash1.Header.Revision, hash2.Hash, hash2.Header.Revision)
	}
	again, err := c.Get(ctx, "k/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(again.Kvs) != len(head.Kvs) {
		t.Fatalf("%d keys before the restart, %d after", len(head.Kvs), len(again.Kvs))
	}
	for i := range head.Kvs {
		a, b := head.Kvs[i], again.Kvs[i]
		if string(a.Key) != string(b.Key) || string(a.Value) != string(b.Value) || a.ModRevision != b.ModRevision || a.CreateRevision != b.CreateRevision || a.Version != b.Version {
			t.Fatalf("key %s: %v before the restart, %v after", a.Key, a, b)
		}
	}
}

// verifyAcked checks every acknowledged put at its own revision and
// returns the highest.
func verifyAcked(ctx context.Context, t *testing.T, c *clientv3.Client, acked []ackedPut) int64 {
	t.Helper()
	var maxRev int64
	for _, a := range acked {
		resp, err := c.Get(ctx, a.key, clientv3.WithRev(a.rev))
		if err != nil {
			t.Fatalf("get %s at %d: %v", a.key, a.rev, err)
		}
		if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != a.value || resp.Kvs[0].ModRevision != a.rev {
			t.Fatalf("after restart %s at revision %d = %v, want %q modified at %d", a.key, a.rev, resp.Kvs, a.value, a.rev)
		}
		maxRev = max(maxRev, a.rev)
	}
	return maxRev
}

// loadUntilKilled runs 8 writers against p until n of their puts were
// acknowledged, then kills p with puts still in flight, and returns the
// acknowledged ones.
func loadUntilKilled(ctx context.Context, t *testing.T, p *edgeProc, c *clientv3.Client, round, n int) []ackedPut {
	t.Helper()
	const writers, keysPerWriter = 8, 50
	var (
		mu    sync.Mutex
		acked []ackedPut
	)
	killed := make(chan struct{})
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; lctx.Err() == nil; i++ {
				key := fmt.Sprintf("k/%d/%d", w, i%keysPerWriter)
				val := fmt.Sprintf("v-%d-%d-%d", round, w, i)
				resp, err := c.Put(lctx, key, val)
				if err != nil {
					select {
					case <-killed:
						return
					default:
						continue
					}
				}
				mu.Lock()
				acked = append(acked, ackedPut{key, val, resp.Header.Revision})
				done := len(acked) == n
				mu.Unlock()
				if done {
					p.kill(t)
					close(killed)
				}
			}
		}()
	}
	select {
	case <-killed:
	case <-ctx.Done():
		t.Fatalf("round %d: fewer than %d puts acknowledged before the deadline", round, n)
	}
	lcancel()
	wg.Wait()
	return acked
}
