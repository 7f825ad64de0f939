package core

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// snapVM makes "b" and "b/1" of the generator's keys JSON documents.
var snapVM = ValueMerge{Prefixes: [][]byte{[]byte("b")}}

// twinWorld is a replica (1) and two peers (2, 3) making random requests
// (puts, deletes, txns, leases that expire, JSON edits, compactions) and
// merging each other's changes; twins are states restored from snapshots
// of replica 1 taken along the way, which receive every later request and
// merge replica 1 receives. Each outcome must be the same for all.
type twinWorld struct {
	seed   uint64
	pick   *gen
	now    time.Time
	a      *replica
	peers  []*replica
	twins  []*State
	mutate func(*State) // breaks a restored state (tests of the test)
}

func newTwinWorld(seed uint64, mutate func(*State)) *twinWorld {
	w := &twinWorld{seed: seed, pick: newGen(seed), now: time.Unix(1_800_000_000, 0), mutate: mutate}
	mk := func(id ReplicaID) *replica {
		s := New(id)
		s.SetValueMerge(snapVM)
		return &replica{s: s, g: newGen(seed*10 + uint64(id))}
	}
	w.a = mk(1)
	w.peers = []*replica{mk(2), mk(3)}
	return w
}

// all runs f on replica 1 and every twin and requires the same answer.
func (w *twinWorld) all(what string, f func(s *State) string) error {
	want := f(w.a.s)
	for i, tw := range w.twins {
		if got := f(tw); got != want {
			return fmt.Errorf("%s: twin %d answers\n%s\nreplica answers\n%s", what, i, got, want)
		}
	}
	return nil
}

func appliedText(aps ...*Applied) string {
	var b strings.Builder
	for _, ap := range aps {
		if ap == nil {
			b.WriteString("<nil> ")
			continue
		}
		fmt.Fprintf(&b, "{%x index %d rev %d events %v} ", ap.Encoded, ap.Index, ap.Rev, ap.Events)
	}
	return b.String()
}

// request makes r's request on s, with its answer and changes as text.
func requestText(s *State, now time.Time, r request) (string, []*Applied) {
	var resp any
	var ap *Applied
	var err error
	switch {
	case r.Put != nil:
		resp, ap, err = s.Put(now, r.Put)
	case r.Delete != nil:
		resp, ap, err = s.DeleteRange(now, r.Delete)
	case r.Txn != nil:
		resp, ap, err = s.Txn(now, r.Txn)
	case r.Grant != nil:
		resp, ap, err = s.LeaseGrant(now, r.Grant)
	case r.Revoke != nil:
		resp, ap, err = s.LeaseRevoke(now, r.Revoke.ID)
	default:
		resp, err = coreDo(s, now, r)
	}
	var aps []*Applied
	if ap != nil {
		aps = append(aps, ap)
	}
	return fmt.Sprintf("%v %v %s", resp, err, appliedText(aps...)), aps
}

// jsonPut is a client editing a JSON key: one field of what it reads.
func (w *twinWorld) jsonPut(g *gen, s *State) *pb.PutRequest {
	key := []byte([]string{"b", "b/1"}[g.r.IntN(2)])
	m := map[string]any{}
	if resp, err := s.Range(&pb.RangeRequest{Key: key}); err == nil && len(resp.Kvs) == 1 {
		_ = json.Unmarshal(resp.Kvs[0].Value, &m)
	}
	if m == nil {
		m = map[string]any{}
	}
	f := []string{"x", "y", "z"}[g.r.IntN(3)]
	switch g.r.IntN(4) {
	case 0:
		delete(m, f)
	case 1:
		m[f] = map[string]any{"n": g.r.IntN(3)}
	default:
		m[f] = g.r.IntN(5)
	}
	v, _ := json.Marshal(m)
	return &pb.PutRequest{Key: key, Value: v}
}

