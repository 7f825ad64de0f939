package edge

import (
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/edge/internal/core"
)

// A receiver acknowledges a pushed change only once it is durable: with
// b's storage failing, a must never learn that b holds a change b applied
// in memory but could not persist, not even for a moment (a catches every
// ack as it arrives: noteAck wakes the replication waiters).
func TestSyncReceiverAcksOnlyDurable(t *testing.T) {
	c := newTestCluster(t, []string{"a", "b"}, nil)
	a, b := c.start("a"), c.start("b")
	ctx := testCtx(t)
	cli := newClient(t, a)
	if _, err := cli.Put(ctx, "before", "v"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "b to hold a's first change", func() bool {
		return len(logHashes(b)) == len(logHashes(a))
	})
	if err := b.store.Close(); err != nil {
		t.Fatal(err)
	}

	pb := a.sync.byID[b.MemberID()]
	var (
		mu     sync.Mutex
		target struct {
			r   core.ReplicaID
			seq uint64
			ok  bool
		}
		early bool
	)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			ch := a.sync.waiter()
			mu.Lock()
			if target.ok && pb.state().holds(target.r, target.seq) {
				early = true
			}
			mu.Unlock()
			select {
			case <-ch:
			case <-done:
				return
			}
		}
	}()

	put, err := cli.Put(ctx, "after", "v")
	if err != nil {
		t.Fatal(err)
	}
	// The change is the newest in a's log; find its chain position.
	a.mu.RLock()
	idx := a.st.Index()
	a.mu.RUnlock()
	l := a.sync.log
	l.mu.Lock()
	e := l.entries[idx-l.base]
	l.mu.Unlock()
	mu.Lock()
	target.r, target.seq, target.ok = e.replica, e.seq, true
	mu.Unlock()
	_ = put

	rounds := metricValue(t, a.Registry(), "aether_edge_sync_rounds_total", "b")
	eventually(t, 10*time.Second, "b to apply the change and fail to persist it", func() bool {
		return logHashes(b)[e.id] && b.failure() != nil
	})
	// Two more rounds (stream openings) since: a's sender saw b's stream
	// end and reopened it, so every ack b sent for the change has arrived.
	eventually(t, 10*time.Second, "a to reopen its stream to b", func() bool {
		return metricValue(t, a.Registry(), "aether_edge_sync_rounds_total", "b") >= rounds+2
	})
	close(done)
	wg.Wait()
	if early {
		t.Fatal("a learned that b holds a change b never made durable")
	}
	if pb.state().holds(e.replica, e.seq) {
		t.Fatal("a holds b as having a change b never made durable")
	}
}
