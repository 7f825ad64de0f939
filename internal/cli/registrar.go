package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aethermesh/aether/backend/etcd/replicator"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// serveRegistrar runs the registrar until ctx is cancelled.
func serveRegistrar(ctx context.Context, opts server.Config) error {
	return server.Serve(ctx, opts)
}

func newRegistrarCmd(d deps) *cobra.Command {
	opts := server.DefaultConfig()
	var logLevel, logFormat string

	cmd := &cobra.Command{
		Use:   "registrar",
		Short: "Run a registrar",
		Long: `Run a registrar: the cluster's write choke point and watch cache over etcd.

With no --etcd-endpoints the registrar runs an embedded etcd in --data-dir.
It serves the Registrar gRPC API on --grpc-addr and /healthz, /readyz and
/metrics on --http-addr (and xDS on --xds-addr when given), and runs until interrupted (SIGINT or SIGTERM),
then shuts down gracefully. Without TLS both listen on loopback unless given
explicitly. Until its snapshot is loaded from etcd it answers every call
with UNAVAILABLE saying what it waits for (see docs/operations.md).

A flag whose zero would only mean "the default" (--node-ttl 0s,
--write-batch-size 0, ...) is refused: leave it out for the default.

With --tls-cert and --tls-key it serves TLS; with --tls-client-ca and
--trust-domain as well it requires client certificates and lets a node
write only its own endpoints and node record (see docs/security.md).
Without them it serves plaintext and warns: development only.`,
		Example: `  aether registrar --cluster-name c1 --region eu-west --zone eu-west-1a
  aether registrar --etcd-endpoints http://etcd-0:2379,http://etcd-1:2379
  AETHER_GRPC_ADDR=:9443 AETHER_LOG_FORMAT=json aether registrar
  aether registrar --trust-domain example.org --tls-cert server-localhost.pem \
    --tls-key server-localhost-key.pem --tls-client-ca ca.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(cmd.ErrOrStderr(), logLevel, logFormat)
			if err != nil {
				return err
			}
			if err := refuseZeros(cmd.Flags(), append(registrarZeroFlags, endpointSliceZeroFlags...)...); err != nil {
				return err
			}
			endpointSliceDefaults(cmd.Flags(), &opts)
			// Plaintext listens on loopback unless told otherwise; with TLS
			// the defaults are every interface (server.DefaultListenAddrs).
			grpcAddr, httpAddr := server.DefaultListenAddrs(opts.TLSEnabled())
			if !cmd.Flags().Changed("grpc-addr") {
				opts.GRPCAddr = grpcAddr
			}
			if !cmd.Flags().Changed("http-addr") {
				opts.HTTPAddr = httpAddr
			}
			if !cmd.Flags().Changed("sync-mode") {
				// The flag shows the default on etcd; left out, the
				// registrar picks by its backend's capabilities (poll on
				// one without a change feed), which an explicit watch
				// would refuse.
				opts.SyncMode = ""
			}
			if err := validateRegistrarOptions(opts); err != nil {
				return err
			}
			if opts.MaxStreamsPerIdentity == 0 {
				opts.MaxStreamsPerIdentity = -1 // the flag's 0 is unlimited; the option's 0 is the default
			}
			opts.Logger = logger
			return d.serve(cmd.Context(), opts)
		},
	}

	f := cmd.Flags()
	f.StringSliceVar(&opts.EtcdEndpoints, "etcd-endpoints", opts.EtcdEndpoints, "etcd client URLs, comma-separated; empty runs an embedded etcd")
	f.StringVar(&opts.DataDir, "data-dir", opts.DataDir, "data directory of the embedded etcd")
	f.StringVar(&opts.EmbeddedEtcdAddr, "embedded-etcd-addr", opts.EmbeddedEtcdAddr, "client address of the embedded etcd")
	f.StringVar(&opts.EmbeddedEtcdPeerAddr, "embedded-etcd-peer-addr", opts.EmbeddedEtcdPeerAddr, "peer address of the embedded etcd")
	addDynamoDBFlags(f, &opts)
	addEndpointSliceFlags(f, &opts)
	addKubernetesFlags(f, &opts)
	f.StringVar(&opts.GRPCAddr, "grpc-addr", opts.GRPCAddr, "address of the Registrar gRPC API (port 0 picks a free port); default loopback only without TLS, "+server.DefaultTLSGRPCAddr+" (every interface) with --tls-cert")
	f.StringVar(&opts.HTTPAddr, "http-addr", opts.HTTPAddr, "address of /healthz, /readyz and /metrics (port 0 picks a free port); default loopback only without TLS, "+server.DefaultTLSHTTPAddr+" (every interface) with --tls-cert")
	f.StringVar(&opts.XDSAddr, "xds-addr", "", "serve xDS (ADS, CDS/EDS/LDS/RDS, state of the world and delta) for proxyless gRPC clients (xds:///service) and gateways on this address, with the same TLS as --grpc-addr; empty (the default) serves none. Resources are named after the service, or service:port for a service with several ports (see README, \"xDS\")")
	f.BoolVar(&opts.EnablePprof, "enable-pprof", false, "serve Go runtime profiles at /debug/pprof/ on --http-addr (for diagnosing; off by default)")
	f.StringVar(&opts.ClusterName, "cluster-name", opts.ClusterName, "cluster this registrar writes for")
	f.StringVar(&opts.Region, "region", opts.Region, "region this registrar writes for")
	f.StringVar(&opts.Zone, "zone", opts.Zone, "zone this registrar runs in (optional)")
	f.StringVar(&opts.SyncMode, "sync-mode", opts.SyncMode, "how this replica learns other replicas' writes: watch (an etcd watch, applied as changes arrive) or poll (no watch: only from the full re-list every --sync-interval; for comparison, and as on backends without a change feed)")
	f.DurationVar(&opts.SyncInterval, "sync-interval", opts.SyncInterval, "full re-list from etcd every interval, as a backstop to the watch (with --sync-mode poll, the only sync)")
	f.DurationVar(&opts.SyncDebounce, "sync-debounce", opts.SyncDebounce, "at most one re-list per this interval when the watch asks for one")
	f.DurationVar(&opts.WriteBatchInterval, "write-batch-interval", opts.WriteBatchInterval, "flush pending writes to etcd every interval")
	f.IntVar(&opts.WriteBatchSize, "write-batch-size", opts.WriteBatchSize, "flush sooner once this many writes are pending")
	f.IntVar(&opts.WriteQueueLimit, "write-queue-limit", opts.WriteQueueLimit, "refuse writes once this many endpoints wait to be persisted")
	f.IntVar(&opts.WatchHistory, "watch-history", opts.WatchHistory, "events retained so watchers can resume")
	f.IntVar(&opts.WatchBuffer, "watch-buffer", opts.WatchBuffer, "undelivered messages per watch stream before it is cut off")
	f.DurationVar(&opts.ProgressInterval, "watch-progress-interval", opts.ProgressInterval, "send idle watch streams a PROGRESS bookmark every interval")
	f.StringArrayVar(&opts.PeerEtcd, "peer-etcd", nil, "peer region's etcd for multi-region replication, region=endpoint[,endpoint] (repeatable)")
	f.DurationVar(&opts.ReplicationLeaseTTL, "replication-lease-ttl", opts.ReplicationLeaseTTL, "lease TTL of this region's keys mirrored into peer regions; they expire there this long after the region stops renewing it")
	f.DurationVar(&opts.NodeTTL, "node-ttl", opts.NodeTTL, "lease TTL of node records: a node whose heartbeats stop disappears, with its endpoints, this long after its last heartbeat")
	f.StringVar(&opts.TLSCertFile, "tls-cert", "", "serve gRPC and HTTP over TLS with this certificate (PEM; reloaded when the file changes); without it the registrar serves plaintext, for development only")
	f.StringVar(&opts.TLSKeyFile, "tls-key", "", "private key of --tls-cert (PEM)")
	f.StringVar(&opts.TLSClientCAFile, "tls-client-ca", "", "require gRPC client certificates issued by this CA (PEM bundle) and authorize each call by the caller's SPIFFE ID; needs --trust-domain")
	f.StringVar(&opts.TrustDomain, "trust-domain", "", "SPIFFE trust domain of client identities (e.g. example.org); certificates from another trust domain are rejected")
	f.StringVar(&opts.OperatorPrefix, "operator-prefix", "", "SPIFFE ID prefix of operator identities, which may write anything (default spiffe://<trust-domain>/operator/)")
	f.DurationVar(&opts.TLSReloadInterval, "tls-reload-interval", opts.TLSReloadInterval, "check --tls-cert, --tls-key and --tls-client-ca for changes every interval")
	f.StringVar(&opts.EtcdCACert, "etcd-cacert", "", "CA bundle (PEM) to verify an external etcd's server certificate (https:// --etcd-endpoints)")
	f.StringVar(&opts.EtcdCert, "etcd-cert", "", "client certificate (PEM) for an external etcd that requires one")
	f.StringVar(&opts.EtcdKey, "etcd-key", "", "private key of --etcd-cert (PEM)")
	f.StringVar(&opts.EmbeddedEtcdCert, "embedded-etcd-cert", "", "serve the embedded etcd's client URL over TLS (https://) with this certificate (PEM); also the registrar's client certificate to it when --embedded-etcd-client-ca is set")
	f.StringVar(&opts.EmbeddedEtcdKey, "embedded-etcd-key", "", "private key of --embedded-etcd-cert (PEM)")
	f.StringVar(&opts.EmbeddedEtcdClientCA, "embedded-etcd-client-ca", "", "require the embedded etcd's clients to present a certificate of this CA (PEM bundle); needs --embedded-etcd-cert")
	f.StringVar(&opts.EmbeddedEtcdPeerCert, "embedded-etcd-peer-cert", "", "serve the embedded etcd's peer URL over TLS (https://) with this certificate (PEM)")
	f.StringVar(&opts.EmbeddedEtcdPeerKey, "embedded-etcd-peer-key", "", "private key of --embedded-etcd-peer-cert (PEM)")
	f.StringVar(&opts.EmbeddedEtcdPeerCA, "embedded-etcd-peer-ca", "", "require the embedded etcd's peers to present a certificate of this CA (PEM bundle); needs --embedded-etcd-peer-cert")
	f.StringVar(&opts.PeerEtcdCACert, "peer-etcd-cacert", "", "CA bundle (PEM) to verify peer regions' etcd server certificates (--peer-etcd endpoints become https://)")
	f.StringVar(&opts.PeerEtcdCert, "peer-etcd-cert", "", "client certificate (PEM) the replicator presents to peer regions' etcd")
	f.StringVar(&opts.PeerEtcdKey, "peer-etcd-key", "", "private key of --peer-etcd-cert (PEM)")
	f.IntVar(&opts.MaxRecvMsgSize, "max-recv-msg-size", opts.MaxRecvMsgSize, "largest gRPC request message accepted, in bytes; larger ones get RESOURCE_EXHAUSTED")
	f.IntVar(&opts.MaxMetadataEntries, "max-metadata-entries", opts.MaxMetadataEntries, "most metadata entries of an endpoint (and labels of a node); more get INVALID_ARGUMENT")
	f.IntVar(&opts.MaxMetadataBytes, "max-metadata-bytes", opts.MaxMetadataBytes, "most bytes of metadata keys plus values of an endpoint (and labels of a node); more get INVALID_ARGUMENT")
	f.IntVar(&opts.MaxWatchServices, "max-watch-services", opts.MaxWatchServices, "most services in one watch filter (WatchEndpoints, Subscribe start and updates); more get INVALID_ARGUMENT")
	f.IntVar(&opts.MaxStreamsPerIdentity, "max-streams-per-identity", opts.MaxStreamsPerIdentity, "most open watch streams per client identity (SPIFFE ID with mTLS, IP address otherwise); 0 = unlimited; more get RESOURCE_EXHAUSTED")
	f.IntVar(&opts.MaxEndpointsPerNode, "max-endpoints-per-node", opts.MaxEndpointsPerNode, "most endpoints one node may register; a registration of a new endpoint beyond it gets RESOURCE_EXHAUSTED (updates are always allowed)")
	f.BoolVar(&opts.PeerWatch, "peer-watch", false, "stream this replica's writes to the other replicas of its cluster as they are acknowledged, and apply theirs, so cross-replica freshness does not wait on --write-batch-interval and the backend's feed (the backend stays the source of truth). Off by default until the disruption battery has judged it (docs/architecture.md, \"Peer-watch\")")
	f.StringVar(&opts.PeerAdvertiseAddr, "peer-advertise-addr", "", "gRPC address this replica's peers dial for peer-watch (default: --grpc-addr as bound, with the host name when bound to every interface)")
	f.StringVar(&opts.PeerWatchCACert, "peer-watch-cacert", "", "CA bundle (PEM) verifying peer registrars' server certificates for peer-watch with TLS (default --tls-client-ca); the registrar dials them with --tls-cert as its client identity")
	f.DurationVar(&opts.PeerMemberTTL, "peer-member-ttl", opts.PeerMemberTTL, "lease TTL of this replica's peer-watch member record: a replica that stops renewing drops out of its peers' view this long after")
	f.DurationVar(&opts.PeerDiscoveryInterval, "peer-discovery-interval", opts.PeerDiscoveryInterval, "list the peer-watch member records every interval")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	return cmd
}

// registrarZeroFlags are the registrar flags whose zero server.Config
// would replace with the default (see refuseZeros). The addresses,
// --data-dir, --cluster-name and --region are not listed: an empty one is
// refused by validateRegistrarOptions with its own message.
var registrarZeroFlags = []string{
	"sync-mode", "sync-interval", "sync-debounce",
	"write-batch-interval", "write-batch-size", "write-queue-limit",
	"watch-history", "watch-buffer", "watch-progress-interval",
	"node-ttl", "replication-lease-ttl", "tls-reload-interval",
	"max-recv-msg-size", "max-metadata-entries", "max-metadata-bytes",
	"max-watch-services", "max-endpoints-per-node", "peer-member-ttl", "peer-discovery-interval",
	"dynamodb-full-scan-interval",
}

// validateRegistrarOptions checks the options before anything starts, so a
// typo fails fast with the flag named.
func validateRegistrarOptions(o server.Config) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.MaxStreamsPerIdentity < 0 {
		return fmt.Errorf("--max-streams-per-identity must not be negative (0 means unlimited)")
	}
	names := []struct{ flag, what, value string }{
		{"--cluster-name", "cluster name", o.ClusterName},
		{"--region", "region", o.Region},
	}
	if o.Zone != "" {
		names = append(names, struct{ flag, what, value string }{"--zone", "zone", o.Zone})
	}
	for _, n := range names {
		if err := registry.ValidateName(n.what, n.value); err != nil {
			return fmt.Errorf("%s: %v", n.flag, err)
		}
	}
	if _, err := replicator.ParsePeers(o.Region, o.PeerEtcd); err != nil {
		return err
	}
	addrs := []struct{ flag, value string }{
		{"--grpc-addr", o.GRPCAddr},
		{"--http-addr", o.HTTPAddr},
	}
	if len(o.EtcdEndpoints) == 0 && o.Backend != server.BackendDynamoDB && o.Backend != server.BackendKubernetes {
		if o.DataDir == "" {
			return fmt.Errorf("--data-dir must not be empty when the embedded etcd is used (no --etcd-endpoints)")
		}
		addrs = append(addrs,
			struct{ flag, value string }{"--embedded-etcd-addr", o.EmbeddedEtcdAddr},
			struct{ flag, value string }{"--embedded-etcd-peer-addr", o.EmbeddedEtcdPeerAddr},
		)
	}
	if o.XDSAddr != "" {
		addrs = append(addrs, struct{ flag, value string }{"--xds-addr", o.XDSAddr})
	}
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a.value); err != nil {
			return fmt.Errorf("%s %q: not a host:port address (%v); use e.g. 127.0.0.1:9443 or :9443", a.flag, a.value, unwrapAddrErr(err))
		}
	}
	for i, ep := range o.EtcdEndpoints {
		if strings.TrimSpace(ep) == "" {
			return fmt.Errorf("--etcd-endpoints: entry %d is empty; give comma-separated URLs such as http://etcd-0:2379", i+1)
		}
	}
	return nil
}

// unwrapAddrErr drops the repeated address from a net.AddrError.
func unwrapAddrErr(err error) string {
	if ae, ok := err.(*net.AddrError); ok {
		return ae.Err
	}
	return err.Error()
}

// newLogger builds the registrar's logger writing to w.
func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	switch strings.ToLower(level) {
	case "debug":
		lvl = slog.LevelDebug
	case "info":
		lvl = slog.LevelInfo
	case "warn", "warning":
		lvl = slog.LevelWarn
	case "error":
		lvl = slog.LevelError
	default:
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	ho := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, ho)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", format)
}
