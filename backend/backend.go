// Package backend is the contract between the registrar and the durable
// store it persists the registry to and learns other replicas' writes from.
// It names what they exchange (mutations and their outcomes, listings,
// keys-and-revisions digests, watch batches) and the errors a store reports,
// and it says, per method, what a caller may rely on. The etcd backend
// (package etcdstore), the DynamoDB backend (package backend/dynamodb: a
// Store with Leases, synced by polling) and the in-memory model (package
// backend/memory) implement it, and package backend/backendtest checks
// that they keep it.
//
// A store offers the core (Store) and whichever optional capabilities it
// can: a change feed (Watcher), a cheap digest (Digester), and leases it
// expires itself (Leases). A consumer that finds a capability missing
// degrades instead of failing: without a Watcher it syncs by polling List,
// without a Digester its backstop takes a full listing.
//
// # Revisions
//
// Every value a store returns carries a revision: an int64 that is per
// store, greater than zero, and that increases with every write that
// changes something (a write that changes nothing need not move it). Two
// revisions of the same store compare: the greater one is later. Revisions
// of different stores never compare, and a consumer must not carry one from
// a store to another (a restored backup, another cluster): it lists afresh
// instead. Within one store, a key's mod revision is the revision of the
// write that gave it its current value; every listing and digest is
// consistent at exactly one revision, and a watch resumes from any revision
// a listing, a digest or a watch batch reported.
//
// # Compaction
//
// A store may forget history (etcd compacts it; a model may be told to).
// Reading at, or watching from, a revision it has forgotten fails with an
// error that satisfies errors.Is(err, ErrCompacted), or, for a watch, ends
// with a WatchBatch whose Compacted is set. Either way the consumer lists
// afresh and continues from the new listing's revision; nothing else is
// lost.
package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// Sentinel errors. A store returns errors that wrap them (errors.Is), with
// its own detail in the message.
var (
	// ErrCompacted: the revision asked for has been compacted away. List
	// afresh and continue from the new listing's revision.
	ErrCompacted = errors.New("revision compacted")
	// ErrLeaseNotFound means a lease has expired or was revoked: the node it
	// kept alive is gone and must announce itself again.
	ErrLeaseNotFound = errors.New("lease not found (expired or revoked)")
	// ErrUnavailable marks a failure of the moment (the store unreachable,
	// no quorum, a timeout): the same call may succeed later. A store need
	// not mark every such failure; a caller retries any error that is not
	// a permanent refusal.
	ErrUnavailable = errors.New("backend unavailable")
)

// Mark returns err, unchanged in its message, so that errors.Is(result,
// sentinel) holds as well as errors.Is(result, err)'s own chain: a store
// maps its native errors to this package's sentinels without rewording
// what it logs. Mark(nil, s) is nil.
func Mark(err, sentinel error) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, sentinel: sentinel}
}

type marked struct{ err, sentinel error }

func (m *marked) Error() string   { return m.err.Error() }
func (m *marked) Unwrap() []error { return []error{m.err, m.sentinel} }

// Mutation puts Endpoint at ID's key, or deletes the key when Endpoint is nil.
// Stamp, KeyRev and TombRev are for ApplyOrdered only: a delete's stamp
// (a put's is its Endpoint's), and the mod revisions of the key and of its
// tombstone as the writer last saw them (0: absent).
type Mutation struct {
	ID       registry.EndpointID
	Endpoint *registryv1.ServiceEndpoint
	Stamp    *registryv1.WriteStamp
	KeyRev   int64
	TombRev  int64
}

// StampOf is the stamp ApplyOrdered orders m by: its Endpoint's for a put,
// Stamp for a delete.
func (m Mutation) StampOf() *registryv1.WriteStamp {
	if m.Endpoint != nil {
		return m.Endpoint.GetStamp()
	}
	return m.Stamp
}

// Outcome is what became of one mutation of ApplyOrdered.
type Outcome struct {
	// Landed: the store holds the mutation, written at Revision.
	Landed   bool
	Revision int64
	// Superseded: the store holds a newer write of the key (Current, nil
	// for a delete, with its stamp CurrentStamp), so this one was dropped.
	Superseded   bool
	Current      *registryv1.ServiceEndpoint
	CurrentStamp *registryv1.WriteStamp
	// KeyRev and TombRev are the mod revisions of the key and of its
	// tombstone as last seen (0: absent): the guesses to swap against
	// next time.
	KeyRev, TombRev int64
	// Err is the store's permanent refusal of this mutation alone (too
	// large, invalid): retrying it cannot help. Other mutations are
	// unaffected.
	Err error
}

