package replicator

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"

	"github.com/aethermesh/aether/registry"
)

// Defaults for zero Config fields.
const (
	DefaultLeaseTTL       = 30 * time.Second
	DefaultRequestTimeout = 5 * time.Second
	// DefaultMaxTxnOps is etcd's --max-txn-ops default; a peer configured
	// lower would refuse our larger Txns.
	DefaultMaxTxnOps = 128
	// DefaultPageSize bounds each Range of a full sync (on either side).
	DefaultPageSize = 1000

	maxSessionTTL = 5 * time.Second
	minSessionTTL = 2 * time.Second // etcd's own minimum lease TTL with default timings
)

// ReplicationRoot holds the replicator's own bookkeeping keys. It is outside
// registry.Root, so registrars never see these keys and they are never
// mirrored.
const ReplicationRoot = "/aether/v1/replication/"

// FenceKey is the key on a peer that the origin region's replicator claims
// for each peer session; every mirrored write is conditional on it.
func FenceKey(origin string) string { return ReplicationRoot + origin + "/fence" }

// HomeKey is written into the origin's own etcd by its leader. Finding it on
// a "peer" means the peer is the local etcd under another name: mirroring
// there would rewrite the origin's own keys under a peer lease, so the peer
// is refused.
func HomeKey(origin string) string { return ReplicationRoot + origin + "/home" }

// DefaultElectionPrefix is the election prefix for region. It is outside
// registry.Root, so it is never mirrored, and it names no region subtree.
func DefaultElectionPrefix(region string) string {
	return "/aether/v1/election/replicator/" + region
}

// Peer is a region whose etcd receives a mirror of ours.
type Peer struct {
	Region    string
	Endpoints []string
}

func (p Peer) String() string { return p.Region + "=" + strings.Join(p.Endpoints, ",") }

// Config configures a Replicator. Zero values take the defaults.
type Config struct {
	Region string           // this region; required, a valid registry name
	Local  *clientv3.Client // the local region's etcd; required; the caller owns it
	Peers  []Peer           // at least one; distinct regions, none equal to Region

	// PeerClient builds the client of a peer. The replicator owns the
	// client it returns and closes it when Run returns. Default: a clientv3
	// client of p.Endpoints without TLS (see NewPeerClient).
	PeerClient func(p Peer) (*clientv3.Client, error)

	// LeaseTTL is the origin-heartbeat lease TTL on every peer (whole
	// seconds, rounded up; etcd may raise it to its minimum, 2s by
	// default). Keepalives go every TTL/3. Default 30s.
	LeaseTTL time.Duration
	// SessionTTL is the TTL of the local election session: how long a
	// crashed leader holds the election. A clean shutdown resigns at once.
	// It must be below LeaseTTL, and should be well below 2/3 of it, or a
	// crashed leader's mirror expires on peers before its successor takes
	// over. Default LeaseTTL/6 within [2s, 5s].
	SessionTTL time.Duration
	// ElectionPrefix is the local etcd election prefix. Default
	// DefaultElectionPrefix(Region). It must not be under registry.Root.
	ElectionPrefix string
	// Identity is this replica's candidate value, shown as the leader
	// (e.g. the registrar's host:port). Default hostname/pid.
	Identity string

	RequestTimeout time.Duration // per etcd request; default 5s
	MaxTxnOps      int           // default 128, etcd's --max-txn-ops default
	PageSize       int           // keys per Range in a full sync; default 1000

	Logger     *slog.Logger
	Registerer prometheus.Registerer // optional
}

