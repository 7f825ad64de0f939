package edge

import (
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
)

// etcd's Lock and Election services, as `etcdctl lock` / `elect` call them.
func TestLockAndElection(t *testing.T) {
	s := startServer(t, "", nil)
	c := newClient(t, s)
	ctx := testCtx(t)
	lc := v3lockpb.NewLockClient(c.ActiveConnection())

	g1, err := c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := c.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	l1, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("m"), Lease: int64(g1.ID)})
	if err != nil {
		t.Fatalf("first lock: %v", err)
	}
	second := make(chan *v3lockpb.LockResponse, 1)
	go func() {
		l2, err := lc.Lock(ctx, &v3lockpb.LockRequest{Name: []byte("m"), Lease: int64(g2.ID)})
		if err != nil {
			t.Errorf("second lock: %v", err)
		}
		second <- l2
	}()
	select {
	case <-second:
		t.Fatal("second holder got the lock while the first held it")
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := lc.Unlock(ctx, &v3lockpb.UnlockRequest{Key: l1.Key}); err != nil {
		t.Fatal(err)
	}
	select {
	case l2 := <-second:
		if l2 == nil || string(l2.Key) == string(l1.Key) {
			t.Fatalf("second lock: %+v", l2)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second holder never got the lock")
	}

	ec := v3electionpb.NewElectionClient(c.ActiveConnection())
	cr, err := ec.Campaign(ctx, &v3electionpb.CampaignRequest{Name: []byte("e"), Lease: int64(g1.ID), Value: []byte("me")})
	if err != nil {
		t.Fatal(err)
	}
	lr, err := ec.Leader(ctx, &v3electionpb.LeaderRequest{Name: []byte("e")})
	if err != nil || string(lr.Kv.Value) != "me" {
		t.Fatalf("leader: %+v %v", lr, err)
	}
	if _, err := ec.Resign(ctx, &v3electionpb.ResignRequest{Leader: cr.Leader}); err != nil {
		t.Fatal(err)
	}
}
