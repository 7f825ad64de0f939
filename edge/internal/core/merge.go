package core

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrMissingParents is Merge's answer to a change whose parents are not
// all applied here: changes must arrive in causal order (a peer sends its
// log in index order).
var ErrMissingParents = errors.New("core: merge: parents not applied here")

// Merge applies a change made by another replica (part 2's sync; here so
// the data model is proven to merge). It is idempotent: a change already
// applied returns nil, nil. The conflict rule (package doc) decides each
// put and delete against the key's winner; the change gets this replica's
// next index, and its next revision if any op took effect. Lease grants
// of other replicas never expire here (their granter expires them, with a
// revoke change).
func (s *State) Merge(now time.Time, encoded []byte) (*Applied, error) {
	c, err := DecodeChange(encoded)
	if err != nil {
		return nil, fmt.Errorf("core: merge: %w", err)
	}
	// A replica's changes arrive in chain order with strictly increasing
	// stamps, so one at or before the last applied stamp of its author is
	// applied already, even when Collect has dropped its hash.
	if last, ok := s.LastStamp(c.Replica); ok && c.Stamp.Compare(last) <= 0 {
		return nil, nil
	}
	if c.Replica == s.id {
		// Our own change, unknown here: this replica lost its log. Its
		// local changes replay as made, merged ones by the rule, so a
		// change of ours must not come back as merged; a replica that lost
		// its log rejoins under a new id.
		return nil, fmt.Errorf("core: merge: change %s of this replica (%d) is not in its log: rejoin under a new replica id", hashOf(encoded), s.id)
	}
	if err := s.checkParents(c); err != nil {
		return nil, err
	}
	// The HLC receive rule (HLC.Recv) in two halves: record keeps the
	// clock at the largest stamp applied, and the next local stamp,
	// Next(now), is strictly after it and at least now. Not folding now in
	// here keeps the clock a function of the applied changes, so replay
	// restores it exactly. (now is for part 2's uses: remote leases'
	// local view.)
	w := s.newWriter()
	s.mergeOps(w, c)
	return s.record(c, encoded, w), nil
}

func (s *State) checkParents(c *Change) error {
	for _, p := range c.Parents {
		if _, ok := s.known[p]; ok {
			continue
		}
		if _, ok := s.forgotten[p]; !ok {
			return fmt.Errorf("%w: %s", ErrMissingParents, p)
		}
	}
	return nil
}

// wins is the conflict rule: (stamp, replica) strictly after the key's
// winner.
func wins(stamp HLC, r ReplicaID, k *keyRec) bool {
	if c := stamp.Compare(k.win); c != 0 {
		return c > 0
	}
	return r > k.winRepl
}

// mergeOps applies a remote change's ops under the conflict rule. Ops of
// one change on one key (a Txn's delete then put) share a stamp: they are
// decided against the winner before the change, so they take effect, or
// not, together and in order.
func (s *State) mergeOps(w *writer, c *Change) {
	w.src, w.merge = c, true
	for i, op := range c.Ops {
		if (op.Kind == OpPut || op.Kind == OpDelete) && s.vm.IsJSON(op.Key) {
			s.jsonMergeOp(w, c, i, false)
			continue
		}
		switch op.Kind {
		case OpPut:
			if k := s.keys[string(op.Key)]; k != nil && !wins(c.Stamp, c.Replica, k) {
				continue
			}
			w.put(op.Key, op.Value, op.Lease)
		case OpDelete:
			k := s.keys[string(op.Key)]
			if k != nil && !wins(c.Stamp, c.Replica, k) {
				continue
			}
			if k != nil && k.live() != nil {
				w.del(op.Key)
				continue
			}
			// Nothing to delete here (a concurrent delete got there
			// first, or the put never won): the tombstone still becomes
			// the winner, so an older put arriving later stays out.
			if k == nil {
				k = &keyRec{key: op.Key}
				s.keys[string(op.Key)] = k
				s.order.insert(k)
			}
			w.tombs = append(w.tombs, k)
		case OpLeaseGrant:
			if s.leases[op.Lease] == nil {
				s.grant(op.Lease, op.TTL, c.Replica, time.Time{})
				s.leases[op.Lease].expiry = time.Time{} // the granter's to expire
			}
		case OpLeaseRevoke:
			delete(s.leases, op.Lease)
		}
	}
}

// mergeRev is the revision mergeOps would give c now: the next one if any
// put or delete takes effect, else 0. Replay checks it before applying.
func (s *State) mergeRev(c *Change) int64 {
	live := map[string]bool{}
	docs := map[string]*jdoc{} // JSON keys: the documents after earlier ops that changed nothing visible
	for i, op := range c.Ops {
		if op.Kind != OpPut && op.Kind != OpDelete {
			continue
		}
		if s.vm.IsJSON(op.Key) {
			k := s.keys[string(op.Key)]
			d, ok := docs[string(op.Key)]
			if !ok && k != nil {
				d = k.doc
			}
			var cur *val
			if k != nil {
				cur = k.live()
			}
			nd, change := jsonEffect(cur, d, op, regOf(c, i))
			if change {
				return s.rev + 1
			}
			docs[string(op.Key)] = nd
			continue
		}
		k := s.keys[string(op.Key)]
		if k != nil && !wins(c.Stamp, c.Replica, k) {
			continue
		}
		if op.Kind == OpPut {
			return s.rev + 1
		}
		l, seen := live[string(op.Key)]
		if !seen {
			l = k != nil && k.live() != nil
		}
		if l {
			return s.rev + 1
		}
		live[string(op.Key)] = false
	}
	return 0
}

// advanceHeads makes id a head in place of its parents, keeping the heads
// sorted (they are the next local change's parents, which the encoding
// requires sorted).
func (s *State) advanceHeads(parents []Hash, id Hash) {
	if len(parents) == len(s.heads) && slices.Equal(parents, s.heads) {
		s.heads = []Hash{id} // the common case: a change on all our heads
		return
	}
	next := make([]Hash, 0, len(s.heads)+1)
	for _, h := range s.heads {
		if !slices.Contains(parents, h) {
			next = append(next, h)
		}
	}
	next = append(next, id)
	slices.SortFunc(next, func(a, b Hash) int { return bytes.Compare(a[:], b[:]) })
	s.heads = next
}
