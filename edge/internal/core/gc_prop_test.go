package core

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// gcWorld is three replicas writing concurrently, each change delivered to
// the others in a random causal order, each replica reporting its vector
// now and then and collecting at the stable point TEAM.md's rule gives
// from the reports it received. Every replica has a twin, ref, that
// applies the same requests and changes in the same order and never
// collects: what GC drops must never change an answer.
type gcWorld struct {
	t    *testing.T
	r    *rand.Rand
	now  time.Time
	reps []*gcReplica
}

type gcReplica struct {
	s, ref *State
	skew   time.Duration
	log    []*Applied      // every change in the order this replica applied it
	has    map[Hash]bool   // the test's own record: never collected
	parent map[Hash][]Hash // parents of every change in log
	// reports are this replica's vectors as it reported them; heard[k] is
	// how many of replica k's reports this one received (in order).
	reports []map[ReplicaID]uint64
	heard   []int
}

var gcVM = ValueMerge{Prefixes: [][]byte{[]byte("/j/")}}

func newGCWorld(t *testing.T, seed uint64) *gcWorld {
	w := &gcWorld{t: t, r: rand.New(rand.NewPCG(seed, seed*7919)), now: time.Unix(1_800_000_000, 0)}
	for i := range 3 {
		rep := &gcReplica{s: New(ReplicaID(i + 1)), ref: New(ReplicaID(i + 1)),
			skew: time.Duration(i-1) * 700 * time.Millisecond,
			has:  map[Hash]bool{}, parent: map[Hash][]Hash{}, heard: make([]int, 3)}
		rep.s.SetValueMerge(gcVM)
		rep.ref.SetValueMerge(gcVM)
		w.reps = append(w.reps, rep)
	}
	return w
}

// jsonValue is a random object over few fields, some nested, so puts
// assign, replace and drop fields and nested objects.
func (w *gcWorld) jsonValue() []byte {
	var b strings.Builder
	b.WriteString("{")
	first := true
	for _, f := range []string{"a", "b", "c"} {
		if w.r.IntN(3) == 0 {
			continue
		}
		if !first {
			b.WriteString(",")
		}
		first = false
		switch w.r.IntN(3) {
		case 0:
			fmt.Fprintf(&b, "%q:{", f)
			inner := []string{}
			for _, g := range []string{"x", "y"} {
				if w.r.IntN(2) == 0 {
					inner = append(inner, fmt.Sprintf("%q:%d", g, w.r.IntN(3)))
				}
			}
			b.WriteString(strings.Join(inner, ",") + "}")
		default:
			fmt.Fprintf(&b, "%q:%d", f, w.r.IntN(4))
		}
	}
	b.WriteString("}")
	if w.r.IntN(8) == 0 {
		return []byte("plain") // a scalar root: replaces the whole document
	}
	return []byte(b.String())
}

func (w *gcWorld) key() []byte {
	if w.r.IntN(2) == 0 {
		return []byte(fmt.Sprintf("k%d", w.r.IntN(4)))
	}
	return []byte(fmt.Sprintf("/j/%d", w.r.IntN(3)))
}

// local makes one random write at replica i, on both twins; they must
// make the very same change.
func (w *gcWorld) local(i int) {
	rep := w.reps[i]
	now := w.now.Add(rep.skew)
	var a, ar *Applied
	var err, errRef error
	switch w.r.IntN(5) {
	case 0, 1, 2:
		k := w.key()
		v := []byte(fmt.Sprintf("v%d", w.r.IntN(100)))
		if bytes.HasPrefix(k, []byte("/j/")) {
			v = w.jsonValue()
		}
		_, a, err = rep.s.Put(now, &pb.PutRequest{Key: k, Value: v})
		_, ar, errRef = rep.ref.Put(now, &pb.PutRequest{Key: k, Value: v})
	case 3:
		k := w.key()
		_, a, err = rep.s.DeleteRange(now, &pb.DeleteRangeRequest{Key: k})
		_, ar, errRef = rep.ref.DeleteRange(now, &pb.DeleteRangeRequest{Key: k})
	default:
		req := &pb.DeleteRangeRequest{Key: []byte("k"), RangeEnd: []byte("l")}
		if w.r.IntN(2) == 0 {
			req = &pb.DeleteRangeRequest{Key: []byte("/j/"), RangeEnd: []byte("/j0")}
		}
		_, a, err = rep.s.DeleteRange(now, req)
		_, ar, errRef = rep.ref.DeleteRange(now, req)
	}
	if err != nil || errRef != nil {
		w.t.Fatalf("replica %d: local write: %v / reference %v", i+1, err, errRef)
	}
	w.same(i, "local write", a, ar)
	rep.add(a)
}

