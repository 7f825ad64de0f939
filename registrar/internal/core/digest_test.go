package core

import (
	"fmt"
	"math"
	"math/rand"
	"slices"
	"sort"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// The digest backstop (digest.go) takes from the snapshot every value whose
// recorded mod revision (state.epRev, state.nodeRev) equals the one a
// keys-only listing reports. That is exact only if a recorded revision
// always names the write whose value the snapshot holds. These tests pin
// that invariant down, then the comparison and the merge built on it.

func weight(w uint32) func(*registryv1.ServiceEndpoint) {
	return func(ep *registryv1.ServiceEndpoint) { ep.Weight = w }
}

// revListing is a listing at rev whose endpoints carry mod revisions.
func revListing(rev int64, eps []*registryv1.ServiceEndpoint, revs []int64) backend.Listing {
	return backend.Listing{Revision: rev, Endpoints: eps, EndpointRevs: revs}
}

// clone is what a backend hands back: an equal value, never the pointer
// the state stored.
func clone(ep *registryv1.ServiceEndpoint) *registryv1.ServiceEndpoint {
	return proto.Clone(ep).(*registryv1.ServiceEndpoint)
}

func mustRegister(t *testing.T, s *State, ep *registryv1.ServiceEndpoint) {
	t.Helper()
	if _, _, err := s.Register(ep, t0); err != nil {
		t.Fatal(err)
	}
}

func mustTake(t *testing.T, s *State) []backend.Mutation {
	t.Helper()
	b := s.TakeBatch(100, time.Time{})
	if len(b) == 0 {
		t.Fatal("nothing to take")
	}
	return b
}

func TestEpRevTracksTheStoredValue(t *testing.T) {
	a := mkEP(t, "web", "10.0.0.1")
	id := registry.IDOf(a)
	aDrain := mkEP(t, "web", "10.0.0.1", draining)
	aW3 := mkEP(t, "web", "10.0.0.1", weight(3))
	for _, tc := range []struct {
		name   string
		run    func(t *testing.T, s *State)
		want   int64                       // 0: not known
		wantEP *registryv1.ServiceEndpoint // nil: absent
	}{{
		name: "a listing records its mod revisions",
		run:  func(t *testing.T, s *State) {}, want: 5, wantEP: a,
	}, {
		name: "a listing without revisions makes it unknown",
		run:  func(t *testing.T, s *State) { s.ApplyListing(listing(20, clone(a))) },
		want: 0, wantEP: a,
	}, {
		name: "a listing's newer value records its revision",
		run: func(t *testing.T, s *State) {
			s.ApplyListing(revListing(20, []*registryv1.ServiceEndpoint{clone(aDrain)}, []int64{18}))
		},
		want: 18, wantEP: aDrain,
	}, {
		name: "a local register: unknown",
		run:  func(t *testing.T, s *State) { mustRegister(t, s, clone(aDrain)) },
		want: 0, wantEP: aDrain,
	}, {
		name: "a local register that landed: the landed revision",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			s.batchDone(mustTake(t, s), 12)
		},
		want: 12, wantEP: aDrain,
	}, {
		name: "a newer local write while the batch was in flight: unknown",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			b := mustTake(t, s)
			mustRegister(t, s, clone(aW3))
			s.batchDone(b, 12)
		},
		want: 0, wantEP: aW3,
	}, {
		name: "... until the newer write lands",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			b := mustTake(t, s)
			mustRegister(t, s, clone(aW3))
			s.batchDone(b, 12)
			s.batchDone(mustTake(t, s), 13)
		},
		want: 13, wantEP: aW3,
	}, {
		name: "a newer local write that restores the old attributes: still unknown",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			b := mustTake(t, s)
			mustRegister(t, s, clone(a))
			mustRegister(t, s, clone(aDrain)) // a new value, equal to the one in flight
			s.batchDone(b, 12)
		},
		want: 0, wantEP: aDrain,
	}, {
		name: "an unregister while the batch was in flight",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			b := mustTake(t, s)
			if _, err := s.unregister(id, time.Time{}); err != nil {
				t.Fatal(err)
			}
			s.batchDone(b, 12)
		},
		want: 0, wantEP: nil,
	}, {
		// It changes no attribute, but it is a write of its own, stamped
		// later, and the backend holds it only once it lands.
		name: "a re-register with the same attributes while in flight: unknown",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			b := mustTake(t, s)
			mustRegister(t, s, clone(aDrain))
			s.batchDone(b, 12)
		},
		want: 0, wantEP: aDrain,
	}, {
		name: "... until it lands",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			b := mustTake(t, s)
			mustRegister(t, s, clone(aDrain))
			s.batchDone(b, 12)
			s.batchDone(mustTake(t, s), 13)
		},
		want: 13, wantEP: aDrain,
	}, {
		name: "a failed flush: unknown",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			s.BatchFailed(mustTake(t, s))
		},
		want: 0, wantEP: aDrain,
	}, {
		name: "a failed flush retried: the retry's revision",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			s.BatchFailed(mustTake(t, s))
			s.batchDone(mustTake(t, s), 13)
		},
		want: 13, wantEP: aDrain,
	}, {
		name: "a flushed delete records nothing",
		run: func(t *testing.T, s *State) {
			if _, err := s.unregister(id, time.Time{}); err != nil {
				t.Fatal(err)
			}
			s.batchDone(mustTake(t, s), 12)
		},
		want: 0, wantEP: nil,
	}, {
		name: "a flush that lands below the snapshot's revision still names its write",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			b := mustTake(t, s)
			s.ApplyWatch(backend.WatchBatch{Revision: 20}) // progress past the write
			s.batchDone(b, 15)
		},
		want: 15, wantEP: aDrain,
	}, {
		name: "a watch put records its revision",
		run: func(t *testing.T, s *State) {
			s.ApplyWatch(backend.WatchBatch{Revision: 12, Events: []backend.Event{put(12, clone(aDrain))}})
		},
		want: 12, wantEP: aDrain,
	}, {
		name: "a watch put of the same attributes records the newer revision",
		run: func(t *testing.T, s *State) {
			s.ApplyWatch(backend.WatchBatch{Revision: 12, Events: []backend.Event{put(12, clone(a))}})
		},
		want: 12, wantEP: a,
	}, {
		name: "a watch event not newer than the snapshot is skipped",
		run: func(t *testing.T, s *State) {
			s.ApplyWatch(backend.WatchBatch{Revision: 10, Events: []backend.Event{put(10, clone(aDrain))}})
		},
		want: 5, wantEP: a,
	}, {
		name: "a watch event guarded by a pending write is skipped",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			s.ApplyWatch(backend.WatchBatch{Revision: 12, Events: []backend.Event{put(12, clone(aW3))}})
		},
		want: 0, wantEP: aDrain,
	}, {
		name: "a watch event guarded by an in-flight write is skipped, the flush then names its own write",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			b := mustTake(t, s)
			s.ApplyWatch(backend.WatchBatch{Revision: 16, Events: []backend.Event{put(16, clone(aW3))}})
			s.batchDone(b, 15)
		},
		want: 15, wantEP: aDrain,
	}, {
		name: "a watch event older than our landed write is skipped",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			s.batchDone(mustTake(t, s), 15)
			s.ApplyWatch(backend.WatchBatch{Revision: 12, Events: []backend.Event{put(12, clone(aW3))}})
		},
		want: 15, wantEP: aDrain,
	}, {
		name: "the watch's report of our own write",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			stored := s.Get(id)
			s.batchDone(mustTake(t, s), 15)
			s.ApplyWatch(backend.WatchBatch{Revision: 15, Events: []backend.Event{put(15, clone(stored))}})
		},
		want: 15, wantEP: aDrain,
	}, {
		name: "a watch delete drops it",
		run: func(t *testing.T, s *State) {
			s.ApplyWatch(backend.WatchBatch{Revision: 12, Events: []backend.Event{del(12, a)}})
		},
		want: 0, wantEP: nil,
	}, {
		name: "a watch delete and re-add: the re-add's revision",
		run: func(t *testing.T, s *State) {
			s.ApplyWatch(backend.WatchBatch{Revision: 13, Events: []backend.Event{del(12, a), put(13, clone(a))}})
		},
		want: 13, wantEP: a,
	}, {
		name: "a listing's removal drops it",
		run:  func(t *testing.T, s *State) { s.ApplyListing(listing(20)) },
		want: 0, wantEP: nil,
	}, {
		name: "a listing leaves a pending write's alone",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			s.ApplyListing(revListing(20, []*registryv1.ServiceEndpoint{clone(aW3)}, []int64{18}))
		},
		want: 0, wantEP: aDrain,
	}, {
		name: "a listing older than our landed write leaves it alone",
		run: func(t *testing.T, s *State) {
			mustRegister(t, s, clone(aDrain))
			s.batchDone(mustTake(t, s), 15)
			s.ApplyListing(revListing(12, []*registryv1.ServiceEndpoint{clone(aW3)}, []int64{11}))
		},
		want: 15, wantEP: aDrain,
	}, {
		name: "a background listing leaves the watch's newer word and revision",
		run: func(t *testing.T, s *State) {
			s.TrackForListing()
			s.ApplyWatch(backend.WatchBatch{Revision: 20, Events: []backend.Event{put(18, clone(aDrain))}})
			s.ApplyListing(revListing(15, []*registryv1.ServiceEndpoint{clone(a)}, []int64{5}))
		},
		want: 18, wantEP: aDrain,
	}, {
		name: "a listing in steps records revisions",
		run: func(t *testing.T, s *State) {
			l := revListing(20, []*registryv1.ServiceEndpoint{mkEP(t, "db", "10.0.1.1"), clone(aW3)}, []int64{17, 19})
			ap := NewListingApply(l)
			if !s.BeginListing(ap) {
				t.Fatal("listing refused")
			}
			for done := false; !done; {
				_, done = s.StepListing(ap, 1)
			}
			if got := s.epRev[registry.IDOf(l.Endpoints[0])]; got != 17 {
				t.Errorf("db endpoint's revision %d, want 17", got)
			}
		},
		want: 19, wantEP: aW3,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStateForTest("e", 100, 100)
			s.ApplyListing(revListing(10, []*registryv1.ServiceEndpoint{clone(a)}, []int64{5}))
			tc.run(t, s)
			got, known := s.epRev[id]
			if got != tc.want || known != (tc.want != 0) {
				t.Errorf("epRev %d (recorded %v), want %d", got, known, tc.want)
			}
			stored := s.Get(id)
			switch {
			case tc.wantEP == nil && stored != nil:
				t.Errorf("stored %v, want absent", stored)
			case tc.wantEP != nil && (stored == nil || !registry.SameAttributes(stored, tc.wantEP)):
				t.Errorf("stored %v, want %v", stored, tc.wantEP)
			}
		})
	}
}

