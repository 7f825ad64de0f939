package registrar

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/registry"
)

// Options configure a registrar process: where its etcd is, where it serves,
// who it is, and how it batches and streams. Zero values take the defaults
// of DefaultOptions.
type Options struct {
	// Backend. With no EtcdEndpoints the registrar runs an embedded etcd in
	// DataDir, serving clients at EmbeddedEtcdAddr and peers at
	// EmbeddedEtcdPeerAddr.
	EtcdEndpoints        []string
	DataDir              string
	EmbeddedEtcdAddr     string
	EmbeddedEtcdPeerAddr string

	// Serving. GRPCAddr serves the Registrar API, gRPC health and
	// reflection; HTTPAddr serves /healthz, /readyz and /metrics. Port 0
	// picks a free port (see Server.GRPCAddr). Empty takes
	// DefaultListenAddrs: loopback only without TLS.
	GRPCAddr string
	HTTPAddr string
	// EnablePprof serves Go's runtime profiles at /debug/pprof/ on HTTPAddr,
	// as etcd's --enable-pprof does. Off by default: a profile costs CPU and
	// shows internals, so it is for diagnosing, behind the same TLS as
	// /metrics.
	EnablePprof bool

	// Identity: the origin this registrar writes for.
	ClusterName string
	Region      string
	Zone        string

	// Sync: how this replica learns other replicas' writes. SyncMode
	// SyncWatch (the default) applies an etcd watch's changes as they
	// arrive, with a full re-list every SyncInterval as a backstop and at
	// most one re-list per SyncDebounce when the watch asks for one
	// (reconnects, compaction, bursts of errors). SyncPoll opens no watch:
	// other replicas' writes arrive only with the full re-list every
	// SyncInterval, as on a backend without a change feed (kept for
	// comparison, see the disruption battery in docs/benchmarks.md).
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

	// Nodes: a node record lives under an etcd lease of NodeTTL that the
	// node's heartbeats renew; when it lapses, etcd deletes the record and
	// the registrar's ghost sweep removes the node's endpoints.
	NodeTTL time.Duration

	// Multi-region replication: with one or more PeerEtcd specs
	// ("region=ep[,ep]"), the region's registrars elect one replicator that
	// mirrors /aether/v1/regions/<Region>/ into each peer region's etcd
	// under a lease of ReplicationLeaseTTL that it keeps alive.
	PeerEtcd            []string
	ReplicationLeaseTTL time.Duration

	// Transport security (see docs/security.md). With TLSCertFile and
	// TLSKeyFile the gRPC API and the HTTP endpoints serve TLS; the pair is
	// re-read from its files every TLSReloadInterval, so rotating it needs no
	// restart. With TLSClientCAFile as well, every gRPC client must present
	// a certificate that chains to it, carrying a SPIFFE ID of TrustDomain,
	// and the registrar authorizes each call (package authz): a node writes
	// only its own endpoints and node record, an operator (OperatorPrefix,
	// default spiffe://<TrustDomain>/operator/) writes anything, any
	// authenticated identity reads. Without TLSClientCAFile there is no
	// authentication and no authorization: development mode.
	TLSCertFile       string
	TLSKeyFile        string
	TLSClientCAFile   string
	TrustDomain       string
	OperatorPrefix    string
	TLSReloadInterval time.Duration

	// TLS to an external etcd (EtcdEndpoints must be https://): EtcdCACert
	// verifies etcd's server certificate, EtcdCert and EtcdKey are the
	// registrar's client certificate when etcd requires one.
	EtcdCACert string
	EtcdCert   string
	EtcdKey    string

	// TLS of the embedded etcd (no EtcdEndpoints). With EmbeddedEtcdCert
	// and EmbeddedEtcdKey its client URL is https://; with
	// EmbeddedEtcdClientCA as well, every etcd client must present a
	// certificate of that CA, and the registrar's own client presents
	// EmbeddedEtcdCert (pki server certificates carry client auth). The
	// registrar verifies the embedded etcd against EmbeddedEtcdClientCA and
	// the certificates in EmbeddedEtcdCert (which it serves itself). The
	// peer link is configured alike by the EmbeddedEtcdPeer* options.
	EmbeddedEtcdCert     string
	EmbeddedEtcdKey      string
	EmbeddedEtcdClientCA string
	EmbeddedEtcdPeerCert string
	EmbeddedEtcdPeerKey  string
	EmbeddedEtcdPeerCA   string

	// TLS to the peer regions' etcd for replication (PeerEtcd endpoints
	// given as host:port become https://): PeerEtcdCACert verifies their
	// server certificates, PeerEtcdCert and PeerEtcdKey are the client
	// certificate the replicator presents. The same for every peer.
	PeerEtcdCACert string
	PeerEtcdCert   string
	PeerEtcdKey    string

	// Limits (see docs/security.md, "Limits"). MaxRecvMsgSize bounds one
	// gRPC request message in bytes (gRPC answers RESOURCE_EXHAUSTED).
	// MaxMetadataEntries and MaxMetadataBytes bound an endpoint's metadata
	// and a node's labels (INVALID_ARGUMENT). MaxWatchServices bounds the
	// services of one watch filter (INVALID_ARGUMENT). MaxStreamsPerIdentity
	// bounds the open WatchEndpoints/Subscribe streams of one caller: its
	// SPIFFE ID with mTLS, its IP address otherwise; negative means
	// unlimited (the CLI's --max-streams-per-identity 0). MaxEndpointsPerNode
	// bounds the endpoints one node has in this registrar's origin; updates
	// of existing endpoints are always allowed (RESOURCE_EXHAUSTED).
	MaxRecvMsgSize        int
	MaxMetadataEntries    int
	MaxMetadataBytes      int
	MaxWatchServices      int
	MaxStreamsPerIdentity int
	MaxEndpointsPerNode   int

	Logger *slog.Logger
}