// withDefaults validates cfg and fills in defaults.
func (cfg Config) withDefaults() (Config, error) {
	if err := registry.ValidateName("region", cfg.Region); err != nil {
		return cfg, fmt.Errorf("replicator: %w", err)
	}
	if cfg.Local == nil {
		return cfg, errors.New("replicator: a local etcd client is required")
	}
	if len(cfg.Peers) == 0 {
		return cfg, errors.New("replicator: no peers; the replicator is inert without --peer-etcd")
	}
	seen := map[string]bool{}
	for i, p := range cfg.Peers {
		if err := validatePeer(p); err != nil {
			return cfg, fmt.Errorf("replicator: peer %d: %w", i+1, err)
		}
		if p.Region == cfg.Region {
			return cfg, fmt.Errorf("replicator: peer region %q is this region; a region never mirrors into itself", p.Region)
		}
		if seen[p.Region] {
			return cfg, fmt.Errorf("replicator: peer region %q is given more than once", p.Region)
		}
		seen[p.Region] = true
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.LeaseTTL < time.Second {
		return cfg, fmt.Errorf("replicator: lease TTL %v is below etcd's 1s granularity", cfg.LeaseTTL)
	}
	cfg.LeaseTTL = ceilSeconds(cfg.LeaseTTL)
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = min(max(cfg.LeaseTTL/6, minSessionTTL), maxSessionTTL)
	}
	if cfg.SessionTTL < time.Second {
		return cfg, fmt.Errorf("replicator: session TTL %v is below etcd's 1s granularity", cfg.SessionTTL)
	}
	cfg.SessionTTL = ceilSeconds(cfg.SessionTTL)
	if cfg.SessionTTL >= cfg.LeaseTTL {
		return cfg, fmt.Errorf("replicator: session TTL %v must be below the lease TTL %v, or every leader crash drops the mirror from peers", cfg.SessionTTL, cfg.LeaseTTL)
	}
	if cfg.ElectionPrefix == "" {
		cfg.ElectionPrefix = DefaultElectionPrefix(cfg.Region)
	}
	cfg.ElectionPrefix = strings.TrimRight(cfg.ElectionPrefix, "/")
	if cfg.ElectionPrefix == "" || strings.HasPrefix(cfg.ElectionPrefix+"/", registry.Root) || strings.HasPrefix(registry.Root, cfg.ElectionPrefix+"/") {
		return cfg, fmt.Errorf("replicator: election prefix %q must not be, contain or be under %s (it would be mirrored or watched as registry data)", cfg.ElectionPrefix, registry.Root)
	}
	if cfg.Identity == "" {
		h, _ := os.Hostname()
		cfg.Identity = fmt.Sprintf("%s/%d", h, os.Getpid())
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.MaxTxnOps <= 0 {
		cfg.MaxTxnOps = DefaultMaxTxnOps
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.PeerClient == nil {
		cfg.PeerClient = NewPeerClient
	}
	if cfg.SessionTTL > cfg.LeaseTTL/2 {
		cfg.Logger.Warn("replicator: session TTL is more than half the lease TTL; after a leader crash the mirror may expire on peers before a successor re-attaches it",
			"session_ttl", cfg.SessionTTL, "lease_ttl", cfg.LeaseTTL)
	}
	return cfg, nil
}

func ceilSeconds(d time.Duration) time.Duration {
	return (d + time.Second - 1).Truncate(time.Second)
}

// ParsePeer parses one --peer-etcd value, "region=endpoint[,endpoint...]".
// An endpoint is host:port or an http:// or https:// URL without a path.
// Whether the region is this one or repeats another peer is checked by
// ParsePeers and New, which see all of them.
func ParsePeer(spec string) (Peer, error) {
	region, eps, ok := strings.Cut(spec, "=")
	if !ok {
		return Peer{}, fmt.Errorf("--peer-etcd %q: want region=endpoint[,endpoint...], e.g. eu-west=http://etcd.eu-west:2379", spec)
	}
	region = strings.TrimSpace(region)
	if err := registry.ValidateName("region", region); err != nil {
		return Peer{}, fmt.Errorf("--peer-etcd %q: %w", spec, err)
	}
	p := Peer{Region: region}
	if strings.TrimSpace(eps) == "" {
		return Peer{}, fmt.Errorf("--peer-etcd %q: region %s has no endpoints", spec, region)
	}
	for i, ep := range strings.Split(eps, ",") {
		ep = strings.TrimSpace(ep)
		if ep == "" {
			return Peer{}, fmt.Errorf("--peer-etcd %q: endpoint %d is empty", spec, i+1)
		}
		p.Endpoints = append(p.Endpoints, ep)
	}
	if err := validatePeer(p); err != nil {
		return Peer{}, fmt.Errorf("--peer-etcd %q: %w", spec, err)
	}
	return p, nil
}

// ParsePeers parses every --peer-etcd value for region self: each as
// ParsePeer, and none naming self or a region given before.
func ParsePeers(self string, specs []string) ([]Peer, error) {
	var peers []Peer
	seen := map[string]int{}
	for i, s := range specs {
		p, err := ParsePeer(s)
		if err != nil {
			return nil, err
		}
		if p.Region == self {
			return nil, fmt.Errorf("--peer-etcd %q: region %s is this registrar's own --region; a region never mirrors into itself", s, p.Region)
		}
		if j, dup := seen[p.Region]; dup {
			return nil, fmt.Errorf("--peer-etcd %q: region %s was already given by --peer-etcd %q", s, p.Region, specs[j])
		}
		seen[p.Region] = i
		peers = append(peers, p)
	}
	return peers, nil
}

func validatePeer(p Peer) error {
	if err := registry.ValidateName("peer region", p.Region); err != nil {
		return err
	}
	if len(p.Endpoints) == 0 {
		return fmt.Errorf("peer region %s has no endpoints", p.Region)
	}
	seen := map[string]bool{}
	for _, ep := range p.Endpoints {
		if err := validateEndpoint(ep); err != nil {
			return fmt.Errorf("peer region %s: %w", p.Region, err)
		}
		if seen[ep] {
			return fmt.Errorf("peer region %s: endpoint %q is given twice", p.Region, ep)
		}
		seen[ep] = true
	}
	return nil
}

func validateEndpoint(ep string) error {
	if strings.ContainsAny(ep, " \t\r\n") {
		return fmt.Errorf("endpoint %q contains whitespace", ep)
	}
	hostPort := ep
	if strings.Contains(ep, "://") {
		u, err := url.Parse(ep)
		if err != nil {
			return fmt.Errorf("endpoint %q: %v", ep, err)
		}
		if u.Scheme != "http" && u.Scheme != "https" {
			return fmt.Errorf("endpoint %q: scheme %q; use http:// or https://", ep, u.Scheme)
		}
		if u.Path != "" && u.Path != "/" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return fmt.Errorf("endpoint %q: want scheme://host:port and nothing else", ep)
		}
		hostPort = u.Host
	}
	host, port, err := net.SplitHostPort(hostPort)
	if err != nil {
		return fmt.Errorf("endpoint %q: not host:port (%v)", ep, unwrapAddrErr(err))
	}
	if host == "" {
		return fmt.Errorf("endpoint %q: empty host", ep)
	}
	if port == "" {
		return fmt.Errorf("endpoint %q: empty port", ep)
	}
	return nil
}

func unwrapAddrErr(err error) string {
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return ae.Err
	}
	return err.Error()
}

