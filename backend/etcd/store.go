// Package etcd is the etcd backend of the registry: it writes endpoint
// mutations in batches, lists the registry at a single revision and streams
// changes after a revision. It knows the v1 key schema only through package
// registry and holds no state of its own beyond its options, so any number
// of Stores may share one client.
//
// A *Store is a backend.Full: the types it exchanges are package backend's
// (aliased here under their old names), and its errors satisfy backend's
// sentinels (ErrCompacted, ErrLeaseNotFound) as well as etcd's own.
//
// Invariants:
//
//   - Every key written is registry.EndpointID.Key() of a valid identity, and
//     every value is registry.EncodeEndpoint of an endpoint whose identity is
//     that key. Apply checks the whole batch before sending anything, so an
//     invalid batch writes nothing.
//   - Apply never sends more than MaxTxnOps operations in one Txn (etcd
//     rejects larger ones), and never a key twice in one Txn (etcd rejects
//     that too). Its writes are unconditional puts and deletes, so replaying
//     a batch, whole or from any point, converges on the same state: that is
//     what makes a retry after a partial failure safe.
//   - ApplyOrdered lets no write replace a write of the same key stamped
//     later (registry.CompareStamps), whatever order writers' Txns arrive
//     in; a delete leaves its stamp as a tombstone outside registry.Root
//     (ordered.go). It never lets one mutation that etcd refuses fail the
//     others.
//   - A Listing is consistent at exactly Listing.Revision: every page is read
//     at the first page's revision, so writes that land while paging do not
//     appear. It therefore composes with Watch(ctx, Listing.Revision) into a
//     gapless view.
//   - Watch delivers each revision at most once and in order, across any
//     number of broken and re-established etcd watches, and says so
//     (Compacted) rather than skipping when it cannot resume.
//   - List and Watch agree on what counts as an endpoint: keys under
//     registry.Root that are not endpoint keys are ignored silently, and an
//     endpoint key whose value does not decode is treated as absent (skipped
//     by List, a removal for Watch) and logged.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// Defaults for zero Options fields.
const (
	// DefaultMaxTxnOps is etcd's --max-txn-ops default. A Store must not be
	// configured above the server's value, or every large batch fails.
	DefaultMaxTxnOps = 128
	// DefaultPageSize keeps each Range response to a few MiB for endpoints
	// within registry.DefaultLimits, well under gRPC's and etcd's limits.
	DefaultPageSize = 5000
)

// maxListAttempts bounds how often List starts over after the revision it
// was paging at got compacted; losing that race twice in a row means
// compaction is far too aggressive for listings to finish.
const maxListAttempts = 3

// maxSkipLogs bounds the per-key warnings of one listing, so a subtree full
// of garbage does not flood the log on every periodic re-list; the count in
// the summary line is still exact.
const maxSkipLogs = 10

// Options configure a Store. Zero values take the defaults.
type Options struct {
	MaxTxnOps int // default 128, etcd's --max-txn-ops default
	PageSize  int // keys per Range page when listing, default 5000
	// MaxTxnBytes bounds the values one ordered Txn carries (default 1
	// MiB, under etcd's default --max-request-bytes of 1.5 MiB).
	MaxTxnBytes int
	Logger      *slog.Logger
}

// Store reads and writes the registry in etcd.
type Store struct {
	cli         *clientv3.Client
	maxTxnOps   int
	pageSize    int
	maxTxnBytes int
	log         *slog.Logger

	// afterPage, if set, runs after each page of a listing is read. Tests
	// use it to write or compact between pages deterministically.
	afterPage func(ctx context.Context, page int)

	// noRangeStream is set once etcd turned out to lack RangeStream
	// (before v3.7), or by tests of the paged fallback.
	noRangeStream atomic.Bool

	// tomb is the lease ApplyOrdered writes tombstones under.
	tomb tombLease
}

