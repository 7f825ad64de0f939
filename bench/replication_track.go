package bench

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// change is one write the workload made in the origin region.
type change struct {
	Key string
	Val string // "" for a delete
	Del bool
	// Rev is the origin revision the write committed at; Returned is when
	// the Put or Delete returned to the writer.
	Rev      int64
	Returned time.Time
}

// observation is one watch event as a watcher received it.
type observation struct {
	At  time.Time
	Key string
	Val string
	Del bool
}

// firstSeen dates each change (sorted by Rev) to the first observation that
// shows it or a later change of the same key: a mirror that coalesces puts
// of one key (the replicator keeps the last event per key of a batch) never
// shows the earlier values, but it has delivered them once it shows a newer
// one. Observations must be in the order they were received. A put is
// matched by its value (the workload makes every value unique), a delete by
// being the next delete of its key (the workload never re-creates a deleted
// key, so that is exact). Unmatched observations (a marker key, a lease
// expiry) are ignored; changes never shown stay zero.
func firstSeen(changes []change, obs []observation) []time.Time {
	type keyLog struct {
		idx  []int          // indices into changes, in revision order
		put  map[string]int // value -> position in idx
		done int            // positions below done are seen
	}
	logs := make(map[string]*keyLog)
	for i, c := range changes {
		l := logs[c.Key]
		if l == nil {
			l = &keyLog{put: map[string]int{}}
			logs[c.Key] = l
		}
		if !c.Del {
			l.put[c.Val] = len(l.idx)
		}
		l.idx = append(l.idx, i)
	}
	seen := make([]time.Time, len(changes))
	for _, o := range obs {
		l := logs[o.Key]
		if l == nil {
			continue
		}
		pos := -1
		if o.Del {
			for p := l.done; p < len(l.idx); p++ {
				if changes[l.idx[p]].Del {
					pos = p
					break
				}
			}
		} else if p, ok := l.put[o.Val]; ok {
			pos = p
		}
		for ; l.done <= pos; l.done++ {
			seen[l.idx[l.done]] = o.At
		}
	}
	return seen
}

// lagStats is the mirror lag of a set of changes: for each, the time the
// destination first showed it minus the earliest evidence that the origin
// had committed it (the writer's call returning, or the origin's own
// watcher seeing it, whichever came first).
type lagStats struct {
	Lags    []time.Duration
	Missing int // changes the destination never showed
	// Coalesced are changes of a key the destination never showed whose
	// last change is a delete: a mirror that keeps the last event per key
	// of a catch-up batch (the replicator) writes the delete of a key it
	// never created there, which etcd applies without an event. The
	// destination's state is then right and nothing is lost, but there is
	// no moment to date, so they are counted apart from Missing.
	Coalesced  int
	LastCommit time.Time // latest commit time among the changes
	LastSeen   time.Time // latest first-seen time on the destination
}

func computeLags(changes []change, origin, dest []observation) lagStats {
	atOrigin := firstSeen(changes, origin)
	atDest := firstSeen(changes, dest)
	// A key's changes are coalesced away only if none of them was shown:
	// one shown change means the destination held the key, and a delete it
	// then missed is a stale key, which stays Missing.
	type keyFate struct{ shown, endsDeleted bool }
	fate := make(map[string]*keyFate)
	for i, c := range changes {
		f := fate[c.Key]
		if f == nil {
			f = &keyFate{}
			fate[c.Key] = f
		}
		f.shown = f.shown || !atDest[i].IsZero()
		f.endsDeleted = c.Del
	}
	var s lagStats
	for i, c := range changes {
		committed := c.Returned
		if t := atOrigin[i]; !t.IsZero() && (committed.IsZero() || t.Before(committed)) {
			committed = t
		}
		if committed.After(s.LastCommit) {
			s.LastCommit = committed
		}
		if atDest[i].IsZero() {
			if f := fate[c.Key]; !f.shown && f.endsDeleted {
				s.Coalesced++
			} else {
				s.Missing++
			}
			continue
		}
		if atDest[i].After(s.LastSeen) {
			s.LastSeen = atDest[i]
		}
		s.Lags = append(s.Lags, max(atDest[i].Sub(committed), 0))
	}
	return s
}

