package core

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// xworld is three replicas making random requests (JSON edits, deletes,
// txns, leases that expire), exchanging changes between random pairs,
// compacting and collecting at the stable points every member's vector
// allows.
type xworld struct {
	t    testing.TB
	pick *gen
	now  time.Time
	reps []*replica
}

func newXWorld(t testing.TB, seed uint64) *xworld {
	w := &xworld{t: t, pick: newGen(seed), now: time.Unix(1_800_000_000, 0)}
	for id := ReplicaID(1); id <= 3; id++ {
		s := New(id)
		s.SetValueMerge(snapVM)
		w.reps = append(w.reps, &replica{s: s, g: newGen(seed*10 + uint64(id))})
	}
	return w
}

func (w *xworld) local(p *replica) {
	tw := &twinWorld{now: w.now}
	g := p.g
	r := g.next(false)
	if g.r.IntN(3) == 0 {
		r = request{Put: tw.jsonPut(g, p.s)}
	}
	switch {
	case r.Compact != nil:
		if s := p.s; s.Rev() > max(s.CompactRev(), 1) {
			_ = s.Compact(max(s.CompactRev(), 1) + 1 + g.r.Int64N(s.Rev()-max(s.CompactRev(), 1)))
		}
		return
	case r.Grant != nil:
		r.Grant.TTL, r.Grant.ID = int64(g.r.IntN(20)), 0
	case r.Revoke != nil:
		if ids := p.s.leaseIDs(); len(ids) > 0 {
			r.Revoke.ID = ids[g.r.IntN(len(ids))]
		}
	}
	_, aps := requestText(p.s, w.now, r)
	p.log = append(p.log, aps...)
	p.log = append(p.log, p.s.ExpireLeases(w.now)...)
	g.observe(p.s.Rev(), p.s.CompactRev(), p.s.leaseIDs())
}

func (w *xworld) send(from, to *replica) {
	w.t.Helper()
	tw := &twinWorld{now: w.now}
	if err := tw.send(from, to); err != nil {
		w.t.Fatal(err)
	}
}

// collect collects at p the stable point of the team's rule, with every
// member's current vector (usable when p holds that member's changes).
func (w *xworld) collect(p *replica) {
	have := p.s.Vector()
	stable := maps.Clone(have)
	for _, q := range w.reps {
		v := q.s.Vector()
		if v[q.s.Replica()] > have[q.s.Replica()] {
			return
		}
		for r, n := range stable {
			stable[r] = min(n, v[r])
		}
	}
	if _, err := p.s.Collect(stable); err != nil {
		w.t.Fatal(err)
	}
}

func (w *xworld) run(steps int) {
	for range steps {
		switch k := w.pick.r.IntN(100); {
		case k < 60:
			w.local(w.reps[w.pick.r.IntN(3)])
		case k < 85:
			i, j := w.pick.r.IntN(3), w.pick.r.IntN(3)
			if i != j {
				w.send(w.reps[i], w.reps[j])
			}
		default:
			w.collect(w.reps[w.pick.r.IntN(3)])
		}
		w.now = w.now.Add(time.Duration(w.pick.r.IntN(1500)) * time.Millisecond)
	}
}

// xview is what must agree between a replica that merged a transfer and
// one that merged the same changes one by one: values (and HashKV), bytes
// keys' winners, leases with their keys, the vector, last stamps, heads.
func xview(t *testing.T, s *State) string {
	var b strings.Builder
	b.WriteString(keyValues(t, s))
	s.order.ascend(nil, nil, func(k *keyRec) bool {
		if !s.vm.IsJSON(k.key) && k.live() != nil {
			fmt.Fprintf(&b, "\nwinner %q %v %d", k.key, k.win, k.winRepl)
		}
		return true
	})
	for _, id := range s.leaseIDs() {
		l := s.leases[id]
		fmt.Fprintf(&b, "\nlease %d ttl %d granter %d stamp %v keys %q", id, l.ttl, l.granter, l.stamp, sortedKeys(l.keys))
	}
	v := s.Vector()
	for _, r := range slices.Sorted(maps.Keys(v)) {
		last, _ := s.LastStamp(r)
		fmt.Fprintf(&b, "\nchain %d: %d, last %v", r, v[r], last)
	}
	fmt.Fprintf(&b, "\nheads %x", s.Heads())
	return b.String()
}