// Sync modes (Options.SyncMode, --sync-mode).
const (
	// SyncWatch learns other replicas' writes from an etcd watch, with a
	// periodic full re-list as a backstop.
	SyncWatch = "watch"
	// SyncPoll learns them only from the periodic full re-list.
	SyncPoll = "poll"
)

// TLSEnabled reports whether the registrar serves TLS.
func (o Options) TLSEnabled() bool { return o.TLSCertFile != "" }

// AuthzEnabled reports whether client certificates are required and calls
// authorized.
func (o Options) AuthzEnabled() bool { return o.TLSClientCAFile != "" }

// EtcdTLSEnabled reports whether the registrar talks TLS to etcd.
func (o Options) EtcdTLSEnabled() bool {
	return o.EtcdCACert != "" || o.EtcdCert != "" || o.EtcdKey != ""
}

// EmbeddedEtcdTLSEnabled reports whether any embedded etcd TLS option is set.
func (o Options) EmbeddedEtcdTLSEnabled() bool {
	return o.EmbeddedEtcdCert != "" || o.EmbeddedEtcdKey != "" || o.EmbeddedEtcdClientCA != "" ||
		o.EmbeddedEtcdPeerCert != "" || o.EmbeddedEtcdPeerKey != "" || o.EmbeddedEtcdPeerCA != ""
}

// PeerEtcdTLSEnabled reports whether the replicator talks TLS to peer etcd.
func (o Options) PeerEtcdTLSEnabled() bool {
	return o.PeerEtcdCACert != "" || o.PeerEtcdCert != "" || o.PeerEtcdKey != ""
}

// Listen defaults. Without TLS the registrar is unencrypted and
// unauthenticated (any client may write any endpoint), so by default it
// listens on loopback only, as etcd and Consul's dev mode do: reaching it
// from another host takes an explicit --grpc-addr/--http-addr, which is a
// decision rather than an accident. With TLS the defaults are every
// interface, since a certificate is a sign the registrar is meant to be
// reached over the network (without --tls-client-ca it still warns that
// nobody is authenticated).
const (
	DefaultGRPCAddr    = "127.0.0.1:9443"
	DefaultHTTPAddr    = "127.0.0.1:8081"
	DefaultTLSGRPCAddr = ":9443"
	DefaultTLSHTTPAddr = ":8081"
)

// DefaultListenAddrs are the default gRPC and HTTP addresses of a
// registrar with or without TLS.
func DefaultListenAddrs(tls bool) (grpcAddr, httpAddr string) {
	if tls {
		return DefaultTLSGRPCAddr, DefaultTLSHTTPAddr
	}
	return DefaultGRPCAddr, DefaultHTTPAddr
}

