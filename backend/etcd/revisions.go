package etcd

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// A full listing decodes every value, and etcd reads every one from its
// backend to send it: for 100k endpoints that is over 100 MB each time. A
// consumer that keeps a copy and the mod revision of each value (Listing's
// EndpointRevs and NodeRevs, or a watch event's Revision) can instead ask
// which keys exist at which mod revision, and fetch only the values whose
// revision it does not already hold. etcd answers a keys-only range from
// its in-memory index without touching its backend, so the question is
// cheap on both sides.

// keysOnlyPageFactor makes a keys-only page this many times a listing page:
// a keyed revision is a few dozen bytes where a value is a few hundred, and
// every page makes etcd count the rest of the range (of the part, when
// read in Parts).
const keysOnlyPageFactor = 10

// The digest's types are package backend's.
type (
	// KeyRevisions is backend.KeyRevisions: a keys-only listing under
	// registry.Root at one revision.
	KeyRevisions = backend.KeyRevisions
	// EndpointRevision is backend.EndpointRevision.
	EndpointRevision = backend.EndpointRevision
	// NodeRevision is backend.NodeRevision.
	NodeRevision = backend.NodeRevision
)

// ListRevisions returns the keys under registry.Root and their mod
// revisions, at a single revision, without their values.
func (s *Store) ListRevisions(ctx context.Context) (KeyRevisions, error) {
	return s.ListRevisionsInParts(ctx, Parts{})
}

// Parts is backend.Parts: a keys-only listing split into reads of a key
// range each.
type Parts = backend.Parts

// ListRevisionsInParts is ListRevisions read in parts, all at the revision
// of the first, so the result is the same as one read's.
func (s *Store) ListRevisionsInParts(ctx context.Context, p Parts) (KeyRevisions, error) {
	ranges := p.Ranges()
	return overCompaction(ctx, s, registry.Root, func() (KeyRevisions, error) {
		kr := KeyRevisions{Endpoints: make([]EndpointRevision, 0, p.Expect)}
		for i, r := range ranges {
			if i > 0 && p.Between != nil {
				if err := p.Between(ctx); err != nil {
					return KeyRevisions{}, err
				}
			}
			rev, err := s.listRevisionsRange(ctx, &kr, r[0], r[1])
			if err != nil {
				return KeyRevisions{}, err
			}
			if kr.Revision == 0 {
				// The first part's: the later parts are read at it. (A
				// stream's header gives etcd's current revision, not
				// the one it was pinned to.)
				kr.Revision = rev
			}
		}
		return kr, nil
	})
}

// listRevisionsRange adds the keys in [from, end) to kr, read at
// kr.Revision (or the current revision when that is 0), and returns the
// revision read at.
func (s *Store) listRevisionsRange(ctx context.Context, kr *KeyRevisions, from, end string) (int64, error) {
	if !s.noRangeStream.Load() {
		rev, err := s.listRevisionsStreamed(ctx, kr, from, end)
		if status.Code(err) != codes.Unimplemented {
			return rev, err
		}
		// An etcd before 3.7 has no RangeStream: page instead, from now on.
		s.noRangeStream.Store(true)
		s.log.Info("etcd has no RangeStream (before v3.7); keys-only listings are paged")
	}
	return s.listRevisionsPaged(ctx, kr, from, end)
}

// addKeyRevision files one key of a keys-only listing.
func addKeyRevision(kr *KeyRevisions, kv *mvccpb.KeyValue) {
	key := string(kv.Key)
	// Endpoint keys first: they are nearly all of them. (A node name
	// cannot contain "/", so no key is both.)
	switch {
	case registry.IsEndpointKey(key):
		if id, err := registry.ParseEndpointKey(key); err == nil {
			kr.Endpoints = append(kr.Endpoints, EndpointRevision{ID: id, ModRevision: kv.ModRevision})
		}
	case registry.IsNodeKey(key):
		if id, err := registry.ParseNodeKey(key); err == nil {
			kr.Nodes = append(kr.Nodes, NodeRevision{ID: id, ModRevision: kv.ModRevision})
		}
	}
}