// TestMergeSnapshotLikeChangeByChange: replica 1 merges replica 2's
// transfer; a twin of replica 1 merges replica 2's changes one by one
// instead. Both must agree (values, winners, leases, vector, heads), keep
// agreeing as everyone's later changes arrive (replica 2's name its heads
// as parents), and the transfer is idempotent. Replicas diverge before
// (each has changes the other lacks, deletes and JSON field edits among
// them), and replica 2 has compacted and collected.
func TestMergeSnapshotLikeChangeByChange(t *testing.T) {
	revs := 0
	for seed := uint64(1); seed <= 12; seed++ {
		w := newXWorld(t, seed)
		w.run(300)
		a, b := w.reps[0], w.reps[1]
		ref := &replica{g: a.g}
		var err error
		if ref.s, err = Restore(1, a.s.Snapshot()); err != nil {
			t.Fatal(err)
		}
		ref.s.SetValueMerge(snapVM)
		ref.log = slices.Clone(a.log)
		w.send(b, ref)

		tr := b.s.TransferSnapshot()
		before := a.s.Rev()
		ap, err := a.s.MergeSnapshot(w.now, tr)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if ap.Encoded != nil || ap.Index != 0 || ap.Change != nil || (ap.Rev != 0) != (a.s.Rev() == before+1) || (ap.Rev == 0) != (len(ap.Events) == 0) {
			t.Fatalf("seed %d: applied %+v, revision %d -> %d", seed, ap, before, a.s.Rev())
		}
		if ap.Rev != 0 {
			revs++
			// Published as a watch catching up from the revision sees them.
			if evs, err := a.s.Events(ap.Rev, []byte{0}, []byte{0}); err != nil || fmt.Sprint(evs) != fmt.Sprint(ap.Events) {
				t.Fatalf("seed %d: published %v, catch-up gives %v (%v)", seed, ap.Events, evs, err)
			}
			for i := 1; i < len(ap.Events); i++ {
				if bytes.Compare(ap.Events[i-1].Kv.Key, ap.Events[i].Kv.Key) >= 0 {
					t.Fatalf("seed %d: events not in key order", seed)
				}
			}
		}
		if va, vr := xview(t, a.s), xview(t, ref.s); va != vr {
			t.Fatalf("seed %d: after the transfer\n%s\nchange by change\n%s", seed, va, vr)
		}
		snap := a.s.Snapshot()
		if ap2, err := a.s.MergeSnapshot(w.now, tr); err != nil || ap2.Rev != 0 || !bytes.Equal(a.s.Snapshot(), snap) {
			t.Fatalf("seed %d: the same transfer again: %v, %v, state changed %v", seed, ap2, err, !bytes.Equal(a.s.Snapshot(), snap))
		}
		// The merged state is a state like any other: it snapshots and
		// restores, also once compaction passed the transfer's revision.
		if _, err := Restore(1, snap); err != nil {
			t.Fatalf("seed %d: restore after the transfer: %v", seed, err)
		}

		// Later changes of the others (replica 2's on its heads), merged
		// into both; the twin cannot take replica 1's own later changes
		// (they are its own), so replica 1 writes only after.
		for round := range 30 {
			for _, p := range w.reps[1:] {
				w.local(p)
			}
			if round%5 == 4 {
				_ = a.s.Compact(a.s.Rev())
				_ = ref.s.Compact(ref.s.Rev())
			}
			w.send(w.reps[1], w.reps[2])
			w.send(w.reps[2], w.reps[1])
			for _, p := range w.reps[1:] {
				w.send(p, a)
				w.send(p, ref)
			}
		}
		if va, vr := xview(t, a.s), xview(t, ref.s); va != vr {
			t.Fatalf("seed %d: after later changes\n%s\nchange by change\n%s", seed, va, vr)
		}
		for range 30 {
			for _, p := range w.reps {
				w.local(p)
			}
			for _, p := range w.reps {
				for _, q := range w.reps {
					if p != q {
						w.send(p, q)
					}
				}
			}
		}
		for _, p := range w.reps[1:] {
			if ka, kp := keyValues(t, a.s), keyValues(t, p.s); ka != kp {
				t.Fatalf("seed %d: replica %d did not converge with replica 1:\n%s\n%s", seed, p.s.Replica(), kp, ka)
			}
		}
		if _, err := Restore(1, a.s.Snapshot()); err != nil {
			t.Fatalf("seed %d: restore at the end: %v", seed, err)
		}
	}
	if revs == 0 {
		t.Fatal("no transfer changed anything")
	}
}