func (rep *gcReplica) add(a *Applied) {
	rep.log = append(rep.log, a)
	rep.has[a.ID] = true
	rep.parent[a.ID] = a.Change.Parents
}

// same requires the twins to have answered a change alike.
func (w *gcWorld) same(i int, what string, a, ar *Applied) {
	w.t.Helper()
	if (a == nil) != (ar == nil) {
		w.t.Fatalf("replica %d: %s: collected state applied %v, reference %v", i+1, what, a != nil, ar != nil)
	}
	if a == nil {
		return
	}
	if !bytes.Equal(a.Encoded, ar.Encoded) || a.Index != ar.Index || a.Rev != ar.Rev || fmt.Sprint(a.Events) != fmt.Sprint(ar.Events) {
		w.t.Fatalf("replica %d: %s differs from the reference:\n%s index %d rev %d %v\n---\n%s index %d rev %d %v", i+1, what,
			opsString(a.Change.Ops), a.Index, a.Rev, a.Events, opsString(ar.Change.Ops), ar.Index, ar.Rev, ar.Events)
	}
}

// deliver sends up to n changes of from that to lacks, each chosen at
// random among those whose parents to holds (a random causal order), and
// now and then one to already holds (a duplicate, perhaps collected).
func (w *gcWorld) deliver(from, to int, n int) {
	a, b := w.reps[from], w.reps[to]
	for range n {
		var cands []*Applied
		for _, ap := range a.log {
			if b.has[ap.ID] {
				continue
			}
			ok := true
			for _, p := range a.parent[ap.ID] {
				if !b.has[p] {
					ok = false
					break
				}
			}
			if ok {
				cands = append(cands, ap)
			}
		}
		if w.r.IntN(6) == 0 && len(b.log) > 0 {
			dup := b.log[w.r.IntN(len(b.log))]
			got, err := b.s.Merge(w.now.Add(b.skew), dup.Encoded)
			if got != nil || err != nil {
				w.t.Fatalf("replica %d: duplicate %s merged again: %v %v", to+1, dup.ID, got != nil, err)
			}
		}
		if len(cands) == 0 {
			return
		}
		ap := cands[w.r.IntN(len(cands))]
		got, err := b.s.Merge(w.now.Add(b.skew), ap.Encoded)
		gotRef, errRef := b.ref.Merge(w.now.Add(b.skew), ap.Encoded)
		if err != nil || errRef != nil {
			w.t.Fatalf("replica %d: merge of %s from %d: %v / reference %v", to+1, ap.ID, from+1, err, errRef)
		}
		if got == nil {
			w.t.Fatalf("replica %d: a change it lacks was taken for a duplicate", to+1)
		}
		w.same(to, "merge", got, gotRef)
		b.add(got)
	}
}

// stable is TEAM.md's stable point at replica i: its own vector, min each
// member's newest report that is usable here (the member's own count in
// it is applied here), a member heard from not at all counting as zero.
func (w *gcWorld) stable(i int) map[ReplicaID]uint64 {
	rep := w.reps[i]
	applied := rep.s.Vector()
	out := maps0(applied)
	for k, other := range w.reps {
		if k == i {
			continue
		}
		var use map[ReplicaID]uint64
		for j := rep.heard[k] - 1; j >= 0; j-- {
			v := other.reports[j]
			if v[ReplicaID(k+1)] <= applied[ReplicaID(k+1)] {
				use = v
				break
			}
		}
		for r := range out {
			out[r] = min(out[r], use[r])
		}
	}
	return out
}

func maps0(v map[ReplicaID]uint64) map[ReplicaID]uint64 {
	out := make(map[ReplicaID]uint64, len(v))
	for r, n := range v {
		out[r] = n
	}
	return out
}

