// Package server is the composition root of a registrar process: its
// listeners and TLS, the embedded etcd or the client to an external one,
// the etcd backend, the HTTP mux (health, readiness, metrics, pprof), the
// start-up gate and the multi-region replicator, wired around one replica
// (package registrar). It is the one place that knows the replica runs on
// etcd: the replica sees a backend.Store and a replication status.
package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/backend"
	etcdstore "github.com/aethermesh/aether/backend/etcd"
	"github.com/aethermesh/aether/backend/etcd/embedetcd"
	"github.com/aethermesh/aether/backend/etcd/replicator"
	kubestore "github.com/aethermesh/aether/backend/kubernetes"
	"github.com/aethermesh/aether/console"
	"github.com/aethermesh/aether/internal/pprofhttp"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registrar/grpcapi"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/xds"
)

// Server is a running registrar process: its etcd (embedded or a client to
// an external cluster), the Registrar, and the gRPC and HTTP listeners.
//
// It serves from the moment its listeners are bound, before its backend
// is up: until the snapshot is loaded the Registrar service answers every
// call with UNAVAILABLE saying what it waits for, gRPC health says
// NOT_SERVING and /readyz fails with the same reason (startup.go). A
// client that dialled a registrar whose etcd is unreachable so learns it
// at once, instead of holding a connection that never answers.
type Server struct {
	opts    Config
	etcd    *embedetcd.Server // nil with external etcd; set by load
	cli     *clientv3.Client  // set by load
	reg     *registrar.Registrar
	api     *grpcapi.Service
	backend *startupBackend
	grpc    *grpc.Server
	health  *health.Server
	http    *http.Server
	grpcLis net.Listener
	httpLis net.Listener

	xds     *xds.Server  // nil without --xds-addr
	xdsGRPC *grpc.Server // its own server: xDS clients are not Registrar clients
	xdsLis  net.Listener
	xdsDone chan struct{} // closed when xdsGRPC.Serve has returned

	tls *pki.Reloader // nil without --tls-cert

	console *console.Console // the status page at /ui (ui.go)

	repl     *replicator.Replicator // nil without --peer-etcd; set by load
	replStop context.CancelFunc
	replDone chan struct{}

	dynamo *dynamoBackend   // with --backend dynamodb; nil on etcd
	kube   *kubestore.Store // with --backend kubernetes, once connected (kubernetes.go)

	eslices *endpointSlices // with --endpointslices (endpointslice.go)

	startup  *startup
	loadStop context.CancelFunc
	loadDone chan struct{} // closed when load has returned
}