// TestMergeSnapshotOfASuperset: a replica that has nothing the sender
// lacks ends with the sender's key space (HashKV), vector and heads, and
// the sender's later changes (on its heads) merge.
func TestMergeSnapshotOfASuperset(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		w := newXWorld(t, seed)
		w.run(300)
		a, b := w.reps[0], w.reps[1]
		w.send(a, b)
		for range 30 {
			w.local(b)
			w.local(w.reps[2])
			w.send(w.reps[2], b)
		}
		w.collect(b)
		if _, err := a.s.MergeSnapshot(w.now, b.s.TransferSnapshot()); err != nil {
			t.Fatal(err)
		}
		ha, _, _ := a.s.HashKV(0)
		hb, _, _ := b.s.HashKV(0)
		if ha != hb || keyValues(t, a.s) != keyValues(t, b.s) {
			t.Fatalf("seed %d: key space after the transfer\n%s\nsender\n%s", seed, keyValues(t, a.s), keyValues(t, b.s))
		}
		if !maps.Equal(a.s.Vector(), b.s.Vector()) || !slices.Equal(a.s.Heads(), b.s.Heads()) {
			t.Fatalf("seed %d: vector %v heads %x, sender %v %x", seed, a.s.Vector(), a.s.Heads(), b.s.Vector(), b.s.Heads())
		}
		// Every change the sender had is a duplicate now; its later
		// ones merge.
		for _, ap := range b.log {
			if got, err := a.s.Merge(w.now, ap.Encoded); err != nil || got != nil {
				t.Fatalf("seed %d: an old change of the sender: %v, %v", seed, got, err)
			}
		}
		n := len(b.log)
		for range 10 {
			w.local(b)
		}
		for _, ap := range b.log[n:] {
			if _, err := a.s.Merge(w.now, ap.Encoded); err != nil {
				t.Fatalf("seed %d: a later change of the sender: %v", seed, err)
			}
		}
		if keyValues(t, a.s) != keyValues(t, b.s) {
			t.Fatalf("seed %d: diverged after later changes", seed)
		}
	}
}

