package registrar

import (
	"fmt"
	"github.com/aethermesh/aether/internal/defaults"
	"log/slog"
	"time"

	"github.com/aethermesh/aether/registry"
)

// Options configure one replica: who it writes for, and how it batches,
// syncs and streams. They are only what the replica itself reads; where
// its store is, where it serves and how it secures that are the process's
// (package server). Zero values take the defaults of DefaultOptions.
type Options struct {
	// Identity: the origin this registrar writes for, and the zone it runs
	// in (optional), which in-process consumers read through Identity to
	// rank localities relative to this replica.
	ClusterName string
	Region      string
	Zone        string

	// Sync: how this replica learns other replicas' writes. SyncMode
	// SyncWatch (the default when the backend has a change feed) applies
	// the feed's changes as they arrive, with a full re-list every
	// SyncInterval as a backstop and at most one re-list per SyncDebounce
	// when the watch asks for one (reconnects, compaction, bursts of
	// errors). SyncPoll opens no watch: other replicas' writes arrive only
	// with the full re-list every SyncInterval, as on a backend without a
	// change feed (kept for comparison, see the disruption battery in
	// docs/benchmarks.md). Empty picks watch when the backend has a change
	// feed and poll when it has none (see New).
	SyncMode     string
	SyncInterval time.Duration
	SyncDebounce time.Duration

	// Write-behind: flush every WriteBatchInterval, or sooner once
	// WriteBatchSize writes are pending; refuse new writes once
	// WriteQueueLimit distinct endpoints are waiting to be persisted.
	WriteBatchInterval time.Duration
	WriteBatchSize     int
	WriteQueueLimit    int

	// Streams: WatchHistory events are retained for resume; each stream
	// buffers at most WatchBuffer undelivered messages before it is cut off;
	// an idle stream gets a PROGRESS bookmark every ProgressInterval.
	WatchHistory     int
	WatchBuffer      int
	ProgressInterval time.Duration

	// Nodes: a node record lives under a lease of NodeTTL that the node's
	// heartbeats renew; when it lapses, the store deletes the record and
	// the registrar's ghost sweep removes the node's endpoints.
	NodeTTL time.Duration

	// Limits the replica enforces on what it stores (see docs/security.md,
	// "Limits"). MaxMetadataEntries and MaxMetadataBytes bound an
	// endpoint's metadata and a node's labels (INVALID_ARGUMENT).
	// MaxEndpointsPerNode bounds the endpoints one node has in this
	// registrar's origin; updates of existing endpoints are always allowed
	// (RESOURCE_EXHAUSTED).
	// MaxWatchServices bounds the services one subscription names
	// (INVALID_ARGUMENT on the wire, ErrTooManyServices in process).
	MaxMetadataEntries  int
	MaxMetadataBytes    int
	MaxEndpointsPerNode int
	MaxWatchServices    int

	// Peer-watch (--peer-watch, on by default in the CLI and in
	// DefaultOptions; the zero Options leave it off): stream local writes
	// to the other replicas of the cluster, found through member records
	// in the backend kept under a lease of PeerMemberTTL and listed every
	// PeerDiscoveryInterval (peer.go).
	PeerWatch             bool
	PeerMemberTTL         time.Duration
	PeerDiscoveryInterval time.Duration

	Logger *slog.Logger
}

// Sync modes (Options.SyncMode, --sync-mode).
const (
	// SyncWatch learns other replicas' writes from the backend's change
	// feed, with a periodic full re-list as a backstop.
	SyncWatch = "watch"
	// SyncPoll learns them only from the periodic full re-list.
	SyncPoll = "poll"
)

// DefaultOptions returns the replica's defaults, which the CLI flags show.
func DefaultOptions() Options {
	return Options{
		ClusterName:         "default",
		Region:              "default",
		SyncMode:            SyncWatch,
		SyncInterval:        5 * time.Second,
		SyncDebounce:        200 * time.Millisecond,
		WriteBatchInterval:  100 * time.Millisecond,
		WriteBatchSize:      50,
		WriteQueueLimit:     100000,
		WatchHistory:        100000,
		WatchBuffer:         4096,
		ProgressInterval:    10 * time.Second,
		NodeTTL:             30 * time.Second,
		MaxMetadataEntries:  registry.DefaultLimits.MaxMetadataEntries,
		MaxMetadataBytes:    registry.DefaultLimits.MaxMetadataBytes,
		MaxEndpointsPerNode: 1000,
		MaxWatchServices:    1000,

		// Off for a replica built as a library: peer-watch needs an
		// address its peers can dial, which only the process that owns
		// the listeners knows. The process's defaults (server.DefaultConfig,
		// the CLI) turn it on.
		PeerWatch:             false,
		PeerMemberTTL:         defaultPeerMemberTTL,
		PeerDiscoveryInterval: defaultPeerDiscovery,
	}
}