// Settled reports whether the mutation needs no retry.
func (o Outcome) Settled() bool { return o.Landed || o.Superseded || o.Err != nil }

// Listing is a consistent snapshot of (part of) the registry.
type Listing struct {
	Endpoints []*registryv1.ServiceEndpoint // in key order
	Nodes     []*registryv1.Node            // node records, in key order
	Revision  int64                         // the store revision the listing is consistent at
	Skipped   int                           // endpoint keys whose value did not decode (logged at warn)
	// EndpointRevs[i] and NodeRevs[i] are the mod revisions of Endpoints[i]
	// and Nodes[i]: the revision each value was written at. A consumer that
	// remembers them can later tell from a keys-only listing
	// (ListRevisions) which values changed.
	EndpointRevs []int64
	NodeRevs     []int64
}

// KeyRevisions is a keys-only listing under registry.Root at one revision:
// each endpoint's and node record's identity and mod revision, in key order.
// Keys that do not parse as either are left out, as List leaves them out.
type KeyRevisions struct {
	Endpoints []EndpointRevision
	Nodes     []NodeRevision
	Revision  int64 // the store revision the listing is consistent at
}

// EndpointRevision is an endpoint key and the revision its value was
// written at.
type EndpointRevision struct {
	ID          registry.EndpointID
	ModRevision int64
}

// NodeRevision is a node record key and the revision its value was written
// at.
type NodeRevision struct {
	ID          registry.NodeID
	ModRevision int64
}

// Parts splits a keys-only listing into reads of a key range each, so that
// a large listing costs the store and its reader a little at a time rather
// than all at once: one read of a large registry is a burst of CPU on both
// that every other request on the machine queues behind.
type Parts struct {
	// Bounds are keys at which a new part starts, in increasing order.
	// Any keys do: the parts cover all of registry.Root whatever they
	// are, and only their sizes depend on them. Bounds out of order or
	// outside registry.Root are ignored.
	Bounds []string
	// Between, if set, runs after each part but the last (a pause); an
	// error from it ends the listing with that error.
	Between func(context.Context) error
	// Expect is about how many endpoint keys to expect (0: unknown).
	Expect int
}

// Ranges turns the bounds into key ranges [from, end) that cover
// registry.Root, one per part.
func (p Parts) Ranges() [][2]string {
	from, end := registry.Root, PrefixEnd(registry.Root)
	var out [][2]string
	for _, b := range p.Bounds {
		if b <= from || b >= end {
			continue
		}
		out = append(out, [2]string{from, b})
		from = b
	}
	return append(out, [2]string{from, end})
}

// PrefixEnd is the smallest key greater than every key that starts with
// prefix (the end of the range the prefix spans); "\x00" when there is
// none, meaning "to the end", as etcd spells it.
func PrefixEnd(prefix string) string {
	end := []byte(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return string(end[:i+1])
		}
	}
	return "\x00"
}

// Event is one change to one endpoint.
type Event struct {
	ID       registry.EndpointID
	Endpoint *registryv1.ServiceEndpoint // nil for a delete
	Revision int64                       // ModRevision of the put, or the delete's revision
}

// NodeEvent is one change to one node record.
type NodeEvent struct {
	ID       registry.NodeID
	Node     *registryv1.Node // nil for a delete (a lapsed lease, or a node that left)
	Revision int64
}

// WatchBatch is what one response of a store's change feed carried.
type WatchBatch struct {
	// Events may be empty: for a progress notification, or for a response
	// whose changes were all to keys that are not endpoints.
	Events []Event
	// Nodes are the node-record changes of the same response.
	Nodes []NodeEvent
	// Revision is a revision the consumer is known current up to: every
	// change up to and including it has been delivered. For a batch with
	// events it is the last event's revision (a store catching a watcher
	// up on history may already be further on than what it has sent); for
	// a progress notification it is the store's revision. It never
	// decreases, and Watch(ctx, Revision) resumes gaplessly.
	Revision int64
	// Compacted means the watch could not resume because its revision was
	// compacted away; Revision is the last revision delivered. The channel
	// closes after this batch: List again and Watch from the listing.
	Compacted bool
}

