package backendtest

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// endpoint i of service at generation gen (its Node names the generation,
// so a reader can tell versions apart), stamped hlc by writer.
func endpoint(service string, i, gen int, hlc uint64, writer string) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service:  service,
		Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
		Ip:       fmt.Sprintf("10.0.%d.%d", i>>8&0xff, i&0xff),
		Ports:    []*registryv1.Port{{Name: "http", Port: 8080}},
		Node:     fmt.Sprintf("node-%d", gen),
		Cluster:  "c1",
		Region:   "r1",
		State:    registryv1.State_STATE_SERVING,
		Weight:   1,
		Stamp:    stamp(hlc, writer),
	}
}

func stamp(hlc uint64, writer string) *registryv1.WriteStamp {
	return &registryv1.WriteStamp{Hlc: hlc, Writer: writer}
}

func put(ep *registryv1.ServiceEndpoint) backend.Mutation {
	return backend.Mutation{ID: registry.IDOf(ep), Endpoint: ep}
}

func del(id registry.EndpointID, hlc uint64, writer string) backend.Mutation {
	return backend.Mutation{ID: id, Stamp: stamp(hlc, writer)}
}

func apply(t T, s backend.Store, muts ...backend.Mutation) []backend.Outcome {
	t.Helper()
	outs, err := s.ApplyOrdered(testCtx(t), muts)
	if err != nil {
		t.Fatalf("ApplyOrdered: %v", err)
	}
	if len(outs) != len(muts) {
		t.Fatalf("ApplyOrdered returned %d outcomes for %d mutations", len(outs), len(muts))
	}
	return outs
}

func applyOne(t T, s backend.Store, m backend.Mutation) backend.Outcome {
	t.Helper()
	return apply(t, s, m)[0]
}

// stored is what the store holds for id now: its value (nil: absent) and
// mod revision.
func stored(t T, s backend.Store, id registry.EndpointID) (*registryv1.ServiceEndpoint, int64) {
	t.Helper()
	ep, rev, _, err := s.GetEndpoint(testCtx(t), id)
	if err != nil {
		t.Fatalf("GetEndpoint %s: %v", id, err)
	}
	return ep, rev
}