// tracker follows one etcd's copy of a subtree through a watch: it keeps the
// current key/value state, records observations while asked to, and tells
// when the state first equals a target.
type tracker struct {
	mu         sync.Mutex
	state      map[string]string
	recording  bool
	obs        []observation
	lastChange time.Time // last event that changed state

	target      map[string]string
	mismatch    int       // keys whose state differs from target
	convergedAt time.Time // when mismatch last became 0 (zero while > 0)

	// emptiedAt is the first time the state went from non-empty to empty
	// (a lease expiry takes every key at once).
	emptiedAt time.Time

	err  error
	done chan struct{}
}

// track starts a tracker of prefix on cli, whose state starts empty (the
// subtree must be empty); it returns once the watch is established.
func track(ctx context.Context, cli *clientv3.Client, prefix string) (*tracker, error) {
	t := &tracker{state: map[string]string{}, done: make(chan struct{})}
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	select {
	case resp, ok := <-wch:
		if !ok || !resp.Created || resp.Err() != nil {
			return nil, fmt.Errorf("watch %s: not established: %v", prefix, resp.Err())
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	go t.run(ctx, wch)
	return t, nil
}

func (t *tracker) run(ctx context.Context, wch clientv3.WatchChan) {
	defer close(t.done)
	for resp := range wch {
		now := time.Now()
		t.mu.Lock()
		if err := resp.Err(); err != nil {
			t.err = err
			t.mu.Unlock()
			return
		}
		for _, ev := range resp.Events {
			t.applyLocked(now, string(ev.Kv.Key), string(ev.Kv.Value), ev.Type == mvccpb.DELETE)
		}
		t.mu.Unlock()
	}
	if ctx.Err() == nil {
		t.mu.Lock()
		t.err = fmt.Errorf("watch ended")
		t.mu.Unlock()
	}
}

func (t *tracker) applyLocked(now time.Time, key, val string, del bool) {
	if t.recording {
		t.obs = append(t.obs, observation{At: now, Key: key, Val: val, Del: del})
	}
	old, had := t.state[key]
	if del {
		if !had {
			return
		}
		delete(t.state, key)
		if len(t.state) == 0 && t.emptiedAt.IsZero() {
			t.emptiedAt = now
		}
	} else {
		if had && old == val {
			return // a re-put of the same value (e.g. re-attached to a new lease)
		}
		t.state[key] = val
	}
	t.lastChange = now
	if t.target == nil {
		return
	}
	want, wanted := t.target[key]
	wasEq := had == wanted && old == want
	isEq := !del == wanted && (del || val == want)
	switch {
	case wasEq && !isEq:
		t.mismatch++
		t.convergedAt = time.Time{}
	case !wasEq && isEq:
		t.mismatch--
		if t.mismatch == 0 {
			t.convergedAt = now
		}
	}
}

// record starts (or stops) keeping observations, dropping earlier ones.
func (t *tracker) record(on bool) {
	t.mu.Lock()
	t.recording, t.obs = on, nil
	t.mu.Unlock()
}

func (t *tracker) observations() []observation {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]observation(nil), t.obs...)
}

// setTarget makes want the state to converge to. If the state already
// equals it, it converged at the last change.
func (t *tracker) setTarget(want map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.target = want
	t.mismatch = diffCount(t.state, want)
	t.convergedAt = time.Time{}
	if t.mismatch == 0 {
		t.convergedAt = t.lastChange
	}
}

// converged reports when the state came to equal the target (zero if it
// does not now), the number of keys still differing, and a watch error.
func (t *tracker) converged() (time.Time, int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.convergedAt, t.mismatch, t.err
}

func (t *tracker) resetEmptied() {
	t.mu.Lock()
	t.emptiedAt = time.Time{}
	t.mu.Unlock()
}

func (t *tracker) emptied() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.emptiedAt
}

// diffCount is how many keys have another value (or presence) in a than in b.
func diffCount(a, b map[string]string) int {
	n := 0
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			n++
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			n++
		}
	}
	return n
}

// stale counts keys of dest that src lacks (deletes the mirror never made)
// and keys whose values differ or that dest lacks.
func compareStates(src, dest map[string]string) (extra, other int) {
	for k, v := range dest {
		if w, ok := src[k]; !ok {
			extra++
		} else if w != v {
			other++
		}
	}
	for k := range src {
		if _, ok := dest[k]; !ok {
			other++
		}
	}
	return extra, other
}

// readState reads every key under prefix.
func readState(ctx context.Context, cli *clientv3.Client, prefix string) (map[string]string, error) {
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(gctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		m[string(kv.Key)] = string(kv.Value)
	}
	return m, nil
}

func sortByRev(cs []change) {
	sort.Slice(cs, func(i, j int) bool { return cs[i].Rev < cs[j].Rev })
}