// Store is the core every backend offers: ordered writes, consistent
// listings and point reads. Its methods are safe for concurrent use.
type Store interface {
	// ApplyOrdered writes muts (unique keys; a put's stamp is its
	// Endpoint's, a delete's is Stamp) so that, per key, the write with
	// the newest stamp (registry.CompareStamps) wins whatever order
	// writers' calls arrive in: a write is dropped (Superseded) when the
	// store holds one stamped the same or later, including a delete,
	// whose stamp the store keeps as a tombstone for at least as long as
	// a flush can still be queued somewhere. KeyRev and TombRev are the
	// caller's guesses of the mod revisions the store holds (0: absent);
	// a wrong guess may cost a round trip, never correctness.
	//
	// outs[i] says what became of muts[i]. A landed put's KeyRev is its
	// Revision, a landed delete's KeyRev is 0. A mutation the store
	// refuses permanently is reported in its own Err and the others still
	// land. err is a failure of the moment: mutations not Settled must
	// then be retried, those Settled stand. A duplicate key fails the
	// whole call before anything is written.
	//
	// Retrying is safe: re-sending mutations that already landed (their
	// answer was lost) with the guesses they were first sent with writes
	// nothing and moves no revision; each is reported Superseded by its
	// own value (CurrentStamp equal to its stamp).
	ApplyOrdered(ctx context.Context, muts []Mutation) (outs []Outcome, err error)
	// List returns every endpoint and node record under registry.Root,
	// consistent at exactly Listing.Revision (no write after it shows, no
	// write at or before it is missing), in key order, each value with its
	// mod revision. Watch(ctx, Listing.Revision) continues it gaplessly.
	// A listing overtaken by compaction may be started over by the store;
	// if it gives up, the error satisfies errors.Is(err, ErrCompacted).
	List(ctx context.Context) (Listing, error)
	// GetEndpoint reads one endpoint's value as the store holds it now (a
	// linearizable read); nil when absent or undecodable. rev is the key's
	// mod revision (0 when absent) and at the revision the read was
	// served at (at least every revision the store reported before).
	GetEndpoint(ctx context.Context, id registry.EndpointID) (ep *registryv1.ServiceEndpoint, rev, at int64, err error)
	// GetAt reads the values of the given endpoints and node records as
	// they were at revision rev, into a Listing at rev, in the order asked
	// (not key order). A key absent at rev is absent from the listing.
	// Unless there is nothing to read, it fails with an error satisfying
	// errors.Is(err, ErrCompacted) once rev is compacted away; a caller
	// then lists afresh.
	GetAt(ctx context.Context, rev int64, eps []registry.EndpointID, nodes []registry.NodeID) (Listing, error)
}

// Watcher is a store's change feed. A store without one is synced by
// polling List.
type Watcher interface {
	// Watch streams changes under registry.Root with revision > afterRev,
	// all of one revision's changes in the same batch (a write's changes
	// arrive together; a batch may carry several revisions, as a feed
	// catching up does), each change exactly once and in revision order, across
	// any failures of the store's own feed underneath. Pass the Revision
	// of a Listing, a KeyRevisions or a WatchBatch as afterRev. If the
	// feed cannot resume because afterRev+1 has been compacted away, it
	// sends one WatchBatch{Compacted: true} whose Revision is the last
	// revision delivered, and closes the channel.
	//
	// The channel is unbuffered and closes when ctx ends; a consumer that
	// stops reading must cancel ctx, which also ends a pending send.
	Watch(ctx context.Context, afterRev int64) <-chan WatchBatch
}

// Digester is a store that answers which keys exist at which mod revision
// without sending their values, far cheaper than List for a consumer that
// keeps a copy (it fetches only what changed, with GetAt). Without it a
// consumer's periodic repair takes a full listing.
type Digester interface {
	// ListRevisionsInParts returns the keys under registry.Root and their
	// mod revisions, read in p's parts (p.Between runs between them), all
	// consistent at the one Revision returned, as one read would be.
	ListRevisionsInParts(ctx context.Context, p Parts) (KeyRevisions, error)
}