func TestEpRevForNodeRecords(t *testing.T) {
	n1 := &registryv1.Node{Name: "n1", Region: "r", Cluster: "c", Zone: "z1"}
	n1b := &registryv1.Node{Name: "n1", Region: "r", Cluster: "c", Zone: "z2"}
	n1c := &registryv1.Node{Name: "n1", Region: "r", Cluster: "c", Zone: "z3"}
	id := registry.NodeIDOf(n1)
	nodeListing := func(rev int64, ns []*registryv1.Node, revs []int64) backend.Listing {
		return backend.Listing{Revision: rev, Nodes: ns, NodeRevs: revs}
	}
	watchNode := func(s *State, batchRev, rev int64, n *registryv1.Node) {
		s.ApplyWatch(backend.WatchBatch{Revision: batchRev, Nodes: []backend.NodeEvent{{ID: id, Node: n, Revision: rev}}})
	}
	for _, tc := range []struct {
		name     string
		run      func(s *State)
		want     int64
		wantNode *registryv1.Node
	}{{
		name: "a listing records its mod revisions",
		run:  func(s *State) {}, want: 6, wantNode: n1,
	}, {
		name: "a listing without revisions makes it unknown",
		run:  func(s *State) { s.ApplyListing(nodeListing(20, []*registryv1.Node{n1}, nil)) },
		want: 0, wantNode: n1,
	}, {
		name: "a listing's newer record records its revision",
		run:  func(s *State) { s.ApplyListing(nodeListing(20, []*registryv1.Node{n1b}, []int64{19})) },
		want: 19, wantNode: n1b,
	}, {
		name: "a listing's removal drops it",
		run:  func(s *State) { s.ApplyListing(nodeListing(20, nil, nil)) },
		want: 0, wantNode: nil,
	}, {
		name: "our put records its revision",
		run:  func(s *State) { s.NodePut(n1b, 12) },
		want: 12, wantNode: n1b,
	}, {
		name: "our revoke drops it",
		run:  func(s *State) { s.NodeGone(id, 12) },
		want: 0, wantNode: nil,
	}, {
		name: "a watch put records its revision",
		run:  func(s *State) { watchNode(s, 12, 12, n1b) },
		want: 12, wantNode: n1b,
	}, {
		name: "a watch delete drops it",
		run:  func(s *State) { watchNode(s, 12, 12, nil) },
		want: 0, wantNode: nil,
	}, {
		name: "a watch event not newer than the snapshot is skipped",
		run:  func(s *State) { watchNode(s, 10, 10, n1b) },
		want: 6, wantNode: n1,
	}, {
		name: "a watch event older than our put is skipped",
		run: func(s *State) {
			s.NodePut(n1b, 15)
			watchNode(s, 12, 12, n1c)
		},
		want: 15, wantNode: n1b,
	}, {
		name: "a listing older than our put keeps ours and its revision",
		run: func(s *State) {
			s.NodePut(n1b, 15)
			s.ApplyListing(nodeListing(12, []*registryv1.Node{n1c}, []int64{11}))
		},
		want: 15, wantNode: n1b,
	}, {
		name: "a listing older than our revoke keeps it gone",
		run: func(s *State) {
			s.NodeGone(id, 15)
			s.ApplyListing(nodeListing(12, []*registryv1.Node{n1c}, []int64{11}))
		},
		want: 0, wantNode: nil,
	}, {
		name: "a background listing keeps the watch's newer record and revision",
		run: func(s *State) {
			s.TrackForListing()
			watchNode(s, 20, 18, n1b)
			s.ApplyListing(nodeListing(15, []*registryv1.Node{n1}, []int64{6}))
		},
		want: 18, wantNode: n1b,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStateForTest("e", 100, 100)
			s.ApplyListing(nodeListing(10, []*registryv1.Node{n1}, []int64{6}))
			tc.run(s)
			got, known := s.nodeRev[id]
			if got != tc.want || known != (tc.want != 0) {
				t.Errorf("nodeRev %d (recorded %v), want %d", got, known, tc.want)
			}
			if stored := s.nodes[id]; !proto.Equal(stored, tc.wantNode) {
				t.Errorf("stored %v, want %v", stored, tc.wantNode)
			}
		})
	}
}