// local is one request on replica 1 (and its twins).
func (w *twinWorld) local() error {
	g := w.a.g
	r := g.next(true)
	if g.r.IntN(5) == 0 {
		r = request{Put: w.jsonPut(g, w.a.s)}
	}
	if r.Grant != nil {
		r.Grant.TTL = int64(g.r.IntN(20)) // short: some expire
		if g.r.IntN(3) == 0 {
			r.Grant.ID = 0
		}
	}
	if r.Compact != nil {
		if g.r.IntN(2) == 0 && w.a.s.Rev() > w.a.s.CompactRev() {
			// One that works: the generator aims mostly at the edges.
			r.Compact.Revision = w.a.s.CompactRev() + 1 + g.r.Int64N(w.a.s.Rev()-w.a.s.CompactRev())
		}
		return w.all(r.String(), func(s *State) string { return fmt.Sprint(s.Compact(r.Compact.Revision)) })
	}
	var aps []*Applied
	err := w.all(r.String(), func(s *State) string {
		text, got := requestText(s, w.now, r)
		if s == w.a.s {
			aps = got
		}
		return text
	})
	w.a.log = append(w.a.log, aps...)
	g.observe(w.a.s.Rev(), w.a.s.CompactRev(), w.a.s.leaseIDs())
	return err
}

// peerLocal is one request on a peer: no compactions (they would only
// slow the peer's state down), some JSON edits and leases.
func (w *twinWorld) peerLocal(p *replica) {
	g := p.g
	r := g.next(false)
	if g.r.IntN(4) == 0 {
		r = request{Put: w.jsonPut(g, p.s)}
	}
	if r.Compact != nil {
		return
	}
	if r.Grant != nil {
		r.Grant.TTL = int64(g.r.IntN(20))
		r.Grant.ID = 0 // the peer's own ids: client ids would collide with replica 1's
	}
	if r.Revoke != nil || r.TTL != nil {
		if ids := p.s.leaseIDs(); len(ids) > 0 {
			id := ids[g.r.IntN(len(ids))]
			if r.Revoke != nil {
				r.Revoke.ID = id
			} else {
				r.TTL.ID = id
			}
		}
	}
	_, aps := requestText(p.s, w.now, r)
	p.log = append(p.log, aps...)
	p.log = append(p.log, p.s.ExpireLeases(w.now)...)
	g.observe(p.s.Rev(), p.s.CompactRev(), p.s.leaseIDs())
}

// intoA merges p's changes into replica 1 and its twins, in p's order.
func (w *twinWorld) intoA(p *replica) error {
	for _, ap := range p.log {
		var got *Applied
		err := w.all("merge", func(s *State) string {
			m, err := s.Merge(w.now, ap.Encoded)
			if s == w.a.s {
				got = m
			}
			return fmt.Sprint(appliedText(m), err)
		})
		if err != nil {
			return err
		}
		if got != nil {
			w.a.log = append(w.a.log, got)
		}
	}
	return nil
}

// collect runs Collect on replica 1 and its twins at the stable point the
// sync layer would compute with every member's current vector: usable
// when replica 1 holds all of that member's own changes.
func (w *twinWorld) collect() error {
	for _, p := range w.peers {
		if err := w.intoA(p); err != nil {
			return err
		}
	}
	have := w.a.s.Vector()
	stable := have
	for _, p := range w.peers {
		v := p.s.Vector()
		if v[p.s.Replica()] > have[p.s.Replica()] {
			return nil
		}
		next := map[ReplicaID]uint64{}
		for r, n := range stable {
			if m := min(n, v[r]); m > 0 {
				next[r] = m
			}
		}
		stable = next
	}
	return w.all("collect", func(s *State) string {
		st, err := s.Collect(stable)
		return fmt.Sprint(st, err, s.Tombstones(), s.Forgotten(), s.Collected())
	})
}