// Leases is node liveness that the store enforces itself: a node record is
// written under a lease, and when the lease is neither renewed nor revoked
// within its TTL, the store deletes the record (a change the Watcher
// reports like any other), so no replica decides on its own that a node
// is dead. A lease that has expired or was revoked is reported with an
// error satisfying errors.Is(err, ErrLeaseNotFound).
type Leases interface {
	// GrantLease creates a lease of at least the given TTL (a store may
	// round it up) and returns its id, never 0.
	GrantLease(ctx context.Context, ttl time.Duration) (int64, error)
	// KeepAliveOnce renews a lease for its granted TTL and returns that
	// TTL.
	KeepAliveOnce(ctx context.Context, lease int64) (time.Duration, error)
	// LeaseTTL reports a lease's remaining and granted TTL.
	LeaseTTL(ctx context.Context, lease int64) (remaining, granted time.Duration, err error)
	// RevokeLease ends a lease now, deleting every record attached to it,
	// and returns the revision of the deletion. Revoking a lease that is
	// already gone is not an error (the revision is then 0).
	RevokeLease(ctx context.Context, lease int64) (int64, error)
	// PutNode writes a node record attached to lease and returns the
	// revision. A lease that no longer exists fails, so a record is never
	// written outside a live lease.
	PutNode(ctx context.Context, n *registryv1.Node, lease int64) (int64, error)
}

// Member is one registrar replica of a cluster as peer-watch finds it:
// the replica's incarnation (its epoch, unique per process start) and the
// gRPC address its peers dial to receive its local writes.
type Member struct {
	Epoch string `json:"epoch"`
	Addr  string `json:"addr"`
}

// Members is replica membership for peer-watch: each replica of a cluster
// writes its Member record under a lease of its own (Leases), so a
// replica that stops renewing drops out by the store's own expiry, and the
// others find the live ones by listing. The records live outside
// registry.Root: no listing, digest or watch of the registry sees them.
type Members interface {
	// PutMember writes m for (region, cluster) attached to lease; a lease
	// that no longer exists fails with ErrLeaseNotFound.
	PutMember(ctx context.Context, region, cluster string, m Member, lease int64) error
	// ListMembers returns the live members of (region, cluster), in
	// epoch order.
	ListMembers(ctx context.Context, region, cluster string) ([]Member, error)
}

// MembersPrefix is where a store keeps member records of (region,
// cluster), for a store with a key space (etcd).
func MembersPrefix(region, cluster string) string {
	return "/aether/members/v1/" + region + "/" + cluster + "/"
}

// Full is a store with every capability: what the registrar runs on
// today.
type Full interface {
	Store
	Watcher
	Digester
	Leases
}

// ErrInvalidMutation marks a mutation refused before anything was sent: a
// malformed identity, no stamp, a value that names another endpoint.
var ErrInvalidMutation = errors.New("invalid mutation")

// Prepared is one mutation of a batch as a store writes it: its key and
// encoded value (nil for a delete).
type Prepared struct {
	Key   string
	Value []byte
}

// Prepare checks a batch for ApplyOrdered the same way for every store:
// a mutation that cannot be written (invalid identity, no stamp, a value
// naming another endpoint, a value that does not encode) gets its own
// Outcome.Err, wrapping ErrInvalidMutation, and the others go on; a key
// written twice refuses the whole batch, as the caller broke the contract.
// outs carries each mutation's guesses forward.
func Prepare(muts []Mutation) (ps []Prepared, outs []Outcome, err error) {
	ps = make([]Prepared, len(muts))
	outs = make([]Outcome, len(muts))
	seen := make(map[string]int, len(muts))
	for i, m := range muts {
		outs[i].KeyRev, outs[i].TombRev = m.KeyRev, m.TombRev
		key, kerr := m.ID.Key()
		if kerr != nil {
			outs[i].Err = fmt.Errorf("%w: endpoint id %s: %v", ErrInvalidMutation, m.ID, kerr)
			continue
		}
		if j, dup := seen[key]; dup {
			return nil, nil, fmt.Errorf("%w: mutations %d and %d both write %s", ErrInvalidMutation, j, i, key)
		}
		seen[key] = i
		ps[i].Key = key
		switch {
		case m.StampOf() == nil:
			outs[i].Err = fmt.Errorf("%w: %s has no write stamp", ErrInvalidMutation, key)
		case m.Endpoint != nil && registry.IDOf(m.Endpoint) != m.ID:
			outs[i].Err = fmt.Errorf("%w: endpoint %s does not match its id %s", ErrInvalidMutation, registry.IDOf(m.Endpoint), key)
		case m.Endpoint != nil:
			val, eerr := registry.EncodeEndpoint(m.Endpoint)
			if eerr != nil {
				outs[i].Err = fmt.Errorf("%w: encode %s: %v", ErrInvalidMutation, key, eerr)
				continue
			}
			ps[i].Value = val
		}
	}
	return ps, outs, nil
}
