package etcd

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
)

// stamped is endpoint 1 of web at generation gen, stamped hlc by writer.
func stamped(gen int, hlc uint64, writer string) *registryv1.ServiceEndpoint {
	ep := endpoint("web", 1, gen)
	ep.Stamp = &registryv1.WriteStamp{Hlc: hlc, Writer: writer}
	return ep
}

func stampOf(hlc uint64, writer string) *registryv1.WriteStamp {
	return &registryv1.WriteStamp{Hlc: hlc, Writer: writer}
}

// stored reads back what etcd holds for ep's key: the value (nil when
// absent) and its mod revision.
func stored(t *testing.T, cli *clientv3.Client, ep *registryv1.ServiceEndpoint) (*registryv1.ServiceEndpoint, int64) {
	t.Helper()
	resp, err := cli.Get(testCtx(t), v1Key(ep))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0
	}
	got, err := registry.DecodeEndpoint(v1Key(ep), resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return got, resp.Kvs[0].ModRevision
}

func applyOne(t *testing.T, s *Store, m Mutation) Outcome {
	t.Helper()
	outs, err := s.ApplyOrdered(testCtx(t), []Mutation{m})
	if err != nil {
		t.Fatalf("ApplyOrdered: %v", err)
	}
	return outs[0]
}

// Two writers whose flushes reach etcd out of the order they stamped in:
// whatever arrives, etcd keeps the newest stamp, and a stale writer is
// told what overtook it.
func TestApplyOrderedNewestStampWins(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})

	newer := stamped(2, 200, "B")
	o := applyOne(t, s, Mutation{ID: registry.IDOf(newer), Endpoint: newer})
	if !o.Landed || o.KeyRev != o.Revision {
		t.Fatalf("first write: %+v, want landed at its revision", o)
	}
	// A writer that never saw it (guess: absent) with an older stamp.
	older := stamped(1, 100, "A")
	o = applyOne(t, s, Mutation{ID: registry.IDOf(older), Endpoint: older})
	if !o.Superseded || o.Current.GetNode() != newer.Node || o.CurrentStamp.GetHlc() != 200 {
		t.Fatalf("older write: %+v, want superseded by the newer value", o)
	}
	if got, _ := stored(t, cli, newer); got.GetNode() != newer.Node {
		t.Fatalf("etcd holds %v, want the newer write", got)
	}
	// An equal clock reading is ordered by writer.
	tie := stamped(3, 200, "C")
	o = applyOne(t, s, Mutation{ID: registry.IDOf(tie), Endpoint: tie, KeyRev: 1})
	if !o.Landed {
		t.Fatalf("same hlc, later writer: %+v, want landed after a wrong guess", o)
	}
	// Re-sending a write that already landed (its answer was lost) is
	// settled as it is, not written twice.
	_, rev := stored(t, cli, tie)
	o = applyOne(t, s, Mutation{ID: registry.IDOf(tie), Endpoint: tie})
	if !o.Superseded || o.Current.GetNode() != tie.Node {
		t.Fatalf("replayed write: %+v, want settled by its own value", o)
	}
	if _, again := stored(t, cli, tie); again != rev {
		t.Fatalf("replay rewrote the key: revision %d, was %d", again, rev)
	}
}

// A delete leaves its stamp behind, so a write stamped before it but
// flushed after cannot bring the endpoint back; one stamped after it can.
func TestApplyOrderedDeleteLeavesATombstone(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})

	ep := stamped(1, 100, "A")
	id := registry.IDOf(ep)
	o := applyOne(t, s, Mutation{ID: id, Endpoint: ep})
	o = applyOne(t, s, Mutation{ID: id, Stamp: stampOf(300, "B"), KeyRev: o.KeyRev})
	if !o.Landed || o.KeyRev != 0 || o.TombRev != o.Revision {
		t.Fatalf("delete: %+v, want landed, key absent, tombstone at its revision", o)
	}
	if got, _ := stored(t, cli, ep); got != nil {
		t.Fatalf("after the delete etcd holds %v", got)
	}
	tk, _ := registry.TombstoneKey(id)
	if !strings.HasPrefix(tk, registry.TombstoneRoot) || strings.HasPrefix(tk, registry.Root) {
		t.Fatalf("tombstone key %q must be outside the registry prefix %q", tk, registry.Root)
	}
	resp, err := cli.Get(testCtx(t), tk)
	if err != nil || len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("tombstone %q: %v %v, want one key under a lease", tk, resp, err)
	}
	ttl, err := cli.TimeToLive(testCtx(t), clientv3.LeaseID(resp.Kvs[0].Lease))
	if err != nil || ttl.TTL <= 0 || time.Duration(ttl.GrantedTTL)*time.Second != TombstoneTTL {
		t.Fatalf("tombstone lease: %+v %v, want granted %v and alive", ttl, err, TombstoneTTL)
	}

	// Stamped before the delete, flushed after, by a writer that saw the
	// key present: superseded, and told it is gone.
	stale := stamped(2, 200, "C")
	o = applyOne(t, s, Mutation{ID: id, Endpoint: stale, KeyRev: 2})
	if !o.Superseded || o.Current != nil || o.CurrentStamp.GetHlc() != 300 {
		t.Fatalf("stale put: %+v, want superseded by the delete", o)
	}
	// The same from a writer that guessed absent and no tombstone.
	o = applyOne(t, s, Mutation{ID: id, Endpoint: stale})
	if !o.Superseded || o.Current != nil {
		t.Fatalf("stale put guessing absent: %+v, want superseded by the delete", o)
	}
	if got, _ := stored(t, cli, ep); got != nil {
		t.Fatalf("a write older than the delete brought the endpoint back: %v", got)
	}
	// An older delete does not lower the tombstone's stamp.
	o = applyOne(t, s, Mutation{ID: id, Stamp: stampOf(250, "C")})
	if !o.Superseded {
		t.Fatalf("older delete: %+v, want superseded", o)
	}
	fresh := stamped(4, 400, "A")
	o = applyOne(t, s, Mutation{ID: id, Endpoint: fresh})
	if !o.Landed {
		t.Fatalf("put stamped after the delete: %+v, want landed", o)
	}
	if got, _ := stored(t, cli, ep); got.GetNode() != fresh.Node {
		t.Fatalf("etcd holds %v, want the write after the delete", got)
	}
}

