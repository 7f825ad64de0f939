package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// convergeBound is how long after a heal every replica may take to hold
// every change any of them held at the heal (and, once writes stop, to
// report the same HashKV). What it is made of: a blackholed stream resumes
// as soon as the proxy forwards again (TCP holds what was sent), a reset
// one reconnects within the sync backoff (maxBackoff, 1s) plus a connect;
// then the catch-up is one vector exchange and the missing changes, each
// merged and fsync'd in batches. The tests log what they measure
// (docs/architecture.md has this machine's figures).
const convergeBound = 10 * time.Second

// waitCaughtUp waits until every replica holds every change any of them
// held at the heal (the clients keep writing, so the replicas are never
// equal at one instant under load; HashKV equality is checked once they
// stop), and returns how long that took, failing past the bound.
func waitCaughtUp(t *testing.T, ss []*Server, healed time.Time, what string) time.Duration {
	t.Helper()
	// What any replica held: the elementwise maximum of their vectors.
	want := vector{}
	for _, s := range ss {
		for r, n := range appliedVector(s) {
			want[r] = max(want[r], n)
		}
	}
	deadline := healed.Add(convergeBound)
	for {
		done := true
		for _, s := range ss {
			if !appliedVector(s).covers(want) {
				done = false
				break
			}
		}
		if done {
			d := time.Since(healed)
			t.Logf("%s: %d changes on every replica %v after heal", what, want.lacks(vector{}), d.Round(time.Millisecond))
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the changes held at the heal are not on every replica %v after it", what, convergeBound)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitConvergedWithin waits, once writes have stopped, for the replicas to
// hold the same changes and report the same HashKV.
func waitConvergedWithin(t *testing.T, ss []*Server, since time.Time, what string) (uint32, time.Duration) {
	t.Helper()
	ctx := testCtx(t)
	deadline := since.Add(convergeBound)
	for {
		if h, ok := converged(ctx, t, ss); ok {
			d := time.Since(since)
			t.Logf("%s: same HashKV %v after the writes stopped", what, d.Round(time.Millisecond))
			return h, d
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not converged %v after the writes stopped", what, convergeBound)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// During partitions that isolate one replica, split two against two, and
// flap, every replica keeps serving its pinned client's reads and writes
// (no request fails); after each heal all converge within convergeBound;
// no acknowledged write is lost; each client keeps read-your-writes and
// monotonic reads; each replica's watches pass watchcheck; each replica's
// own history is linearizable under porcupine; JSON edits of different
// fields made at partitioned sites all survive; the converged state is the
// reference merge of every change.
func TestPartitions(t *testing.T) {
	names := []string{"a", "b", "c", "d"}
	m := newMesh(t, names)
	// The test's own deadline (testCtx's 30s is close to what this takes
	// under the race detector on a loaded machine); each request still
	// has its own 5s.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sites := map[string]*site{}
	all := map[string]*watchRec{}
	pref := map[string]*watchRec{}
	for i, n := range names {
		s := m.c.srv[n]
		all[n] = recordWatch(t, s, n+"/all", "", 2)
		pref[n] = recordWatch(t, s, n+"/json", jsonPrefix, 2)
		sites[n] = newSite(t, n, s, uint64(i+1))
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var pause sync.RWMutex
	for _, n := range names {
		sites[n].loop(ctx, stop, &pause, &wg)
	}
	stopped := false
	defer func() {
		if !stopped {
			close(stop)
			wg.Wait()
		}
	}()
	running := func() []*Server { return m.c.running() }
	var bounds []string
	// settle measures a heal twice: under load, until every change held at
	// the heal is everywhere; then, the clients held still, until every
	// replica reports the same HashKV.
	settle := func(what string, healed time.Time) {
		d := waitCaughtUp(t, running(), healed, what)
		pause.Lock()
		defer pause.Unlock()
		_, q := waitConvergedWithin(t, running(), time.Now(), what)
		bounds = append(bounds, fmt.Sprintf("%s=%v(+%v to equal HashKV)", what, d.Round(time.Millisecond), q.Round(time.Millisecond)))
	}

	// A partition lasts long enough for each side to make a few hundred
	// writes; the clients never pause.
	hold := func(d time.Duration) {
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	hold(500 * time.Millisecond)

	// 1. Isolate a.
	m.partition([]string{"a"}, []string{"b", "c", "d"})
	hold(1500 * time.Millisecond)
	m.heal()
	settle("isolate", time.Now())

	// A watch resuming from a past revision at each replica (a client
	// that reconnects with the revision it had): it must deliver exactly
	// what followed, then live events.
	resumed := map[string]*watchRec{}
	for _, n := range names {
		s := m.c.srv[n]
		s.mu.RLock()
		from := max(2, s.st.Rev()-30)
		s.mu.RUnlock()
		resumed[n] = recordWatch(t, s, n+"/resumed", "", from)
	}

	// 2. Two against two, with a JSON edit of a field of its own at each
	// side, and of one common field (the later edit wins).
	m.partition([]string{"a", "b"}, []string{"c", "d"})
	hold(300 * time.Millisecond)
	jsonAt := func(n, field, value string) {
		w := newSite(t, n+"-split", m.c.srv[n], 99)
		w.editJSON(ctx, field, value)
		if len(w.errs) > 0 {
			t.Fatalf("JSON edit at %s: %v", n, w.errs)
		}
	}
	jsonAt("a", "split-ab", "from-a")
	jsonAt("c", "split-cd", "from-c")
	jsonAt("b", "common", "from-b")
	hold(20 * time.Millisecond)
	jsonAt("d", "common", "from-d") // later: wins
	hold(1200 * time.Millisecond)
	m.heal()
	settle("split", time.Now())
	for _, n := range names {
		r, err := newClientQuiet(t, m.c.srv[n]).Get(ctx, jsonDoc)
		if err != nil || len(r.Kvs) != 1 {
			t.Fatalf("%s: %s after the split: %v %v", n, jsonDoc, r, err)
		}
		var doc map[string]any
		if err := json.Unmarshal(r.Kvs[0].Value, &doc); err != nil {
			t.Fatal(err)
		}
		if doc["split-ab"] != "from-a" || doc["split-cd"] != "from-c" || doc["common"] != "from-d" {
			t.Fatalf("%s: %s after the split is %s: want both sides' fields and the later common edit", n, jsonDoc, r.Kvs[0].Value)
		}
	}

	// 3. Flap: links cut (reset) and restored every 150ms, a different
	// pair each time, with a blackholed replica in between.
	for i := range 12 {
		a, b := names[i%4], names[(i+1+i/4)%4]
		if a == b {
			b = names[(i+2)%4]
		}
		if i%3 == 2 {
			m.partition([]string{names[i%4]}, without(names, names[i%4]))
		} else {
			m.cut(a, b)
		}
		hold(150 * time.Millisecond)
		m.heal()
		hold(50 * time.Millisecond)
	}
	settle("flap", time.Now())

	close(stop)
	wg.Wait()
	stopped = true
	quiet := time.Now()
	hash, d := waitConvergedWithin(t, running(), quiet, "quiet")
	bounds = append(bounds, fmt.Sprintf("quiet=%v", d.Round(time.Millisecond)))
	t.Logf("convergence after heal: %s (bound %v)", strings.Join(bounds, " "), convergeBound)

	var acked []string
	total := 0
	for _, n := range names {
		w := sites[n]
		if len(w.errs) > 0 {
			t.Fatalf("%d failures at %s, first: %s", len(w.errs), n, strings.Join(w.errs[:min(5, len(w.errs))], "\n"))
		}
		acked = append(acked, w.acked...)
		total += len(w.ops)
	}
	t.Logf("%d client operations, %d acknowledged puts", total, len(acked))
	final := checkReference(t, m.c.srv["a"], hash, acked)
	// Every site's last JSON edit of its own field survived.
	var doc map[string]any
	if err := json.Unmarshal([]byte(final[jsonDoc]), &doc); err != nil {
		t.Fatalf("%s = %q: %v", jsonDoc, final[jsonDoc], err)
	}
	for _, n := range names {
		ok := sites[n].jsonOK
		if len(ok) == 0 {
			t.Fatalf("%s made no JSON edit", n)
		}
		_, last, _ := strings.Cut(ok[len(ok)-1], "=")
		if doc[n] != last {
			t.Fatalf("%s's last JSON edit %s=%s is lost: the document is %s", n, n, last, final[jsonDoc])
		}
	}
	for _, n := range names {
		checkWatches(t, m.c.srv[n], n, all[n], pref[n], resumed[n])
		checkLinearizable(t, sites[n], all[n])
	}
}

func without(names []string, x string) []string {
	var out []string
	for _, n := range names {
		if n != x {
			out = append(out, n)
		}
	}
	return out
}

// The session checks can fail: a read at an older revision than the
// client saw (monotonic reads), or older than its own write
// (read-your-writes), is reported.
func TestSiteChecksCatchViolations(t *testing.T) {
	w := &site{name: "x", wrote: map[string]int64{}, seenMod: map[string]int64{}}
	w.observe("k", 10, nil)
	w.observe("k", 9, nil)
	if len(w.errs) != 1 || !strings.Contains(w.errs[0], "monotonic reads") {
		t.Fatalf("a revision going back: %q", w.errs)
	}
	w = &site{name: "x", wrote: map[string]int64{"k": 12}, seenMod: map[string]int64{}}
	w.observe("k", 12, &mvccpb.KeyValue{Key: []byte("k"), ModRevision: 11})
	if len(w.errs) != 1 || !strings.Contains(w.errs[0], "read-your-writes") {
		t.Fatalf("a value older than the client's write: %q", w.errs)
	}
	w = &site{name: "x", wrote: map[string]int64{}, seenMod: map[string]int64{"k": 7}}
	w.observe("k", 20, &mvccpb.KeyValue{Key: []byte("k"), ModRevision: 6})
	if len(w.errs) != 1 || !strings.Contains(w.errs[0], "monotonic reads") {
		t.Fatalf("a key's value going back: %q", w.errs)
	}
}

// A lease's owner cut off by a partition (not stopped): it keeps expiring
// its leases by its own clock, the other side keeps showing the lease
// (granted TTL, no local expiry) and its keys, refuses keepalives for it,
// and deletes the keys as ordinary events when the owner's expiry arrives
// after the heal.
func TestPartitionLeaseOwnerCutOff(t *testing.T) {
	names := []string{"a", "b", "c"}
	m := newMesh(t, names)
	ctx := testCtx(t)
	ca, cb := newClient(t, m.c.srv["a"]), newClient(t, m.c.srv["b"])
	lease, err := ca.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ca.Put(ctx, "/leased", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"b", "c"} {
		cli := newClientQuiet(t, m.c.srv[n])
		eventually(t, 10*time.Second, n+" to get the leased key", func() bool {
			r, err := cli.Get(ctx, "/leased")
			return err == nil && len(r.Kvs) == 1 && r.Kvs[0].Lease == int64(lease.ID)
		})
	}
	r, err := cb.Get(ctx, "/leased")
	if err != nil {
		t.Fatal(err)
	}
	w := cb.Watch(ctx, "/leased", clientv3.WithRev(r.Header.Revision+1))
	m.partition([]string{"a"}, []string{"b", "c"})
	// The owner expires the lease by its clock (no keepalive): the key
	// goes at a while the partition lasts.
	eventually(t, 10*time.Second, "a to expire its lease", func() bool {
		r, err := ca.Get(ctx, "/leased")
		return err == nil && len(r.Kvs) == 0
	})
	r, err = cb.Get(ctx, "/leased")
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("b lost the key while the owner is cut off: %v %v", r, err)
	}
	ttl, err := cb.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys())
	if err != nil || ttl.GrantedTTL != 2 || ttl.TTL < 2 || len(ttl.Keys) != 1 {
		t.Fatalf("b's view of the cut-off owner's lease: %+v %v", ttl, err)
	}
	if _, err := cb.KeepAliveOnce(ctx, lease.ID); err == nil {
		t.Fatal("b renewed a lease it does not own")
	}
	m.heal()
	select {
	case resp := <-w:
		if len(resp.Events) != 1 || resp.Events[0].Type != mvccpb.DELETE {
			t.Fatalf("b's watcher after the heal: %+v", resp)
		}
	case <-ctx.Done():
		t.Fatal("the owner's expiry never reached b")
	}
	waitConvergedWithin(t, m.c.running(), time.Now(), "lease expiry")
}