// limits returns the registry validation limits these options configure.
func (o Options) limits() registry.Limits {
	l := registry.DefaultLimits
	l.MaxMetadataEntries = o.MaxMetadataEntries
	l.MaxMetadataBytes = o.MaxMetadataBytes
	return l
}

// withDefaults fills zero fields from DefaultOptions.
func (o Options) withDefaults() Options {
	d := DefaultOptions()
	defaults.Set(&o.ClusterName, d.ClusterName)
	defaults.Set(&o.Region, d.Region)
	defaults.Set(&o.SyncMode, d.SyncMode)
	defaults.Set(&o.SyncInterval, d.SyncInterval)
	defaults.Set(&o.SyncDebounce, d.SyncDebounce)
	defaults.Set(&o.WriteBatchInterval, d.WriteBatchInterval)
	defaults.Set(&o.WriteBatchSize, d.WriteBatchSize)
	defaults.Set(&o.WriteQueueLimit, d.WriteQueueLimit)
	defaults.Set(&o.WatchHistory, d.WatchHistory)
	defaults.Set(&o.WatchBuffer, d.WatchBuffer)
	defaults.Set(&o.ProgressInterval, d.ProgressInterval)
	defaults.Set(&o.NodeTTL, d.NodeTTL)
	defaults.Set(&o.MaxMetadataEntries, d.MaxMetadataEntries)
	defaults.Set(&o.MaxMetadataBytes, d.MaxMetadataBytes)
	defaults.Set(&o.MaxEndpointsPerNode, d.MaxEndpointsPerNode)
	defaults.Set(&o.MaxWatchServices, d.MaxWatchServices)
	defaults.Set(&o.PeerMemberTTL, d.PeerMemberTTL)
	defaults.Set(&o.PeerDiscoveryInterval, d.PeerDiscoveryInterval)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// Validate reports the first option that cannot work, naming the flag.
func (o Options) Validate() error {
	checks := []struct {
		bad  bool
		flag string
		msg  string
	}{
		{o.SyncMode != "" && o.SyncMode != SyncWatch && o.SyncMode != SyncPoll, "--sync-mode", fmt.Sprintf("%q: use watch or poll", o.SyncMode)},
		{o.SyncInterval < 0, "--sync-interval", "must be positive"},
		{o.SyncDebounce < 0, "--sync-debounce", "must not be negative"},
		{o.WriteBatchInterval < 0, "--write-batch-interval", "must be positive"},
		{o.WriteBatchSize < 0, "--write-batch-size", "must be positive"},
		{o.WriteQueueLimit < 0, "--write-queue-limit", "must be positive"},
		{o.WatchHistory < 0, "--watch-history", "must be positive"},
		{o.WatchBuffer < 0, "--watch-buffer", "must be positive"},
		{o.ProgressInterval < 0, "--watch-progress-interval", "must be positive"},
		{o.NodeTTL < 0, "--node-ttl", "must be positive"},
		{o.NodeTTL > 0 && o.NodeTTL < 2*time.Second, "--node-ttl", "must be at least 2s (etcd leases count whole seconds)"},
		{o.MaxMetadataEntries < 0, "--max-metadata-entries", "must be positive"},
		{o.MaxMetadataBytes < 0, "--max-metadata-bytes", "must be positive"},
		{o.MaxEndpointsPerNode < 0, "--max-endpoints-per-node", "must be positive"},
		{o.MaxWatchServices < 0, "--max-watch-services", "must be positive"},
		{o.PeerMemberTTL < 0 || (o.PeerMemberTTL > 0 && o.PeerMemberTTL < 2*time.Second), "--peer-member-ttl", "must be at least 2s (etcd leases count whole seconds)"},
		{o.PeerDiscoveryInterval < 0, "--peer-discovery-interval", "must be positive"},
	}
	for _, c := range checks {
		if c.bad {
			return fmt.Errorf("%s %s", c.flag, c.msg)
		}
	}
	return nil
}