// A batch mixes settled and unsettled guesses: every mutation ends as the
// stamps say, in one call, whatever the guesses were.
func TestApplyOrderedBatchOfMixedGuesses(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{MaxTxnOps: 8}) // four mutations per Txn
	var first []Mutation
	for i := range 10 {
		ep := endpoint("web", i, 1)
		ep.Stamp = stampOf(uint64(100+i), "A")
		first = append(first, Mutation{ID: registry.IDOf(ep), Endpoint: ep})
	}
	outs, err := s.ApplyOrdered(testCtx(t), first)
	if err != nil {
		t.Fatal(err)
	}
	var second []Mutation
	for i, o := range outs {
		if !o.Landed {
			t.Fatalf("mutation %d: %+v", i, o)
		}
		ep := endpoint("web", i, 2)
		// Even: newer, with a right guess or a wrong one; odd: older.
		hlc := uint64(200)
		if i%2 == 1 {
			hlc = 50
		}
		ep.Stamp = stampOf(hlc, "B")
		m := Mutation{ID: registry.IDOf(ep), Endpoint: ep}
		if i%4 == 0 {
			m.KeyRev = o.KeyRev
		}
		second = append(second, m)
	}
	outs, err = s.ApplyOrdered(testCtx(t), second)
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range outs {
		got, _ := stored(t, cli, second[i].Endpoint)
		if i%2 == 0 && (!o.Landed || got.GetNode() != "node-2") {
			t.Errorf("newer write %d: %+v, etcd %v", i, o, got)
		}
		if i%2 == 1 && (!o.Superseded || got.GetNode() != "node-1" || o.Current.GetNode() != "node-1") {
			t.Errorf("older write %d: %+v, etcd %v", i, o, got)
		}
	}
}

// A value etcd refuses (larger than its request limit) is reported alone;
// the rest of its batch lands, even when it shares a Txn with them.
func TestApplyOrderedIsolatesARefusedMutation(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	for _, tc := range []struct {
		name  string
		bytes int
	}{
		{"a Txn of its own", 0},
		{"sharing a Txn, found by splitting", 8 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newStore(t, cli, Options{MaxTxnBytes: tc.bytes})
			var muts []Mutation
			for i := range 9 {
				ep := endpoint("svc-"+strings.ReplaceAll(tc.name, " ", "-")[:5], i, 1)
				ep.Stamp = stampOf(100, "A")
				if i == 4 {
					// Over etcd's default --max-request-bytes (1.5 MiB).
					ep.Metadata = map[string]string{"blob": strings.Repeat("x", 1600<<10)}
				}
				muts = append(muts, Mutation{ID: registry.IDOf(ep), Endpoint: ep})
			}
			outs, err := s.ApplyOrdered(testCtx(t), muts)
			if err != nil {
				t.Fatalf("ApplyOrdered: %v (a permanent refusal of one mutation must not fail the call)", err)
			}
			for i, o := range outs {
				got, _ := stored(t, cli, muts[i].Endpoint)
				switch {
				case i == 4 && (o.Err == nil || !Permanent(o.Err) || got != nil):
					t.Errorf("oversized mutation: %+v, etcd %v; want refused, named, not stored", o, got != nil)
				case i != 4 && (!o.Landed || got == nil):
					t.Errorf("mutation %d: %+v; want landed despite its oversized neighbour", i, o)
				}
			}
		})
	}
}

// A failure of the moment is an error of the call, never a refusal of a
// mutation: the caller retries it.
func TestApplyOrderedUnreachableIsNotPermanent(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s, _ := newStore(t, cli, Options{})
	etcd.Stop()
	ep := stamped(1, 100, "A")
	ctx := testCtx(t)
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	outs, err := s.ApplyOrdered(short, []Mutation{{ID: registry.IDOf(ep), Endpoint: ep}})
	if err == nil || Permanent(err) {
		t.Fatalf("etcd down: err %v (permanent %v), want a transient error", err, Permanent(err))
	}
	if outs[0].Settled() {
		t.Fatalf("etcd down: %+v, want unsettled", outs[0])
	}
}

// Permanent tells etcd's refusals of a request as it is from failures of
// the moment, backpressure included.
func TestPermanentClassifiesEtcdErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{rpctypes.ErrRequestTooLarge, true},
		{rpctypes.ErrTooManyOps, true},
		{fmt.Errorf("txn: %w", rpctypes.ErrGRPCRequestTooLarge), true},
		{status.Error(codes.ResourceExhausted, "trying to send message larger than max (3003883 vs. 2097152)"), true},
		{fmt.Errorf("%w: bad id", ErrInvalidMutation), true},
		{rpctypes.ErrTooManyRequests, false},
		{rpctypes.ErrGRPCRequestTooManyRequests, false},
		{rpctypes.ErrNoLeader, false},
		{rpctypes.ErrTimeout, false},
		{rpctypes.ErrLeaseNotFound, false},
		{status.Error(codes.Unavailable, "connection refused"), false},
		{context.DeadlineExceeded, false},
		{fmt.Errorf("etcd txn: %w", context.Canceled), false},
	} {
		if got := Permanent(tc.err); got != tc.want {
			t.Errorf("Permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