// Serve runs a registrar until ctx ends, then shuts it down gracefully. It
// serves (UNAVAILABLE, see Server) while its snapshot loads; a start-up
// that fails for good (the embedded etcd cannot start, say) ends Serve with
// that error.
func Serve(ctx context.Context, opts Config) error {
	s, err := Launch(ctx, opts)
	if err != nil {
		return err
	}
	var loadErr error
	select {
	case <-ctx.Done():
	case <-s.loadDone:
		// A start that failed for good ends Serve; one abandoned because
		// ctx ended is the ordinary shutdown.
		if loadErr = s.startup.failure(); loadErr == nil {
			<-ctx.Done()
		}
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := s.Close(closeCtx); loadErr == nil {
		return err
	}
	return loadErr
}

// Start brings a registrar up: the listeners, etcd, the snapshot. It
// returns once the registrar serves, or with an error if ctx ends first
// (the listeners answer UNAVAILABLE meanwhile, see Launch).
func Start(ctx context.Context, opts Config) (*Server, error) {
	s, err := Launch(ctx, opts)
	if err != nil {
		return nil, err
	}
	if err := s.WaitReady(ctx); err != nil {
		closeCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(closeCtx)
		return nil, err
	}
	return s, nil
}

// Launch checks the options, binds the listeners and serves on them at
// once, then starts etcd (or connects to it) and loads the snapshot in the
// background. Until that is done the Registrar service answers UNAVAILABLE
// naming what it waits for; WaitReady waits for it. ctx bounds the start:
// when it ends before the snapshot is loaded, the start is abandoned.
// EtcdClient and EtcdEndpoints are valid once WaitReady has returned nil.
func Launch(ctx context.Context, opts Config) (_ *Server, err error) {
	opts = opts.withDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	s := &Server{opts: opts, loadDone: make(chan struct{})}
	defer func() {
		if err != nil {
			s.teardown()
		}
	}()

	// The registrar exists before its backend does: it is only asked to
	// load once load has connected the backend, and nothing reaches it
	// through the API before then (the gate in startup.go).
	s.startup = newStartup(log)
	s.backend = &startupBackend{startup: s.startup}
	var store backend.Store = s.backend
	if opts.Backend == BackendDynamoDB {
		// A store with fewer capabilities, so the registrar finds what it
		// lacks (dynamodb.go).
		s.dynamo = &dynamoBackend{startup: s.startup, log: log}
		store = s.dynamo
	}
	s.reg, err = registrar.New(opts.Options, store)
	if err != nil {
		return nil, err
	}
	// The replica's defaults are its own, and an empty SyncMode resolves
	// against the backend's capabilities: what it runs with is what
	// Options reports.
	s.opts.Options = s.reg.Options()
	opts = s.opts

	for flag, v := range map[string]string{"--cluster-name": opts.ClusterName, "--region": opts.Region} {
		if err := registry.ValidateName(flag, v); err != nil {
			return nil, err
		}
	}
	if opts.Zone != "" {
		if err := registry.ValidateName("--zone", opts.Zone); err != nil {
			return nil, err
		}
	}
	peers, err := replicator.ParsePeers(opts.Region, opts.PeerEtcd)
	if err != nil {
		return nil, err // names --peer-etcd and the expected form
	}

	// Bind first: a port clash should fail in milliseconds, not after etcd
	// has started.
	if s.grpcLis, err = net.Listen("tcp", opts.GRPCAddr); err != nil {
		return nil, fmt.Errorf("--grpc-addr %s: %w (choose a free address)", opts.GRPCAddr, err)
	}
	if s.httpLis, err = net.Listen("tcp", opts.HTTPAddr); err != nil {
		return nil, fmt.Errorf("--http-addr %s: %w (choose a free address)", opts.HTTPAddr, err)
	}
	if opts.XDSAddr != "" {
		if s.xdsLis, err = net.Listen("tcp", opts.XDSAddr); err != nil {
			return nil, fmt.Errorf("--xds-addr %s: %w (choose a free address, or leave it empty to serve no xDS)", opts.XDSAddr, err)
		}
	}

	// Everything read from files is read now, so that a bad certificate
	// fails the start at once rather than from the background.
	etcdCfg := clientv3.Config{
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		Logger:               zap.NewNop(),
	}
	if opts.EmbeddedEtcdCert != "" && len(opts.EtcdEndpoints) == 0 {
		if etcdCfg.TLS, err = embeddedEtcdClientTLS(opts); err != nil {
			return nil, err
		}
	}
	if opts.EtcdTLSEnabled() {
		// Static: a registrar restarts to pick up a new etcd client
		// certificate (the etcd client keeps one TLS config).
		if etcdCfg.TLS, err = pki.ClientTLSConfig(opts.EtcdCACert, opts.EtcdCert, opts.EtcdKey); err != nil {
			return nil, fmt.Errorf("--etcd-cacert/--etcd-cert/--etcd-key: %w", err)
		}
	}
	var peerClient func(replicator.Peer) (*clientv3.Client, error)
	if opts.PeerEtcdTLSEnabled() {
		peerTLS, err := pki.ClientTLSConfig(opts.PeerEtcdCACert, opts.PeerEtcdCert, opts.PeerEtcdKey)
		if err != nil {
			return nil, fmt.Errorf("--peer-etcd-cacert/--peer-etcd-cert/--peer-etcd-key: %w", err)
		}
		peerClient = replicator.NewTLSPeerClient(peerTLS)
	}

	var grpcCreds []grpc.ServerOption
	if opts.TLSEnabled() {
		var cfg *tls.Config
		cfg, s.tls, err = pki.ServerTLSConfig(opts.TLSCertFile, opts.TLSKeyFile, opts.TLSClientCAFile, opts.AuthzEnabled(), opts.TLSReloadInterval, pki.WithLogger(log))
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key/--tls-client-ca: %w", err)
		}
		grpcCreds = append(grpcCreds, grpc.Creds(credentials.NewTLS(cfg)))
		// HTTP (/healthz, /readyz, /metrics) serves the same, reloaded
		// certificate but requires no client certificate: health probes and
		// scrapers rarely have one, and these endpoints write nothing. With
		// mTLS on it verifies one when given, against the same reloaded
		// client CA as gRPC, so that the console (/ui) can admit operators
		// only (ui.go).
		httpTLS := &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: s.tls.GetCertificate,
			NextProtos:     []string{"h2", "http/1.1"},
		}
		if opts.AuthzEnabled() {
			httpTLS.ClientAuth = tls.VerifyClientCertIfGiven
			httpTLS.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
				c := httpTLS.Clone()
				c.GetConfigForClient = nil
				c.ClientCAs = s.tls.CAPool()
				return c, nil
			}
		}
		s.httpLis = tls.NewListener(s.httpLis, httpTLS)
		if opts.AuthzEnabled() {
			prefix, _ := authz.NormalizeOperatorPrefix(opts.TrustDomain, opts.OperatorPrefix) // validated
			log.Info("mTLS on: client certificates required, calls authorized per identity",
				"trust_domain", opts.TrustDomain, "operator_prefix", prefix, "cert", opts.TLSCertFile, "client_ca", opts.TLSClientCAFile)
		} else {
			log.Warn("TLS without --tls-client-ca: clients are NOT authenticated and any client may write any endpoint; add --tls-client-ca and --trust-domain for production",
				"cert", opts.TLSCertFile)
		}
	} else {
		log.Warn("PLAINTEXT: no --tls-cert/--tls-key, so gRPC and HTTP are unencrypted and unauthenticated and any client may write any endpoint; use this for local development only (see docs/security.md)",
			"grpc", s.GRPCAddr(), "http", s.HTTPAddr(), "loopback_only", loopback(s.GRPCAddr()) && loopback(s.HTTPAddr()))
	}
	if len(opts.EtcdEndpoints) > 0 && !opts.EtcdTLSEnabled() {
		log.Warn("etcd client connection without TLS (no --etcd-cacert/--etcd-cert/--etcd-key)", "endpoints", opts.EtcdEndpoints)
	}

	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	s.health.SetServingStatus(registrarv1.Registrar_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", s.readyz)
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg.MetricsRegistry(), promhttp.HandlerOpts{}))
	if opts.EnablePprof {
		pprofhttp.Mount(mux)
	}
	s.http = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := s.http.Serve(s.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "err", err)
		}
	}()

	s.grpc = grpc.NewServer(append(grpcCreds,
		grpcapi.ServerCodec(),
		// gRPC refuses a larger request itself with RESOURCE_EXHAUSTED
		// ("grpc: received message larger than max (N vs. M)").
		grpc.MaxRecvMsgSize(opts.MaxRecvMsgSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.ChainUnaryInterceptor(s.startup.unary),
		grpc.ChainStreamInterceptor(s.startup.stream),
	)...)
	api := grpcapi.Config{
		Logger:                log.With("component", "registrar", "cluster", opts.ClusterName, "region", opts.Region),
		Registerer:            s.reg.MetricsRegistry(),
		MaxStreamsPerIdentity: opts.MaxStreamsPerIdentity,
		SharedEncoding:        true, // the server has grpcapi.ServerCodec
		// s.repl is set by load before the startup gate opens, and no
		// Registrar call passes the gate before: the gate orders the two.
		Replication: func() ([]*registrarv1.PeerReplicationStatus, bool) { return replicationStatus(s.repl) },
	}
	if opts.AuthzEnabled() {
		api.Authz = &grpcapi.Authz{TrustDomain: opts.TrustDomain, OperatorPrefix: opts.OperatorPrefix}
	}
	if s.api, err = grpcapi.Register(s.grpc, s.reg, api); err != nil {
		return nil, err
	}
	if opts.PeerWatch {
		if err := s.setupPeerWatch(api); err != nil {
			return nil, err
		}
	}
	healthpb.RegisterHealthServer(s.grpc, s.health)
	reflection.Register(s.grpc)
	go func() {
		if err := s.grpc.Serve(s.grpcLis); err != nil {
			log.Error("grpc server stopped", "err", err)
		}
	}()

	if s.xdsLis != nil {
		if err := s.serveXDS(grpcCreds, mux); err != nil {
			return nil, err
		}
	}

	s.serveConsole(mux)

	if err := s.setupEndpointSlices(); err != nil {
		return nil, err
	}

	loadCtx, cancel := context.WithCancel(ctx)
	s.loadStop = cancel
	go func() {
		defer close(s.loadDone)
		switch err := s.load(loadCtx, etcdCfg, peers, peerClient); {
		case err == nil:
		case loadCtx.Err() != nil:
			s.startup.abandon(err)
		default:
			s.startup.fail(err)
		}
	}()
	return s, nil
}