func epName(id registry.EndpointID) string { return id.Service + "/" + id.IP }

// planNames renders a plan's have and need keys, in plan order.
func planNames(p *DigestPlan) (have, need []string) {
	for _, ep := range p.have.Endpoints {
		have = append(have, epName(registry.IDOf(ep)))
	}
	for _, n := range p.have.Nodes {
		have = append(have, "node "+n.Name)
	}
	for _, id := range p.NeedEndpoints {
		need = append(need, epName(id))
	}
	for _, id := range p.NeedNodes {
		need = append(need, "node "+id.Name)
	}
	return have, need
}

// fetchAt is GetAt over a listing: the values of the needed keys, with
// their revisions.
func fetchAt(l backend.Listing, eps []registry.EndpointID, nodes []registry.NodeID) backend.Listing {
	f := backend.Listing{Revision: l.Revision}
	for i, ep := range l.Endpoints {
		if slices.Contains(eps, registry.IDOf(ep)) {
			f.Endpoints = append(f.Endpoints, clone(ep))
			f.EndpointRevs = append(f.EndpointRevs, l.EndpointRevs[i])
		}
	}
	for i, n := range l.Nodes {
		if slices.Contains(nodes, registry.NodeIDOf(n)) {
			f.Nodes = append(f.Nodes, proto.Clone(n).(*registryv1.Node))
			f.NodeRevs = append(f.NodeRevs, l.NodeRevs[i])
		}
	}
	return f
}