// send merges the changes of from that to lacks into to (not replica 1).
func (w *twinWorld) send(from, to *replica) error {
	for _, ap := range from.log {
		got, err := to.s.Merge(w.now, ap.Encoded)
		if err != nil {
			return fmt.Errorf("merge %s into replica %d: %w", ap.ID, to.s.Replica(), err)
		}
		if got != nil {
			to.log = append(to.log, got)
		}
	}
	return nil
}

// snapshot takes a snapshot of replica 1 and adds its restored twin.
func (w *twinWorld) snapshot(t *testing.T) error {
	b := w.a.s.Snapshot()
	r, err := Restore(1, b)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if again := r.Snapshot(); !bytes.Equal(again, b) {
		return errors.New("restored state snapshots to other bytes")
	}
	r.SetValueMerge(snapVM)
	if w.mutate != nil {
		w.mutate(r)
	}
	w.twins = append(w.twins, r)
	return w.compare(t)
}

// compare holds every twin to replica 1 on everything observable now.
func (w *twinWorld) compare(t *testing.T) error {
	if err := w.all("dump", func(s *State) string { return dump(t, s) }); err != nil {
		return err
	}
	return w.all("leases now", func(s *State) string {
		var b strings.Builder
		for _, l := range s.Leases().Leases {
			ttl, _ := s.LeaseTimeToLive(w.now, &pb.LeaseTimeToLiveRequest{ID: l.ID})
			e, ok := s.NextLeaseExpiry()
			fmt.Fprintf(&b, "%d ttl %d next %v %v; ", l.ID, ttl.TTL, e.UnixNano(), ok)
		}
		return b.String()
	})
}

func (w *twinWorld) run(t *testing.T, steps int) error {
	for step := range steps {
		k := w.pick.r.IntN(100)
		var err error
		switch {
		case k < 45:
			err = w.local()
		case k < 75:
			w.peerLocal(w.peers[w.pick.r.IntN(2)])
		case k < 85:
			err = w.intoA(w.peers[w.pick.r.IntN(2)])
		case k < 92:
			err = w.send(w.a, w.peers[w.pick.r.IntN(2)])
		case k < 95:
			err = errors.Join(w.send(w.peers[0], w.peers[1]), w.send(w.peers[1], w.peers[0]))
		case k < 97:
			// As the shell's auto-compaction does, at a revision that works.
			if s := w.a.s; s.Rev() > max(s.CompactRev(), 1) {
				rev := max(s.CompactRev(), 1) + 1 + w.pick.r.Int64N(s.Rev()-max(s.CompactRev(), 1))
				err = w.all("compact", func(s *State) string { return fmt.Sprint(s.Compact(rev)) })
			}
		case k < 98:
			err = w.collect()
		case t != nil:
			err = w.snapshot(t)
		}
		if err != nil {
			return fmt.Errorf("seed %d step %d: %w", w.seed, step, err)
		}
		w.now = w.now.Add(time.Duration(w.pick.r.IntN(1500)) * time.Millisecond)
		var exp []*Applied
		err = w.all("expire", func(s *State) string {
			aps := s.ExpireLeases(w.now)
			if s == w.a.s {
				exp = aps
			}
			return appliedText(aps...)
		})
		w.a.log = append(w.a.log, exp...)
		if err != nil {
			return fmt.Errorf("seed %d step %d: %w", w.seed, step, err)
		}
	}
	// Everything merged everywhere: the later merges agree too, and the
	// states end up the same to the byte.
	for _, p := range w.peers {
		if err := w.intoA(p); err != nil {
			return fmt.Errorf("seed %d final merge: %w", w.seed, err)
		}
	}
	if t == nil {
		return nil
	}
	if err := w.compare(t); err != nil {
		return fmt.Errorf("seed %d at the end: %w", w.seed, err)
	}
	want := w.a.s.Snapshot()
	for i, tw := range w.twins {
		if !bytes.Equal(tw.Snapshot(), want) || !docsEqual(tw, w.a.s) {
			return fmt.Errorf("seed %d: twin %d ends in another state", w.seed, i)
		}
	}
	return nil
}

