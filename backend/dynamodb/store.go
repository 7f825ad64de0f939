package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/ratelimit"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// Defaults for zero Options fields.
const (
	// DefaultWindow is the settle window: a write lands within half of it
	// after its revision is allocated or is abandoned (and retried under a
	// new revision), and the index catches up within the other half.
	DefaultWindow = 4 * time.Second
	// DefaultFullScanEvery is the backstop's period: a consistent Scan of
	// the whole table that repairs whatever the incremental poll missed.
	DefaultFullScanEvery = 5 * time.Minute
	// DefaultWriteConcurrency is how many conditional writes of one batch
	// are in flight at once.
	DefaultWriteConcurrency = 16
	// DefaultMaxPerRevision is the most mutations of one batch written
	// under one revision: at DefaultWriteConcurrency and DynamoDB's
	// single-digit milliseconds a write, a few tenths of a second, well
	// inside the half window a revision's writes get.
	DefaultMaxPerRevision = 400
	// TombstoneTTL is how long a delete's tombstone is kept at least (as
	// the etcd backend's); DynamoDB's TTL removes it some time after.
	TombstoneTTL = 10 * time.Minute
)

// MaxItemBytes is DynamoDB's item size limit.
const MaxItemBytes = 400 << 10

// MaxValueBytes is the largest serialized endpoint or node this backend
// writes: an item holds its value and the previous one (for listings at
// one revision), plus a few hundred bytes of key and attributes, and all
// of it must fit MaxItemBytes. A larger value is refused alone, in its
// own Outcome.Err, and the rest of its batch is written.
const MaxValueBytes = (MaxItemBytes - 4<<10) / 2

// Config is how a registrar reaches its table: the SDK's standard chain
// (environment, shared config and credentials files, web identity,
// instance metadata) plus these.
type Config struct {
	Table    string
	Region   string // "" = the chain's (AWS_REGION, the shared config)
	Endpoint string // "" = AWS; a URL for a local server (dynalite)
}

// NewClient builds a DynamoDB client from the SDK's standard chain and
// cfg. Its retryer retries throttling (ProvisionedThroughputExceeded,
// ThrottlingException) and transient failures with jittered exponential
// backoff, without the client-side retry quota, which under sustained
// throttling would turn retries into failures.
func NewClient(ctx context.Context, cfg Config) (*ddb.Client, error) {
	var opts []func(*config.LoadOptions) error
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	opts = append(opts, config.WithRetryer(NewRetryer))
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("dynamodb: loading AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		return nil, errors.New("dynamodb: no region: set --dynamodb-region (or AWS_REGION, or a region in the shared config)")
	}
	if loopback(cfg.Endpoint) {
		// A local server (dynalite) wants requests signed, by anyone: when
		// the chain has no credentials, placeholder ones do, so a
		// development registrar or the benchmark needs no AWS setup.
		// Credentials the chain does have are used as they are.
		rctx, cancel := context.WithTimeout(ctx, localCredentialsWait)
		_, err := awsCfg.Credentials.Retrieve(rctx)
		cancel()
		if err != nil {
			awsCfg.Credentials = credentials.NewStaticCredentialsProvider("local", "local", "")
		}
	}
	return ddb.NewFromConfig(awsCfg, func(o *ddb.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	}), nil
}

// localCredentialsWait bounds the credential chain's search (instance
// metadata, last, may not answer off EC2) before a loopback endpoint
// falls back to placeholder credentials.
const localCredentialsWait = 3 * time.Second

// loopback reports whether endpoint is a URL on this host (a local
// DynamoDB-compatible server, never AWS).
func loopback(endpoint string) bool {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return false
	}
	h := u.Hostname()
	if h == "localhost" {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// NewRetryer is the retryer NewClient configures: the SDK's standard one
// (throttling and transient errors retried), 10 attempts, no client-side
// retry quota, and full-jitter exponential backoff from 25 ms (what AWS
// recommends for DynamoDB, whose throttling clears in milliseconds; the
// SDK's default starts at a second) up to 2 s.
func NewRetryer() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		o.MaxAttempts = 10
		o.MaxBackoff = 2 * time.Second
		o.Backoff = jitterBackoff{base: 25 * time.Millisecond, max: 2 * time.Second}
		o.RateLimiter = ratelimit.None
	})
}

// jitterBackoff waits a uniformly random time below base*2^(attempt-1),
// capped at max.
type jitterBackoff struct{ base, max time.Duration }

