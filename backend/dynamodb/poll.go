package dynamodb

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// maxListAttempts bounds how often List polls again because some key was
// written twice between the counter read and the index read, so its state
// at the listing's revision is not in the table.
const maxListAttempts = 5

// entry is what the mirror knows of one item: its current version and the
// one before it.
type entry struct {
	v     []byte // nil: a tombstone
	rev   int64
	pv    []byte // the previous value; nil: absent
	prev  int64  // the previous revision; 0: absent before
	lease int64  // a node record's lease
	// leaseExp and leaseTTL are a lease item's (unix ms, ms).
	leaseExp, leaseTTL int64
	// ep and pep are v and pv decoded, once per version read (a poll
	// lists every endpoint, and decoding 100k of them each time would be
	// most of its CPU); the same value is then handed back poll after
	// poll, as values are immutable once stored.
	ep, pep *registryv1.ServiceEndpoint
}

func entryOf(item map[string]types.AttributeValue) entry {
	e := entry{rev: numAttr(item, attrRev), prev: numAttr(item, attrPrevRev), lease: numAttr(item, attrLease),
		leaseExp: numAttr(item, attrLeaseExp), leaseTTL: numAttr(item, attrLeaseTTL)}
	e.v, _ = binAttr(item, attrValue)
	if e.v == nil {
		if _, live := item[attrValue]; live {
			e.v = []byte{} // an empty value is still a value
		}
	}
	e.pv, _ = binAttr(item, attrPrevValue)
	return e
}

// at is the item's value and mod revision as of revision r: the current
// version if written at or before r, else the previous one if that was;
// known is false when both are later (the key was written twice since).
// A nil value means absent at r.
// rev is that version's revision (a deletion's, for an absent key; 0 if
// the key never existed as far as the item knows).
func (e entry) at(r int64) (v []byte, rev int64, known bool) {
	switch {
	case e.rev <= r:
		return e.v, e.rev, true
	case e.prev <= r:
		return e.pv, e.prev, true
	}
	return nil, 0, false
}

// reading is a counter value and when it was read (after its response
// arrived): every revision up to c was allocated before t.
type reading struct {
	t time.Time
	c int64
}

// PollStats is what one List read from the table.
type PollStats struct {
	Full     bool    // a full Scan (the first listing and the backstop)
	Requests int     // DynamoDB requests made (the counter read included)
	Items    int     // items returned
	Capacity float64 // read capacity units consumed, as the server reported (0 if it does not)
	// Bytes is the size of the items read, by DynamoDB's rule (attribute
	// names plus values); Billed is the read units DynamoDB's pricing
	// rule makes of it: per request, the bytes rounded up to 4 KB, at
	// least one unit, halved for an eventually consistent read (the
	// index's). A server that reports no capacity (or a model of one)
	// still shows what AWS would bill.
	Bytes    int
	Billed   float64
	Cursor   int64 // an incremental poll's lower bound (revisions above it were read)
	Revision int64 // the listing's revision
}

// bill adds one request's items to Bytes and Billed.
func (st *PollStats) bill(items []map[string]types.AttributeValue, consistent bool) {
	n := 0
	for _, item := range items {
		n += itemSize(item)
	}
	st.Bytes += n
	units := float64(max(1, (n+4095)/4096))
	if !consistent {
		units /= 2
	}
	st.Billed += units
}

// itemSize is an item's size as DynamoDB counts it: each attribute's name
// plus its value (a number at about one byte per two digits plus one).
func itemSize(item map[string]types.AttributeValue) int {
	n := 0
	for name, v := range item {
		n += len(name)
		switch v := v.(type) {
		case *types.AttributeValueMemberS:
			n += len(v.Value)
		case *types.AttributeValueMemberB:
			n += len(v.Value)
		case *types.AttributeValueMemberN:
			n += (len(v.Value)+1)/2 + 1
		default:
			n++
		}
	}
	return n
}

// mirror is the registry as this Store last read it, which List brings up
// to date with the incremental poll.
type mirror struct {
	entries  map[string]entry
	hist     []reading // counter readings of recent polls, oldest first
	lastFull time.Time
	rescanAt time.Time // a second full scan due one window after the first
	listRev  int64
	last     PollStats
	total    PollStats // summed over every List
}

func newMirror() mirror { return mirror{entries: map[string]entry{}} }

// LastPoll reports what the last List read, and the sums over every List.
func (s *Store) LastPoll() (last, total PollStats) {
	s.pollMu.Lock()
	defer s.pollMu.Unlock()
	return s.m.last, s.m.total
}

// ForceFullScan makes the next List a full scan (the backstop), as the
// periodic one is.
func (s *Store) ForceFullScan() {
	s.pollMu.Lock()
	defer s.pollMu.Unlock()
	s.m.lastFull = time.Time{}
}

