// Package replica is the vocabulary a registrar replica shares with its
// front ends (the gRPC adapter in registrar/grpcapi, and in-process
// consumers such as an xDS feed or a status page): the errors its calls
// return, the write check a caller may attach, the subscription a watcher
// reads events from, and Follow, the one loop that keeps a front end's copy
// of the replica's view across cuts.
//
// It imports only the API's messages, registry, the project's backoff
// (internal/retry) and the registrar's pure core (whose errors it
// re-exports), so
// that both the registrar (which implements the calls) and a front end
// (which must not depend on *registrar.Registrar, only on the methods it
// calls) can name the same types: an interface method in the front end
// matches the registrar's method only if every type in the signature is
// identical, and a type defined in package registrar would make the front
// end import the registrar, whose process code in turn wires the front end.
//
// Positions in a replica's event history are registry.Position; their
// tokens are parsed by registry.ParsePosition (through ParseVersion here).
//
// The registrar re-exports every name here (registrar.ErrNotFound is
// replica.ErrNotFound, registrar.Subscription is replica.Subscription), so
// an in-process caller needs only package registrar.
package replica

import (
	"errors"
	"fmt"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registrar/internal/core"
	"github.com/aethermesh/aether/registry"
)

// Errors of the replica's calls. Each is matched with errors.Is; the text
// around it (wrapping) says what the call was doing.
var (
	// ErrNotFound: the endpoint (or node record) the call names is not
	// held, not here nor, after a look at the backend, anywhere.
	ErrNotFound = core.ErrNotFound
	// ErrQueueFull: the write queue holds its limit of endpoints waiting
	// to be persisted; the backend is not keeping up, retry later.
	ErrQueueFull = core.ErrQueueFull
	// ErrNodeFull: the registration would give a node more endpoints than
	// the per-node limit; updates of existing endpoints are always allowed.
	ErrNodeFull = core.ErrNodeFull
	// ErrOwned: the removal names an endpoint of a live node, whose agent
	// would register it again; only that node may remove it.
	ErrOwned = errors.New("endpoint belongs to a live node")
	// ErrBackendUnavailable: the backend did not answer; retry.
	ErrBackendUnavailable = errors.New("backend unavailable")
	// ErrNoLeases: node calls on a backend without leases, which could
	// never let a node record lapse; a retry cannot change that.
	ErrNoLeases = errors.New("the configured backend has no leases, so this registrar keeps no node records (AnnounceNode, Heartbeat and LeaveNode are not available on it)")
	// ErrNotPersisted: a wait for persistence ended before the write was
	// persisted; the write stays acknowledged and queued.
	ErrNotPersisted = errors.New("not yet persisted")
	// ErrRefused: the backend refused the write permanently (too large,
	// invalid); the acknowledged write is held back, the others persist.
	ErrRefused = errors.New("refused by the backend")

	// ErrNotReady: the replica has not loaded its snapshot yet (Start has
	// not returned), so it has nothing true to tell a subscriber: an empty
	// snapshot would say every endpoint is gone.
	ErrNotReady = errors.New("registrar is not serving: its snapshot is not loaded")
	// ErrShuttingDown: the replica is ending its subscriptions because the
	// process stops; resume on another replica from the last version
	// received.
	ErrShuttingDown = errors.New("registrar is shutting down")
	// ErrSlowConsumer: the subscription was cut because its consumer let
	// its buffer fill (--watch-buffer batches waiting); resume from the
	// last version received.
	ErrSlowConsumer = errors.New("subscription cut: its consumer fell behind")
	// ErrClosed: the subscription was closed by its own consumer.
	ErrClosed = errors.New("subscription closed")
	// ErrBadVersion: a version token not of the form a registrar issues
	// (see ParseVersion). A well-formed token of another replica
	// or incarnation is not an error: it just cannot be resumed.
	ErrBadVersion = errors.New("not a version token")
	// ErrWatchesAll: an update of the services of a subscription that
	// watches all services.
	ErrWatchesAll = errors.New("the subscription watches all services")
	// ErrTooManyServices: a subscription would watch more services than
	// the replica's limit (--max-watch-services); see ServiceLimitError.
	ErrTooManyServices = errors.New("too many services for one subscription")
)

// ServiceLimitError refuses a subscription, or an update of its services,
// that would watch Services distinct services, more than Limit. Nothing was
// changed.
type ServiceLimitError struct {
	Services, Limit int
}

func (e *ServiceLimitError) Error() string {
	return fmt.Sprintf("%d distinct services exceed the limit of %d per subscription", e.Services, e.Limit)
}

func (e *ServiceLimitError) Is(target error) bool { return target == ErrTooManyServices }

// WriteCheck decides whether a write may go ahead. It is called under the
// registrar's lock, between looking up the endpoint stored under the key
// and writing it, so what it sees cannot change before the write: ep is
// the endpoint the write would store (normalized; nil for unregister and
// for drain) and stored the endpoint the snapshot holds under its key (nil
// if none). A non-nil error aborts the write and is returned as is. It
// must be fast and must not call the registrar.
type WriteCheck func(ep, stored *registryv1.ServiceEndpoint) error

// Written names an acknowledged write, for WaitPersisted.
type Written struct {
	ID    registry.EndpointID
	Stamp *registryv1.WriteStamp
}

// Identity is the origin a replica writes for: its region and cluster
// (every endpoint it accepts is of that origin) and the zone it runs in.
type Identity struct {
	Region, Cluster, Zone string
}

// Limits are the replica's bounds that a front end names in its refusals.
type Limits struct {
	// WatchBuffer is how many batches may wait on a subscription before
	// it is cut (ErrSlowConsumer).
	WatchBuffer int
	// MaxWatchServices bounds the services of one subscription
	// (ErrTooManyServices).
	MaxWatchServices int
	// WriteQueueLimit is how many endpoints may wait to be persisted
	// before writes are refused (ErrQueueFull).
	WriteQueueLimit int
}