func (b jitterBackoff) BackoffDelay(attempt int, _ error) (time.Duration, error) {
	d := b.max
	if attempt < 20 {
		d = min(b.max, b.base<<max(attempt-1, 0))
	}
	return time.Duration(rand.Int64N(int64(d) + 1)), nil
}

// Options configure a Store. Zero values take the defaults.
type Options struct {
	Window           time.Duration // default DefaultWindow
	FullScanEvery    time.Duration // default DefaultFullScanEvery
	WriteConcurrency int           // default DefaultWriteConcurrency
	MaxPerRevision   int           // default DefaultMaxPerRevision
	Logger           *slog.Logger
	// Now is the clock of leases and of the poll's window (default
	// time.Now).
	Now func() time.Time
}

// Store is the registry in one DynamoDB table. Its methods are safe for
// concurrent use.
type Store struct {
	cli    *ddb.Client
	table  string
	shards int
	opts   Options
	log    *slog.Logger

	// seen is the highest revision this store has reported, so that a
	// point read's revision is never below one reported before.
	seen atomic.Int64

	pollMu sync.Mutex // serializes polls; guards m
	m      mirror

	allocMu  sync.RWMutex // allocations share it; a listing's counter read takes it alone
	flightMu sync.Mutex
	inflight map[int64]int // revisions allocated here whose writes are not done, and how many users each

	// beforeWrite, if set, runs before each mutation's write: a test
	// holds a write in flight with it.
	beforeWrite func(key string, rev int64)

	shareMu    sync.Mutex // guards the heartbeats' shared revision
	shareRev   int64
	shareStart time.Time
}

// Open checks that table exists with this backend's schema (an error
// naming `aether dynamodb create-table` if not) and returns a Store on
// it. The caller keeps ownership of cli.
func Open(ctx context.Context, cli *ddb.Client, table string, opts Options) (*Store, error) {
	shards, err := checkTable(ctx, cli, table)
	if err != nil {
		return nil, err
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	if opts.FullScanEvery <= 0 {
		opts.FullScanEvery = DefaultFullScanEvery
	}
	if opts.WriteConcurrency <= 0 {
		opts.WriteConcurrency = DefaultWriteConcurrency
	}
	if opts.MaxPerRevision <= 0 {
		opts.MaxPerRevision = DefaultMaxPerRevision
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{cli: cli, table: table, shards: shards, opts: opts, log: opts.Logger, m: newMirror(), inflight: map[int64]int{}}, nil
}

func (s *Store) report(rev int64) {
	for {
		cur := s.seen.Load()
		if rev <= cur || s.seen.CompareAndSwap(cur, rev) {
			return
		}
	}
}

// shardOf is the change shard of a key: a hash, so writes spread evenly
// over the index's partition keys whatever the key distribution.
func (s *Store) shardOf(key string) int64 {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int64(h.Sum32() % uint32(s.shards))
}

// unavailable marks an SDK error as a failure of the moment unless it is
// a permanent refusal (validation, a missing table).
func unavailable(err error) error {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "ValidationException", "ResourceNotFoundException", "AccessDeniedException", "UnrecognizedClientException":
			return err
		}
	}
	return backend.Mark(err, backend.ErrUnavailable)
}

// allocate takes the next revision from the meta item's counter: one
// conditional update per batch, so every replica's batches are ordered
// by one sequence.
//
// The revision is registered in flight until its writes are done (the
// caller calls landed): a listing of this Store is cut below it, so that
// a write of its own that landed after the listing read its key is not
// shown undone (the registrar would take that for another replica's
// revert of its write, and flap the endpoint until the next poll).
func (s *Store) allocate(ctx context.Context) (int64, error) {
	s.allocMu.RLock()
	defer s.allocMu.RUnlock()
	out, err := s.cli.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       keyOf(metaKey),
		UpdateExpression:          aws.String("ADD r :one"),
		ConditionExpression:       aws.String("attribute_exists(pk)"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":one": num(1)},
		ReturnValues:              types.ReturnValueUpdatedNew,
	})
	if err != nil {
		var ccf *types.ConditionalCheckFailedException
		if errors.As(err, &ccf) {
			return 0, fmt.Errorf("%w: table %s lost its meta item: run `aether dynamodb create-table --dynamodb-table %s`", ErrTable, s.table, s.table)
		}
		return 0, fmt.Errorf("dynamodb: allocating a revision: %w", unavailable(err))
	}
	rev := numAttr(out.Attributes, attrRev)
	s.hold(rev)
	return rev, nil
}

// hold and landed count the writes in flight under a revision.
func (s *Store) hold(rev int64) {
	s.flightMu.Lock()
	defer s.flightMu.Unlock()
	s.inflight[rev]++
}