// List brings the mirror up to date, with the incremental poll or, when
// due, a full scan, and returns it cut at one revision. See the package
// doc for what that revision promises.
func (s *Store) List(ctx context.Context) (backend.Listing, error) {
	s.pollMu.Lock()
	defer s.pollMu.Unlock()
	for attempt := 1; ; attempt++ {
		var st PollStats
		c, rcu, err := s.listCounter(ctx)
		if err != nil {
			return backend.Listing{}, err
		}
		read := reading{t: s.opts.Now(), c: c}
		st.Requests, st.Capacity, st.Billed = 1, rcu, 1 // the counter: one consistent read under 4 KB
		now := read.t
		full := s.m.lastFull.IsZero() || now.Sub(s.m.lastFull) >= s.opts.FullScanEvery ||
			(!s.m.rescanAt.IsZero() && !now.Before(s.m.rescanAt))
		if full {
			if err := s.fullScan(ctx, &st); err != nil {
				return backend.Listing{}, err
			}
			if s.m.lastFull.IsZero() && len(s.m.hist) == 0 {
				// Writes in flight during the first scan (allocated before
				// it, landing after it passed their key) are below every
				// cursor the polls will have until a reading is a window
				// old: one more scan then picks them up.
				s.m.rescanAt = now.Add(s.opts.Window)
			} else {
				s.m.rescanAt = time.Time{}
			}
			s.m.lastFull = now
		} else {
			st.Cursor = s.cursor()
			if err := s.poll(ctx, st.Cursor, &st); err != nil {
				return backend.Listing{}, err
			}
		}
		s.m.hist = append(s.m.hist, read)
		s.trimHistory(now)
		l, ok := s.cut(c)
		s.m.total.Requests += st.Requests
		s.m.total.Items += st.Items
		s.m.total.Capacity += st.Capacity
		s.m.total.Bytes += st.Bytes
		s.m.total.Billed += st.Billed
		if !ok {
			if attempt >= maxListAttempts {
				return backend.Listing{}, backend.Mark(fmt.Errorf("dynamodb: no listing at one revision after %d polls: keys are rewritten faster than a poll runs", attempt), backend.ErrUnavailable)
			}
			continue
		}
		st.Full, st.Revision = full, l.Revision
		s.m.last = st
		s.m.total.Full = full
		s.prune()
		return l, nil
	}
}

// cursor is where the next poll reads from: the highest counter reading
// at least a window older than the last poll's reading. Every revision up
// to such a reading had landed and reached the index a window after it,
// so before the last poll read the index; that poll read everything above
// its own cursor, and the polls before it, by the same rule, everything
// below. (A window older than now would not do: with polls further apart
// than the window, the last poll's own reading qualifies, and a write
// allocated just before it and landing just after it read the index would
// be below every later cursor, missed until the full scan.) Before any
// reading is that old, the oldest one (a second full scan covers what lies
// below it, see List).
//
// In List the last reading is the previous poll's; after List has added
// its own (prune), it is the one the next poll will judge by.
func (s *Store) cursor() int64 {
	var c int64
	if len(s.m.hist) == 0 {
		return 0
	}
	ref := s.m.hist[len(s.m.hist)-1].t
	found := false
	for _, r := range s.m.hist {
		if ref.Sub(r.t) >= s.opts.Window {
			c, found = r.c, true
		}
	}
	if !found {
		c = s.m.hist[0].c
	}
	return c
}

// trimHistory keeps the newest reading at least a window older than now
// (the reading just added: what the next poll's cursor is judged by) and
// every newer one.
func (s *Store) trimHistory(now time.Time) {
	keep := 0
	for i, r := range s.m.hist {
		if now.Sub(r.t) >= s.opts.Window {
			keep = i
		}
	}
	s.m.hist = append(s.m.hist[:0], s.m.hist[keep:]...)
}

// prune forgets tombstones below the cursor: no poll reads that far back
// again, and a listing shows a forgotten key as absent, as the tombstone
// does.
func (s *Store) prune() {
	c := s.cursor()
	for k, e := range s.m.entries {
		if e.v == nil && e.rev <= c && e.leaseExp == 0 {
			delete(s.m.entries, k)
		}
	}
}

func (s *Store) merge(key string, e entry) {
	if old, ok := s.m.entries[key]; ok && (old.rev > e.rev || old.rev == e.rev && old.leaseExp >= e.leaseExp) {
		// A re-read of the overlap, or an index lagging the mirror. (Two
		// heartbeats of one lease may share a revision, see
		// sharedRevision: the later expiry is the newer.)
		return
	}
	s.m.entries[key] = e
}