// TestSnapshotRestoreIndistinguishable: a state restored from a snapshot
// taken at any point answers every later request, expiry and merge as the
// original does, and shows the same history (dump: every retained
// revision's Range and HashKV, the events from the compaction, heads,
// index and revision maps, leases, winners).
func TestSnapshotRestoreIndistinguishable(t *testing.T) {
	twins := 0
	for seed := uint64(1); seed <= 10; seed++ {
		w := newTwinWorld(seed, nil)
		if err := w.run(t, 400); err != nil {
			t.Fatal(err)
		}
		twins += len(w.twins)
		if w.a.s.CompactRev() < 2 {
			t.Fatalf("seed %d: never compacted: the workload misses compaction", seed)
		}
	}
	if twins < 10 {
		t.Fatalf("only %d snapshots taken", twins)
	}
}

// TestSnapshotChecksCatchBreakage proves the twin test can fail: a
// restored state that lost any one part of the state is caught.
func TestSnapshotChecksCatchBreakage(t *testing.T) {
	breaks := map[string]func(*State){
		"winners": func(s *State) {
			for _, k := range s.keys {
				k.win, k.winRepl = HLC{}, 0
			}
		},
		"forgotten": func(s *State) { clear(s.forgotten) },
		"documents": func(s *State) {
			for _, k := range s.keys {
				k.doc = nil
			}
		},
		"lease expiries": func(s *State) {
			for _, l := range s.leases {
				l.expiry = l.expiry.Add(time.Hour)
			}
		},
		"clock": func(s *State) { s.clock = HLC{} },
		"chains": func(s *State) {
			for _, ch := range s.chains {
				ch.last = HLC{}
			}
		},
		"collect list": func(s *State) {
			for _, k := range s.gcKeys {
				k.gc = false
			}
			s.gcKeys = nil
		},
		"dirty keys": func(s *State) {
			for _, k := range s.dirty {
				k.dirty = false
			}
			s.dirty = nil
		},
	}
	for name, br := range breaks {
		caught := false
		for seed := uint64(1); seed <= 16 && !caught; seed++ {
			caught = newTwinWorld(seed, br).run(t, 500) != nil
		}
		if !caught {
			t.Errorf("a restored state without its %s went unnoticed", name)
		}
	}
}

// snapshotOf is a snapshot of replica 1 after a short random workload
// (without twins).
func snapshotOf(t testing.TB, seed uint64, steps int) []byte {
	w := newTwinWorld(seed, nil)
	if err := w.run(nil, steps); err != nil {
		t.Fatal(err)
	}
	return w.a.s.Snapshot()
}

func TestRestoreRefusesMalformed(t *testing.T) {
	good := snapshotOf(t, 3, 120)
	if _, err := Restore(1, good); err != nil {
		t.Fatal(err)
	}
	mustRefuse := func(what string, b []byte, want string) {
		t.Helper()
		_, err := Restore(1, b)
		if err == nil {
			t.Errorf("%s: accepted", what)
		} else if !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", what, err, want)
		}
	}
	mustRefuse("empty", nil, "not a snapshot")
	mustRefuse("a change", (&Change{Replica: 1}).Encode(), "not a snapshot")
	v2 := bytes.Clone(good)
	v2[2] = 2
	mustRefuse("version 2", v2, "snapshot version 2, want 1")
	if _, err := Restore(2, good); err == nil || !strings.Contains(err.Error(), "snapshot of replica 1, not 2") {
		t.Errorf("another replica's snapshot: %v", err)
	}
	mustRefuse("trailing byte", append(bytes.Clone(good), 0), "1 trailing bytes")
	for n := range len(good) {
		if _, err := Restore(1, good[:n]); err == nil {
			t.Fatalf("truncated to %d of %d bytes: accepted", n, len(good))
		}
	}
	// The index as a two-byte varint: the same number, not canonical.
	at := 3 + 8 + 12 + 16
	_, n := binary.Uvarint(good[at:])
	padded := append(bytes.Clone(good[:at+n]), 0)
	padded[at+n-1] |= 0x80
	padded = append(padded, good[at+n:]...)
	mustRefuse("non-minimal varint", padded, "not in canonical form")
	// Every single-byte corruption is refused or restores a state that
	// snapshots to the corrupted bytes (a different, consistent state):
	// never a panic, never a silent rewrite.
	for i := range good {
		b := bytes.Clone(good)
		b[i] ^= 0x41
		if s, err := Restore(1, b); err == nil && !bytes.Equal(s.Snapshot(), b) {
			t.Fatalf("byte %d corrupted: restored to other bytes", i)
		}
	}
}