// load is the background part of a start: the embedded etcd (if any), the
// etcd client, the snapshot, the replicator. Only once all of it is done
// does the server report ready.
func (s *Server) load(ctx context.Context, etcdCfg clientv3.Config, peers []replicator.Peer, peerClient func(replicator.Peer) (*clientv3.Client, error)) error {
	opts, log := s.opts, s.opts.Logger
	if s.dynamo != nil {
		return s.loadDynamo(ctx)
	}
	if opts.Backend == BackendKubernetes {
		return s.loadKubernetes(ctx)
	}
	endpoints := opts.EtcdEndpoints
	if len(endpoints) == 0 {
		dir := filepath.Join(opts.DataDir, "etcd")
		s.startup.waitFor("starting its embedded etcd in " + dir)
		etcd, err := embedetcd.Start(ctx, embedetcd.Config{
			Dir:        dir,
			ClientAddr: opts.EmbeddedEtcdAddr,
			PeerAddr:   opts.EmbeddedEtcdPeerAddr,
			Logger:     log,
			ClientTLS: embedetcd.TLS{
				CertFile: opts.EmbeddedEtcdCert,
				KeyFile:  opts.EmbeddedEtcdKey,
				CAFile:   opts.EmbeddedEtcdClientCA,
			},
			PeerTLS: embedetcd.TLS{
				CertFile: opts.EmbeddedEtcdPeerCert,
				KeyFile:  opts.EmbeddedEtcdPeerKey,
				CAFile:   opts.EmbeddedEtcdPeerCA,
			},
		})
		if err != nil {
			return err
		}
		s.etcd = etcd
		if opts.EmbeddedEtcdCert == "" && !loopback(opts.EmbeddedEtcdAddr) {
			log.Warn("embedded etcd serves clients without TLS (no --embedded-etcd-cert/--embedded-etcd-key); any host that reaches --embedded-etcd-addr can read and write the registry; add them or listen on loopback", "addr", opts.EmbeddedEtcdAddr)
		}
		endpoints = s.etcd.Endpoints()
		log.Info("embedded etcd started", "data_dir", opts.DataDir, "endpoints", endpoints)
	}
	etcdCfg.Endpoints = endpoints
	cli, err := clientv3.New(etcdCfg)
	if err != nil {
		return fmt.Errorf("--etcd-endpoints %v: %w", endpoints, err)
	}
	s.cli = cli
	s.backend.Backend = etcdstore.New(s.cli, etcdstore.Options{Logger: log})

	s.startup.waitFor("loading its snapshot from etcd at " + strings.Join(endpoints, ","))
	probeCtx, stopProbe := context.WithCancel(ctx)
	probed := make(chan struct{})
	go func() { defer close(probed); s.startup.probe(probeCtx, endpoints, etcdCfg.TLS) }()
	err = s.reg.Start(ctx)
	stopProbe()
	<-probed
	if err != nil {
		return err
	}

	if len(peers) > 0 {
		// The replicator is hosted here because it needs what the registrar
		// already has: the local etcd client, and replicas to elect among.
		s.repl, err = replicator.New(replicator.Config{
			Region:     opts.Region,
			Local:      s.cli,
			Peers:      peers,
			PeerClient: peerClient,
			LeaseTTL:   opts.ReplicationLeaseTTL,
			Identity:   s.GRPCAddr(),
			Logger:     log,
			Registerer: s.reg.MetricsRegistry(),
		})
		if err != nil {
			return fmt.Errorf("--peer-etcd: %w", err)
		}
		rctx, cancel := context.WithCancel(context.Background())
		s.replStop, s.replDone = cancel, make(chan struct{})
		go func() {
			defer close(s.replDone)
			if err := s.repl.Run(rctx); err != nil {
				log.Error("replicator stopped", "err", err)
			}
		}()
		log.Info("multi-region replication configured", "peers", len(peers), "lease_ttl", opts.ReplicationLeaseTTL)
	}
	s.serving()
	return nil
}