// DefaultOptions returns the defaults the CLI flags show (the plaintext
// listen addresses; see DefaultListenAddrs).
func DefaultOptions() Options {
	return Options{
		DataDir:               "./aether-data",
		EmbeddedEtcdAddr:      "127.0.0.1:2379",
		EmbeddedEtcdPeerAddr:  "127.0.0.1:2380",
		GRPCAddr:              DefaultGRPCAddr,
		HTTPAddr:              DefaultHTTPAddr,
		ClusterName:           "default",
		Region:                "default",
		SyncMode:              SyncWatch,
		SyncInterval:          5 * time.Second,
		SyncDebounce:          200 * time.Millisecond,
		WriteBatchInterval:    100 * time.Millisecond,
		WriteBatchSize:        50,
		WriteQueueLimit:       100000,
		WatchHistory:          100000,
		WatchBuffer:           4096,
		ProgressInterval:      10 * time.Second,
		NodeTTL:               30 * time.Second,
		ReplicationLeaseTTL:   30 * time.Second,
		TLSReloadInterval:     10 * time.Second,
		MaxRecvMsgSize:        4 << 20,
		MaxMetadataEntries:    registry.DefaultLimits.MaxMetadataEntries,
		MaxMetadataBytes:      registry.DefaultLimits.MaxMetadataBytes,
		MaxWatchServices:      1000,
		MaxStreamsPerIdentity: 64,
		MaxEndpointsPerNode:   1000,
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
	set := func(p *string, v string) {
		if *p == "" {
			*p = v
		}
	}
	setD := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	setI := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	set(&o.DataDir, d.DataDir)
	set(&o.EmbeddedEtcdAddr, d.EmbeddedEtcdAddr)
	set(&o.EmbeddedEtcdPeerAddr, d.EmbeddedEtcdPeerAddr)
	grpcAddr, httpAddr := DefaultListenAddrs(o.TLSEnabled())
	set(&o.GRPCAddr, grpcAddr)
	set(&o.HTTPAddr, httpAddr)
	set(&o.ClusterName, d.ClusterName)
	set(&o.Region, d.Region)
	set(&o.SyncMode, d.SyncMode)
	setD(&o.SyncInterval, d.SyncInterval)
	setD(&o.SyncDebounce, d.SyncDebounce)
	setD(&o.WriteBatchInterval, d.WriteBatchInterval)
	setI(&o.WriteBatchSize, d.WriteBatchSize)
	setI(&o.WriteQueueLimit, d.WriteQueueLimit)
	setI(&o.WatchHistory, d.WatchHistory)
	setI(&o.WatchBuffer, d.WatchBuffer)
	setD(&o.ProgressInterval, d.ProgressInterval)
	setD(&o.NodeTTL, d.NodeTTL)
	setD(&o.ReplicationLeaseTTL, d.ReplicationLeaseTTL)
	setD(&o.TLSReloadInterval, d.TLSReloadInterval)
	setI(&o.MaxRecvMsgSize, d.MaxRecvMsgSize)
	setI(&o.MaxMetadataEntries, d.MaxMetadataEntries)
	setI(&o.MaxMetadataBytes, d.MaxMetadataBytes)
	setI(&o.MaxWatchServices, d.MaxWatchServices)
	setI(&o.MaxStreamsPerIdentity, d.MaxStreamsPerIdentity)
	setI(&o.MaxEndpointsPerNode, d.MaxEndpointsPerNode)
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
		{o.ReplicationLeaseTTL < 0, "--replication-lease-ttl", "must be positive"},
		{o.ReplicationLeaseTTL > 0 && o.ReplicationLeaseTTL < 3*time.Second, "--replication-lease-ttl", "must be at least 3s (the replicator's election session must be shorter)"},
		{o.MaxRecvMsgSize < 0, "--max-recv-msg-size", "must be positive"},
		{o.MaxRecvMsgSize > 0 && o.MaxRecvMsgSize < 64<<10, "--max-recv-msg-size", "must be at least 65536 bytes (64 KiB), or a valid registration may not fit"},
		{o.MaxMetadataEntries < 0, "--max-metadata-entries", "must be positive"},
		{o.MaxMetadataBytes < 0, "--max-metadata-bytes", "must be positive"},
		{o.MaxWatchServices < 0, "--max-watch-services", "must be positive"},
		{o.MaxEndpointsPerNode < 0, "--max-endpoints-per-node", "must be positive"},
	}
	for _, c := range checks {
		if c.bad {
			return fmt.Errorf("%s %s", c.flag, c.msg)
		}
	}
	return o.validateSecurity()
}

