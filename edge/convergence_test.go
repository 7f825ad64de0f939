package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/edge/internal/core"
)

// ackedWrite is a write a replica acknowledged with a new revision: the
// change that made that revision there must reach every replica.
type ackedWrite struct {
	origin string
	rev    int64
	what   string
}

// convLoad writes at one replica until n writes are done: puts, deletes
// and put-if-absent Txns on plain keys, leases (a put on a new lease, a
// revoke deleting its keys), and JSON edits (a field set or removed,
// nested ones included, a whole object, a value that is not an object, a
// delete of the document).
func convLoad(ctx context.Context, t *testing.T, s *Server, name string, seed uint64, n int) ([]ackedWrite, []string) {
	cli := newClient(t, s)
	rng := rand.New(rand.NewPCG(seed, 11))
	var acks []ackedWrite
	var puts []string
	var leases []clientv3.LeaseID
	ack := func(rev int64, what string) { acks = append(acks, ackedWrite{origin: name, rev: rev, what: what}) }
	for i := range n {
		key := fmt.Sprintf("k%d", rng.IntN(8))
		doc := fmt.Sprintf("%sd%d", jsonPrefix, rng.IntN(3))
		val := fmt.Sprintf("%s/%d/%d", name, seed, i)
		var err error
		switch r := rng.IntN(24); {
		case r < 6:
			var resp *clientv3.PutResponse
			if resp, err = cli.Put(ctx, key, val); err == nil {
				ack(resp.Header.Revision, "put "+key)
				puts = append(puts, key+"="+val)
			}
		case r < 8:
			var resp *clientv3.DeleteResponse
			if resp, err = cli.Delete(ctx, key); err == nil && resp.Deleted > 0 {
				ack(resp.Header.Revision, "delete "+key)
			}
		case r < 10:
			var resp *clientv3.TxnResponse
			resp, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", 0)).
				Then(clientv3.OpPut(key, val)).Else(clientv3.OpDelete(key)).Commit()
			if err == nil {
				ack(resp.Header.Revision, "txn "+key)
				if resp.Succeeded {
					puts = append(puts, key+"="+val)
				}
			}
		case r < 11:
			var g *clientv3.LeaseGrantResponse
			if g, err = cli.Grant(ctx, 600); err == nil {
				leases = append(leases, g.ID)
				var resp *clientv3.PutResponse
				if resp, err = cli.Put(ctx, "l"+key, val, clientv3.WithLease(g.ID)); err == nil {
					ack(resp.Header.Revision, "leased put")
					puts = append(puts, "l"+key+"="+val)
				}
			}
		case r < 12 && len(leases) > 0:
			_, err = cli.Revoke(ctx, leases[0])
			leases = leases[1:]
		default:
			var rev int64
			if rev, err = jsonEdit(ctx, cli, rng, doc, val); err == nil && rev > 0 {
				ack(rev, "json "+doc)
			}
		}
		if err != nil {
			t.Errorf("%s: write %d: %v", name, i, err)
			return acks, puts
		}
	}
	return acks, puts
}

// jsonEdit does one random edit of doc; it returns the revision of the
// write (0 when it wrote nothing).
func jsonEdit(ctx context.Context, cli *clientv3.Client, rng *rand.Rand, doc, val string) (int64, error) {
	switch rng.IntN(10) {
	case 0:
		resp, err := cli.Delete(ctx, doc)
		if err != nil || resp.Deleted == 0 {
			return 0, err
		}
		return resp.Header.Revision, nil
	case 1:
		resp, err := cli.Put(ctx, doc, "plain-"+val)
		if err != nil {
			return 0, err
		}
		return resp.Header.Revision, nil
	case 2:
		b, _ := json.Marshal(map[string]any{"fresh": val, "n": map[string]any{"x": val}})
		resp, err := cli.Put(ctx, doc, string(b))
		if err != nil {
			return 0, err
		}
		return resp.Header.Revision, nil
	}
	g, err := cli.Get(ctx, doc)
	if err != nil {
		return 0, err
	}
	m := map[string]any{}
	if len(g.Kvs) == 1 {
		_ = json.Unmarshal(g.Kvs[0].Value, &m) // not an object: start over
		if m == nil {
			m = map[string]any{}
		}
	}
	target := m
	if rng.IntN(3) == 0 {
		n, ok := m["n"].(map[string]any)
		if !ok {
			n = map[string]any{}
			m["n"] = n
		}
		target = n
	}
	f := []string{"a", "b", "c", "d"}[rng.IntN(4)]
	if rng.IntN(4) == 0 {
		delete(target, f)
	} else {
		target[f] = val
	}
	b, _ := json.Marshal(m)
	resp, err := cli.Put(ctx, doc, string(b))
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// Concurrent random writes at every replica (3 and 5, a complete graph of
// 2ms links), then quiet: every replica reports the same HashKV, equal to
// the reference merge of every change; every acknowledged write's change
// is on every replica. The checks can fail: a dropped change, or merging
// JSON keys as bytes, gives another hash.
func TestConvergence(t *testing.T) {
	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("replicas=%d", n), func(t *testing.T) {
			testConvergence(t, []string{"a", "b", "c", "d", "e"}[:n])
		})
	}
}