// Values taken from the snapshot may be stale by the time the merged
// listing is applied; a local write or a watch change made after the
// comparison must still win.
func TestDigestHaveGoesStaleBeforeApply(t *testing.T) {
	a, b := mkEP(t, "web", "10.0.0.1"), mkEP(t, "web", "10.0.0.2")
	for _, tc := range []struct {
		name  string
		track bool
		after func(t *testing.T, s *State) // between comparison and application
		want  []string
	}{{
		name:  "a local register",
		after: func(t *testing.T, s *State) { mustRegister(t, s, mkEP(t, "web", "10.0.0.1", draining)) },
		want:  []string{"10.0.0.1/STATE_DRAINING", "10.0.0.2/STATE_SERVING"},
	}, {
		name: "a local register that landed",
		after: func(t *testing.T, s *State) {
			mustRegister(t, s, mkEP(t, "web", "10.0.0.1", draining))
			s.batchDone(mustTake(t, s), 21)
		},
		want: []string{"10.0.0.1/STATE_DRAINING", "10.0.0.2/STATE_SERVING"},
	}, {
		name: "a local unregister",
		after: func(t *testing.T, s *State) {
			if _, err := s.unregister(registry.IDOf(a), time.Time{}); err != nil {
				t.Fatal(err)
			}
		},
		want: []string{"10.0.0.2/STATE_SERVING"},
	}, {
		name: "a watch change after the listing", track: true,
		after: func(t *testing.T, s *State) {
			s.ApplyWatch(backend.WatchBatch{Revision: 22, Events: []backend.Event{put(21, mkEP(t, "web", "10.0.0.1", draining)), del(22, b)}})
		},
		want: []string{"10.0.0.1/STATE_DRAINING"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStateForTest("e", 100, 100)
			s.ApplyListing(revListing(10, []*registryv1.ServiceEndpoint{clone(a), clone(b)}, []int64{3, 4}))
			if tc.track {
				s.TrackForListing()
			}
			kr := backend.KeyRevisions{Revision: 20, Endpoints: []backend.EndpointRevision{{ID: registry.IDOf(a), ModRevision: 3}, {ID: registry.IDOf(b), ModRevision: 4}}}
			p := NewDigestPlan(kr)
			s.CompareDigest(p, math.MaxInt)
			if p.Needs() != 0 {
				t.Fatalf("needs %d", p.Needs())
			}
			tc.after(t, s)
			s.ApplyListing(p.Merge(backend.Listing{Revision: 20}))
			if got := snapshotIPs(s); !eq(got, tc.want) {
				t.Fatalf("snapshot %v, want %v", got, tc.want)
			}
		})
	}
}

// The randomized model: a backend that keeps every key's history, writers
// on both sides, a watch that lags, listings full and digested, all
// interleaved at random. After every step each recorded revision must name
// a write, in the backend's history, of exactly the value the snapshot
// holds; and once everything settles a digest backstop must leave the
// snapshot exactly the backend's, after which nothing needs fetching.

type epWrite struct {
	rev int64
	ep  *registryv1.ServiceEndpoint // nil: deleted
}

type nodeWrite struct {
	rev int64
	n   *registryv1.Node // nil: deleted
}

type modelBackend struct {
	rev    int64
	eps    map[registry.EndpointID][]epWrite
	nodes  map[registry.NodeID][]nodeWrite
	watch  bool                 // record changes for a watch
	unsent []backend.WatchBatch // one per revision, not yet delivered
}

// epAt is id's value and mod revision as of rev (nil, 0: absent).
func (b *modelBackend) epAt(id registry.EndpointID, rev int64) (*registryv1.ServiceEndpoint, int64) {
	var cur epWrite
	for _, w := range b.eps[id] {
		if w.rev <= rev {
			cur = w
		}
	}
	if cur.ep == nil {
		return nil, 0
	}
	return cur.ep, cur.rev
}

func (b *modelBackend) nodeAt(id registry.NodeID, rev int64) (*registryv1.Node, int64) {
	var cur nodeWrite
	for _, w := range b.nodes[id] {
		if w.rev <= rev {
			cur = w
		}
	}
	if cur.n == nil {
		return nil, 0
	}
	return cur.n, cur.rev
}

// commit ends a transaction: etcd moves to a new revision only when the
// transaction changed something.
func (b *modelBackend) commit(batch backend.WatchBatch) int64 {
	if len(batch.Events)+len(batch.Nodes) == 0 {
		return b.rev
	}
	b.rev++
	batch.Revision = b.rev
	if b.watch {
		b.unsent = append(b.unsent, batch)
	}
	return b.rev
}

// apply writes muts in one transaction, as Store.Apply does for a batch
// within MaxTxnOps.
func (b *modelBackend) apply(muts []backend.Mutation) int64 {
	var batch backend.WatchBatch
	for _, m := range muts {
		if cur, _ := b.epAt(m.ID, b.rev); cur == nil && m.Endpoint == nil {
			continue // deleting nothing changes nothing
		}
		ev := backend.Event{ID: m.ID, Revision: b.rev + 1}
		var v *registryv1.ServiceEndpoint
		if m.Endpoint != nil {
			v = clone(m.Endpoint)
			ev.Endpoint = clone(v)
		}
		b.eps[m.ID] = append(b.eps[m.ID], epWrite{b.rev + 1, v})
		batch.Events = append(batch.Events, ev)
	}
	return b.commit(batch)
}

