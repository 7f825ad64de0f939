package core

import (
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// peerPair is two replicas of one cluster: a writes, b hears it through
// peer-watch and, later, through the backend's watch.
func peerPair() (a, b *State) {
	cfg := func(epoch string) Config {
		return Config{Epoch: epoch, HistorySize: 100, QueueLimit: 100, FlushAtBatch: 100, PeerGrace: time.Second}
	}
	return New(cfg("a")), New(cfg("b"))
}

// watched is the backend's report of ep (nil: a deletion of id) at rev.
func watched(id registry.EndpointID, ep *registryv1.ServiceEndpoint, rev int64) backend.WatchBatch {
	return backend.WatchBatch{Events: []backend.Event{{ID: id, Endpoint: cloneOrNil(ep), Revision: rev}}, Revision: rev}
}

func TestPeerWriteThenEchoChangesNothing(t *testing.T) {
	a, b := peerPair()
	ep := mkEP(t, "web", "10.0.0.1")
	_, eff, err := a.Register(ep, t0)
	if err != nil || len(eff.Peer) != 1 {
		t.Fatalf("register: %v, peer writes %d", err, len(eff.Peer))
	}
	got := b.ApplyPeer(eff.Peer, t0)
	if got.PeerApplied != 1 || len(got.Events) != 1 || b.Provisional() != 1 {
		t.Fatalf("peer write: applied %d, events %v, provisional %d", got.PeerApplied, types(got), b.Provisional())
	}
	// The same write again (a stream resumed) is stale.
	if again := b.ApplyPeer(eff.Peer, t0); again.PeerApplied != 0 || len(again.Events) != 0 {
		t.Fatalf("duplicate peer write applied: %v", types(again))
	}
	stored := a.Get(registry.IDOf(ep))
	w := b.ApplyWatch(watched(registry.IDOf(ep), stored, 5))
	if len(w.Events) != 0 || w.Echoes != 1 || b.Provisional() != 0 {
		t.Fatalf("echo: events %v, echoes %d, provisional %d", types(w), w.Echoes, b.Provisional())
	}
	if b.Version().Seq != 1 {
		t.Fatalf("b's sequence %d after a write and its echo, want 1", b.Version().Seq)
	}
}

// A peer write arriving after the backend reported a newer write of the
// key must not roll it back; an older backend report must not roll back a
// provisional write either.
func TestPeerOrderingByStamp(t *testing.T) {
	a, b := peerPair()
	ep := mkEP(t, "web", "10.0.0.1")
	id := registry.IDOf(ep)
	_, e1, _ := a.Register(proto.Clone(ep).(*registryv1.ServiceEndpoint), t0)
	v1 := proto.Clone(a.Get(id)).(*registryv1.ServiceEndpoint)
	_, e2, _ := a.Register(mkEP(t, "web", "10.0.0.1", draining), t0.Add(time.Millisecond))
	v2 := proto.Clone(a.Get(id)).(*registryv1.ServiceEndpoint)

	// Late peer event: the backend already reported v2.
	b.ApplyWatch(watched(id, v2, 7))
	if got := b.ApplyPeer(e1.Peer, t0); got.PeerApplied != 0 || len(got.Events) != 0 {
		t.Fatalf("stale peer write applied: %v", types(got))
	}
	if b.Get(id).GetState() != registryv1.State_STATE_DRAINING {
		t.Fatal("b rolled back to the older value")
	}

	// A second replica: v2 arrives by peer, then the backend reports v1
	// (its older flush), then v2.
	_, c := peerPair()
	c.ApplyPeer(e2.Peer, t0)
	if w := c.ApplyWatch(watched(id, v1, 6)); len(w.Events) != 0 {
		t.Fatalf("an older backend report changed a provisional write: %v", types(w))
	}
	if w := c.ApplyWatch(watched(id, v2, 7)); len(w.Events) != 0 || w.Echoes != 1 {
		t.Fatalf("echo of v2: %v, echoes %d", types(w), w.Echoes)
	}

	// A deletion the backend reported makes a later peer put of the value
	// it removed stale.
	_, d := peerPair()
	d.ApplyWatch(watched(id, v1, 6))
	d.ApplyWatch(watched(id, nil, 8))
	if got := d.ApplyPeer(e1.Peer, t0); got.PeerApplied != 0 || d.Get(id) != nil {
		t.Fatal("a peer put of a value the backend deleted resurrected it")
	}
}

// A peer write the backend never confirms is left alone by a listing read
// within the grace, and removed by one read after it.
func TestUnconfirmedPeerWriteRepairedByBackstop(t *testing.T) {
	a, b := peerPair()
	ep := mkEP(t, "web", "10.0.0.1")
	_, eff, _ := a.Register(ep, t0)
	b.ApplyPeer(eff.Peer, t0)
	list := func(started time.Time, rev int64) Effects {
		la := NewListingApply(backend.Listing{Revision: rev})
		la.Started = started
		if !b.BeginListing(la) {
			t.Fatal("listing ignored")
		}
		e, _ := b.StepListing(la, 1<<30)
		return e
	}
	if e := list(t0.Add(500*time.Millisecond), 3); len(e.Events) != 0 || b.Len() != 1 {
		t.Fatalf("a listing within the grace removed the provisional write: %v", types(e))
	}
	if e := list(t0.Add(2*time.Second), 4); len(e.Events) != 1 || b.Len() != 0 || b.Provisional() != 0 {
		t.Fatalf("a listing after the grace: events %v, endpoints %d, provisional %d", types(e), b.Len(), b.Provisional())
	}
}

// A local write of the key waiting for its flush wins over a peer's.
func TestLocalWriteWinsOverPeer(t *testing.T) {
	a, b := peerPair()
	_, eff, _ := a.Register(mkEP(t, "web", "10.0.0.1"), t0.Add(time.Second))
	if _, _, err := b.Register(mkEP(t, "web", "10.0.0.1", draining), t0); err != nil {
		t.Fatal(err)
	}
	if got := b.ApplyPeer(eff.Peer, t0); got.PeerApplied != 0 {
		t.Fatal("peer write applied over a queued local write")
	}
	// A peer deletion reaches b and is echoed by the backend's deletion.
	_, c := peerPair()
	id := registry.IDOf(mkEP(t, "web", "10.0.0.1"))
	c.ApplyPeer(eff.Peer, t0)
	_, del, err := a.Unregister(id, t0.Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.ApplyPeer(del.Peer, t0); len(got.Events) != 1 || c.Get(id) != nil {
		t.Fatalf("peer deletion: %v", types(got))
	}
	if w := c.ApplyWatch(watched(id, nil, 9)); len(w.Events) != 0 || w.Echoes != 1 || c.Provisional() != 0 {
		t.Fatalf("deletion echo: %v, echoes %d", types(w), w.Echoes)
	}
}

func cloneOrNil(ep *registryv1.ServiceEndpoint) *registryv1.ServiceEndpoint {
	if ep == nil {
		return nil
	}
	return proto.Clone(ep).(*registryv1.ServiceEndpoint)
}

// A provisional deletion the backend never reports (the key was never
// persisted) is ended by the first backstop after the grace, even one that
// reconciles only other services; a deletion floor lasts one backstop
// interval at least.
func TestPeerBookkeepingEnds(t *testing.T) {
	a, b := peerPair()
	ep := mkEP(t, "web", "10.0.0.1")
	id := registry.IDOf(ep)
	_, put, _ := a.Register(ep, t0)
	_, del, _ := a.Unregister(id, t0)
	b.ApplyPeer(put.Peer, t0)
	b.ApplyPeer(del.Peer, t0)
	if b.Provisional() != 1 || b.Get(id) != nil {
		t.Fatalf("provisional %d, held %v", b.Provisional(), b.Get(id))
	}
	list := func(started time.Time, rev int64) {
		la := NewListingApply(backend.Listing{Revision: rev})
		la.Scope = Scope{"db": true}
		la.Started = started
		b.BeginListing(la)
		b.StepListing(la, 1<<30)
	}
	list(t0.Add(500*time.Millisecond), 3)
	if b.Provisional() != 1 {
		t.Fatal("a listing within the grace ended the provisional deletion")
	}
	list(t0.Add(2*time.Second), 4)
	if b.Provisional() != 0 {
		t.Fatal("the provisional deletion outlived the grace and a backstop")
	}

	// The floor of a deleted value outlives one listing, not two.
	_, c := peerPair()
	v := proto.Clone(put.Peer[0].Endpoint).(*registryv1.ServiceEndpoint)
	c.ApplyWatch(watched(id, v, 6))
	c.ApplyWatch(watched(id, nil, 7))
	c2 := func(rev int64) {
		la := NewListingApply(backend.Listing{Revision: rev})
		la.Started = t0
		c.BeginListing(la)
		c.StepListing(la, 1<<30)
	}
	c2(8)
	if got := c.ApplyPeer(put.Peer, t0); got.PeerApplied != 0 {
		t.Fatal("the deletion floor was gone after one listing")
	}
	c2(9)
	if got := c.ApplyPeer(put.Peer, t0); got.PeerApplied != 1 {
		t.Fatal("the deletion floor outlived two listings")
	}
}
