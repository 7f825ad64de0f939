package registrar

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

// The hooks through which the composition root (package server) wires a
// replica into a process without reaching its internals. They are the
// smallest set that process needs today; the in-process API and the gRPC
// adapter's own package replace them.

// GRPCConfig is what the gRPC service reads that the replica does not:
// who may call it and how much one caller may open. Zero limits take the
// defaults of DefaultGRPCConfig.
type GRPCConfig struct {
	// Authorize requires a SPIFFE client identity of TrustDomain on every
	// call and authorizes it (package authz): a node writes only its own
	// endpoints and node record, an operator (OperatorPrefix, default
	// spiffe://<TrustDomain>/operator/) writes anything, any authenticated
	// identity reads. The transport must verify client certificates.
	Authorize      bool
	TrustDomain    string
	OperatorPrefix string

	// MaxWatchServices bounds the services of one watch filter
	// (INVALID_ARGUMENT). MaxStreamsPerIdentity bounds the open
	// WatchEndpoints/Subscribe streams of one caller: its SPIFFE ID with
	// Authorize, its IP address otherwise; negative means unlimited.
	MaxWatchServices      int
	MaxStreamsPerIdentity int
}

// DefaultGRPCConfig returns the gRPC service's defaults, which the CLI
// flags show.
func DefaultGRPCConfig() GRPCConfig {
	return GRPCConfig{MaxWatchServices: 1000, MaxStreamsPerIdentity: 64}
}

func (c GRPCConfig) withDefaults() GRPCConfig {
	d := DefaultGRPCConfig()
	if c.MaxWatchServices == 0 {
		c.MaxWatchServices = d.MaxWatchServices
	}
	if c.MaxStreamsPerIdentity == 0 {
		c.MaxStreamsPerIdentity = d.MaxStreamsPerIdentity
	}
	return c
}

// ReplicationStatus reports the multi-region replicator's view of each
// peer region. An interface, so that the replica does not link the
// replicator (and with it an etcd client): the process that runs one
// adapts it.
type ReplicationStatus interface {
	ReplicationPeers() []*registrarv1.PeerReplicationStatus
}

// RegisterGRPCServer registers the Registrar API on s, a server built with
// WireCodec: each event is encoded once for all of its streams.
func (r *Registrar) RegisterGRPCServer(s grpc.ServiceRegistrar, c GRPCConfig) {
	r.registerGRPC(s, newWireCache(), c)
}

// WireCodec is the server option RegisterGRPCServer's server needs: the
// codec that sends an event's shared encoding as is.
func WireCodec() grpc.ServerOption { return wireCodecOption() }

// SetReplication makes ReplicationStatus report rs. The replicator starts
// after the gRPC service is registered (it needs the loaded backend); the
// call gate of the process orders this write before every call that reads
// it.
func (r *Registrar) SetReplication(rs ReplicationStatus) { r.repl = rs }

// Metrics is the registry of the replica's metrics, for a process to serve
// and to add its own (the replicator's) to.
func (r *Registrar) Metrics() *prometheus.Registry { return r.metrics.reg }

// Now is the replica's clock, so that ages a process reports about it
// (readiness) are on the same clock as the times it records.
func (r *Registrar) Now() time.Time { return r.now() }

// Options are the options the replica runs with, defaults filled in and
// the sync mode resolved against the backend's capabilities.
func (r *Registrar) Options() Options { return r.opts }