func (w *gcWorld) collect(i int) CollectStats {
	st, err := w.reps[i].s.Collect(w.stable(i))
	if err != nil {
		w.t.Fatalf("replica %d: collect: %v", i+1, err)
	}
	return st
}

func (w *gcWorld) compact(i int, rev int64) {
	rep := w.reps[i]
	if rev <= rep.s.CompactRev() || rev > rep.s.Rev() {
		return
	}
	if err := rep.s.Compact(rev); err != nil {
		w.t.Fatal(err)
	}
	if err := rep.ref.Compact(rev); err != nil {
		w.t.Fatal(err)
	}
}

// check compares what clients and peers see of the twins.
func (w *gcWorld) check(i int) {
	w.t.Helper()
	rep := w.reps[i]
	if a, b := observable(w.t, rep.s), observable(w.t, rep.ref); a != b {
		w.t.Fatalf("replica %d: the collected state answers differently:\n%s\n--- reference\n%s", i+1, a, b)
	}
	if a, b := fmt.Sprint(rep.s.Vector()), fmt.Sprint(rep.ref.Vector()); a != b {
		w.t.Fatalf("replica %d: vector %s, reference %s", i+1, a, b)
	}
}

// replay rebuilds replica i from its log, as recovery does, compacts and
// collects where it did: the same state, GC's bookkeeping included.
func (w *gcWorld) replay(i int) {
	rep := w.reps[i]
	fresh := New(rep.s.Replica())
	fresh.SetValueMerge(gcVM)
	for _, ap := range rep.log {
		if err := fresh.Replay(ap.Encoded, ap.Index, ap.Rev); err != nil {
			w.t.Fatalf("replica %d: replay index %d: %v", i+1, ap.Index, err)
		}
	}
	if c := rep.s.CompactRev(); c >= 0 {
		if err := fresh.Compact(c); err != nil {
			w.t.Fatal(err)
		}
	}
	if _, err := fresh.Collect(rep.s.Collected()); err != nil {
		w.t.Fatal(err)
	}
	if a, b := dump(w.t, rep.s), dump(w.t, fresh); a != b {
		w.t.Fatalf("replica %d: replay and collect once give another state:\n%s\n--- replayed\n%s", i+1, a, b)
	}
}

func (w *gcWorld) report(k int) {
	w.reps[k].reports = append(w.reps[k].reports, w.reps[k].s.Vector())
}

// hear delivers some of k's reports to i (in order, some late).
func (w *gcWorld) hear(i, k int) {
	rep := w.reps[i]
	n := len(w.reps[k].reports)
	if n > rep.heard[k] {
		rep.heard[k] += 1 + w.r.IntN(n-rep.heard[k])
	}
}

// TestCollectKeepsAnswers is the property: whatever GC collects at stable
// points computed by the rule, from reports delivered late and in any
// causal order of changes, every later answer (reads at every retained
// revision, HashKV, events, the changes later writes make and the effect
// of every later merge) is the uncollected reference's; and a replica
// rebuilt from its log and collected once at the same point is the same
// state.
func TestCollectKeepsAnswers(t *testing.T) {
	var collected CollectStats
	for seed := uint64(1); seed <= 30; seed++ {
		w := newGCWorld(t, seed)
		for step := range 500 {
			w.now = w.now.Add(time.Duration(w.r.IntN(30)) * time.Millisecond)
			i := w.r.IntN(3)
			switch x := w.r.IntN(20); {
			case x < 7:
				w.local(i)
			case x < 12:
				w.deliver(w.r.IntN(3), i, 1+w.r.IntN(6))
			case x < 14:
				w.report(i)
			case x < 16:
				w.hear(i, w.r.IntN(3))
			case x < 18:
				rep := w.reps[i]
				lo := max(rep.s.CompactRev(), 1)
				w.compact(i, lo+w.r.Int64N(rep.s.Rev()-lo+1))
			default:
				st := w.collect(i)
				collected.Hashes += st.Hashes
				collected.Keys += st.Keys
				collected.Fields += st.Fields
			}
			if step%25 == 24 {
				w.check(w.r.IntN(3))
			}
		}
		for i := range w.reps {
			w.check(i)
			w.replay(i)
		}
		// Then everything everywhere: the replicas converge, collected
		// or not.
		for range 2 {
			for a := range 3 {
				for b := range 3 {
					if a != b {
						w.deliver(a, b, 1<<20)
					}
				}
			}
		}
		h0, _, _ := w.reps[0].s.HashKV(0)
		for i, rep := range w.reps {
			w.check(i)
			if h, _, _ := rep.s.HashKV(0); h != h0 {
				t.Fatalf("seed %d: replica %d did not converge: %08x, replica 1 %08x", seed, i+1, h, h0)
			}
		}
	}
	// The property must have been exercised, not only kept vacuously.
	if collected.Hashes == 0 || collected.Keys == 0 || collected.Fields == 0 {
		t.Fatalf("the random runs collected too little to test anything: %+v", collected)
	}
	t.Logf("collected over all runs: %+v", collected)
}