// TestMergeSnapshotConflicts spells the rule out on one case of each kind.
func TestMergeSnapshotConflicts(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	a, b := New(1), New(2)
	for _, s := range []*State{a, b} {
		s.SetValueMerge(ValueMerge{Prefixes: [][]byte{[]byte("j")}})
	}
	put := func(s *State, at time.Duration, k, v string) *Applied {
		_, ap, err := s.Put(t0.Add(at), &pb.PutRequest{Key: []byte(k), Value: []byte(v)})
		if err != nil {
			t.Fatal(err)
		}
		return ap
	}
	del := func(s *State, at time.Duration, k string) *Applied {
		_, ap, err := s.DeleteRange(t0.Add(at), &pb.DeleteRangeRequest{Key: []byte(k)})
		if err != nil {
			t.Fatal(err)
		}
		return ap
	}
	var shared []*Applied
	shared = append(shared, put(a, 0, "gone", "1"), put(a, 0, "old", "a"), put(a, 0, "j", `{"x":1,"y":1,"z":1}`))
	for _, ap := range shared {
		if _, err := b.Merge(t0, ap.Encoded); err != nil {
			t.Fatal(err)
		}
	}
	// Concurrently: b deletes "gone" and edits y, drops z; a edits x,
	// writes "old" before b does (b's later write wins), writes "mine".
	put(a, 1*time.Second, "old", "a2")
	put(b, 2*time.Second, "old", "b")
	del(b, 2*time.Second, "gone")
	put(b, 2*time.Second, "j", `{"x":1,"y":2}`)
	put(a, 3*time.Second, "j", `{"x":3,"y":1,"z":1}`)
	put(a, 3*time.Second, "mine", "m")
	// b compacts and collects with only itself and a as members, a's
	// vector as it was when b last heard from it: the tombstone of
	// "gone" goes at b.
	_ = b.Compact(b.Rev())
	if _, err := b.Collect(b.Vector()); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := b.Winner([]byte("gone")); ok {
		t.Fatal("the test needs the tombstone collected at the sender")
	}
	ap, err := a.MergeSnapshot(t0, b.TransferSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	var evs []string
	for _, e := range ap.Events {
		evs = append(evs, fmt.Sprintf("%s %s=%s", e.Type, e.Kv.Key, e.Kv.Value))
	}
	if got, want := strings.Join(evs, "; "), `DELETE gone=; PUT j={"x":3,"y":2}; PUT old=b`; got != want {
		t.Errorf("events %s, want %s", got, want)
	}
	if got, want := keyValues(t, a), `"j"="{\"x\":3,\"y\":2}" "mine"="m" "old"="b" `; !strings.HasPrefix(got, want) {
		t.Errorf("values %s, want %s", got, want)
	}
	if w, r, _ := a.Winner([]byte("old")); r != 2 || w.Wall != t0.Add(2*time.Second).UnixNano() {
		t.Errorf("winner of old: %v %d", w, r)
	}
}

// TestMergeSnapshotIntoACollector: the receiver is the one that collected.
// b was away past the retention while a deleted a key and a JSON field and
// collected both tombstones (a's stable point no longer waited for b); b
// comes back holding the values from before. Merging b's transfer at a
// brings b's own write made while away, and neither the deleted key nor
// the deleted field: a saw the writes b still holds, so their absence at
// a is a collected delete (merging b's changes one by one would drop them
// as duplicates as well).
func TestMergeSnapshotIntoACollector(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	a, b := New(1), New(2)
	for _, s := range []*State{a, b} {
		s.SetValueMerge(ValueMerge{Prefixes: [][]byte{[]byte("j")}})
	}
	away := false
	put := func(s *State, at time.Duration, k, v string) {
		if _, ap, err := s.Put(t0.Add(at), &pb.PutRequest{Key: []byte(k), Value: []byte(v)}); err != nil {
			t.Fatal(err)
		} else if s == a && !away {
			if _, err := b.Merge(t0, ap.Encoded); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(a, 0, "gone", "1")
	put(a, 0, "keep", "1")
	put(a, 0, "j", `{"x":1,"z":1}`)
	away = true // a's changes no longer reach b
	if _, _, err := a.DeleteRange(t0.Add(time.Second), &pb.DeleteRangeRequest{Key: []byte("gone")}); err != nil {
		t.Fatal(err)
	}
	put(a, time.Second, "j", `{"x":1}`)
	if _, ap, err := b.Put(t0.Add(2*time.Second), &pb.PutRequest{Key: []byte("bnew"), Value: []byte("1")}); err != nil || ap == nil {
		t.Fatal(err)
	}
	_ = a.Compact(a.Rev())
	if _, err := a.Collect(a.Vector()); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := a.Winner([]byte("gone")); ok {
		t.Fatal("the test needs the tombstone of gone collected at the receiver")
	}
	ap, err := a.MergeSnapshot(t0.Add(3*time.Second), b.TransferSnapshot())
	if err != nil {
		t.Fatal(err)
	}
	var evs []string
	for _, e := range ap.Events {
		evs = append(evs, fmt.Sprintf("%s %s=%s", e.Type, e.Kv.Key, e.Kv.Value))
	}
	if got, want := strings.Join(evs, "; "), `PUT bnew=1`; got != want {
		t.Errorf("events %s, want %s (a deleted key or field came back)", got, want)
	}
	if got, want := keyValues(t, a), `"bnew"="1" "j"="{\"x\":1}" "keep"="1" `; !strings.HasPrefix(got, want) {
		t.Errorf("values %s, want %s", got, want)
	}
	// b, merging a's transfer, takes the delete and the field's removal.
	if _, err := b.MergeSnapshot(t0.Add(3*time.Second), a.TransferSnapshot()); err != nil {
		t.Fatal(err)
	}
	if ka, kb := keyValues(t, a), keyValues(t, b); ka != kb {
		t.Errorf("a and b differ after both transfers:\n%s\n%s", ka, kb)
	}
}

func TestMergeSnapshotRefuses(t *testing.T) {
	w := newXWorld(t, 5)
	w.run(200)
	a, b := w.reps[0], w.reps[1]
	good := b.s.TransferSnapshot()
	snap := a.s.Snapshot()
	for n := 0; n < len(good); n += 1 + n/64 {
		if _, err := a.s.MergeSnapshot(w.now, good[:n]); err == nil {
			t.Fatalf("transfer truncated to %d of %d bytes: accepted", n, len(good))
		}
	}
	for _, bad := range [][]byte{append(bytes.Clone(good), 0), b.s.Snapshot(), a.s.TransferSnapshot()} {
		if _, err := a.s.MergeSnapshot(w.now, bad); err == nil {
			t.Fatal("accepted a transfer with a trailing byte, a full snapshot or its own")
		}
	}
	if !bytes.Equal(a.s.Snapshot(), snap) {
		t.Fatal("a refused transfer changed the state")
	}
	// A transfer holding changes of this replica its log lacks.
	fresh := New(1)
	if _, err := fresh.MergeSnapshot(w.now, good); err == nil || !strings.Contains(err.Error(), "rejoin under a new replica id") {
		t.Fatalf("a replica that lost its log: %v", err)
	}
	// The other way: a sender that lost its own history (a fresh replica
	// under b's id) sends fewer of its changes than a holds.
	if a.s.Vector()[b.s.Replica()] == 0 {
		t.Fatal("the test needs a to hold some of b's changes")
	}
	lost := New(b.s.Replica())
	lost.SetValueMerge(snapVM)
	if _, err := a.s.MergeSnapshot(w.now, lost.TransferSnapshot()); err == nil || !strings.Contains(err.Error(), "lost its history and must rejoin under a new replica id") {
		t.Fatalf("a sender that lost its history: %v", err)
	}
	if !bytes.Equal(a.s.Snapshot(), snap) {
		t.Fatal("a refused transfer changed the state")
	}
}

// FuzzMergeSnapshot: decoding a transfer never panics, and what decodes
// re-encodes to the same bytes and merges without panicking.
func FuzzMergeSnapshot(f *testing.F) {
	for seed := uint64(1); seed <= 3; seed++ {
		w := newXWorld(f, seed)
		w.run(60 * int(seed))
		f.Add(w.reps[1].s.TransferSnapshot())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := decodeTransfer(b)
		if err != nil {
			return
		}
		if !bytes.Equal(tr.encode(), b) {
			t.Fatal("decoded transfer encodes to other bytes")
		}
		s := New(9)
		s.SetValueMerge(snapVM)
		if _, err := s.MergeSnapshot(time.Unix(0, 0), b); err != nil {
			return
		}
		if _, err := Restore(9, s.Snapshot()); err != nil {
			t.Fatalf("the merged state does not restore: %v", err)
		}
	})
}