// serving is the end of a load, on any backend: the snapshot is loaded,
// so xDS starts and the server reports ready.
func (s *Server) serving() {
	opts, log := s.opts, s.opts.Logger
	if s.xds != nil {
		// The feed subscribes to the replica, which refuses until its
		// snapshot is loaded; clients connected meanwhile wait for the
		// first snapshot.
		s.xds.Start()
	}
	s.startEndpointSlices()
	s.startup.ready()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(registrarv1.Registrar_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	log.Info("registrar serving", "grpc", s.GRPCAddr(), "http", s.HTTPAddr(),
		"cluster", opts.ClusterName, "region", opts.Region, "backend", opts.Backend, "tls", opts.TLSEnabled(), "mtls", opts.AuthzEnabled())
}

// serveXDS serves xDS on its own listener and gRPC server: xDS clients
// are not Registrar clients, so neither the Registrar API's codec and
// start-up gate nor its stream limits apply, but its credentials do.
// The status of its clients (aether xds status) is /xds/status on mux,
// the HTTP port's, behind the same TLS as /metrics: mounted here, once
// s.xds exists (a ServeMux takes handlers while it serves).
func (s *Server) serveXDS(creds []grpc.ServerOption, mux *http.ServeMux) (err error) {
	opts, log := s.opts, s.opts.Logger
	s.xds, err = xds.New(xds.Config{
		Source:     s.reg,
		Locality:   xds.Locality{Region: opts.Region, Zone: opts.Zone},
		Logger:     log.With("component", "xds"),
		Registerer: s.reg.MetricsRegistry(),
	})
	if err != nil {
		return fmt.Errorf("--xds-addr: %w", err)
	}
	s.xdsGRPC = grpc.NewServer(append(slices.Clip(creds),
		grpc.MaxRecvMsgSize(opts.MaxRecvMsgSize),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	)...)
	s.xds.Register(s.xdsGRPC)
	mux.Handle("/xds/status", s.xds.StatusHandler())
	lis, done := s.xdsLis, make(chan struct{})
	s.xdsDone = done
	go func() {
		defer close(done)
		if err := s.xdsGRPC.Serve(lis); err != nil {
			log.Error("xds server stopped", "err", err)
		}
	}()
	log.Info("serving xDS", "addr", s.XDSAddr(), "tls", opts.TLSEnabled(), "mtls", opts.AuthzEnabled())
	return nil
}

// XDSAddr is the bound xDS address, "" without --xds-addr.
func (s *Server) XDSAddr() string {
	if s.xdsLis == nil {
		return ""
	}
	return s.xdsLis.Addr().String()
}

// WaitReady waits until the snapshot is loaded and the registrar serves
// (nil), the start failed (its error), or ctx ends.
func (s *Server) WaitReady(ctx context.Context) error {
	select {
	case <-s.loadDone:
		return s.startup.outcome()
	case <-ctx.Done():
		return fmt.Errorf("registrar not ready: %s: %w", s.startup.reason(), ctx.Err())
	}
}

// loopback reports whether host:port listens on loopback only.
func loopback(hostPort string) bool {
	host, _, err := net.SplitHostPort(hostPort)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// embeddedEtcdClientTLS is the registrar's client TLS to its own embedded
// etcd. It trusts --embedded-etcd-client-ca (when given) and the
// certificates of --embedded-etcd-cert itself, which is what the embedded
// etcd serves, so a self-signed or privately issued certificate needs no
// extra CA flag. When the embedded etcd requires client certificates, the
// registrar presents --embedded-etcd-cert/--embedded-etcd-key: pki server
// certificates carry client auth for exactly this (etcd's own gateway
// does the same). Static: the registrar restarts to pick up a new pair.
func embeddedEtcdClientTLS(opts Config) (*tls.Config, error) {
	const flags = "--embedded-etcd-cert/--embedded-etcd-key/--embedded-etcd-client-ca"
	var cert, key string
	if opts.EmbeddedEtcdClientCA != "" {
		cert, key = opts.EmbeddedEtcdCert, opts.EmbeddedEtcdKey
	}
	cfg, err := pki.ClientTLSConfig(opts.EmbeddedEtcdClientCA, cert, key)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flags, err)
	}
	if cfg.RootCAs == nil {
		cfg.RootCAs = x509.NewCertPool()
	}
	raw, err := os.ReadFile(opts.EmbeddedEtcdCert)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flags, err)
	}
	if !cfg.RootCAs.AppendCertsFromPEM(raw) {
		return nil, fmt.Errorf("%s: %s holds no PEM certificate", flags, opts.EmbeddedEtcdCert)
	}
	return cfg, nil
}