// putNode writes (n) or deletes (id only) a node record.
func (b *modelBackend) putNode(id registry.NodeID, n *registryv1.Node) int64 {
	if cur, _ := b.nodeAt(id, b.rev); cur == nil && n == nil {
		return b.commit(backend.WatchBatch{})
	}
	ev := backend.NodeEvent{ID: id, Revision: b.rev + 1}
	var v *registryv1.Node
	if n != nil {
		v = proto.Clone(n).(*registryv1.Node)
		ev.Node = proto.Clone(n).(*registryv1.Node)
	}
	b.nodes[id] = append(b.nodes[id], nodeWrite{b.rev + 1, v})
	return b.commit(backend.WatchBatch{Nodes: []backend.NodeEvent{ev}})
}

func sortedKeys[K comparable, V any](m map[K]V, key func(K) string) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return key(out[i]) < key(out[j]) })
	return out
}

func epKey(id registry.EndpointID) string { k, _ := id.Key(); return k }
func nodeKey(id registry.NodeID) string   { k, _ := id.Key(); return k }

// listAt is List at rev (as Store.List, with revisions).
func (b *modelBackend) listAt(rev int64) backend.Listing {
	l := backend.Listing{Revision: rev}
	for _, id := range sortedKeys(b.eps, epKey) {
		if ep, r := b.epAt(id, rev); ep != nil {
			l.Endpoints = append(l.Endpoints, clone(ep))
			l.EndpointRevs = append(l.EndpointRevs, r)
		}
	}
	for _, id := range sortedKeys(b.nodes, nodeKey) {
		if n, r := b.nodeAt(id, rev); n != nil {
			l.Nodes = append(l.Nodes, proto.Clone(n).(*registryv1.Node))
			l.NodeRevs = append(l.NodeRevs, r)
		}
	}
	return l
}

// keyRevisionsAt is ListRevisions at rev.
func (b *modelBackend) keyRevisionsAt(rev int64) backend.KeyRevisions {
	l := b.listAt(rev)
	kr := backend.KeyRevisions{Revision: rev}
	for i, ep := range l.Endpoints {
		kr.Endpoints = append(kr.Endpoints, backend.EndpointRevision{ID: registry.IDOf(ep), ModRevision: l.EndpointRevs[i]})
	}
	for i, n := range l.Nodes {
		kr.Nodes = append(kr.Nodes, backend.NodeRevision{ID: registry.NodeIDOf(n), ModRevision: l.NodeRevs[i]})
	}
	return kr
}

// getAt is GetAt at rev.
func (b *modelBackend) getAt(rev int64, eps []registry.EndpointID, nodes []registry.NodeID) backend.Listing {
	l := backend.Listing{Revision: rev}
	for _, id := range eps {
		if ep, r := b.epAt(id, rev); ep != nil {
			l.Endpoints = append(l.Endpoints, clone(ep))
			l.EndpointRevs = append(l.EndpointRevs, r)
		}
	}
	for _, id := range nodes {
		if n, r := b.nodeAt(id, rev); n != nil {
			l.Nodes = append(l.Nodes, proto.Clone(n).(*registryv1.Node))
			l.NodeRevs = append(l.NodeRevs, r)
		}
	}
	return l
}

// modelListing is a listing on its way: read at rev, compared (digest)
// in steps, then applied in steps.
type modelListing struct {
	tracked bool
	rev     int64
	plan    *DigestPlan // digest: until compared
	l       backend.Listing
	apply   *ListingApply // once begun
}

type epRevModel struct {
	t        *testing.T
	name     string
	rng      *rand.Rand
	s        *State
	b        *modelBackend
	poll     bool
	ids      []registry.EndpointID
	nodeIDs  []registry.NodeID
	inflight []backend.Mutation
	nodeOps  []func() // our node writes that landed, not yet recorded in the state
	lst      *modelListing
	step     int
	log      []string
	fetched  int // values the digest listings fetched
	listed   int // keys they listed
}

func (m *epRevModel) logf(format string, args ...any) {
	m.log = append(m.log, fmt.Sprintf("%d: ", m.step)+fmt.Sprintf(format, args...))
	if len(m.log) > 60 {
		m.log = m.log[1:]
	}
}

func (m *epRevModel) fatalf(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("%s, step %d: %s\nlast steps:\n%s", m.name, m.step, fmt.Sprintf(format, args...), joinLines(m.log))
}

func joinLines(lines []string) string {
	out := ""
	for _, l := range lines {
		out += "  " + l + "\n"
	}
	return out
}

func (m *epRevModel) randomEP(id registry.EndpointID) *registryv1.ServiceEndpoint {
	muts := []func(*registryv1.ServiceEndpoint){weight(uint32(1 + m.rng.Intn(3)))}
	if m.rng.Intn(2) == 0 {
		muts = append(muts, draining)
	}
	return mkEP(m.t, id.Service, id.IP, muts...)
}

func (m *epRevModel) randomNode(id registry.NodeID) *registryv1.Node {
	return &registryv1.Node{Name: id.Name, Region: id.Region, Cluster: id.Cluster, Zone: fmt.Sprintf("z%d", m.rng.Intn(3))}
}

func describe(ep *registryv1.ServiceEndpoint) string {
	if ep == nil {
		return "<none>"
	}
	return fmt.Sprintf("%s/%s %s w%d", ep.Service, ep.Ip, ep.State, ep.Weight)
}

