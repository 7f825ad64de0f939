package server

import (
	"fmt"
	"github.com/aethermesh/aether/internal/defaults"
	"log/slog"
	"strings"
	"time"

	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/registrar"
)

// Config configures a registrar process: where its etcd is, where it
// serves, how it secures that, and the replica it runs (the embedded
// registrar.Options, whose fields read as the Config's own). Zero values
// take the defaults of DefaultConfig.
type Config struct {
	// The replica: identity, sync, write-behind, streams, nodes, the
	// limits it enforces on what it stores, the logger (which the process
	// logs to as well).
	registrar.Options

	// Backend. With no EtcdEndpoints the registrar runs an embedded etcd in
	// DataDir, serving clients at EmbeddedEtcdAddr and peers at
	// EmbeddedEtcdPeerAddr.
	EtcdEndpoints        []string
	DataDir              string
	EmbeddedEtcdAddr     string
	EmbeddedEtcdPeerAddr string
	// Backend is the store: BackendEtcd (the default: the options above),
	// BackendDynamoDB (DynamoDB, below) or BackendKubernetes (the API
	// server's objects, below); with the last two no embedded etcd runs.
	Backend string
	// DynamoDB: the table (made by `aether dynamodb create-table`), and
	// the region and endpoint where the SDK's standard chain (environment,
	// shared config, web identity, instance metadata) does not say them.
	DynamoDBTable    string
	DynamoDBRegion   string
	DynamoDBEndpoint string
	// DynamoDBFullScanInterval is how often the poll is a full Scan, the
	// backstop for a write the incremental poll missed (default 5m); at
	// 100k endpoints the scans are most of the read bill
	// (docs/benchmarks.md).
	DynamoDBFullScanInterval time.Duration
	// Kubernetes (--backend kubernetes, kubernetes.go): the kubeconfig
	// (else KUBECONFIG, else the pod's service account), the namespace
	// of the backend's objects (else the kubeconfig context's or the
	// pod's), and whether the registrar installs its CRDs itself.
	Kubeconfig            string
	KubernetesNamespace   string
	KubernetesInstallCRDs bool

	// Serving. GRPCAddr serves the Registrar API, gRPC health and
	// reflection; HTTPAddr serves /healthz, /readyz and /metrics. Port 0
	// picks a free port (see Server.GRPCAddr). Empty takes
	// DefaultListenAddrs: loopback only without TLS.
	GRPCAddr string
	HTTPAddr string
	// XDSAddr, when set, serves xDS (package xds: ADS and the per-type
	// services, state of the world and delta) for proxyless gRPC clients
	// and gateways that run no agent, on a gRPC server of its own, with
	// the same TLS (and client certificate requirement) as GRPCAddr. Empty
	// means off.
	XDSAddr string
	// EnablePprof serves Go's runtime profiles at /debug/pprof/ on HTTPAddr,
	// as etcd's --enable-pprof does. Off by default: a profile costs CPU and
	// shows internals, so it is for diagnosing, behind the same TLS as
	// /metrics.
	EnablePprof bool

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

	// Limits of the gRPC layer (see docs/security.md, "Limits").
	// MaxRecvMsgSize bounds one gRPC request message in bytes (gRPC answers
	// RESOURCE_EXHAUSTED). MaxStreamsPerIdentity bounds the
	// open WatchEndpoints/Subscribe streams of one caller: its SPIFFE ID
	// with mTLS, its IP address otherwise; negative means unlimited (the
	// CLI's --max-streams-per-identity 0).
	MaxRecvMsgSize        int
	MaxStreamsPerIdentity int

	// Peer-watch (Options.PeerWatch): PeerAdvertiseAddr is the gRPC
	// address this replica's member record gives its peers (default: the
	// bound GRPCAddr, with this host's name when it is bound to every
	// interface). With TLS on, peers are dialed with this registrar's own
	// certificate (TLSCertFile) as the client identity, their server
	// certificates verified against PeerWatchCACert (default
	// TLSClientCAFile).
	PeerAdvertiseAddr string
	PeerWatchCACert   string

	// EndpointSlices: discovery.k8s.io/v1 EndpointSlices of this origin's
	// services for Kubernetes-native consumers (endpointslice.go).
	EndpointSlices EndpointSlicesConfig
}