// GRPCAddr is the bound gRPC address (useful with port 0).
func (s *Server) GRPCAddr() string { return s.grpcLis.Addr().String() }

// HTTPAddr is the bound HTTP address.
func (s *Server) HTTPAddr() string { return s.httpLis.Addr().String() }

// Registrar is the running registrar.
func (s *Server) Registrar() *registrar.Registrar { return s.reg }

// Close stops serving, persists what is queued (bounded by ctx) and stops
// etcd if embedded.
func (s *Server) Close(ctx context.Context) error {
	// A start still loading is abandoned first: load owns the etcd and
	// the registrar's loops until it returns.
	s.loadStop()
	<-s.loadDone
	s.health.Shutdown()
	s.reg.EndStreams()
	done := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.grpc.Stop() // streams do not end by themselves
	}
	s.api.Wait() // the streams' goroutines, released by the stop
	s.closeXDS()
	err := s.reg.Close(ctx)
	s.teardown()
	return err
}

// closeXDS stops the feed first (joining its goroutine), then the xDS
// server and its streams: xDS streams never end by themselves.
func (s *Server) closeXDS() {
	if s.xds != nil {
		s.xds.Close()
	}
	if s.xdsGRPC != nil {
		s.xdsGRPC.Stop()
		<-s.xdsDone
	}
}