// check asserts the invariant the digest relies on.
func (m *epRevModel) check() {
	m.t.Helper()
	for id, r := range m.s.epRev {
		stored := m.s.Get(id)
		if stored == nil {
			m.fatalf("%s has revision %d but no stored value", epName(id), r)
		}
		var written *registryv1.ServiceEndpoint
		found := false
		for _, w := range m.b.eps[id] {
			if w.rev == r {
				written, found = w.ep, true
			}
		}
		if !found || written == nil || !registry.SameAttributes(stored, written) {
			m.fatalf("%s: stored %s with revision %d, but the backend wrote %s there (found %v)", epName(id), describe(stored), r, describe(written), found)
		}
	}
	for id, r := range m.s.nodeRev {
		stored := m.s.nodes[id]
		if stored == nil {
			m.fatalf("node %s has revision %d but no record", id.Name, r)
		}
		var written *registryv1.Node
		found := false
		for _, w := range m.b.nodes[id] {
			if w.rev == r {
				written, found = w.n, true
			}
		}
		if !found || !proto.Equal(stored, written) {
			m.fatalf("node %s: stored %v with revision %d, but the backend wrote %v there (found %v)", id.Name, stored, r, written, found)
		}
	}
}

func (m *epRevModel) pickID() registry.EndpointID { return m.ids[m.rng.Intn(len(m.ids))] }

// deliver hands the watch's next k batches to the state as one.
func (m *epRevModel) deliver(k int) {
	if m.poll || (m.lst != nil && !m.lst.tracked) {
		return // no watch; or a foreground listing has it stopped
	}
	if len(m.b.unsent) == 0 {
		m.logf("watch progress at %d", m.b.rev)
		m.s.ApplyWatch(backend.WatchBatch{Revision: m.b.rev})
		return
	}
	k = min(k, len(m.b.unsent))
	var b backend.WatchBatch
	for _, u := range m.b.unsent[:k] {
		b.Events = append(b.Events, u.Events...)
		b.Nodes = append(b.Nodes, u.Nodes...)
		b.Revision = u.Revision
	}
	m.b.unsent = m.b.unsent[k:]
	m.logf("watch delivers %d revisions up to %d", k, b.Revision)
	m.s.ApplyWatch(b)
}

// startListing begins a backstop (digest) or full listing at the
// backend's current revision.
func (m *epRevModel) startListing(digest bool) {
	tracked := !m.poll && m.rng.Intn(5) != 0
	if tracked {
		m.s.TrackForListing()
	}
	m.lst = &modelListing{tracked: tracked, rev: m.b.rev}
	if digest {
		m.lst.plan = NewDigestPlan(m.b.keyRevisionsAt(m.b.rev))
	} else {
		m.lst.l = m.b.listAt(m.b.rev)
	}
	m.logf("listing (digest %v, tracked %v) at %d", digest, tracked, m.b.rev)
}

// stepListing moves the listing on by one step; true when it is over.
func (m *epRevModel) StepListing() bool {
	l := m.lst
	switch {
	case l.plan != nil:
		if !m.s.CompareDigest(l.plan, 1+m.rng.Intn(3)) {
			m.logf("listing: compare step")
			return false
		}
		f := m.b.getAt(l.rev, l.plan.NeedEndpoints, l.plan.NeedNodes)
		if len(f.Endpoints)+len(f.Nodes) != l.plan.Needs() {
			m.fatalf("fetched %d of %d needed values at %d", len(f.Endpoints)+len(f.Nodes), l.plan.Needs(), l.rev)
		}
		m.fetched += l.plan.Needs()
		m.listed += len(l.plan.kr.Endpoints) + len(l.plan.kr.Nodes)
		m.logf("listing: compared, fetched %d of %d", l.plan.Needs(), len(l.plan.kr.Endpoints)+len(l.plan.kr.Nodes))
		l.l = l.plan.Merge(f)
		l.plan = nil
		return false
	case l.apply == nil:
		l.apply = NewListingApply(l.l)
		if !m.s.BeginListing(l.apply) {
			m.s.Untrack()
			m.logf("listing at %d refused", l.rev)
			m.endListing()
			return true
		}
		m.logf("listing: begun")
		return false
	}
	eff, done := m.s.StepListing(l.apply, 1+m.rng.Intn(2))
	evs := eff.Events
	m.logf("listing: apply step, %d events", len(evs))
	if done {
		m.endListing()
	}
	return done
}

func (m *epRevModel) endListing() {
	if !m.lst.tracked && !m.poll {
		// The watch resumes after the foreground listing.
		for len(m.b.unsent) > 0 && m.b.unsent[0].Revision <= m.lst.rev {
			m.b.unsent = m.b.unsent[1:]
		}
	}
	m.lst = nil
}

