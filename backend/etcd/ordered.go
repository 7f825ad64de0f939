package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// Ordered writes: last acknowledged wins.
//
// Several registrars write the same keys behind their acknowledgements, so
// the order their flushes reach etcd is not the order they acknowledged
// in. ApplyOrdered makes etcd keep, per key, the write with the newest
// stamp (registry.CompareStamps) whatever order the flushes come in: each
// mutation is a compare-and-swap on the key's mod revision as the writer
// last saw it, and when that guess is wrong the Txn's failure branch reads
// what etcd holds, so the writer decides on the spot whether its write is
// still the newest (swap again, against what it just read) or has been
// overtaken (drop it, and adopt what etcd holds).
//
// A delete must be ordered too, or a write acknowledged before it but
// flushed after would bring the endpoint back. So a delete leaves its
// stamp as a tombstone under registry.TombstoneRoot, outside the registry,
// under a lease of TombstoneTTL: long enough to outlast any flush still
// queued somewhere (a flush retries within seconds of the backend coming
// back), short enough that deleted endpoints cost nothing for long. A put
// of an absent key compares the tombstone as well.

// TombstoneTTL is how long a delete's stamp is kept.
const TombstoneTTL = 10 * time.Minute

// DefaultMaxTxnBytes bounds the encoded values of one Txn below etcd's
// default --max-request-bytes (1.5 MiB), with room for keys and framing; a
// single larger value gets a Txn of its own, and etcd's refusal then names
// it alone.
const DefaultMaxTxnBytes = 1 << 20

// maxOrderedRounds bounds how often one call re-reads and swaps again:
// each round settles every key whose guess was right or whose writer lost,
// so only a key that another replica rewrites between our read and our
// swap, every time, is left over (and retried by the caller later).
const maxOrderedRounds = 6

// Outcome is backend.Outcome: what became of one mutation of ApplyOrdered.
type Outcome = backend.Outcome

// ErrInvalidMutation marks a mutation refused before anything was sent.
var ErrInvalidMutation = backend.ErrInvalidMutation

// Permanent reports whether an etcd error means the request can never
// succeed as it is (too large, too many operations, malformed), as
// opposed to a failure of the moment (no leader, timeout, connection).
func Permanent(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, ErrInvalidMutation) {
		return true
	}
	// etcd's backpressure shares RESOURCE_EXHAUSTED with a message too
	// large to send, but it passes.
	if errors.Is(err, rpctypes.ErrTooManyRequests) || errors.Is(err, rpctypes.ErrGRPCRequestTooManyRequests) {
		return false
	}
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.FailedPrecondition, codes.OutOfRange:
		return !errors.Is(err, rpctypes.ErrLeaseNotFound)
	}
	return false
}

// tombLease is the lease tombstones are written under; a new one is
// granted once the current one is half its TTL old, so every tombstone
// lives between TombstoneTTL/2 and TombstoneTTL.
type tombLease struct {
	mu      sync.Mutex
	id      int64
	granted time.Time
}

func (s *Store) tombstoneLease(ctx context.Context) (int64, error) {
	s.tomb.mu.Lock()
	defer s.tomb.mu.Unlock()
	if s.tomb.id != 0 && time.Since(s.tomb.granted) < TombstoneTTL/2 {
		return s.tomb.id, nil
	}
	id, err := s.GrantLease(ctx, TombstoneTTL)
	if err != nil {
		return 0, fmt.Errorf("granting the tombstone lease: %w", err)
	}
	s.tomb.id, s.tomb.granted = id, time.Now()
	return id, nil
}

func (s *Store) forgetTombstoneLease(id int64) {
	s.tomb.mu.Lock()
	if s.tomb.id == id {
		s.tomb.id = 0
	}
	s.tomb.mu.Unlock()
}

// orderedOp is one mutation, encoded.
type orderedOp struct {
	key, tomb string
	val       []byte // nil: delete
	stamp     *registryv1.WriteStamp
}

// ApplyOrdered writes muts so that, per key, the write with the newest
// stamp wins (see the comment at the top of this file). A put's stamp is
// its Endpoint's; a delete's is Stamp. KeyRev and TombRev are the caller's
// guesses of the mod revisions etcd holds (0: absent); a wrong guess costs
// a round trip, never correctness.
//
// outs[i] says what became of muts[i]. A mutation etcd refuses permanently
// is found by splitting its Txn and reported in its own Err; the others
// still land. err is a failure of the moment (etcd unreachable, no
// leader): mutations not Settled then must be retried, those Settled stand.
func (s *Store) ApplyOrdered(ctx context.Context, muts []Mutation) (outs []Outcome, err error) {
	ps, outs, err := backend.Prepare(muts)
	if err != nil {
		return nil, err
	}
	ops := make([]orderedOp, len(muts))
	for i, m := range muts {
		if outs[i].Err != nil {
			continue
		}
		tomb, _ := registry.TombstoneKey(m.ID)
		ops[i] = orderedOp{key: ps[i].Key, tomb: tomb, val: ps[i].Value, stamp: m.StampOf()}
	}
	for round := 0; round < maxOrderedRounds; round++ {
		var todo []int
		for i := range muts {
			if !outs[i].Settled() {
				todo = append(todo, i)
			}
		}
		if len(todo) == 0 {
			return outs, nil
		}
		for _, g := range s.orderedGroups(ops, todo) {
			if err := s.applyGroup(ctx, ops, outs, g); err != nil {
				return outs, err
			}
		}
	}
	return outs, nil
}