// New returns a Store using cli. The caller keeps ownership of cli.
func New(cli *clientv3.Client, opts Options) *Store {
	if opts.MaxTxnOps <= 0 {
		opts.MaxTxnOps = DefaultMaxTxnOps
	}
	if opts.PageSize <= 0 {
		opts.PageSize = DefaultPageSize
	}
	if opts.MaxTxnBytes <= 0 {
		opts.MaxTxnBytes = DefaultMaxTxnBytes
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Store{cli: cli, maxTxnOps: opts.MaxTxnOps, pageSize: opts.PageSize, maxTxnBytes: opts.MaxTxnBytes, log: opts.Logger}
}

// Client returns the etcd client the Store uses.
func (s *Store) Client() *clientv3.Client { return s.cli }

// The registry's exchange types are package backend's; the aliases keep
// the names this package has always exported.
type (
	// Mutation is backend.Mutation.
	Mutation = backend.Mutation
	// Listing is backend.Listing.
	Listing = backend.Listing
)

// Apply writes muts in one Txn when len(muts) <= MaxTxnOps, otherwise in
// ceil(len/MaxTxnOps) Txns in order, and returns the revision of the last
// Txn (0 for no mutations: nothing is sent).
//
// Keys must be unique within muts; an invalid ID, an Endpoint whose identity
// differs from ID or a duplicate key is an error and nothing is sent. If a
// later Txn fails, the earlier ones have been committed: the error says how
// many mutations landed, and since every operation is an unconditional put
// or delete the caller may simply retry the whole slice.
//
// Each Txn carries at most MaxTxnOps encoded endpoints, unconditionally:
// Apply is for tools and tests that own their keys (migrate, the
// benchmarks). The registrar writes with ApplyOrdered, which orders
// replicas' writes by stamp and bounds each Txn by bytes as well.
func (s *Store) Apply(ctx context.Context, muts []Mutation) (rev int64, err error) {
	revs, err := s.ApplyEach(ctx, muts)
	if err != nil || len(revs) == 0 {
		return 0, err
	}
	return revs[len(revs)-1], nil
}

// ApplyEach is Apply reporting the revision each mutation landed at
// (revs[i] for muts[i]): mutations in different Txns land at different
// revisions, and a consumer that remembers each key's mod revision (the
// registrar's backstop, see ListRevisions) needs the exact one.
func (s *Store) ApplyEach(ctx context.Context, muts []Mutation) (revs []int64, err error) {
	ops, err := s.ops(muts)
	if err != nil {
		return nil, err
	}
	revs = make([]int64, 0, len(ops))
	n := (len(ops) + s.maxTxnOps - 1) / s.maxTxnOps
	for i := 0; i < n; i++ {
		lo, hi := i*s.maxTxnOps, min((i+1)*s.maxTxnOps, len(ops))
		resp, err := s.cli.Txn(ctx).Then(ops[lo:hi]...).Commit()
		if err != nil {
			return nil, fmt.Errorf("etcd txn %d of %d (mutations %d-%d; %d before it committed): %w", i+1, n, lo, hi-1, lo, err)
		}
		for range hi - lo {
			revs = append(revs, resp.Header.GetRevision())
		}
	}
	return revs, nil
}

// ops validates and encodes a batch, rejecting it whole on the first problem.
func (s *Store) ops(muts []Mutation) ([]clientv3.Op, error) {
	ops := make([]clientv3.Op, 0, len(muts))
	seen := make(map[string]int, len(muts))
	for i, m := range muts {
		key, err := m.ID.Key()
		if err != nil {
			return nil, fmt.Errorf("mutation %d: invalid endpoint id %s: %w", i, m.ID, err)
		}
		if j, dup := seen[key]; dup {
			return nil, fmt.Errorf("mutations %d and %d both write %s; a txn may touch a key once", j, i, key)
		}
		seen[key] = i
		if m.Endpoint == nil {
			ops = append(ops, clientv3.OpDelete(key))
			continue
		}
		if got := registry.IDOf(m.Endpoint); got != m.ID {
			return nil, fmt.Errorf("mutation %d: endpoint %s does not match its id %s", i, got, key)
		}
		val, err := registry.EncodeEndpoint(m.Endpoint)
		if err != nil {
			return nil, fmt.Errorf("mutation %d: encode %s: %w", i, key, err)
		}
		ops = append(ops, clientv3.OpPut(key, string(val)))
	}
	return ops, nil
}

// add decodes one key-value into l: an endpoint or a node record, or a
// skip (logged, up to maxSkipLogs per listing) when its value does not
// decode. Other keys under Root are not ours and are ignored.
func (s *Store) add(l *Listing, kv *mvccpb.KeyValue, logged *int) {
	key := string(kv.Key)
	skip := func(what string, err error) {
		l.Skipped++
		if *logged < maxSkipLogs {
			*logged++
			s.log.Warn("skipping undecodable "+what, "key", key, "mod_revision", kv.ModRevision, "err", err)
		}
	}
	switch {
	case registry.IsNodeKey(key):
		n, err := registry.DecodeNode(key, kv.Value)
		if err != nil {
			skip("node record", err)
			return
		}
		l.Nodes = append(l.Nodes, n)
		l.NodeRevs = append(l.NodeRevs, kv.ModRevision)
	case registry.IsEndpointKey(key):
		ep, err := registry.DecodeEndpoint(key, kv.Value)
		if err != nil {
			skip("endpoint record", err)
			return
		}
		l.Endpoints = append(l.Endpoints, ep)
		l.EndpointRevs = append(l.EndpointRevs, kv.ModRevision)
	}
}

// List returns every endpoint under registry.Root at a single revision,
// using linearizable reads, PageSize keys per request.
func (s *Store) List(ctx context.Context) (Listing, error) {
	return s.ListPrefix(ctx, registry.Root)
}

// ListPrefix is List restricted to a prefix under registry.Root, e.g.
// registry.ServicePrefix(region, cluster, service).
func (s *Store) ListPrefix(ctx context.Context, prefix string) (Listing, error) {
	if !strings.HasPrefix(prefix, registry.Root) {
		return Listing{}, fmt.Errorf("list prefix %q is not under %s", prefix, registry.Root)
	}
	return overCompaction(ctx, s, prefix, func() (Listing, error) { return s.listOnce(ctx, prefix) })
}

// overCompaction runs a paged read until it is not overtaken by
// compaction, at most maxListAttempts times. Auto-compaction may overtake a
// long listing's revision. The listing is useless then, but a fresh one at a
// newer revision is as good, so start over rather than fail the caller.
func overCompaction[T any](ctx context.Context, s *Store, prefix string, read func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for attempt := 1; attempt <= maxListAttempts; attempt++ {
		if v, err = read(); err == nil {
			return v, nil
		}
		if !errors.Is(err, rpctypes.ErrCompacted) || ctx.Err() != nil {
			break
		}
		s.log.Warn("etcd listing overtaken by compaction; starting over", "prefix", prefix, "attempt", attempt)
	}
	var zero T
	if errors.Is(err, rpctypes.ErrCompacted) {
		err = backend.Mark(err, backend.ErrCompacted)
	}
	return zero, err
}

func (s *Store) listOnce(ctx context.Context, prefix string) (Listing, error) {
	var (
		l      Listing
		logged int
		end    = clientv3.GetPrefixRangeEnd(prefix)
		from   = prefix
	)
	for page := 1; ; page++ {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(s.pageSize))}
		if l.Revision != 0 {
			// Pin later pages to the first page's revision so the listing
			// is one snapshot, not a smear across concurrent writes.
			opts = append(opts, clientv3.WithRev(l.Revision))
		}
		resp, err := s.cli.Get(ctx, from, opts...)
		if err != nil {
			return Listing{}, fmt.Errorf("etcd list %s page %d (at revision %d): %w", prefix, page, l.Revision, err)
		}
		if l.Revision == 0 {
			l.Revision = resp.Header.GetRevision()
		}
		for _, kv := range resp.Kvs {
			s.add(&l, kv, &logged)
		}
		if s.afterPage != nil {
			s.afterPage(ctx, page)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		// The smallest key after the last one returned.
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
	if l.Skipped > 0 {
		s.log.Warn("listing skipped undecodable endpoint records", "prefix", prefix, "skipped", l.Skipped, "revision", l.Revision)
	}
	return l, nil
}