func (m *epRevModel) op() {
	switch r := m.rng.Intn(100); {
	case r < 18: // a client registers
		ep := m.randomEP(m.pickID())
		_, ev, err := m.s.register(ep, t0)
		if err != nil {
			m.fatalf("register: %v", err)
		}
		m.logf("register %s (changed %v)", describe(ep), ev != nil)
	case r < 24: // a client unregisters
		id := m.pickID()
		_, err := m.s.unregister(id, time.Time{})
		m.logf("unregister %s (%v)", epName(id), err)
	case r < 34: // the flusher takes a batch
		if m.inflight == nil {
			m.inflight = m.s.TakeBatch(1+m.rng.Intn(3), time.Time{})
			m.logf("take %d", len(m.inflight))
			if len(m.inflight) == 0 {
				m.inflight = nil
			}
		}
	case r < 44: // the batch completes
		if m.inflight == nil {
			return
		}
		switch k := m.rng.Intn(10); {
		case k < 7:
			rev := m.b.apply(m.inflight)
			m.logf("batch of %d landed at %d", len(m.inflight), rev)
			m.s.batchDone(m.inflight, rev)
		case k < 9:
			m.logf("batch of %d failed", len(m.inflight))
			m.s.BatchFailed(m.inflight)
		default: // landed, but the answer was lost
			rev := m.b.apply(m.inflight)
			m.logf("batch of %d landed at %d, reported failed", len(m.inflight), rev)
			m.s.BatchFailed(m.inflight)
		}
		m.inflight = nil
	case r < 58: // another writer
		ids := []registry.EndpointID{m.pickID()}
		if other := m.pickID(); other != ids[0] && m.rng.Intn(3) == 0 {
			ids = append(ids, other)
		}
		var muts []backend.Mutation
		for _, id := range ids {
			mut := backend.Mutation{ID: id}
			if m.rng.Intn(4) != 0 {
				mut.Endpoint = m.randomEP(id)
			}
			muts = append(muts, mut)
		}
		rev := m.b.apply(muts)
		m.logf("another writer: %d keys at %d (%s...)", len(muts), rev, describe(muts[0].Endpoint))
	case r < 72: // the watch delivers
		m.deliver(1 + m.rng.Intn(3))
	case r < 78: // we announce or revoke a node
		id := m.nodeIDs[m.rng.Intn(len(m.nodeIDs))]
		var n *registryv1.Node
		if m.rng.Intn(3) != 0 {
			n = m.randomNode(id)
		}
		rev := m.b.putNode(id, n)
		record := func() {
			if n != nil {
				m.s.NodePut(n, rev)
			} else {
				m.s.NodeGone(id, rev)
			}
		}
		m.logf("our node %s put %v at %d", id.Name, n != nil, rev)
		if m.rng.Intn(2) == 0 {
			record()
		} else {
			m.nodeOps = append(m.nodeOps, record)
		}
	case r < 82: // our node write's answer arrives
		if len(m.nodeOps) > 0 {
			i := m.rng.Intn(len(m.nodeOps))
			m.logf("our node write recorded")
			m.nodeOps[i]()
			m.nodeOps = slices.Delete(m.nodeOps, i, i+1)
		}
	case r < 86: // another writer's node record, or a lease lapsing
		id := m.nodeIDs[m.rng.Intn(len(m.nodeIDs))]
		var n *registryv1.Node
		if m.rng.Intn(3) != 0 {
			n = m.randomNode(id)
		}
		rev := m.b.putNode(id, n)
		m.logf("another node write %s put %v at %d", id.Name, n != nil, rev)
	default: // a listing starts or moves on
		if m.lst == nil {
			m.startListing(m.rng.Intn(3) != 0)
		} else {
			m.StepListing()
		}
	}
}

// settle lets everything in progress finish, then runs a digest backstop
// with nothing else going on: the snapshot must then be exactly the
// backend, and a second comparison must need nothing.
func (m *epRevModel) settle() {
	m.logf("settle")
	for m.lst != nil {
		m.StepListing()
		m.check()
	}
	if m.inflight != nil {
		m.s.batchDone(m.inflight, m.b.apply(m.inflight))
		m.inflight = nil
	}
	for _, op := range m.nodeOps {
		op()
	}
	m.nodeOps = nil
	for {
		b := m.s.TakeBatch(100, time.Time{})
		if len(b) == 0 {
			break
		}
		m.s.batchDone(b, m.b.apply(b))
	}
	m.deliver(len(m.b.unsent))
	m.check()
	m.lst = &modelListing{rev: m.b.rev, plan: NewDigestPlan(m.b.keyRevisionsAt(m.b.rev))}
	for m.lst != nil {
		m.StepListing()
	}
	m.check()
	if d := m.s.queue.depth(); d != 0 {
		m.fatalf("%d writes still queued", d)
	}
	for _, id := range m.ids {
		want, _ := m.b.epAt(id, m.b.rev)
		got := m.s.Get(id)
		if (want == nil) != (got == nil) || (want != nil && !registry.SameAttributes(got, want)) {
			m.fatalf("after settling, %s is %s in the snapshot and %s in the backend", epName(id), describe(got), describe(want))
		}
	}
	for _, id := range m.nodeIDs {
		want, _ := m.b.nodeAt(id, m.b.rev)
		if got := m.s.nodes[id]; !proto.Equal(got, want) {
			m.fatalf("after settling, node %s is %v in the snapshot and %v in the backend", id.Name, got, want)
		}
	}
	p := NewDigestPlan(m.b.keyRevisionsAt(m.b.rev))
	m.s.CompareDigest(p, math.MaxInt)
	if p.Needs() != 0 {
		_, need := planNames(p)
		m.fatalf("after settling, a backstop would still fetch %v", need)
	}
}