func testConvergence(t *testing.T, names []string) {
	m := newMesh(t, names)
	for _, p := range m.links {
		p.SetLatency(2 * time.Millisecond)
	}
	// The load's own deadline: five replicas under the race detector on a
	// loaded two-core machine take several times testCtx's 30s.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var (
		mu    sync.Mutex
		acks  []ackedWrite
		puts  []string
		wg    sync.WaitGroup
		start = time.Now()
	)
	for i, n := range names {
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a, p := convLoad(ctx, t, m.c.srv[n], n, uint64(10*i+g), 120)
				mu.Lock()
				acks, puts = append(acks, a...), append(puts, p...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	quiet := time.Now()
	hash, d := waitConvergedWithin(t, m.c.running(), quiet, "quiet")
	t.Logf("%d replicas: %d acknowledged writes in %v; same HashKV %v after the last", len(names), len(acks),
		quiet.Sub(start).Round(time.Millisecond), d.Round(time.Millisecond))

	// Every acknowledged write's change is everywhere.
	byName := map[string]*Server{}
	for _, n := range names {
		byName[n] = m.c.srv[n]
	}
	vecs := map[string]vector{}
	for _, n := range names {
		vecs[n] = appliedVector(byName[n])
	}
	for _, a := range acks {
		s := byName[a.origin]
		s.mu.RLock()
		h, ok := s.st.HashOfRevision(a.rev)
		s.mu.RUnlock()
		if !ok {
			t.Fatalf("%s: acknowledged %s at revision %d has no change", a.origin, a.what, a.rev)
		}
		// Its place in its author's chain, held wherever a vector covers it.
		r, seq, ok := chainPosition(t, s, h)
		if !ok {
			t.Fatalf("%s: acknowledged %s at revision %d has no place in its author's chain", a.origin, a.what, a.rev)
		}
		for _, n := range names {
			if vecs[n][r] < seq {
				t.Fatalf("%s's acknowledged %s (revision %d) is not on %s", a.origin, a.what, a.rev, n)
			}
		}
	}
	final := checkReference(t, byName["a"], hash, puts)
	jsonKeys := 0
	for k := range final {
		if len(k) > len(jsonPrefix) && k[:len(jsonPrefix)] == jsonPrefix {
			jsonKeys++
		}
	}
	t.Logf("final state: %d keys, %d of them JSON documents", len(final), jsonKeys)

	// The checks can fail.
	changes := logChanges(t, byName["a"])
	if asBytes, _ := referenceMerge(t, changes, core.ValueMerge{}); asBytes == hash && jsonKeys > 0 {
		t.Fatal("merging JSON keys as bytes gives the converged hash: the reference checks nothing of JSON merge")
	}
	dropped := false
	for i := len(changes) - 1; i >= 0 && !dropped; i-- {
		c := changes[i]
		if len(c.Ops) == 0 || c.Ops[0].Kind != core.OpPut {
			continue
		}
		rest := append(append([]*core.Change{}, changes[:i]...), changes[i+1:]...)
		if h, _ := referenceMerge(t, rest, meshVM); h == hash {
			continue // superseded anyway: dropping it changes nothing
		}
		dropped = true
	}
	if !dropped {
		t.Fatal("no dropped change alters the reference merge: it checks nothing")
	}
}
