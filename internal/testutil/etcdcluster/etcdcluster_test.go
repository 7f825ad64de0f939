package etcdcluster

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
)

func TestStartThreeMembers(t *testing.T) {
	t.Parallel()
	c := Start(t, 3)
	if got := c.Names(); !slices.Equal(got, []string{"m0", "m1", "m2"}) {
		t.Fatalf("Names() = %v", got)
	}
	eps, peers := c.Endpoints(), c.PeerURLs()
	if len(eps) != 3 || len(peers) != 3 {
		t.Fatalf("Endpoints() = %v, PeerURLs() = %v", eps, peers)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Each member answers on its own, and all agree on one cluster of three
	// voters.
	var clusterID uint64
	for i, ep := range eps {
		cli := etcdtest.NewClient(t, ep)
		resp, err := cli.MemberList(ctx)
		if err != nil {
			t.Fatalf("member list via %s: %v", ep, err)
		}
		if i == 0 {
			clusterID = resp.Header.GetClusterId()
		} else if resp.Header.GetClusterId() != clusterID {
			t.Errorf("%s is in cluster %x, %s in %x", ep, resp.Header.GetClusterId(), eps[0], clusterID)
		}
		if len(resp.Members) != 3 {
			t.Fatalf("via %s: %d members", ep, len(resp.Members))
		}
		for _, m := range resp.Members {
			j := slices.Index(c.Names(), m.GetName())
			if j < 0 || m.GetIsLearner() || !slices.Equal(m.GetPeerURLs(), []string{peers[j]}) || !slices.Equal(m.GetClientURLs(), []string{eps[j]}) {
				t.Errorf("unexpected member %v", m)
			}
		}
	}

	// A write through one member is read through another.
	if _, err := etcdtest.NewClient(t, eps[0]).Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	resp, err := etcdtest.NewClient(t, eps[2]).Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get via another member: %v %v", resp, err)
	}
}

func TestStartOneMember(t *testing.T) {
	t.Parallel()
	c := Start(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := etcdtest.NewClient(t, c.Endpoints()...).Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
}

func TestKillAndRestartMember(t *testing.T) {
	t.Parallel()
	c := Start(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var leader int
	waitLeader := func(what string) {
		t.Helper()
		wait.For(t, "a leader "+what, 10*time.Second, func() bool { leader = c.Leader(); return leader >= 0 })
	}
	waitLeader("at start")
	old := leader
	c.Kill(old)
	c.Kill(old) // a second kill does nothing
	waitLeader("after the leader was killed")
	if leader == old {
		t.Fatalf("killed member m%d still leads", old)
	}
	// The two left keep a quorum.
	if _, err := etcdtest.NewClient(t, c.Endpoints()[leader]).Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	c.Restart(t, old)
	// The restarted member caught up with what it missed, and serves.
	resp, err := etcdtest.NewClient(t, c.Endpoints()[old]).Get(ctx, "k")
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("get via the restarted member: %v %v", resp, err)
	}
	waitLeader("after the restart")
}