// orderedGroups splits the indexes into Txns within etcd's limits: at most
// MaxTxnOps/2 mutations (the failure branch reads two keys for each) and
// MaxTxnBytes of values.
func (s *Store) orderedGroups(ops []orderedOp, idx []int) [][]int {
	per := max(s.maxTxnOps/2, 1)
	var groups [][]int
	var cur []int
	bytes := 0
	for _, i := range idx {
		n := len(ops[i].val) + len(ops[i].key)
		if len(cur) > 0 && (len(cur) == per || bytes+n > s.maxTxnBytes) {
			groups = append(groups, cur)
			cur, bytes = nil, 0
		}
		cur = append(cur, i)
		bytes += n
	}
	if len(cur) > 0 {
		groups = append(groups, cur)
	}
	return groups
}

// applyGroup runs one conditional Txn over the mutations g and records
// their outcomes. A permanent refusal of the Txn is narrowed down by
// splitting it until it names single mutations.
func (s *Store) applyGroup(ctx context.Context, ops []orderedOp, outs []Outcome, g []int) error {
	lease := int64(0)
	for _, i := range g {
		if ops[i].val == nil {
			var err error
			if lease, err = s.tombstoneLease(ctx); err != nil {
				return err
			}
			break
		}
	}
	var cmps []clientv3.Cmp
	var then, orElse []clientv3.Op
	for _, i := range g {
		op, o := ops[i], outs[i]
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(op.key), "=", o.KeyRev))
		if o.KeyRev == 0 {
			// Absent as far as we know: the last write may have been a
			// delete, whose stamp only its tombstone holds.
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(op.tomb), "=", o.TombRev))
		}
		if op.val != nil {
			then = append(then, clientv3.OpPut(op.key, string(op.val)))
		} else {
			tv, err := registry.EncodeTombstone(op.stamp)
			if err != nil {
				return fmt.Errorf("encode tombstone of %s: %w", op.key, err)
			}
			then = append(then, clientv3.OpDelete(op.key), clientv3.OpPut(op.tomb, string(tv), clientv3.WithLease(clientv3.LeaseID(lease))))
		}
		orElse = append(orElse, clientv3.OpGet(op.key), clientv3.OpGet(op.tomb))
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(then...).Else(orElse...).Commit()
	if err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			s.forgetTombstoneLease(lease) // expired under us: the next round grants another
			return nil
		}
		if !Permanent(err) {
			return fmt.Errorf("etcd txn of %d mutations: %w", len(g), err)
		}
		if len(g) == 1 {
			outs[g[0]].Err = fmt.Errorf("etcd refused the write of %s: %w", ops[g[0]].key, err)
			return nil
		}
		half := len(g) / 2
		if err := s.applyGroup(ctx, ops, outs, g[:half]); err != nil {
			return err
		}
		return s.applyGroup(ctx, ops, outs, g[half:])
	}
	rev := resp.Header.GetRevision()
	if resp.Succeeded {
		for _, i := range g {
			o := &outs[i]
			o.Landed, o.Revision = true, rev
			if ops[i].val != nil {
				o.KeyRev = rev
			} else {
				o.KeyRev, o.TombRev = 0, rev
			}
		}
		return nil
	}
	for j, i := range g {
		s.resolve(ops[i], &outs[i], resp.Responses[2*j].GetResponseRange().GetKvs(), resp.Responses[2*j+1].GetResponseRange().GetKvs())
	}
	return nil
}

// resolve decides a mutation whose Txn failed its compares, from what etcd
// holds for its key and tombstone: still newest (retry against what was
// read), or overtaken (superseded). A guess that was right is retried as
// is: another mutation of the Txn failed it.
func (s *Store) resolve(op orderedOp, o *Outcome, key, tomb []*mvccpb.KeyValue) {
	var keyRev, tombRev int64
	var cur *registryv1.ServiceEndpoint
	var curStamp *registryv1.WriteStamp
	if len(tomb) > 0 {
		tombRev = tomb[0].ModRevision
		if st, err := registry.DecodeTombstone(tomb[0].Value); err == nil {
			curStamp = st
		} else {
			s.log.Warn("undecodable tombstone; treating it as absent", "key", op.tomb, "err", err)
		}
	}
	if len(key) > 0 {
		keyRev = key[0].ModRevision
		curStamp = nil // a value present means the last write was a put
		if ep, err := registry.DecodeEndpoint(op.key, key[0].Value); err == nil {
			cur, curStamp = ep, ep.GetStamp()
		} else {
			s.log.Warn("undecodable endpoint record; overwriting it", "key", op.key, "err", err)
		}
	}
	o.KeyRev, o.TombRev = keyRev, tombRev
	if registry.CompareStamps(op.stamp, curStamp) <= 0 {
		o.Superseded, o.Current, o.CurrentStamp = true, cur, curStamp
	}
}

// GetEndpoint reads one endpoint's value as etcd holds it now (a
// linearizable read); nil when absent or undecodable. rev is the key's mod
// revision (0 when absent) and at the revision the read was served at.
func (s *Store) GetEndpoint(ctx context.Context, id registry.EndpointID) (ep *registryv1.ServiceEndpoint, rev, at int64, err error) {
	key, err := id.Key()
	if err != nil {
		return nil, 0, 0, err
	}
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("etcd get %s: %w", key, err)
	}
	at = resp.Header.GetRevision()
	if len(resp.Kvs) == 0 {
		return nil, 0, at, nil
	}
	kv := resp.Kvs[0]
	ep, derr := registry.DecodeEndpoint(key, kv.Value)
	if derr != nil {
		s.log.Warn("undecodable endpoint record; treating it as absent", "key", key, "err", derr)
		return nil, kv.ModRevision, at, nil
	}
	return ep, kv.ModRevision, at, nil
}