// fullScan reads the whole table with consistent reads and replaces the
// mirror with it.
func (s *Store) fullScan(ctx context.Context, st *PollStats) error {
	old := s.m.entries
	s.m.entries = make(map[string]entry, len(old))
	p := ddb.NewScanPaginator(s.cli, &ddb.ScanInput{
		TableName:              aws.String(s.table),
		ConsistentRead:         aws.Bool(true),
		ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
	})
	for p.HasMorePages() {
		out, err := p.NextPage(ctx)
		if err != nil {
			s.m.entries = old
			return fmt.Errorf("dynamodb: full scan of %s: %w", s.table, unavailable(err))
		}
		st.Requests++
		st.Items += len(out.Items)
		st.Capacity += capacity(out.ConsumedCapacity)
		st.bill(out.Items, true)
		for _, item := range out.Items {
			key, _ := strAttr(item, attrKey)
			if key == metaKey {
				continue
			}
			s.merge(key, entryOf(item))
		}
	}
	// The scan read at least as late as the mirror: keep a newer version
	// only if the mirror's is (a write that landed behind the scan).
	for k, e := range old {
		if cur, ok := s.m.entries[k]; ok && e.rev > cur.rev {
			s.m.entries[k] = e
		}
	}
	return nil
}

// poll reads, from every shard of the changes index, the items written
// above cursor.
func (s *Store) poll(ctx context.Context, cursor int64, st *PollStats) error {
	for shard := 0; shard < s.shards; shard++ {
		p := ddb.NewQueryPaginator(s.cli, &ddb.QueryInput{
			TableName:              aws.String(s.table),
			IndexName:              aws.String(ChangesIndex),
			KeyConditionExpression: aws.String("s = :s AND r > :c"),
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":s": num(int64(shard)), ":c": num(cursor),
			},
			ReturnConsumedCapacity: types.ReturnConsumedCapacityTotal,
		})
		for p.HasMorePages() {
			out, err := p.NextPage(ctx)
			if err != nil {
				return fmt.Errorf("dynamodb: polling shard %d above revision %d: %w", shard, cursor, unavailable(err))
			}
			st.Requests++
			st.Items += len(out.Items)
			st.Capacity += capacity(out.ConsumedCapacity)
			st.bill(out.Items, false)
			for _, item := range out.Items {
				key, _ := strAttr(item, attrKey)
				s.merge(key, entryOf(item))
			}
		}
	}
	return nil
}

// decoded is the endpoint of e's version at rev (its current or previous
// one), decoded once and kept in the mirror; nil if it does not decode
// (logged).
func (s *Store) decoded(key string, e *entry, rev int64) *registryv1.ServiceEndpoint {
	slot, raw := &e.ep, e.v
	if rev != e.rev {
		slot, raw = &e.pep, e.pv
	}
	if *slot == nil {
		ep, err := registry.DecodeEndpoint(key, raw)
		if err != nil {
			s.log.Warn("stored endpoint does not decode", "key", key, "err", err)
			return nil
		}
		*slot = ep
		s.m.entries[key] = *e
	}
	return *slot
}

// cut is the mirror as of revision c: each key's version at c. ok is false
// when a key was written twice above c (the caller polls again).
func (s *Store) cut(c int64) (backend.Listing, bool) {
	type kv struct {
		key string
		v   []byte
		rev int64
		ep  *registryv1.ServiceEndpoint
	}
	var eps, nodes []kv
	var l backend.Listing
	top := s.m.listRev
	now := s.opts.Now().UnixMilli()
	for key, e := range s.m.entries {
		if !strings.HasPrefix(key, registry.Root) {
			continue
		}
		v, rev, known := e.at(c)
		if !known {
			return backend.Listing{}, false
		}
		top = max(top, rev) // a deletion at or below c is part of the state too
		if v == nil {
			continue
		}
		switch {
		case registry.IsEndpointKey(key):
			ep := s.decoded(key, &e, rev)
			if ep == nil {
				l.Skipped++
				continue
			}
			eps = append(eps, kv{key, v, rev, ep})
		case registry.IsNodeKey(key):
			if !s.leaseLive(e.lease, now) {
				continue // its lease ran out: gone for every replica alike
			}
			nodes = append(nodes, kv{key, v, rev, nil})
		}
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].key < eps[j].key })
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].key < nodes[j].key })
	l.Revision = max(top, 1)
	for _, x := range eps {
		l.Endpoints, l.EndpointRevs = append(l.Endpoints, x.ep), append(l.EndpointRevs, x.rev)
	}
	for _, x := range nodes {
		n, err := registry.DecodeNode(x.key, x.v)
		if err != nil {
			s.log.Warn("stored node record does not decode", "key", x.key, "err", err)
			continue
		}
		l.Nodes, l.NodeRevs = append(l.Nodes, n), append(l.NodeRevs, x.rev)
	}
	s.m.listRev = l.Revision
	s.report(l.Revision)
	return l, true
}