// validateSecurity checks the TLS, identity and etcd TLS options. Every
// error names the flags and says how to fix them.
func (o Options) validateSecurity() error {
	switch {
	case o.TLSCertFile != "" && o.TLSKeyFile == "":
		return fmt.Errorf("--tls-cert needs --tls-key: give the registrar's certificate and its private key together (or neither, for plaintext development mode)")
	case o.TLSKeyFile != "" && o.TLSCertFile == "":
		return fmt.Errorf("--tls-key needs --tls-cert: give the registrar's certificate and its private key together (or neither, for plaintext development mode)")
	case o.TLSClientCAFile != "" && o.TLSCertFile == "":
		return fmt.Errorf("--tls-client-ca needs --tls-cert and --tls-key: client certificates can only be verified over TLS (aether certs issue --server HOST makes a pair)")
	case o.TLSClientCAFile != "" && o.TrustDomain == "":
		return fmt.Errorf("--tls-client-ca needs --trust-domain: client identities are SPIFFE IDs of one trust domain (the one given to aether certs init, e.g. --trust-domain example.org)")
	case o.TrustDomain != "" && o.TLSClientCAFile == "":
		return fmt.Errorf("--trust-domain is only used with --tls-client-ca: without a client CA no client is authenticated; add --tls-client-ca (the CA's ca.pem) or drop --trust-domain")
	case o.OperatorPrefix != "" && o.TrustDomain == "":
		return fmt.Errorf("--operator-prefix needs --trust-domain and --tls-client-ca: operators are identified by their client certificates")
	case o.TLSReloadInterval < 0:
		return fmt.Errorf("--tls-reload-interval must be positive")
	}
	if o.TrustDomain != "" {
		if err := authz.ValidateTrustDomain(o.TrustDomain); err != nil {
			return fmt.Errorf("--trust-domain: %v", err)
		}
		if _, err := authz.NormalizeOperatorPrefix(o.TrustDomain, o.OperatorPrefix); err != nil {
			return fmt.Errorf("--operator-prefix: %v", err)
		}
	}
	if o.EtcdTLSEnabled() {
		switch {
		case (o.EtcdCert == "") != (o.EtcdKey == ""):
			return fmt.Errorf("--etcd-cert and --etcd-key go together: give the registrar's etcd client certificate and its key, or neither")
		case len(o.EtcdEndpoints) == 0:
			return fmt.Errorf("--etcd-cacert, --etcd-cert and --etcd-key apply to an external etcd: add --etcd-endpoints https://HOST:2379 or drop them (the embedded etcd is reached over loopback)")
		}
		for _, ep := range o.EtcdEndpoints {
			if strings.HasPrefix(strings.TrimSpace(ep), "http://") {
				return fmt.Errorf("--etcd-endpoints %s is plaintext but etcd TLS is configured (--etcd-cacert/--etcd-cert/--etcd-key); use https://%s", ep, strings.TrimPrefix(strings.TrimSpace(ep), "http://"))
			}
		}
	}
	return o.validateEtcdTLS()
}

// validateEtcdTLS checks the embedded etcd's and the peer etcd TLS options.
func (o Options) validateEtcdTLS() error {
	pairs := []struct{ cert, key, ca, certFlag, keyFlag, caFlag string }{
		{o.EmbeddedEtcdCert, o.EmbeddedEtcdKey, o.EmbeddedEtcdClientCA, "--embedded-etcd-cert", "--embedded-etcd-key", "--embedded-etcd-client-ca"},
		{o.EmbeddedEtcdPeerCert, o.EmbeddedEtcdPeerKey, o.EmbeddedEtcdPeerCA, "--embedded-etcd-peer-cert", "--embedded-etcd-peer-key", "--embedded-etcd-peer-ca"},
	}
	for _, p := range pairs {
		switch {
		case (p.cert == "") != (p.key == ""):
			return fmt.Errorf("%s and %s go together: give the embedded etcd's certificate and its key, or neither (aether certs issue --server HOST makes a pair)", p.certFlag, p.keyFlag)
		case p.ca != "" && p.cert == "":
			return fmt.Errorf("%s needs %s and %s: certificates can only be required over TLS", p.caFlag, p.certFlag, p.keyFlag)
		}
	}
	if o.EmbeddedEtcdTLSEnabled() && len(o.EtcdEndpoints) > 0 {
		return fmt.Errorf("--embedded-etcd-cert, --embedded-etcd-key, --embedded-etcd-client-ca and --embedded-etcd-peer-* configure the embedded etcd, which does not run with --etcd-endpoints; drop them, or use --etcd-cacert/--etcd-cert/--etcd-key for the external etcd")
	}
	if o.PeerEtcdTLSEnabled() {
		switch {
		case (o.PeerEtcdCert == "") != (o.PeerEtcdKey == ""):
			return fmt.Errorf("--peer-etcd-cert and --peer-etcd-key go together: give the replicator's client certificate for peer etcd and its key, or neither")
		case len(o.PeerEtcd) == 0:
			return fmt.Errorf("--peer-etcd-cacert, --peer-etcd-cert and --peer-etcd-key apply to peer regions' etcd: add --peer-etcd region=https://HOST:2379 or drop them")
		}
		for _, spec := range o.PeerEtcd {
			_, eps, _ := strings.Cut(spec, "=")
			for _, ep := range strings.Split(eps, ",") {
				if ep = strings.TrimSpace(ep); strings.HasPrefix(ep, "http://") {
					return fmt.Errorf("--peer-etcd %s: endpoint %s is plaintext but peer etcd TLS is configured (--peer-etcd-cacert/--peer-etcd-cert/--peer-etcd-key); use https://%s", spec, ep, strings.TrimPrefix(ep, "http://"))
				}
			}
		}
	}
	return nil
}