// listRevisionsStreamed reads the keys with etcd's RangeStream (v3.7):
// etcd reads them in chunks, each under a short hold of its index lock,
// and counts nothing. A paged Range makes etcd count every key after each
// page while holding that lock, and every write etcd applies meanwhile
// waits for it, every --sync-interval on every replica.
func (s *Store) listRevisionsStreamed(ctx context.Context, kr *KeyRevisions, from, end string) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithKeysOnly()}
	if kr.Revision != 0 {
		opts = append(opts, clientv3.WithRev(kr.Revision))
	}
	ch, err := s.cli.GetStream(ctx, from, opts...)
	if err != nil {
		return 0, fmt.Errorf("etcd keys-only stream from %q (at revision %d): %w", from, kr.Revision, err)
	}
	var rev int64
	for resp := range ch {
		if err := resp.Err(); err != nil {
			cancel()
			for range ch { // the stream's goroutine ends once drained
			}
			return 0, fmt.Errorf("etcd keys-only stream from %q (at revision %d): %w", from, kr.Revision, err)
		}
		for _, kv := range resp.Kvs {
			addKeyRevision(kr, kv)
		}
		if h := resp.Header; h != nil { // the last chunk
			rev = h.GetRevision()
		}
	}
	if rev == 0 {
		return 0, errors.New("etcd keys-only stream ended without its final chunk")
	}
	return rev, nil
}

// listRevisionsPaged reads the keys with paged Ranges, for etcd before
// v3.7.
func (s *Store) listRevisionsPaged(ctx context.Context, kr *KeyRevisions, from, end string) (int64, error) {
	rev := kr.Revision
	for page := 1; ; page++ {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithKeysOnly(),
			clientv3.WithLimit(int64(s.pageSize * keysOnlyPageFactor))}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, from, opts...)
		if err != nil {
			return 0, fmt.Errorf("etcd keys-only list page %d from %q (at revision %d): %w", page, from, rev, err)
		}
		if rev == 0 {
			rev = resp.Header.GetRevision()
			if len(kr.Endpoints) == 0 && cap(kr.Endpoints) == 0 {
				kr.Endpoints = make([]EndpointRevision, 0, resp.Count) // nearly all of them
			}
		}
		for _, kv := range resp.Kvs {
			addKeyRevision(kr, kv)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// GetAt reads the values of the given endpoints and node records as they
// were at revision rev, MaxTxnOps keys per read-only Txn, into a Listing at
// rev, in the order asked (not key order). A key absent at rev is absent
// from the listing, and a value that does not decode is skipped as List
// skips it. Unless there is nothing to read, it fails with an error that
// is both backend.ErrCompacted and rpctypes.ErrCompacted once rev is
// compacted away; a caller then lists afresh.
func (s *Store) GetAt(ctx context.Context, rev int64, eps []registry.EndpointID, nodes []registry.NodeID) (Listing, error) {
	if rev <= 0 {
		return Listing{}, fmt.Errorf("read at revision %d: a revision must be positive", rev)
	}
	keys := make([]string, 0, len(eps)+len(nodes))
	for _, id := range eps {
		k, err := id.Key()
		if err != nil {
			return Listing{}, fmt.Errorf("endpoint %s: %w", id, err)
		}
		keys = append(keys, k)
	}
	for _, id := range nodes {
		k, err := id.Key()
		if err != nil {
			return Listing{}, fmt.Errorf("node %s: %w", id, err)
		}
		keys = append(keys, k)
	}
	l := Listing{Revision: rev}
	var logged int
	for lo := 0; lo < len(keys); lo += s.maxTxnOps {
		hi := min(lo+s.maxTxnOps, len(keys))
		ops := make([]clientv3.Op, 0, hi-lo)
		for _, k := range keys[lo:hi] {
			ops = append(ops, clientv3.OpGet(k, clientv3.WithRev(rev)))
		}
		resp, err := s.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			err = fmt.Errorf("etcd read of %d keys at revision %d: %w", hi-lo, rev, err)
			if errors.Is(err, rpctypes.ErrCompacted) {
				err = backend.Mark(err, backend.ErrCompacted)
			}
			return Listing{}, err
		}
		for _, r := range resp.Responses {
			for _, kv := range r.GetResponseRange().GetKvs() {
				s.add(&l, kv, &logged)
			}
		}
	}
	return l, nil
}
