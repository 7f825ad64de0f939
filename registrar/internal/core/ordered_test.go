package core

import (
	"errors"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// Scripts of the core's part in "last acknowledged wins": stamps, the
// ordered flush's guesses, and what a flush's outcomes do to the snapshot.

func weightOf(w uint32) func(*registryv1.ServiceEndpoint) {
	return func(ep *registryv1.ServiceEndpoint) { ep.Weight = w }
}

// stampFrom is a stamp of another replica taken at wall time at.
func stampFrom(at time.Time, writer string) *registryv1.WriteStamp {
	var c registry.HLC
	return &registryv1.WriteStamp{Hlc: c.Next(at), Writer: writer}
}

func TestWritesAreStampedInAckOrder(t *testing.T) {
	s := newStateForTest("e", 100, 100)
	a, _, _ := s.register(mkEP(t, "web", "10.0.0.1"), t0)
	// Same attributes: no event, but a write of its own, stamped later.
	same, ev, err := s.register(mkEP(t, "web", "10.0.0.1"), t0)
	if err != nil || ev != nil {
		t.Fatalf("re-register: %v %v, want no event", ev, err)
	}
	if registry.CompareStamps(a.Stamp, same.Stamp) >= 0 || same.Stamp.GetWriter() != "e" {
		t.Fatalf("stamps %v then %v: want the later write stamped later, by this replica", a.Stamp, same.Stamp)
	}
	if s.Get(registry.IDOf(a)) != same || s.queue.pending[registry.IDOf(a)].ep != same {
		t.Fatal("the re-registration is not the stored and queued value")
	}
	// A drain of a draining endpoint likewise.
	d1, _, _ := s.drain(registry.IDOf(a), t0)
	d2, ev, _ := s.drain(registry.IDOf(a), t0)
	if ev != nil || registry.CompareStamps(d1.Stamp, d2.Stamp) >= 0 {
		t.Fatalf("second drain: event %v, stamps %v %v", ev, d1.Stamp, d2.Stamp)
	}
	// A value from another replica stamped ahead of our clock: our next
	// write is ordered after it.
	ahead := mkEP(t, "web", "10.0.0.2")
	ahead.Stamp = stampFrom(t0.Add(time.Hour), "other")
	s.ApplyWatch(backend.WatchBatch{Events: []backend.Event{{ID: registry.IDOf(ahead), Endpoint: ahead, Revision: 5}}, Revision: 5})
	w, _, _ := s.register(mkEP(t, "web", "10.0.0.2", weightOf(9)), t0)
	if registry.CompareStamps(w.Stamp, ahead.Stamp) <= 0 {
		t.Fatalf("write after seeing %v stamped %v: want it ordered after", ahead.Stamp, w.Stamp)
	}
	if _, err := s.unregister(registry.IDOf(w), t0); err != nil {
		t.Fatal(err)
	}
	if del := s.queue.pending[registry.IDOf(w)]; del.ep != nil || registry.CompareStamps(del.stamp, w.Stamp) <= 0 {
		t.Fatalf("queued delete %+v: want a delete stamped after the write it removes", del)
	}
}

// The watch's word becomes the flush's guess only where the waiting local
// write is known newer: a guess that names a newer value would let the
// swap overwrite it unseen.
func TestWatchGuessesOnlyUnderANewerLocalWrite(t *testing.T) {
	s := newStateForTest("e", 100, 100)
	id := registry.IDOf(mkEP(t, "web", "10.0.0.1"))
	watch := func(rev int64, ep *registryv1.ServiceEndpoint) {
		s.ApplyWatch(backend.WatchBatch{Events: []backend.Event{{ID: id, Endpoint: ep, Revision: rev}}, Revision: rev})
	}
	older := mkEP(t, "web", "10.0.0.1", weightOf(2))
	older.Stamp = stampFrom(t0.Add(-time.Minute), "other")
	watch(4, older)
	if b := s.base[id]; b.key != 4 {
		t.Fatalf("no local write: guess %+v, want the watched revision 4", b)
	}
	mustRegister(t, s, mkEP(t, "web", "10.0.0.1", weightOf(3))) // stamped at t0
	older2 := mkEP(t, "web", "10.0.0.1", weightOf(4))
	older2.Stamp = stampFrom(t0.Add(-time.Second), "other")
	watch(6, older2)
	if b := s.base[id]; b.key != 6 {
		t.Fatalf("an older value under a newer local write: guess %+v, want 6", b)
	}
	newer := mkEP(t, "web", "10.0.0.1", weightOf(5))
	newer.Stamp = stampFrom(t0.Add(time.Minute), "other")
	watch(8, newer)
	if b := s.base[id]; b.key != 6 {
		t.Fatalf("a newer value than the local write: guess %+v, want it left at 6 (the swap must fail and look)", b)
	}
	watch(9, nil) // a delete: its stamp is not in the watch
	if b := s.base[id]; b.key != 6 {
		t.Fatalf("a delete under a local write: guess %+v, want it left at 6", b)
	}
	b := mustTake(t, s)
	if b[0].KeyRev != 6 {
		t.Fatalf("the flush swaps against %d, want 6", b[0].KeyRev)
	}
}

func TestFlushOutcomes(t *testing.T) {
	s := newStateForTest("e", 100, 100)
	a := mkEP(t, "web", "10.0.0.1")
	bb := mkEP(t, "web", "10.0.0.2")
	c := mkEP(t, "web", "10.0.0.3")
	d := mkEP(t, "web", "10.0.0.4")
	for _, ep := range []*registryv1.ServiceEndpoint{a, bb, c, d} {
		mustRegister(t, s, ep)
	}
	batch := s.TakeBatch(10, t0)
	byIP := map[string]int{}
	for i, m := range batch {
		byIP[m.ID.IP] = i
	}
	theirs := mkEP(t, "web", "10.0.0.2", weightOf(7))
	theirs.Stamp = stampFrom(t0.Add(time.Minute), "other")
	outs := make([]backend.Outcome, len(batch))
	outs[byIP["10.0.0.1"]] = backend.Outcome{Landed: true, Revision: 20, KeyRev: 20}
	outs[byIP["10.0.0.2"]] = backend.Outcome{Superseded: true, Current: theirs, CurrentStamp: theirs.Stamp, KeyRev: 19}
	outs[byIP["10.0.0.3"]] = backend.Outcome{Err: errors.New("etcdserver: request is too large")}
	outs[byIP["10.0.0.4"]] = backend.Outcome{KeyRev: 18} // not settled
	// A newer local write of d arrived while the batch was out.
	dNew := mkEP(t, "web", "10.0.0.4", weightOf(3))
	mustRegister(t, s, dNew)
	evs := s.BatchSettled(batch, outs, t0).Events

	// Landed: persisted, its revision known.
	if s.queue.holds(registry.IDOf(a)) || s.epRev[registry.IDOf(a)] != 20 {
		t.Errorf("landed write: held %v, revision %d", s.queue.holds(registry.IDOf(a)), s.epRev[registry.IDOf(a)])
	}
	// Superseded: the snapshot takes the newer value, with an event, and
	// lagging reports of the key are ignored.
	if got := s.Get(registry.IDOf(bb)); got.GetWeight() != 7 || s.queue.holds(registry.IDOf(bb)) {
		t.Errorf("superseded write: snapshot holds %v, still queued %v", got, s.queue.holds(registry.IDOf(bb)))
	}
	if !eq(types(evs), []string{"ENDPOINT_UPDATED 10.0.0.2"}) {
		t.Errorf("events %v, want the superseding value's update", types(evs))
	}
	if !s.guarded(registry.IDOf(bb), 18) {
		t.Error("a watch report older than the superseding value is not guarded against")
	}
	// Refused: isolated, still guarding its key, out of the flusher's way
	// until its retry time, then offered again.
	if _, ok := s.queue.isolated[registry.IDOf(c)]; !ok || !s.queue.holds(registry.IDOf(c)) {
		t.Errorf("refused write: isolated %v", s.queue.isolated)
	}
	next := s.TakeBatch(10, t0)
	if len(next) != 1 || next[0].ID.IP != "10.0.0.4" || next[0].Endpoint.GetWeight() != 3 || next[0].KeyRev != 18 {
		t.Fatalf("next batch %+v: want only d's newer write, swapping against the revision read (18)", next)
	}
	s.BatchFailed(next)
	later := s.TakeBatch(10, t0.Add(IsolationRetry))
	ips := map[string]bool{}
	for _, m := range later {
		ips[m.ID.IP] = true
	}
	if !ips["10.0.0.3"] || !ips["10.0.0.4"] {
		t.Fatalf("after the isolation retry time: %+v, want c offered again beside d", later)
	}
	// A newer write of an isolated key replaces it.
	s.BatchFailed(later)
	s.queue.isolate(registry.IDOf(c), "too large", t0) // no-op: c is pending, not in flight
	batch = s.TakeBatch(10, t0)
	for _, m := range batch {
		if m.ID.IP == "10.0.0.3" {
			s.queue.isolate(m.ID, "too large", t0)
		}
	}
	mustRegister(t, s, mkEP(t, "web", "10.0.0.3", weightOf(2)))
	if _, ok := s.queue.isolated[registry.IDOf(c)]; ok {
		t.Error("a newer write of an isolated key left the isolated write in place")
	}
}

// A superseded write under a newer local write leaves the snapshot alone:
// the newer write is ordered in its own flush.
func TestSupersededUnderANewerLocalWrite(t *testing.T) {
	s := newStateForTest("e", 100, 100)
	mustRegister(t, s, mkEP(t, "web", "10.0.0.1"))
	b := mustTake(t, s)
	mine := mkEP(t, "web", "10.0.0.1", weightOf(4))
	mustRegister(t, s, mine)
	theirs := mkEP(t, "web", "10.0.0.1", weightOf(9))
	theirs.Stamp = stampFrom(t0.Add(-time.Second), "other")
	evs := s.BatchSettled(b, []backend.Outcome{{Superseded: true, Current: theirs, CurrentStamp: theirs.Stamp, KeyRev: 7}}, t0).Events
	if len(evs) != 0 || s.Get(registry.IDOf(mine)).GetWeight() != 4 {
		t.Fatalf("events %v, snapshot %v: want the newer local write kept", types(evs), s.Get(registry.IDOf(mine)))
	}
	if n := s.TakeBatch(10, t0); len(n) != 1 || n[0].KeyRev != 7 {
		t.Fatalf("next flush %+v: want the local write, swapping against 7", n)
	}
}

// A removal superseded by a newer write brings the endpoint back here too.
func TestSupersededRemoval(t *testing.T) {
	s := newStateForTest("e", 100, 100)
	ep := mkEP(t, "web", "10.0.0.1")
	mustRegister(t, s, ep)
	s.batchDone(mustTake(t, s), 3)
	if _, err := s.unregister(registry.IDOf(ep), t0); err != nil {
		t.Fatal(err)
	}
	theirs := mkEP(t, "web", "10.0.0.1", weightOf(6))
	theirs.Stamp = stampFrom(t0.Add(time.Minute), "other")
	evs := s.BatchSettled(mustTake(t, s), []backend.Outcome{{Superseded: true, Current: theirs, CurrentStamp: theirs.Stamp, KeyRev: 9}}, t0).Events
	if !eq(types(evs), []string{"ENDPOINT_ADDED 10.0.0.1"}) || s.Get(registry.IDOf(ep)).GetWeight() != 6 {
		t.Fatalf("events %v: want the newer write back in the snapshot", types(evs))
	}
}
