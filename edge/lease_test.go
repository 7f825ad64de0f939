package edge

import (
	"errors"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// fakeClock is a Config.Now a test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestLeaseGrantKeepAliveTimeToLiveRevoke(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)

	g, err := c.Grant(ctx, 60)
	if err != nil || g.TTL != 60 || g.ID == 0 {
		t.Fatalf("grant: %+v %v", g, err)
	}
	// A lease grant is not a key-space change: the revision stays.
	if g.ResponseHeader.Revision != 1 {
		t.Fatalf("grant header revision %d, want 1", g.ResponseHeader.Revision)
	}
	if _, err := c.Put(ctx, "l/b", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "l/a", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	ttl, err := c.TimeToLive(ctx, g.ID, clientv3.WithAttachedKeys())
	if err != nil || ttl.GrantedTTL != 60 || ttl.TTL < 58 || len(ttl.Keys) != 2 || string(ttl.Keys[0]) != "l/a" {
		t.Fatalf("time to live: %+v %v", ttl, err)
	}
	ka, err := c.KeepAliveOnce(ctx, g.ID)
	if err != nil || ka.TTL != 60 {
		t.Fatalf("keepalive: %+v %v", ka, err)
	}
	ls, err := c.Leases(ctx)
	if err != nil || len(ls.Leases) != 1 || ls.Leases[0].ID != g.ID {
		t.Fatalf("leases: %+v %v", ls, err)
	}
	if _, err := c.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	gr, _ := c.Get(ctx, "l/", clientv3.WithPrefix())
	if len(gr.Kvs) != 0 {
		t.Fatalf("revoke left %d keys", len(gr.Kvs))
	}
	if _, err := c.Revoke(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("revoke twice: %v", err)
	}
	ttl, err = c.TimeToLive(ctx, g.ID)
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("time to live of a revoked lease: %+v %v", ttl, err)
	}
	if _, err := c.KeepAliveOnce(ctx, g.ID); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// clientv3 turns etcd's TTL 0 answer into ErrLeaseNotFound.
		t.Fatalf("keepalive of a revoked lease: %v", err)
	}
}

// With the real clock: a lease of etcd's minimum TTL expires by itself and
// its keys' deletion reaches watchers as one change.
func TestLeaseExpiresRealClock(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)
	g, err := c.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if g.TTL != 2 { // etcd raises TTLs below its minimum (2s by default)
		t.Fatalf("granted TTL %d, want 2", g.TTL)
	}
	c.Put(ctx, "e/1", "v", clientv3.WithLease(g.ID))
	pr, _ := c.Put(ctx, "e/2", "v", clientv3.WithLease(g.ID))
	wch := c.Watch(ctx, "e/", clientv3.WithPrefix(), clientv3.WithRev(pr.Header.Revision+1))
	start := time.Now()
	wr := recvWatch(t, wch)
	if len(wr.Events) != 2 || wr.Events[0].Type != mvccpb.DELETE || wr.Events[0].Kv.ModRevision != pr.Header.Revision+1 {
		t.Fatalf("expiry events: %+v", wr.Events)
	}
	if el := time.Since(start); el > 4*time.Second {
		t.Fatalf("expiry took %v for a 2s lease", el)
	}
}

// With an injected clock the expiry happens exactly when the clock passes
// the TTL, not before.
func TestLeaseExpiryInjectedClock(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	s := startServer(t, "", func(c *Config) { c.Now = clk.Now })
	c := newClient(t, s)
	ctx := testCtx(t)
	g, err := c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "x", "v", clientv3.WithLease(g.ID)); err != nil {
		t.Fatal(err)
	}
	clk.Add(29 * time.Second)
	s.kickLeases()
	ttl, err := c.TimeToLive(ctx, g.ID)
	if err != nil || ttl.TTL != 1 {
		t.Fatalf("after 29s: %+v %v", ttl, err)
	}
	if gr, _ := c.Get(ctx, "x"); len(gr.Kvs) != 1 {
		t.Fatal("key gone before its lease expired")
	}
	clk.Add(time.Second)
	s.kickLeases()
	eventually(t, 5*time.Second, "the expired lease's key to be deleted", func() bool {
		gr, err := c.Get(ctx, "x")
		return err == nil && len(gr.Kvs) == 0
	})
	ls, _ := c.Leases(ctx)
	if len(ls.Leases) != 0 {
		t.Fatalf("leases after expiry: %v", ls.Leases)
	}
}