func TestEpRevRandomModel(t *testing.T) {
	const steps = 4000
	for _, poll := range []bool{false, true} {
		for seed := int64(1); seed <= 3; seed++ {
			name := fmt.Sprintf("poll=%v/seed=%d", poll, seed)
			t.Run(name, func(t *testing.T) {
				m := &epRevModel{
					t: t, name: name, rng: rand.New(rand.NewSource(seed)), poll: poll,
					s: newStateForTest("e", 1000, 1000),
					b: &modelBackend{eps: map[registry.EndpointID][]epWrite{}, nodes: map[registry.NodeID][]nodeWrite{}, watch: !poll},
				}
				for _, svc := range []string{"web", "db"} {
					for _, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
						m.ids = append(m.ids, registry.IDOf(mkEP(t, svc, ip)))
					}
				}
				for _, name := range []string{"n1", "n2"} {
					m.nodeIDs = append(m.nodeIDs, registry.NodeID{Region: "r", Cluster: "c", Name: name})
				}
				// The registry at start-up.
				for _, id := range m.ids[:4] {
					m.b.apply([]backend.Mutation{{ID: id, Endpoint: m.randomEP(id)}})
				}
				m.b.putNode(m.nodeIDs[0], m.randomNode(m.nodeIDs[0]))
				m.b.unsent = nil
				m.s.ApplyListing(m.b.listAt(m.b.rev))
				m.check()
				for m.step = 1; m.step <= steps; m.step++ {
					m.op()
					m.check()
					if m.step%500 == 0 {
						m.settle()
					}
				}
				m.settle()
				// The model must have exercised what it is about.
				if len(m.s.epRev) == 0 || m.b.rev < steps/10 || m.listed == 0 || m.fetched == 0 || m.fetched >= m.listed {
					t.Fatalf("degenerate run: %d revisions recorded, backend at %d, digests fetched %d of %d", len(m.s.epRev), m.b.rev, m.fetched, m.listed)
				}
				t.Logf("backend at revision %d; digest listings fetched %d of %d values", m.b.rev, m.fetched, m.listed)
			})
		}
	}
}

// A keys-only backstop reconciles only the services where the snapshot may
// differ from the listing: a value to fetch, or endpoints the listing
// lacks. The others matched exactly when compared, and are not looked at
// again; the result is the backend either way.
func TestDigestScopeSkipsCleanServices(t *testing.T) {
	eps := map[string][]*registryv1.ServiceEndpoint{}
	var start backend.Listing
	rev := int64(0)
	for _, svc := range []string{"clean", "changed", "gone", "vanished"} {
		for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
			rev++
			ep := mkEP(t, svc, ip)
			eps[svc] = append(eps[svc], ep)
			start.Endpoints = append(start.Endpoints, ep)
			start.EndpointRevs = append(start.EndpointRevs, rev)
		}
	}
	start.Revision = rev
	s := newStateForTest("e", 100, 100)
	s.ApplyListing(start)

	// The backend at 20: changed's second endpoint rewritten, gone's
	// second deleted, every endpoint of vanished deleted.
	changed := mkEP(t, "changed", "10.0.0.2", draining)
	held := backend.Listing{Revision: 20}
	for i, ep := range start.Endpoints {
		switch {
		case ep.Service == "changed" && ep.Ip == "10.0.0.2":
			held.Endpoints = append(held.Endpoints, changed)
			held.EndpointRevs = append(held.EndpointRevs, 19)
		case ep.Service == "gone" && ep.Ip == "10.0.0.2", ep.Service == "vanished":
		default:
			held.Endpoints = append(held.Endpoints, ep)
			held.EndpointRevs = append(held.EndpointRevs, start.EndpointRevs[i])
		}
	}
	kr := backend.KeyRevisions{Revision: 20}
	for i, ep := range held.Endpoints {
		kr.Endpoints = append(kr.Endpoints, backend.EndpointRevision{ID: registry.IDOf(ep), ModRevision: held.EndpointRevs[i]})
	}

	p := NewDigestPlan(kr)
	for !s.CompareDigest(p, 3) {
	}
	var dirty []string
	for svc := range p.Dirty {
		dirty = append(dirty, svc)
	}
	sort.Strings(dirty)
	if want := []string{"changed", "gone", "vanished"}; !eq(dirty, want) {
		t.Fatalf("dirty services %v, want %v", dirty, want)
	}

	a := NewListingApply(p.Merge(fetchAt(held, p.NeedEndpoints, p.NeedNodes)))
	a.Scope = p.Dirty
	if !s.BeginListing(a) {
		t.Fatal("listing ignored")
	}
	got := slices.Clone(a.services)
	sort.Strings(got)
	if !eq(got, dirty) {
		t.Fatalf("reconciling services %v, want only the dirty %v", got, dirty)
	}
	var names []string
	for done := false; !done; {
		step, d := s.StepListing(a, 1)
		names, done = append(names, types(step.Events)...), d
	}
	sort.Strings(names)
	if want := []string{"ENDPOINT_REMOVED 10.0.0.1", "ENDPOINT_REMOVED 10.0.0.2", "ENDPOINT_REMOVED 10.0.0.2", "ENDPOINT_UPDATED 10.0.0.2"}; !eq(names, want) {
		t.Fatalf("events %v, want %v", names, want)
	}
	if s.Len() != len(held.Endpoints) || s.Get(registry.IDOf(changed)).GetState() != registryv1.State_STATE_DRAINING {
		t.Fatalf("snapshot of %d endpoints (backend %d), changed is %v", s.Len(), len(held.Endpoints), s.Get(registry.IDOf(changed)))
	}
	// Nothing left to fetch or reconcile.
	p = NewDigestPlan(kr)
	s.CompareDigest(p, math.MaxInt)
	if p.Needs() != 0 || len(p.Dirty) != 0 {
		t.Fatalf("after the repair: %d to fetch, dirty %v", p.Needs(), p.Dirty)
	}
}