func (s *Server) teardown() {
	if s.console != nil {
		s.console.Close()
		s.console = nil
	}
	s.closeXDS()
	s.closeEndpointSlices()
	if s.replStop != nil {
		// Stops mirroring without revoking peer leases: revoking would
		// delete this region's mirror from every peer at once. Left alone,
		// the keys live until the lease's TTL runs out, and a successor
		// re-attaches them under its own lease before that.
		s.replStop()
		<-s.replDone
		s.replStop = nil
	}
	if s.grpc != nil {
		s.grpc.Stop()
	}
	if s.http != nil {
		_ = s.http.Close()
	}
	for _, l := range []net.Listener{s.grpcLis, s.httpLis, s.xdsLis} {
		if l != nil {
			_ = l.Close()
		}
	}
	if s.cli != nil {
		_ = s.cli.Close()
	}
	if s.kube != nil {
		_ = s.kube.Close()
	}
	if s.tls != nil {
		_ = s.tls.Close()
	}
	if s.etcd != nil {
		s.etcd.Close()
	}
}

// Options are the options the server runs with, defaults filled in (the
// replica's as the replica resolved them).
func (s *Server) Options() Config { return s.opts }

// EtcdClient is the process's etcd client, valid once WaitReady has
// returned nil: tests of this process and of the replica inspect and
// disturb the store through it.
func (s *Server) EtcdClient() *clientv3.Client { return s.cli }

// EtcdEndpoints are the client URLs of the etcd in use (the embedded one's
// when it runs), valid once WaitReady has returned nil.
func (s *Server) EtcdEndpoints() []string { return s.cli.Endpoints() }

// replicationStatus is the ReplicationStatus answer of a replicator (nil:
// replication not configured).
func replicationStatus(repl *replicator.Replicator) ([]*registrarv1.PeerReplicationStatus, bool) {
	if repl == nil {
		return nil, false
	}
	var peers []*registrarv1.PeerReplicationStatus
	for _, p := range repl.Status() {
		peers = append(peers, &registrarv1.PeerReplicationStatus{
			Region:                   p.Region,
			Endpoints:                p.Endpoints,
			IsLeader:                 p.IsLeader,
			Leader:                   p.Leader,
			Reachable:                p.Reachable,
			Synced:                   p.Synced,
			LeaseId:                  int64(p.LeaseID),
			LeaseTtlSeconds:          p.LeaseTTL.Seconds(),
			LeaseTtlRemainingSeconds: p.LeaseTTLRemaining.Seconds(),
			LastMirroredRevision:     p.LastMirroredRevision,
			LagSeconds:               p.Lag.Seconds(),
			KeysMirrored:             p.KeysMirrored,
			FullSyncs:                p.FullSyncs,
			KeepaliveFailures:        p.KeepaliveFailures,
			LastError:                p.LastError,
		})
	}
	return peers, true
}