// TLSEnabled reports whether the registrar serves TLS.
func (c Config) TLSEnabled() bool { return c.TLSCertFile != "" }

// AuthzEnabled reports whether client certificates are required and calls
// authorized.
func (c Config) AuthzEnabled() bool { return c.TLSClientCAFile != "" }

// EtcdTLSEnabled reports whether the registrar talks TLS to etcd.
func (c Config) EtcdTLSEnabled() bool {
	return c.EtcdCACert != "" || c.EtcdCert != "" || c.EtcdKey != ""
}

// EmbeddedEtcdTLSEnabled reports whether any embedded etcd TLS option is set.
func (c Config) EmbeddedEtcdTLSEnabled() bool {
	return c.EmbeddedEtcdCert != "" || c.EmbeddedEtcdKey != "" || c.EmbeddedEtcdClientCA != "" ||
		c.EmbeddedEtcdPeerCert != "" || c.EmbeddedEtcdPeerKey != "" || c.EmbeddedEtcdPeerCA != ""
}

// PeerEtcdTLSEnabled reports whether the replicator talks TLS to peer etcd.
func (c Config) PeerEtcdTLSEnabled() bool {
	return c.PeerEtcdCACert != "" || c.PeerEtcdCert != "" || c.PeerEtcdKey != ""
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

// DefaultConfig returns the defaults the CLI flags show (the plaintext
// listen addresses, see DefaultListenAddrs; the replica's and the gRPC
// service's: registrar.DefaultOptions with peer-watch on, and at most 64
// streams per caller).
func DefaultConfig() Config {
	o := registrar.DefaultOptions()
	// On: the disruption battery drops nothing with it on either backend,
	// and cross-replica propagation no longer waits on the batch interval
	// or DynamoDB's poll (docs/benchmarks.md, "Peer-watch"). The replica's
	// own default is off, since only this process knows the address its
	// peers dial (its gRPC listener, or --peer-advertise-addr).
	o.PeerWatch = true
	return Config{
		Options:                  o,
		Backend:                  BackendEtcd,
		DynamoDBFullScanInterval: dynamoFullScanDefault,
		DataDir:                  "./aether-data",
		EmbeddedEtcdAddr:         "127.0.0.1:2379",
		EmbeddedEtcdPeerAddr:     "127.0.0.1:2380",
		GRPCAddr:                 DefaultGRPCAddr,
		HTTPAddr:                 DefaultHTTPAddr,
		ReplicationLeaseTTL:      30 * time.Second,
		TLSReloadInterval:        10 * time.Second,
		MaxRecvMsgSize:           4 << 20,
		MaxStreamsPerIdentity:    64,
	}
}

// withDefaults fills the process's zero fields from DefaultConfig. The
// replica's are left to registrar.New, which alone knows what an empty
// SyncMode resolves to on its backend (Launch copies back the result).
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	defaults.Set(&c.Backend, BackendEtcd)
	defaults.Set(&c.DataDir, d.DataDir)
	defaults.Set(&c.EmbeddedEtcdAddr, d.EmbeddedEtcdAddr)
	defaults.Set(&c.EmbeddedEtcdPeerAddr, d.EmbeddedEtcdPeerAddr)
	grpcAddr, httpAddr := DefaultListenAddrs(c.TLSEnabled())
	defaults.Set(&c.GRPCAddr, grpcAddr)
	defaults.Set(&c.HTTPAddr, httpAddr)
	defaults.Set(&c.ReplicationLeaseTTL, d.ReplicationLeaseTTL)
	defaults.Set(&c.TLSReloadInterval, d.TLSReloadInterval)
	defaults.Set(&c.MaxRecvMsgSize, d.MaxRecvMsgSize)
	defaults.Set(&c.MaxStreamsPerIdentity, d.MaxStreamsPerIdentity)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports the first option that cannot work, naming the flag:
// the replica's first (registrar.Options.Validate), then the process's.
func (c Config) Validate() error {
	if err := c.Options.Validate(); err != nil {
		return err
	}
	if err := c.validateKubernetes(); err != nil { // then validateBackend
		return err
	}
	checks := []struct {
		bad  bool
		flag string
		msg  string
	}{
		{c.ReplicationLeaseTTL < 0, "--replication-lease-ttl", "must be positive"},
		{c.ReplicationLeaseTTL > 0 && c.ReplicationLeaseTTL < 3*time.Second, "--replication-lease-ttl", "must be at least 3s (the replicator's election session must be shorter)"},
		{c.MaxRecvMsgSize < 0, "--max-recv-msg-size", "must be positive"},
		{c.MaxRecvMsgSize > 0 && c.MaxRecvMsgSize < 64<<10, "--max-recv-msg-size", "must be at least 65536 bytes (64 KiB), or a valid registration may not fit"},
	}
	for _, ch := range checks {
		if ch.bad {
			return fmt.Errorf("%s %s", ch.flag, ch.msg)
		}
	}
	if err := c.validatePeerWatch(); err != nil {
		return err
	}
	if err := c.validateEndpointSlices(); err != nil {
		return err
	}
	return c.validateSecurity()
}

// validatePeerWatch checks the peer-watch options that need others.
func (c Config) validatePeerWatch() error {
	switch {
	case !c.PeerWatch && (c.PeerAdvertiseAddr != "" || c.PeerWatchCACert != ""):
		return fmt.Errorf("--peer-advertise-addr and --peer-watch-cacert are only used with --peer-watch: add --peer-watch or drop them")
	case c.PeerWatchCACert != "" && c.TLSCertFile == "":
		return fmt.Errorf("--peer-watch-cacert is only used with --tls-cert: without TLS, peers are dialed in plaintext")
	case c.PeerWatch && c.TLSCertFile != "" && c.PeerWatchCACert == "" && c.TLSClientCAFile == "":
		return fmt.Errorf("--peer-watch with --tls-cert needs a CA to verify peer registrars by: add --peer-watch-cacert (or --tls-client-ca)")
	}
	return nil
}

// validateSecurity checks the TLS, identity and etcd TLS options. Every
// error names the flags and says how to fix them.
func (c Config) validateSecurity() error {
	switch {
	case c.TLSCertFile != "" && c.TLSKeyFile == "":
		return fmt.Errorf("--tls-cert needs --tls-key: give the registrar's certificate and its private key together (or neither, for plaintext development mode)")
	case c.TLSKeyFile != "" && c.TLSCertFile == "":
		return fmt.Errorf("--tls-key needs --tls-cert: give the registrar's certificate and its private key together (or neither, for plaintext development mode)")
	case c.TLSClientCAFile != "" && c.TLSCertFile == "":
		return fmt.Errorf("--tls-client-ca needs --tls-cert and --tls-key: client certificates can only be verified over TLS (aether certs issue --server HOST makes a pair)")
	case c.TLSClientCAFile != "" && c.TrustDomain == "":
		return fmt.Errorf("--tls-client-ca needs --trust-domain: client identities are SPIFFE IDs of one trust domain (the one given to aether certs init, e.g. --trust-domain example.org)")
	case c.TrustDomain != "" && c.TLSClientCAFile == "":
		return fmt.Errorf("--trust-domain is only used with --tls-client-ca: without a client CA no client is authenticated; add --tls-client-ca (the CA's ca.pem) or drop --trust-domain")
	case c.OperatorPrefix != "" && c.TrustDomain == "":
		return fmt.Errorf("--operator-prefix needs --trust-domain and --tls-client-ca: operators are identified by their client certificates")
	case c.TLSReloadInterval < 0:
		return fmt.Errorf("--tls-reload-interval must be positive")
	}
	if c.TrustDomain != "" {
		if err := authz.ValidateTrustDomain(c.TrustDomain); err != nil {
			return fmt.Errorf("--trust-domain: %v", err)
		}
		if _, err := authz.NormalizeOperatorPrefix(c.TrustDomain, c.OperatorPrefix); err != nil {
			return fmt.Errorf("--operator-prefix: %v", err)
		}
	}
	if c.EtcdTLSEnabled() {
		switch {
		case (c.EtcdCert == "") != (c.EtcdKey == ""):
			return fmt.Errorf("--etcd-cert and --etcd-key go together: give the registrar's etcd client certificate and its key, or neither")
		case len(c.EtcdEndpoints) == 0:
			return fmt.Errorf("--etcd-cacert, --etcd-cert and --etcd-key apply to an external etcd: add --etcd-endpoints https://HOST:2379 or drop them (the embedded etcd is reached over loopback)")
		}
		for _, ep := range c.EtcdEndpoints {
			if strings.HasPrefix(strings.TrimSpace(ep), "http://") {
				return fmt.Errorf("--etcd-endpoints %s is plaintext but etcd TLS is configured (--etcd-cacert/--etcd-cert/--etcd-key); use https://%s", ep, strings.TrimPrefix(strings.TrimSpace(ep), "http://"))
			}
		}
	}
	return c.validateEtcdTLS()
}

// validateEtcdTLS checks the embedded etcd's and the peer etcd TLS options.
func (c Config) validateEtcdTLS() error {
	pairs := []struct{ cert, key, ca, certFlag, keyFlag, caFlag string }{
		{c.EmbeddedEtcdCert, c.EmbeddedEtcdKey, c.EmbeddedEtcdClientCA, "--embedded-etcd-cert", "--embedded-etcd-key", "--embedded-etcd-client-ca"},
		{c.EmbeddedEtcdPeerCert, c.EmbeddedEtcdPeerKey, c.EmbeddedEtcdPeerCA, "--embedded-etcd-peer-cert", "--embedded-etcd-peer-key", "--embedded-etcd-peer-ca"},
	}
	for _, p := range pairs {
		switch {
		case (p.cert == "") != (p.key == ""):
			return fmt.Errorf("%s and %s go together: give the embedded etcd's certificate and its key, or neither (aether certs issue --server HOST makes a pair)", p.certFlag, p.keyFlag)
		case p.ca != "" && p.cert == "":
			return fmt.Errorf("%s needs %s and %s: certificates can only be required over TLS", p.caFlag, p.certFlag, p.keyFlag)
		}
	}
	if c.EmbeddedEtcdTLSEnabled() && len(c.EtcdEndpoints) > 0 {
		return fmt.Errorf("--embedded-etcd-cert, --embedded-etcd-key, --embedded-etcd-client-ca and --embedded-etcd-peer-* configure the embedded etcd, which does not run with --etcd-endpoints; drop them, or use --etcd-cacert/--etcd-cert/--etcd-key for the external etcd")
	}
	if c.PeerEtcdTLSEnabled() {
		switch {
		case (c.PeerEtcdCert == "") != (c.PeerEtcdKey == ""):
			return fmt.Errorf("--peer-etcd-cert and --peer-etcd-key go together: give the replicator's client certificate for peer etcd and its key, or neither")
		case len(c.PeerEtcd) == 0:
			return fmt.Errorf("--peer-etcd-cacert, --peer-etcd-cert and --peer-etcd-key apply to peer regions' etcd: add --peer-etcd region=https://HOST:2379 or drop them")
		}
		for _, spec := range c.PeerEtcd {
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
