package client

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// Defaults of the zero Config fields.
const (
	// DefaultRegion and DefaultCluster are the registrar's own defaults, so
	// that an agent and a registrar started without flags agree on the
	// origin, and thus on every endpoint's identity.
	DefaultRegion  = "default"
	DefaultCluster = "default"

	DefaultBackoffBase = 100 * time.Millisecond
	DefaultBackoffMax  = 10 * time.Second
)

// Config configures a Client. Only Addrs is required.
type Config struct {
	// Addrs are the registrars' gRPC addresses (host:port). The client uses
	// one at a time and moves to the next after every failure of its stream.
	Addrs []string

	// Region and Cluster are the origin this agent writes for (default
	// "default", as the registrar's). Writes are filled in with them so that
	// an optimistic write has the identity (registry.EndpointID) the
	// registrar will give it; a write naming another origin is refused.
	Region, Cluster string

	// Node names this agent in the registrar's logs and metrics
	// (WatchEndpointsRequest.node_name). It is also the default Node of the
	// endpoints the agent registers, and the owner its unregisters name
	// (UnregisterEndpointRequest.owner_node).
	Node string

	// Services to watch. Empty means all services, for the client's whole
	// life: such a client cannot Subscribe or Unsubscribe (unless
	// OnlySubscribed).
	Services []string

	// OnlySubscribed makes the client watch exactly Services and what
	// Subscribe adds since, even when that is nothing: with no service
	// wanted it keeps no stream open (on the wire an empty service list
	// means all services), its empty cache counts as synced, and it opens
	// a stream at the first Subscribe. Unsubscribe may then remove the
	// last service, which ends the stream. For an agent whose
	// subscription is driven by demand (its proxies' xDS requests) and
	// which must never watch the whole mesh for want of a service.
	OnlySubscribed bool

	// DialOptions for every registrar connection. Nil means plaintext
	// (insecure transport credentials); a non-nil list replaces that
	// default and so must include transport credentials. The client always
	// adds its own connect backoff (BackoffBase, BackoffMax) and keepalive
	// ahead of these, so they can be overridden here.
	DialOptions []grpc.DialOption

	// BackoffBase and BackoffMax bound reconnect and write-retry delays:
	// the n-th consecutive failure waits a uniformly random duration in
	// [0, min(BackoffMax, BackoffBase*2^n)) ("full jitter"), so agents that
	// lost the same registrar do not come back in lockstep. Defaults 100ms
	// and 10s.
	BackoffBase, BackoffMax time.Duration

	// Logger gets the client's logs; default slog.Default().
	Logger *slog.Logger

	// Registerer, if set, gets the client's metrics:
	// agent_registrar_cache_age_seconds, agent_registrar_stream_reconnects_total,
	// agent_registrar_writes_dropped_total, agent_registrar_reasserted_total
	// and agent_registrar_pending_writes.
	// They are unregistered by Close. Two clients on one Registerer need
	// prometheus.WrapRegistererWith to tell them apart.
	Registerer prometheus.Registerer

	// OnChange, if set, is called for every change of the cache, in order,
	// from one goroutine (see the package doc). It must not call Close.
	OnChange func(Change)
}

// ChangeType says how an endpoint changed.
type ChangeType int

// Change types.
const (
	ChangeAdded ChangeType = iota + 1
	ChangeUpdated
	ChangeRemoved
)

func (t ChangeType) String() string {
	switch t {
	case ChangeAdded:
		return "ADDED"
	case ChangeUpdated:
		return "UPDATED"
	case ChangeRemoved:
		return "REMOVED"
	}
	return fmt.Sprintf("ChangeType(%d)", int(t))
}

// Change is one change of the cache.
type Change struct {
	Type ChangeType
	// Endpoint is the new value, or for ChangeRemoved the last one.
	Endpoint *registryv1.ServiceEndpoint
	// Previous is the value an update replaced (ChangeUpdated only).
	Previous *registryv1.ServiceEndpoint
}

// withDefaults validates the config and returns it with defaults filled in
// and Services de-duplicated and sorted.
func (cfg Config) withDefaults() (Config, error) {
	if len(cfg.Addrs) == 0 {
		return cfg, errors.New("client: Config.Addrs must list at least one registrar address (host:port)")
	}
	for i, a := range cfg.Addrs {
		if a == "" {
			return cfg, fmt.Errorf("client: Config.Addrs[%d] is empty", i)
		}
	}
	cfg.Addrs = slices.Clone(cfg.Addrs)
	if cfg.Region == "" {
		cfg.Region = DefaultRegion
	}
	if cfg.Cluster == "" {
		cfg.Cluster = DefaultCluster
	}
	if err := registry.ValidateName("Config.Region", cfg.Region); err != nil {
		return cfg, fmt.Errorf("client: %w", err)
	}
	if err := registry.ValidateName("Config.Cluster", cfg.Cluster); err != nil {
		return cfg, fmt.Errorf("client: %w", err)
	}
	if cfg.Node != "" {
		if err := registry.ValidateName("Config.Node", cfg.Node); err != nil {
			return cfg, fmt.Errorf("client: %w", err)
		}
	}
	svcs := make([]string, 0, len(cfg.Services))
	for i, s := range cfg.Services {
		if err := registry.ValidateName(fmt.Sprintf("Config.Services[%d]", i), s); err != nil {
			return cfg, fmt.Errorf("client: %w", err)
		}
		svcs = append(svcs, s)
	}
	slices.Sort(svcs)
	cfg.Services = slices.Compact(svcs)
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = max(DefaultBackoffMax, cfg.BackoffBase)
	}
	if cfg.BackoffBase < 0 || cfg.BackoffMax < cfg.BackoffBase {
		return cfg, fmt.Errorf("client: backoff %v..%v: BackoffBase must be positive and BackoffMax at least BackoffBase", cfg.BackoffBase, cfg.BackoffMax)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg, nil
}
