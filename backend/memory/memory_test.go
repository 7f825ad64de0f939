package memory_test

import (
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/backendtest"
	"github.com/aethermesh/aether/backend/memory"
)

// clock is a clock that moves only when told to.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Factory is the model's factory for the conformance suite: each store has
// a clock of its own that only Advance moves.
func factory() backendtest.Factory {
	clocks := map[backend.Store]*clock{}
	var mu sync.Mutex
	return backendtest.Factory{
		New: func(backendtest.T) backend.Store {
			c := &clock{now: time.Unix(1_700_000_000, 0)}
			b := memory.New(memory.Options{Now: c.Now})
			mu.Lock()
			clocks[b] = c
			mu.Unlock()
			return b
		},
		Compact: func(t backendtest.T, b backend.Store, rev int64) {
			if err := b.(*memory.Backend).Compact(rev); err != nil {
				t.Fatalf("Compact(%d): %v", rev, err)
			}
		},
		Advance: func(_ backendtest.T, b backend.Store, d time.Duration) {
			mu.Lock()
			c := clocks[b]
			mu.Unlock()
			c.advance(d)
			b.(*memory.Backend).Expire()
		},
	}
}

func TestConformance(t *testing.T) {
	backendtest.RunAll(t, factory())
}

// A lease the clock has not run out keeps its record, one renewed keeps it
// past its first TTL, and one left alone lapses exactly at its TTL.
func TestLeasesRunOutByTheInjectedClock(t *testing.T) {
	c := &clock{now: time.Unix(1_700_000_000, 0)}
	b := memory.New(memory.Options{Now: c.Now})
	ctx := t.Context()
	lease, err := b.GrantLease(ctx, 1500*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if _, granted, _ := b.LeaseTTL(ctx, lease); granted != 2*time.Second {
		t.Fatalf("granted %v, want 2s (whole seconds, rounded up)", granted)
	}
	n := nodeRecord()
	if _, err := b.PutNode(ctx, n, lease); err != nil {
		t.Fatal(err)
	}
	c.advance(1500 * time.Millisecond)
	if _, err := b.KeepAliveOnce(ctx, lease); err != nil {
		t.Fatalf("renewing a live lease: %v", err)
	}
	c.advance(1999 * time.Millisecond) // past the first TTL, within the renewed one
	if l, _ := b.List(ctx); len(l.Nodes) != 1 {
		t.Fatalf("a renewed lease lapsed early: %d nodes", len(l.Nodes))
	}
	c.advance(time.Millisecond)
	b.Expire()
	if l, _ := b.List(ctx); len(l.Nodes) != 0 {
		t.Fatalf("a lease past its TTL kept its record: %d nodes", len(l.Nodes))
	}
}