func (s *Store) landed(rev int64) {
	s.flightMu.Lock()
	defer s.flightMu.Unlock()
	if s.inflight[rev]--; s.inflight[rev] <= 0 {
		delete(s.inflight, rev)
	}
}

// listCounter reads the counter for a listing and returns the revision to
// cut it at: the counter, or just below this Store's oldest revision in
// flight. Allocations wait meanwhile (allocMu), so none can be counted
// by the read and not yet registered.
func (s *Store) listCounter(ctx context.Context) (c int64, rcu float64, err error) {
	s.allocMu.Lock()
	defer s.allocMu.Unlock()
	c, rcu, err = s.counter(ctx)
	if err != nil {
		return 0, 0, err
	}
	s.flightMu.Lock()
	defer s.flightMu.Unlock()
	for rev := range s.inflight {
		if rev <= c {
			c = rev - 1
		}
	}
	return c, rcu, nil
}

// shareFor is how long a revision allocated for heartbeats is used for
// more of them: each node heartbeat would otherwise be one more write of
// the one counter item, which DynamoDB holds to about 1,000 writes/s;
// sharing bounds it to a few per second per replica, whatever the number
// of nodes.
const shareFor = 200 * time.Millisecond

// sharedRevision returns a revision for a heartbeat and the instant its
// settle window started: one allocated less than shareFor ago, or a new
// one. Writes under it must finish by start + Window/2, as a batch's do.
func (s *Store) sharedRevision(ctx context.Context) (int64, time.Time, error) {
	s.shareMu.Lock()
	defer s.shareMu.Unlock()
	now := s.opts.Now()
	if s.shareRev != 0 && now.Sub(s.shareStart) < shareFor {
		s.hold(s.shareRev)
		return s.shareRev, s.shareStart, nil
	}
	rev, err := s.allocate(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	s.shareRev, s.shareStart = rev, now
	return rev, now, nil // held once, by allocate, for this user
}

// counter reads the revision counter: every revision allocated so far.
func (s *Store) counter(ctx context.Context) (int64, float64, error) {
	out, err := s.cli.GetItem(ctx, &ddb.GetItemInput{
		TableName: aws.String(s.table), Key: keyOf(metaKey), ConsistentRead: aws.Bool(true),
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	if err != nil {
		return 0, 0, fmt.Errorf("dynamodb: reading the revision counter: %w", unavailable(err))
	}
	if out.Item == nil {
		return 0, 0, fmt.Errorf("%w: table %s lost its meta item: run `aether dynamodb create-table --dynamodb-table %s`", ErrTable, s.table, s.table)
	}
	return numAttr(out.Item, attrRev), capacity(out.ConsumedCapacity), nil
}

func capacity(c *types.ConsumedCapacity) float64 {
	if c == nil || c.CapacityUnits == nil {
		return 0
	}
	return *c.CapacityUnits
}

// ApplyOrdered writes muts under newly allocated revisions (one per
// MaxPerRevision mutations), each as a
// conditional UpdateItem that lands only over an older stamp (or nothing),
// up to WriteConcurrency at a time. It does not use BatchWriteItem, which
// takes no conditions and so could not keep the newest stamp against a
// concurrent replica, nor TransactWriteItems, whose one failed condition
// cancels every action with it: the batch's mutations are independent,
// and in DynamoDB's pricing a batch costs the same write units as its
// items written one by one. See the package doc.
func (s *Store) ApplyOrdered(ctx context.Context, muts []backend.Mutation) ([]backend.Outcome, error) {
	ps, outs, err := backend.Prepare(muts)
	if err != nil {
		return nil, err
	}
	todo := make([]int, 0, len(muts))
	for i := range muts {
		if outs[i].Err != nil {
			continue
		}
		if len(ps[i].Value) > MaxValueBytes {
			outs[i].Err = fmt.Errorf("%w: %s is %d bytes serialized, more than the %d a DynamoDB item can hold with its previous version", backend.ErrInvalidMutation, ps[i].Key, len(ps[i].Value), MaxValueBytes)
			continue
		}
		todo = append(todo, i)
	}
	// A large batch goes out in chunks of a revision each, small enough
	// to finish well inside the settle window.
	var first error
	for lo := 0; lo < len(todo); lo += s.opts.MaxPerRevision {
		chunk := todo[lo:min(lo+s.opts.MaxPerRevision, len(todo))]
		rev, n, err := s.applyChunk(ctx, chunk, ps, muts, outs)
		if err != nil && first == nil {
			first = fmt.Errorf("dynamodb: %d of %d writes at revision %d did not settle (retry them): %w", n, len(chunk), rev, err)
		}
		if rev == 0 {
			break // no revision to be had (the table unreachable): the rest would fare no better
		}
	}
	return outs, first
}

// applyChunk writes the mutations chunk indexes under one new revision
// and returns it, with how many did not settle and the first error.
func (s *Store) applyChunk(ctx context.Context, chunk []int, ps []backend.Prepared, muts []backend.Mutation, outs []backend.Outcome) (int64, int, error) {
	// The settle window starts before the revision is allocated: every
	// write under it is given until half the window after this instant,
	// so a poller may take every revision allocated a window ago as
	// landed (poll.go).
	start := s.opts.Now()
	rev, err := s.allocate(ctx)
	if err != nil {
		return 0, len(chunk), err
	}
	defer s.landed(rev)
	wctx, cancel := context.WithDeadline(ctx, start.Add(s.opts.Window/2))
	defer cancel()

	errs := make([]error, len(chunk))
	sem := make(chan struct{}, s.opts.WriteConcurrency)
	var wg sync.WaitGroup
	for j, i := range chunk {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[j] = s.writeOne(wctx, rev, ps[i], muts[i], &outs[i])
		}()
	}
	wg.Wait()
	var first error
	failed := 0
	for _, e := range errs {
		if e != nil {
			failed++
			if first == nil {
				first = e
			}
		}
	}
	return rev, failed, first
}

// writeOne writes one prepared mutation at rev, conditionally on its
// stamp being newer than the item's, and fills its outcome. The previous
// version's value and revision move to pv and pr in the same update, so
// a listing can be cut at one revision (poll.go).
func (s *Store) writeOne(ctx context.Context, rev int64, p backend.Prepared, m backend.Mutation, o *backend.Outcome) error {
	st := m.StampOf()
	vals := map[string]types.AttributeValue{
		":r":    num(rev),
		":h":    &types.AttributeValueMemberN{Value: strconv.FormatUint(st.GetHlc(), 10)},
		":w":    str("." + st.GetWriter()),
		":s":    num(s.shardOf(p.Key)),
		":nov":  str("-"),
		":zero": num(0),
	}
	update := "SET pv = if_not_exists(v, :nov), pr = if_not_exists(r, :zero), r = :r, h = :h, w = :w, s = :s"
	if p.Value != nil {
		vals[":v"] = bin(p.Value)
		update += ", v = :v REMOVE x"
	} else {
		vals[":x"] = num(s.opts.Now().Add(TombstoneTTL).Unix())
		update += ", x = :x REMOVE v"
	}
	if s.beforeWrite != nil {
		s.beforeWrite(p.Key, rev)
	}
	_, err := s.cli.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                           aws.String(s.table),
		Key:                                 keyOf(p.Key),
		UpdateExpression:                    aws.String(update),
		ConditionExpression:                 aws.String("attribute_not_exists(pk) OR attribute_not_exists(h) OR h < :h OR (h = :h AND w < :w)"),
		ExpressionAttributeValues:           vals,
		ReturnValuesOnConditionCheckFailure: types.ReturnValuesOnConditionCheckFailureAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	switch {
	case err == nil:
		o.Landed, o.Revision = true, rev
		if p.Value != nil {
			o.KeyRev, o.TombRev = rev, 0
		} else {
			o.KeyRev, o.TombRev = 0, rev
		}
		s.report(rev)
		return nil
	case errors.As(err, &ccf):
		item := ccf.Item
		if item == nil {
			// A server that does not return the item with the failure
			// (dynalite): read it.
			out, gerr := s.cli.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String(s.table), Key: keyOf(p.Key), ConsistentRead: aws.Bool(true)})
			if gerr != nil {
				return fmt.Errorf("write %s superseded, reading what superseded it: %w", p.Key, unavailable(gerr))
			}
			item = out.Item
		}
		if item == nil {
			// The newer write went away in between (an expired tombstone):
			// the next attempt decides again.
			return backend.Mark(fmt.Errorf("write %s: superseded by an item that has since gone", p.Key), backend.ErrUnavailable)
		}
		o.Superseded = true
		o.CurrentStamp = &registryv1.WriteStamp{Hlc: uintAttr(item, attrHLC)}
		if w, ok := strAttr(item, attrWriter); ok && len(w) > 0 {
			o.CurrentStamp.Writer = w[1:]
		}
		r := numAttr(item, attrRev)
		if v, ok := binAttr(item, attrValue); ok {
			ep, derr := registry.DecodeEndpoint(p.Key, v)
			if derr != nil {
				s.log.Warn("stored endpoint does not decode", "key", p.Key, "err", derr)
			}
			o.Current, o.KeyRev, o.TombRev = ep, r, 0
		} else {
			o.Current, o.KeyRev, o.TombRev = nil, 0, r
		}
		s.report(r)
		return nil
	case isValidation(err):
		// The expression is this package's and fixed, so a refusal is of
		// this item (its size, as DynamoDB counts it): permanent, and its
		// alone.
		o.Err = fmt.Errorf("%w: dynamodb refused %s: %v", backend.ErrInvalidMutation, p.Key, err)
		return nil
	default:
		return fmt.Errorf("write %s at revision %d: %w", p.Key, rev, unavailable(err))
	}
}