// NewPeerClient is the default Config.PeerClient: a plain-text clientv3
// client of p.Endpoints (host:port becomes http://host:port) that does not
// wait for a connection, detects a silent peer through gRPC keepalives and
// reconnects within a few seconds of the peer coming back (gRPC's default
// backoff would wait up to two minutes). For TLS, use NewTLSPeerClient.
func NewPeerClient(p Peer) (*clientv3.Client, error) {
	return newPeerClient(p, nil)
}

// NewTLSPeerClient returns a Config.PeerClient like NewPeerClient that
// talks TLS with cfg (root CAs and, if the peer requires one, a client
// certificate): host:port endpoints become https://host:port. Every client
// gets its own clone of cfg.
func NewTLSPeerClient(cfg *tls.Config) func(Peer) (*clientv3.Client, error) {
	return func(p Peer) (*clientv3.Client, error) {
		return newPeerClient(p, cfg.Clone())
	}
}

func newPeerClient(p Peer, tlsCfg *tls.Config) (*clientv3.Client, error) {
	scheme := "http://"
	if tlsCfg != nil {
		scheme = "https://"
	}
	eps := make([]string, len(p.Endpoints))
	for i, ep := range p.Endpoints {
		if !strings.Contains(ep, "://") {
			ep = scheme + ep
		}
		eps[i] = ep
	}
	return clientv3.New(clientv3.Config{
		Endpoints:            eps,
		TLS:                  tlsCfg,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           grpcbackoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 3 * time.Second},
			MinConnectTimeout: 5 * time.Second,
		})},
	})
}