func TestRestoreRefusesBrokenInvariants(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	s := New(1)
	_, _, _ = s.LeaseGrant(now, &pb.LeaseGrantRequest{ID: 7, TTL: 60})
	_, _, _ = s.Put(now, &pb.PutRequest{Key: []byte("k"), Value: []byte("v"), Lease: 7})
	_, _, _ = s.DeleteRange(now, &pb.DeleteRangeRequest{Key: []byte("k")})
	_, _, _ = s.Put(now, &pb.PutRequest{Key: []byte("k"), Value: []byte("w"), Lease: 7})
	cases := map[string]struct {
		mutate func(*State)
		want   string
	}{
		"head not applied": {func(s *State) { s.heads = []Hash{{1}} }, "is not applied"},
		"lease key not live": {func(s *State) {
			s.leases[7].keys["gone"] = struct{}{}
		}, `holds key "gone"`},
		"tombstone inside a generation": {func(s *State) {
			s.keys["k"].gens[0].revs = append(s.keys["k"].gens[0].revs[:1:1], version{main: 3, tomb: true}, version{main: 3, sub: 1, tomb: true})
		}, "a tombstone must end it"},
		"version from the future": {func(s *State) {
			v := &s.keys["k"].gens[1].revs[0]
			v.main, v.v.mod = 99, 99
		}, "at revision 4"},
		"compaction past the revision": {func(s *State) { s.compactRev = 9 }, "compaction 9"},
	}
	for name, c := range cases {
		r, err := Restore(1, s.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		c.mutate(r)
		if _, err := Restore(1, r.Snapshot()); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}

// FuzzRestore: Restore never panics, what it accepts snapshots back to
// the same bytes, and a restored state survives being used (requests,
// compaction, expiry, another round trip).
func FuzzRestore(f *testing.F) {
	f.Add(New(1).Snapshot())
	for seed := uint64(1); seed <= 4; seed++ {
		f.Add(snapshotOf(f, seed, 40*int(seed)))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Restore(1, b)
		if err != nil {
			return
		}
		if !bytes.Equal(s.Snapshot(), b) {
			t.Fatal("restored state snapshots to other bytes")
		}
		now := time.Unix(1_800_000_000, 0)
		all := &pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}}
		for rev := max(s.CompactRev(), 1); rev <= s.Rev() && rev < max(s.CompactRev(), 1)+16; rev++ {
			all.Revision = rev
			_, _ = s.Range(all)
			_, _, _ = s.HashKV(rev)
		}
		_, _ = s.Events(s.CompactRev(), []byte{0}, []byte{0})
		_, _, _ = s.Put(now, &pb.PutRequest{Key: []byte("b"), Value: []byte(`{"x":1}`)})
		_, _, _ = s.DeleteRange(now, &pb.DeleteRangeRequest{Key: []byte("a"), RangeEnd: []byte{0}})
		_ = s.ExpireLeases(now.Add(1000 * time.Hour))
		for _, id := range s.leaseIDs() {
			_, _, _ = s.LeaseRevoke(now, id)
		}
		_ = s.Compact(s.Rev())
		if _, err := Restore(1, s.Snapshot()); err != nil {
			t.Fatalf("a restored state, used, does not restore: %v", err)
		}
	})
}