func isValidation(err error) bool {
	var ae smithy.APIError
	return errors.As(err, &ae) && ae.ErrorCode() == "ValidationException"
}

// GetEndpoint reads one endpoint with a strongly consistent read.
func (s *Store) GetEndpoint(ctx context.Context, id registry.EndpointID) (*registryv1.ServiceEndpoint, int64, int64, error) {
	key, err := id.Key()
	if err != nil {
		return nil, 0, 0, fmt.Errorf("dynamodb: get endpoint: %w", err)
	}
	out, err := s.cli.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String(s.table), Key: keyOf(key), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, 0, 0, fmt.Errorf("dynamodb: get %s: %w", key, unavailable(err))
	}
	// Read after the item, the counter covers every write the item
	// reflects (a revision is allocated before its write lands).
	at, _, err := s.counter(ctx)
	if err != nil {
		return nil, 0, 0, err
	}
	at = max(at, s.seen.Load(), 1)
	v, ok := binAttr(out.Item, attrValue)
	if !ok {
		return nil, 0, at, nil
	}
	ep, derr := registry.DecodeEndpoint(key, v)
	if derr != nil {
		s.log.Warn("stored endpoint does not decode", "key", key, "err", derr)
		return nil, 0, at, nil
	}
	return ep, numAttr(out.Item, attrRev), at, nil
}