// TestCollectBoundsHistory runs sustained writes and deletes with periodic
// compaction and collection at quiescent points (everyone holds everything
// and has heard everyone's vector): what GC keeps (compacted hashes,
// tombstones, chain stamps, JSON document nodes) must shrink to what is
// still unstable, while a replica that never collects keeps growing.
func TestCollectBoundsHistory(t *testing.T) {
	w := newGCWorld(t, 99)
	for round := range 60 {
		for range 40 {
			w.now = w.now.Add(time.Duration(w.r.IntN(30)) * time.Millisecond)
			w.local(w.r.IntN(3))
		}
		for range 2 {
			for a := range 3 {
				for b := range 3 {
					if a != b {
						w.deliver(a, b, 1<<20)
					}
				}
			}
		}
		for k := range 3 {
			w.report(k)
		}
		for i, rep := range w.reps {
			for k := range 3 {
				rep.heard[k] = len(w.reps[k].reports)
			}
			w.compact(i, rep.s.Rev())
			w.collect(i)
			s := rep.s
			// Only each chain's stable-th change can still be a head, so
			// only it may stay.
			if n := s.Forgotten(); n > len(s.chains) {
				t.Fatalf("round %d replica %d: %d compacted hashes kept, want <= %d", round, i+1, n, len(s.chains))
			}
			if n := s.Tombstones(); n != 0 {
				t.Fatalf("round %d replica %d: %d tombstones kept with everything stable", round, i+1, n)
			}
			for r, ch := range s.chains {
				if len(ch.stamps) != 1 || len(ch.gone) > 1 {
					t.Fatalf("round %d replica %d: chain %d keeps %d stamps, %d gone", round, i+1, r, len(ch.stamps), len(ch.gone))
				}
			}
			if len(s.gcKeys) != 0 {
				t.Fatalf("round %d replica %d: %d records left for GC with everything stable", round, i+1, len(s.gcKeys))
			}
			// Documents keep only what they show.
			s.order.ascend(nil, nil, func(k *keyRec) bool {
				if k.doc == nil {
					return true
				}
				if got, want := nodeCount(k.doc.root), shownCount(k.doc.view()); got > want {
					var b strings.Builder
					docString(&b, k.doc.root, "", 0)
					t.Fatalf("round %d replica %d: %q keeps %d document nodes, shows %d:\n%s", round, i+1, k.key, got, want, b.String())
				}
				return true
			})
			w.check(i)
		}
	}
	ref := w.reps[0].ref
	if ref.Forgotten() < 1000 || ref.Tombstones() == 0 {
		t.Fatalf("the uncollected reference kept only %d hashes and %d tombstones: the load does not exercise GC", ref.Forgotten(), ref.Tombstones())
	}
	t.Logf("uncollected reference: %d compacted hashes, %d tombstones; collected: %d, %d", ref.Forgotten(), ref.Tombstones(), w.reps[0].s.Forgotten(), w.reps[0].s.Tombstones())
}

func nodeCount(n *jnode) int {
	if n == nil {
		return 0
	}
	c := 1
	for _, f := range n.fields {
		c += nodeCount(f)
	}
	return c
}

// shownCount is how many paths a view shows (the root included).
func shownCount(v *view) int {
	if v.kind == jAbsent {
		return 0
	}
	c := 1
	for _, f := range v.fields {
		c += shownCount(f)
	}
	return c
}