func list(t T, s backend.Store) backend.Listing {
	t.Helper()
	l, err := s.List(testCtx(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return l
}

func describeOutcome(o backend.Outcome) string {
	return fmt.Sprintf("{landed %v at %d, superseded %v by %s (%s), key rev %d, tomb rev %d, err %v}",
		o.Landed, o.Revision, o.Superseded, o.Current.GetNode(), registry.FormatStamp(o.CurrentStamp), o.KeyRev, o.TombRev, o.Err)
}

// RunApplyOrderedLastStampWins: per key the store keeps the write with the
// newest stamp, whichever order writes arrive in; a delete's stamp
// outlives the endpoint, so a put stamped before it but flushed after
// cannot bring the endpoint back; a dropped write is told what overtook
// it; wrong revision guesses never change the result.
func RunApplyOrderedLastStampWins(t T, f Factory) {
	s := f.New(t)

	// Newer first, then an older one from a writer that never saw it.
	newer := endpoint("web", 1, 2, 200, "B")
	id := registry.IDOf(newer)
	o := applyOne(t, s, put(newer))
	if !o.Landed || o.KeyRev != o.Revision || o.Revision <= 0 {
		t.Fatalf("first write: %s, want landed, its key at its revision", describeOutcome(o))
	}
	older := endpoint("web", 1, 1, 100, "A")
	o = applyOne(t, s, put(older))
	if !o.Superseded || o.Landed || o.Current.GetNode() != newer.Node || o.CurrentStamp.GetHlc() != 200 {
		t.Fatalf("older write after a newer: %s, want superseded by the newer value", describeOutcome(o))
	}
	if got, _ := stored(t, s, id); got.GetNode() != newer.Node {
		t.Fatalf("store holds %s, want the newer write", got.GetNode())
	}

	// Older first, then newer, with a guess that is wrong (absent).
	first := endpoint("web", 2, 1, 100, "A")
	id2 := registry.IDOf(first)
	applyOne(t, s, put(first))
	second := endpoint("web", 2, 2, 200, "B")
	o = applyOne(t, s, put(second))
	if !o.Landed {
		t.Fatalf("newer write after an older, guessing absent: %s, want landed", describeOutcome(o))
	}
	if got, rev := stored(t, s, id2); got.GetNode() != second.Node || rev != o.Revision {
		t.Fatalf("store holds %s at %d, want the newer write at %d", got.GetNode(), rev, o.Revision)
	}

	// An equal clock reading is ordered by writer; a guess that names no
	// revision of the key is as wrong as can be.
	tie := endpoint("web", 1, 3, 200, "C")
	m := put(tie)
	m.KeyRev = o.Revision + 1000
	o = applyOne(t, s, m)
	if !o.Landed {
		t.Fatalf("same clock, later writer, wrong guess: %s, want landed", describeOutcome(o))
	}
	keyRev := o.KeyRev

	// A delete, then writes stamped before it.
	o = applyOne(t, s, backend.Mutation{ID: id, Stamp: stamp(300, "B"), KeyRev: keyRev})
	if !o.Landed || o.KeyRev != 0 {
		t.Fatalf("delete: %s, want landed, the key absent", describeOutcome(o))
	}
	if got, rev := stored(t, s, id); got != nil || rev != 0 {
		t.Fatalf("after the delete the store holds %v at %d", got, rev)
	}
	stale := endpoint("web", 1, 4, 250, "C")
	m = put(stale)
	m.KeyRev = keyRev // a writer that saw the key present
	o = applyOne(t, s, m)
	if !o.Superseded || o.Current != nil || o.CurrentStamp.GetHlc() != 300 {
		t.Fatalf("put stamped before the delete, flushed after: %s, want superseded by the delete", describeOutcome(o))
	}
	o = applyOne(t, s, put(stale)) // a writer that guessed absent
	if !o.Superseded || o.Current != nil {
		t.Fatalf("the same, guessing absent: %s, want superseded by the delete", describeOutcome(o))
	}
	if got, _ := stored(t, s, id); got != nil {
		t.Fatalf("a write older than the delete brought the endpoint back: %s", got.GetNode())
	}
	o = applyOne(t, s, del(id, 250, "C"))
	if !o.Superseded || o.CurrentStamp.GetHlc() != 300 {
		t.Fatalf("an older delete: %s, want superseded, the newer delete's stamp kept", describeOutcome(o))
	}
	o = applyOne(t, s, put(stale)) // still older than the first delete
	if !o.Superseded {
		t.Fatalf("an older delete lowered the tombstone: %s", describeOutcome(o))
	}
	fresh := endpoint("web", 1, 5, 400, "A")
	o = applyOne(t, s, put(fresh))
	if !o.Landed {
		t.Fatalf("put stamped after the delete: %s, want landed", describeOutcome(o))
	}
	if got, _ := stored(t, s, id); got.GetNode() != fresh.Node {
		t.Fatalf("store holds %s, want the write after the delete", got.GetNode())
	}

	// A batch of newer and older writes with right and wrong guesses: each
	// ends as its stamp says, in one call.
	var batch []backend.Mutation
	for i := range 10 {
		batch = append(batch, put(endpoint("batch", i, 1, 100, "A")))
	}
	outs := apply(t, s, batch...)
	var second2 []backend.Mutation
	for i, o := range outs {
		if !o.Landed {
			t.Fatalf("batch mutation %d: %s, want landed", i, describeOutcome(o))
		}
		hlc := uint64(200) // even: newer
		if i%2 == 1 {
			hlc = 50 // odd: older
		}
		m := put(endpoint("batch", i, 2, hlc, "B"))
		if i%4 == 0 {
			m.KeyRev = o.KeyRev // the right guess
		}
		second2 = append(second2, m)
	}
	for i, o := range apply(t, s, second2...) {
		got, _ := stored(t, s, second2[i].ID)
		if i%2 == 0 && (!o.Landed || got.GetNode() != "node-2") {
			t.Errorf("newer batch write %d: %s, store holds %s", i, describeOutcome(o), got.GetNode())
		}
		if i%2 == 1 && (!o.Superseded || got.GetNode() != "node-1" || o.Current.GetNode() != "node-1") {
			t.Errorf("older batch write %d: %s, store holds %s", i, describeOutcome(o), got.GetNode())
		}
	}
}

// RunApplyIdempotent: re-sending mutations that already landed (their
// answer lost) with the guesses they were first sent with changes nothing
// and moves no revision, and each is told it is settled by its own value;
// a duplicate key fails the call before anything is written.
func RunApplyIdempotent(t T, f Factory) {
	s := f.New(t)
	var first []backend.Mutation
	for i := range 6 {
		first = append(first, put(endpoint("idem", i, 1, 100, "A")))
	}
	outs := apply(t, s, first...)
	// A second batch: updates, deletes, and a put of a new key, with the
	// guesses the first batch's outcomes give.
	var second []backend.Mutation
	for i, o := range outs {
		var m backend.Mutation
		if i%2 == 0 {
			m = put(endpoint("idem", i, 2, 200, "B"))
		} else {
			m = del(first[i].ID, 200, "B")
		}
		m.KeyRev, m.TombRev = o.KeyRev, o.TombRev
		second = append(second, m)
	}
	second = append(second, put(endpoint("idem", 9, 1, 200, "B")))
	for i, o := range apply(t, s, second...) {
		if !o.Landed {
			t.Fatalf("second batch mutation %d: %s, want landed", i, describeOutcome(o))
		}
	}
	before := list(t, s)

	for round := range 2 {
		for i, o := range apply(t, s, second...) {
			want := second[i].StampOf()
			if !o.Superseded || o.Landed || registry.CompareStamps(o.CurrentStamp, want) != 0 {
				t.Fatalf("replay %d, mutation %d: %s, want settled by its own stamp %s", round, i, describeOutcome(o), registry.FormatStamp(want))
			}
			if ep := second[i].Endpoint; (ep == nil) != (o.Current == nil) || (ep != nil && !proto.Equal(ep, o.Current)) {
				t.Fatalf("replay %d, mutation %d: current %v, want its own value %v", round, i, o.Current, ep)
			}
		}
		if after := list(t, s); !sameListing(before, after) {
			t.Fatalf("replay %d changed the store:\nbefore %s\nafter  %s", round, describeListing(before), describeListing(after))
		}
	}

	// A key twice in one call: refused whole.
	dup := []backend.Mutation{put(endpoint("idem", 20, 1, 300, "C")), put(endpoint("idem", 21, 1, 300, "C")), put(endpoint("idem", 20, 2, 301, "C"))}
	if _, err := s.ApplyOrdered(testCtx(t), dup); err == nil {
		t.Fatalf("a batch writing a key twice was accepted")
	}
	if got, _ := stored(t, s, dup[1].ID); got != nil {
		t.Fatalf("a refused batch wrote %s", got.GetIp())
	}
}

// RunApplyRefusesAlone: a mutation the store can never accept (no stamp,
// an endpoint that does not match its id) is refused in its own outcome;
// the rest of its batch lands.
func RunApplyRefusesAlone(t T, f Factory) {
	s := f.New(t)
	unstamped := endpoint("refuse", 1, 1, 0, "")
	unstamped.Stamp = nil
	mismatched := put(endpoint("refuse", 2, 1, 100, "A"))
	mismatched.ID = registry.IDOf(endpoint("refuse", 3, 1, 100, "A"))
	muts := []backend.Mutation{
		put(endpoint("refuse", 0, 1, 100, "A")),
		put(unstamped),
		{ID: registry.IDOf(endpoint("refuse", 4, 1, 100, "A"))}, // a delete without a stamp
		mismatched,
		put(endpoint("refuse", 5, 1, 100, "A")),
	}
	outs := apply(t, s, muts...)
	for i, o := range outs {
		good := i == 0 || i == 4
		if good && (!o.Landed || o.Err != nil) {
			t.Errorf("valid mutation %d: %s, want landed despite its neighbours", i, describeOutcome(o))
		}
		if !good && (o.Err == nil || o.Landed || !o.Settled()) {
			t.Errorf("invalid mutation %d: %s, want refused in its own Err", i, describeOutcome(o))
		}
	}
	for _, i := range []int{1, 3} {
		if got, _ := stored(t, s, muts[i].ID); got != nil {
			t.Errorf("refused mutation %d was stored", i)
		}
	}
}

// RunGetEndpoint: a point read returns the value held now, its mod
// revision, and a revision at least as late as every write before it.
func RunGetEndpoint(t T, f Factory) {
	s := f.New(t)
	ctx := testCtx(t)
	ep := endpoint("get", 1, 1, 100, "A")
	id := registry.IDOf(ep)
	got, rev, at, err := s.GetEndpoint(ctx, id)
	if err != nil || got != nil || rev != 0 || at <= 0 {
		t.Fatalf("GetEndpoint of an absent key = %v, %d, %d, %v; want nil, 0, a revision", got, rev, at, err)
	}
	o := applyOne(t, s, put(ep))
	got, rev, at, err = s.GetEndpoint(ctx, id)
	if err != nil || !proto.Equal(got, ep) || rev != o.Revision || at < o.Revision {
		t.Fatalf("GetEndpoint after a put at %d = %v, %d, %d, %v", o.Revision, got, rev, at, err)
	}
	other := applyOne(t, s, put(endpoint("get", 2, 1, 100, "A")))
	if _, rev2, at2, _ := s.GetEndpoint(ctx, id); rev2 != o.Revision || at2 < other.Revision {
		t.Fatalf("GetEndpoint after another key's write at %d: mod revision %d (want %d), at %d", other.Revision, rev2, o.Revision, at2)
	}
	d := applyOne(t, s, del(id, 200, "A"))
	got, rev, at, err = s.GetEndpoint(ctx, id)
	if err != nil || got != nil || rev != 0 || at < d.Revision {
		t.Fatalf("GetEndpoint after a delete at %d = %v, %d, %d, %v", d.Revision, got, rev, at, err)
	}
	if _, _, _, err := s.GetEndpoint(ctx, registry.EndpointID{Service: "no/such"}); err == nil {
		t.Fatalf("GetEndpoint of an invalid id succeeded")
	}
}

// RunListAtOneRevision: a listing holds every endpoint in key order with
// the revision each was written at, and is consistent at its one
// revision even while a writer keeps changing the keys it reads.
func RunListAtOneRevision(t T, f Factory) {
	s := f.New(t)
	empty := list(t, s)
	if len(empty.Endpoints)+len(empty.Nodes) != 0 || empty.Revision <= 0 {
		t.Fatalf("fresh store lists %s, want nothing at a positive revision", describeListing(empty))
	}

	want := map[registry.EndpointID]int64{}
	vals := map[registry.EndpointID]*registryv1.ServiceEndpoint{}
	var last int64
	for lo := 0; lo < 10; lo += 3 {
		var muts []backend.Mutation
		for i := lo; i < min(lo+3, 10); i++ {
			// Services and IPs out of key order, so the listing must sort.
			ep := endpoint(fmt.Sprintf("svc-%d", (i*7)%10), 10-i, 1, 100, "A")
			muts = append(muts, put(ep))
			vals[registry.IDOf(ep)] = ep
		}
		for i, o := range apply(t, s, muts...) {
			want[muts[i].ID] = o.Revision
			last = max(last, o.Revision)
		}
	}
	l := list(t, s)
	if l.Revision < last || len(l.Endpoints) != len(want) || len(l.EndpointRevs) != len(l.Endpoints) {
		t.Fatalf("listing %s after writes up to %d, want %d endpoints at or after it", describeListing(l), last, len(want))
	}
	for i, ep := range l.Endpoints {
		id := registry.IDOf(ep)
		if !proto.Equal(ep, vals[id]) || l.EndpointRevs[i] != want[id] {
			t.Errorf("listed %s at %d, want %v at %d", id, l.EndpointRevs[i], vals[id], want[id])
		}
		if i > 0 {
			if prev, _ := registry.IDOf(l.Endpoints[i-1]).Key(); prev >= key(id) {
				t.Errorf("listing not in key order: %s after %s", key(id), prev)
			}
		}
	}

	// One writer moves keys k0..k(n-1) to the next generation one at a
	// time, in order, so at any single revision the generations never rise
	// along the keys and differ by at most one. A listing smeared across
	// revisions breaks that.
	const n, gens = 8, 12
	ids := make([]registry.EndpointID, n)
	for k := range n {
		ids[k] = registry.IDOf(endpoint("stair", k, 0, 0, ""))
	}
	ctx := testCtx(t)
	var wg sync.WaitGroup
	done := make(chan struct{})
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(done)
		for g := 1; g <= gens; g++ {
			for k := range n {
				outs, err := s.ApplyOrdered(ctx, []backend.Mutation{put(endpoint("stair", k, g, uint64(g), "A"))})
				if err == nil && !outs[0].Landed {
					err = fmt.Errorf("generation %d of key %d: %s", g, k, describeOutcome(outs[0]))
				}
				if err != nil {
					werr = err
					return
				}
			}
		}
	}()
	listings := 0
	for stop := false; !stop; listings++ {
		select {
		case <-done:
			stop = true // one more listing, of the final state
		default:
		}
		l := list(t, s)
		gen := make([]int, n)
		for _, ep := range l.Endpoints {
			for k, id := range ids {
				if registry.IDOf(ep) == id {
					fmt.Sscanf(ep.GetNode(), "node-%d", &gen[k])
				}
			}
		}
		for k := 1; k < n; k++ {
			if gen[k] > gen[k-1] || gen[0]-gen[n-1] > 1 {
				t.Fatalf("listing at %d is not one revision's state: generations %v", l.Revision, gen)
			}
		}
		if stop && gen[n-1] != gens && werr == nil {
			t.Fatalf("final listing at %d: generations %v, want all %d", l.Revision, gen, gens)
		}
	}
	wg.Wait()
	if werr != nil {
		t.Fatalf("writer: %v", werr)
	}
	t.Logf("%d listings during %d writes", listings, n*gens)
}

// RunGetAt: values read at a revision are those of that revision, in the
// order asked; a key absent then is absent.
func RunGetAt(t T, f Factory) {
	s := f.New(t)
	ctx := testCtx(t)
	a1, b1 := endpoint("getat", 1, 1, 100, "A"), endpoint("getat", 2, 1, 100, "A")
	// A batch's mutations may land at one revision (etcd) or at one
	// each (a store without multi-key writes): read at the latest.
	first := apply(t, s, put(a1), put(b1))
	r1 := max(first[0].Revision, first[1].Revision)
	a2, c1 := endpoint("getat", 1, 2, 200, "A"), endpoint("getat", 3, 1, 200, "A")
	outs := apply(t, s, put(a2), del(registry.IDOf(b1), 200, "A"), put(c1))
	r2 := max(outs[0].Revision, outs[1].Revision, outs[2].Revision)
	ids := []registry.EndpointID{registry.IDOf(c1), registry.IDOf(b1), registry.IDOf(a1)}

	old, err := s.GetAt(ctx, r1, ids, nil)
	if err != nil {
		t.Fatalf("GetAt(%d): %v", r1, err)
	}
	if old.Revision != r1 || len(old.Endpoints) != 2 || !proto.Equal(old.Endpoints[0], b1) || !proto.Equal(old.Endpoints[1], a1) ||
		old.EndpointRevs[0] != first[1].Revision || old.EndpointRevs[1] != first[0].Revision {
		t.Fatalf("GetAt(%d) = %s, want b and a as first written, in the order asked", r1, describeListing(old))
	}
	cur, err := s.GetAt(ctx, r2, ids, nil)
	if err != nil {
		t.Fatalf("GetAt(%d): %v", r2, err)
	}
	if cur.Revision != r2 || len(cur.Endpoints) != 2 || !proto.Equal(cur.Endpoints[0], c1) || !proto.Equal(cur.Endpoints[1], a2) ||
		cur.EndpointRevs[0] != outs[2].Revision || cur.EndpointRevs[1] != outs[0].Revision {
		t.Fatalf("GetAt(%d) = %s, want c and a as rewritten", r2, describeListing(cur))
	}
	if l, err := s.GetAt(ctx, r2, nil, nil); err != nil || len(l.Endpoints) != 0 {
		t.Fatalf("GetAt of nothing = %s, %v", describeListing(l), err)
	}
}

func key(id registry.EndpointID) string { k, _ := id.Key(); return k }

func sameListing(a, b backend.Listing) bool {
	if a.Revision != b.Revision || len(a.Endpoints) != len(b.Endpoints) || len(a.Nodes) != len(b.Nodes) {
		return false
	}
	for i := range a.Endpoints {
		if !proto.Equal(a.Endpoints[i], b.Endpoints[i]) || a.EndpointRevs[i] != b.EndpointRevs[i] {
			return false
		}
	}
	for i := range a.Nodes {
		if !proto.Equal(a.Nodes[i], b.Nodes[i]) || a.NodeRevs[i] != b.NodeRevs[i] {
			return false
		}
	}
	return true
}

func describeListing(l backend.Listing) string {
	var parts []string
	for i, ep := range l.Endpoints {
		r := int64(-1)
		if i < len(l.EndpointRevs) {
			r = l.EndpointRevs[i]
		}
		parts = append(parts, fmt.Sprintf("%s/%s=%s@%d", ep.GetService(), ep.GetIp(), ep.GetNode(), r))
	}
	for i, n := range l.Nodes {
		r := int64(-1)
		if i < len(l.NodeRevs) {
			r = l.NodeRevs[i]
		}
		parts = append(parts, fmt.Sprintf("node %s@%d", n.GetName(), r))
	}
	sort.Strings(parts)
	return fmt.Sprintf("at %d [%s]", l.Revision, strings.Join(parts, " "))
}

// isCompacted reports whether err is the contract's compaction error.
func isCompacted(err error) bool { return errors.Is(err, backend.ErrCompacted) }