// GetAt reads the given keys as they were at rev, from each item's current
// and previous version: a key written twice since rev is beyond what the
// table keeps, reported as compacted.
func (s *Store) GetAt(ctx context.Context, rev int64, eps []registry.EndpointID, nodes []registry.NodeID) (backend.Listing, error) {
	l := backend.Listing{Revision: rev}
	for _, id := range eps {
		key, err := id.Key()
		if err != nil {
			return backend.Listing{}, fmt.Errorf("dynamodb: get at %d: %w", rev, err)
		}
		e, ok, err := s.readEntry(ctx, key)
		if err != nil {
			return backend.Listing{}, err
		}
		if !ok {
			continue
		}
		v, r, known := e.at(rev)
		if !known {
			return backend.Listing{}, fmt.Errorf("dynamodb: %s at revision %d: written twice since (now at %d): %w", key, rev, e.rev, backend.ErrCompacted)
		}
		if v == nil {
			continue
		}
		ep, derr := registry.DecodeEndpoint(key, v)
		if derr != nil {
			l.Skipped++
			continue
		}
		l.Endpoints, l.EndpointRevs = append(l.Endpoints, ep), append(l.EndpointRevs, r)
	}
	for _, id := range nodes {
		key, err := id.Key()
		if err != nil {
			return backend.Listing{}, fmt.Errorf("dynamodb: get at %d: %w", rev, err)
		}
		e, ok, err := s.readEntry(ctx, key)
		if err != nil {
			return backend.Listing{}, err
		}
		if !ok {
			continue
		}
		v, r, known := e.at(rev)
		if !known {
			return backend.Listing{}, fmt.Errorf("dynamodb: %s at revision %d: written twice since: %w", key, rev, backend.ErrCompacted)
		}
		if v == nil {
			continue
		}
		n, derr := registry.DecodeNode(key, v)
		if derr != nil {
			continue
		}
		l.Nodes, l.NodeRevs = append(l.Nodes, n), append(l.NodeRevs, r)
	}
	return l, nil
}

func (s *Store) readEntry(ctx context.Context, key string) (entry, bool, error) {
	out, err := s.cli.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String(s.table), Key: keyOf(key), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return entry{}, false, fmt.Errorf("dynamodb: get %s: %w", key, unavailable(err))
	}
	if out.Item == nil {
		return entry{}, false, nil
	}
	return entryOf(out.Item), true, nil
}
