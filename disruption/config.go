package disruption

import (
	"fmt"
	"github.com/aethermesh/aether/internal/defaults"
	"io"
	"log/slog"
	"time"

	"github.com/aethermesh/aether/registrar"
)

// Config sizes one battery. Zero fields take the defaults noted, which are
// the CI short form with watch sync.
type Config struct {
	// SyncMode of both registrars (registrar.Options.SyncMode):
	// registrar.SyncWatch (default) or registrar.SyncPoll.
	SyncMode string `json:"sync_mode"`
	// SyncInterval is both registrars' --sync-interval: the backstop
	// re-list with watch sync, the only sync with poll. Default the
	// registrar's, 5s.
	SyncInterval time.Duration `json:"sync_interval_ns"`

	// Backend is the registrars' store: BackendEtcd (default, an embedded
	// etcd) or BackendDynamoDB (a fresh table on the DynamoDB-compatible
	// server at DynamoDBEndpoint, dynalite in CI; dynamodb.go) or
	// BackendKubernetes (a fresh namespace on the API server of the
	// kubeconfig file at Kubeconfig; kubernetes.go). PeerWatch turns on
	// peer-watch on both registrars.
	Backend          string `json:"backend,omitempty"`
	DynamoDBEndpoint string `json:"-"`
	Kubeconfig       string `json:"-"`
	PeerWatch        bool   `json:"peer_watch,omitempty"`

	// EndpointsPerService is how many pods each service runs (default 2).
	EndpointsPerService int `json:"endpoints_per_service"`
	// Clients is how many agent clients watch through B, failing over to A
	// (default 3); each runs ResolversPerClient resolvers (default 2).
	Clients            int `json:"clients"`
	ResolversPerClient int `json:"resolvers_per_client"`
	// ResolveRate is the resolutions per second of each resolver; 0 means
	// as fast as it can, yielding a millisecond every 256.
	ResolveRate int `json:"resolve_rate"`

	// Quiet is the length of the baseline and settle phases (default
	// 750ms); a reconnect storm round lasts a third of it.
	Quiet time.Duration `json:"quiet_ns"`
	// ReadyDelay is how long a surged pod is registered before an old pod
	// is drained (default 100ms).
	ReadyDelay time.Duration `json:"ready_delay_ns"`
	// DrainPeriod is how long a drained pod stays alive, from its drain
	// being sent until it deregisters and dies (default 1s). A replica whose
	// clients learn of the drain later than this hands out dead endpoints.
	DrainPeriod time.Duration `json:"drain_period_ns"`
	// Downtime is how long each registrar stays down in its rolling
	// restart, and how long the battery waits after it is back (default
	// Quiet/2).
	Downtime time.Duration `json:"downtime_ns"`
	// Storms is the number of reconnect-storm rounds, in each of which
	// every client is replaced by a new one (default 3).
	Storms int `json:"storms"`
	// ChurnRolls is how many times svc-2 and svc-3 are each rolled, both
	// at once, in the churn phase (default 2).
	ChurnRolls int `json:"churn_rolls"`
	// PropagateTimeout bounds how long a write may take to reach every
	// client before the battery fails (default 15s, at least three sync
	// intervals).
	PropagateTimeout time.Duration `json:"propagate_timeout_ns"`

	// Logger receives the registrars', etcd's and clients' logs (default:
	// discarded). Progress, if set, gets a line as each phase starts and
	// the summary at the end.
	Logger   *slog.Logger `json:"-"`
	Progress io.Writer    `json:"-"`
}

func (c Config) withDefaults() Config {
	defaults.Set(&c.Backend, BackendEtcd)
	if c.Backend == BackendDynamoDB {
		// DynamoDB has no change feed: the registrar polls it.
		defaults.Set(&c.SyncMode, registrar.SyncPoll)
	}
	defaults.Set(&c.SyncMode, registrar.SyncWatch)
	defaults.Set(&c.SyncInterval, registrar.DefaultOptions().SyncInterval)
	defaults.Set(&c.EndpointsPerService, 2)
	defaults.Set(&c.Clients, 3)
	defaults.Set(&c.ResolversPerClient, 2)
	defaults.Set(&c.Quiet, 750*time.Millisecond)
	defaults.Set(&c.ReadyDelay, 100*time.Millisecond)
	defaults.Set(&c.DrainPeriod, time.Second)
	defaults.Set(&c.Downtime, c.Quiet/2)
	defaults.Set(&c.Storms, 3)
	defaults.Set(&c.ChurnRolls, 2)
	defaults.Set(&c.PropagateTimeout, max(15*time.Second, 3*c.SyncInterval))
	if c.Logger == nil {
		c.Logger = discard()
	}
	return c
}

func (c Config) validate() error {
	if err := c.validateKubernetes(); err != nil { // then validateBackend
		return err
	}
	if c.SyncMode != registrar.SyncWatch && c.SyncMode != registrar.SyncPoll {
		return fmt.Errorf("disruption: SyncMode %q: use %s or %s", c.SyncMode, registrar.SyncWatch, registrar.SyncPoll)
	}
	for _, v := range []struct {
		name string
		n    int64
	}{
		{"SyncInterval", int64(c.SyncInterval)}, {"EndpointsPerService", int64(c.EndpointsPerService)},
		{"Clients", int64(c.Clients)}, {"ResolversPerClient", int64(c.ResolversPerClient)},
		{"ResolveRate", int64(c.ResolveRate) + 1}, {"Quiet", int64(c.Quiet)}, {"ReadyDelay", int64(c.ReadyDelay)},
		{"DrainPeriod", int64(c.DrainPeriod)}, {"Downtime", int64(c.Downtime)}, {"Storms", int64(c.Storms)},
		{"ChurnRolls", int64(c.ChurnRolls)}, {"PropagateTimeout", int64(c.PropagateTimeout)},
	} {
		if v.n <= 0 {
			return fmt.Errorf("disruption: %s must be positive", v.name)
		}
	}
	return nil
}
