// Package embedetcd runs a single-member etcd inside the registrar process,
// so that a registrar needs no external etcd to start. It is the default
// backend; production deployments with several registrars point them at a
// real etcd cluster instead.
//
// Invariants:
//
//   - One Server is one etcd member named Config.Name that forms a
//     one-member cluster of its own. A data dir, once initialised, carries
//     its membership with it: a restart on the same Dir keeps every key and
//     revision, and the cluster flags of later starts are ignored by etcd.
//   - Start returns only once the member has a leader and serves clients, so
//     the caller may use Endpoints at once. On an error nothing is left
//     running, with one exception: etcd's bootstrap cannot be interrupted, so
//     if ctx ends while it is still opening the data dir, it finishes in the
//     background and is closed at once. A data dir held by another etcd is
//     refused up front rather than waited on (etcd would wait forever).
//   - Endpoints are the URLs actually bound. With port 0 the ports are chosen
//     before etcd starts, because etcd derives its advertised URLs (and, on
//     first start, its member ID) from the configured URLs, not from the
//     listeners it opens.
//   - With ClientTLS or PeerTLS the matching URLs are https:// and, with a
//     CA file, the other side must present a certificate of that CA.
//   - Periodic auto-compaction is always on, so a long-lived embedded etcd
//     does not keep every revision forever. max-txn-ops stays at etcd's
//     default (128), which is what etcdstore batches against.
package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc"
)

// Defaults for the zero values of Config.
const (
	DefaultName                    = "aether"
	DefaultClientAddr              = "127.0.0.1:2379"
	DefaultPeerAddr                = "127.0.0.1:2380"
	DefaultAutoCompactionRetention = time.Hour
)

// Config configures an embedded etcd member. Zero values take the defaults
// above; Dir is required.
type Config struct {
	Dir        string // data dir (created if missing); restart on the same Dir keeps the data
	Name       string // member name, default "aether"
	ClientAddr string // host:port for clients, e.g. "127.0.0.1:2379"; port 0 = pick a free port
	PeerAddr   string // host:port for peers, e.g. "127.0.0.1:2380"; port 0 = pick a free port
	// Logger receives this package's messages and etcd's own errors
	// (component=etcd). etcd's info and warn chatter is dropped so that it
	// does not drown the registrar's logs.
	Logger *slog.Logger
	// AutoCompactionRetention is the periodic auto-compaction window,
	// default 1h, so an embedded etcd does not grow forever.
	AutoCompactionRetention time.Duration

	// ClientTLS, when its CertFile is set, makes the client URLs https://
	// (Endpoints says so) and, with its CAFile, requires every client to
	// present a certificate that chains to it. PeerTLS does the same for
	// the peer URL. etcd re-reads the files on every handshake, so
	// rotating them needs no restart.
	ClientTLS TLS
	PeerTLS   TLS
}

// TLS is the certificate of one of the member's links: CertFile and KeyFile
// (PEM, both or neither) are what the member serves; CAFile (PEM bundle),
// if set, is the CA whose certificates the other side must present
// (client-certificate authentication). Server certificates issued by
// package pki carry both server and client auth, which etcd needs: it
// dials its own client port with the same certificate.
type TLS struct {
	CertFile string
	KeyFile  string
	CAFile   string
}

// Enabled reports whether the link serves TLS.
func (t TLS) Enabled() bool { return t.CertFile != "" }

func (t TLS) validate(kind string) error {
	switch {
	case (t.CertFile == "") != (t.KeyFile == ""):
		return fmt.Errorf("embedded etcd: %s TLS needs both a certificate and its key", kind)
	case t.CAFile != "" && t.CertFile == "":
		return fmt.Errorf("embedded etcd: %s TLS client CA needs a certificate and key to serve TLS with", kind)
	}
	for _, f := range []string{t.CertFile, t.KeyFile, t.CAFile} {
		if f == "" {
			continue
		}
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("embedded etcd: %s TLS: %w", kind, err)
		}
	}
	return nil
}

func (t TLS) info() transport.TLSInfo {
	if !t.Enabled() {
		return transport.TLSInfo{}
	}
	return transport.TLSInfo{
		CertFile:       t.CertFile,
		KeyFile:        t.KeyFile,
		TrustedCAFile:  t.CAFile,
		ClientCertAuth: t.CAFile != "",
	}
}

// Server is a running embedded etcd member.
type Server struct {
	etcd      *embed.Etcd
	endpoints []string
	log       *slog.Logger
	closing   *atomic.Bool
	streams   *streamEnder
	closeOnce sync.Once
}

// pickAttempts bounds retries when a port we picked is taken by someone else
// between our probe and etcd's bind; more than one loss in a row means
// something else is wrong.
const pickAttempts = 3

// Start starts the member and waits until it serves clients or ctx ends.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, errors.New("embedded etcd: a data dir is required")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("embedded etcd: not started: %w", err)
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.ClientAddr == "" {
		cfg.ClientAddr = DefaultClientAddr
	}
	if cfg.PeerAddr == "" {
		cfg.PeerAddr = DefaultPeerAddr
	}
	if cfg.AutoCompactionRetention <= 0 {
		cfg.AutoCompactionRetention = DefaultAutoCompactionRetention
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if err := cfg.ClientTLS.validate("client"); err != nil {
		return nil, err
	}
	if err := cfg.PeerTLS.validate("peer"); err != nil {
		return nil, err
	}
	client, err := parseAddr("client", cfg.ClientAddr)
	if err != nil {
		return nil, err
	}
	client.tls = cfg.ClientTLS.Enabled()
	peer, err := parseAddr("peer", cfg.PeerAddr)
	if err != nil {
		return nil, err
	}
	peer.tls = cfg.PeerTLS.Enabled()
	// etcd refuses a data dir that others can read; create it as etcd would.
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd: create data dir: %w", err)
	}
	if err := checkDirFree(cfg.Dir); err != nil {
		return nil, err
	}

	for attempt := 1; ; attempt++ {
		if err := client.pick(); err != nil {
			return nil, err
		}
		if err := peer.pick(); err != nil {
			return nil, err
		}
		s, err := start(ctx, cfg, client, peer)
		if err == nil {
			return s, nil
		}
		var inUse *addrInUseError
		if errors.As(err, &inUse) && inUse.addr.picked && attempt < pickAttempts && ctx.Err() == nil {
			cfg.Logger.Debug("embedded etcd: picked port was taken before etcd bound it; retrying",
				"addr", inUse.addr.hostPort(), "attempt", attempt)
			continue
		}
		return nil, err
	}
}

func start(ctx context.Context, cfg Config, client, peer *addr) (*Server, error) {
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{client.listenURL()}
	ec.AdvertiseClientUrls = []url.URL{client.advertiseURL()}
	ec.ListenPeerUrls = []url.URL{peer.listenURL()}
	ec.AdvertisePeerUrls = []url.URL{peer.advertiseURL()}
	ec.ClientTLSInfo = cfg.ClientTLS.info()
	ec.PeerTLSInfo = cfg.PeerTLS.info()
	ec.ClusterState = embed.ClusterStateFlagNew
	ec.InitialCluster = ec.InitialClusterFromName(cfg.Name)
	ec.AutoCompactionMode = embed.CompactorModePeriodic
	ec.AutoCompactionRetention = cfg.AutoCompactionRetention.String()
	ec.Logger = "zap"
	ec.LogLevel = "error"
	closing := new(atomic.Bool)
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(newZapLogger(cfg.Logger, closing))
	// A one-member cluster has no peers to heartbeat or lose, so the raft
	// timers matter only for the first election after a start: etcd
	// fast-forwards all but one election tick for a single member, leaving
	// 1..ElectionTicks ticks of randomised wait. At etcd's 100ms/1s that is
	// up to a second; 50ms/250ms bounds it at 250ms.
	ec.TickMs = 50
	ec.ElectionMs = 250
	streams := newStreamEnder()
	ec.GRPCAdditionalServerOptions = []grpc.ServerOption{grpc.ChainStreamInterceptor(streams.intercept)}

	began := time.Now()
	// StartEtcd bootstraps synchronously (WAL replay, bbolt open) and
	// cannot be interrupted, so it runs aside and ctx is honoured while it
	// does; a start abandoned by ctx is closed as soon as StartEtcd returns.
	type result struct {
		e   *embed.Etcd
		err error
	}
	started := make(chan result, 1)
	go func() {
		e, err := embed.StartEtcd(ec)
		started <- result{e, err}
	}()
	var e *embed.Etcd
	select {
	case r := <-started:
		if r.err != nil {
			return nil, describeStartError(r.err, cfg, client, peer)
		}
		e = r.e
	case <-ctx.Done():
		go func() {
			if r := <-started; r.err == nil {
				closing.Store(true)
				r.e.Close()
			}
		}()
		return nil, fmt.Errorf("embedded etcd: start in %s did not finish: %w", cfg.Dir, ctx.Err())
	}

	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: serving at %s failed: %w", client.hostPort(), err)
	case <-e.Server.StopNotify():
		e.Close()
		return nil, fmt.Errorf("embedded etcd: stopped before it was ready (data dir %s)", cfg.Dir)
	case <-ctx.Done():
		closing.Store(true)
		e.Close()
		return nil, fmt.Errorf("embedded etcd: waiting for %s to become ready: %w", client.hostPort(), ctx.Err())
	}

	s := &Server{etcd: e, log: cfg.Logger, closing: closing, streams: streams}
	for _, u := range ec.AdvertiseClientUrls {
		s.endpoints = append(s.endpoints, u.String())
	}
	cfg.Logger.Debug("embedded etcd ready",
		"name", cfg.Name, "dir", cfg.Dir, "client_urls", s.endpoints,
		"peer_url", peer.hostPort(), "took", time.Since(began))
	return s, nil
}

// Endpoints are the client URLs of the member, with the ports actually bound.
func (s *Server) Endpoints() []string {
	return append([]string(nil), s.endpoints...)
}

// Close stops the member and waits until it has stopped and released its
// data dir and ports. Clients' open watches are ended first (see
// streamEnder), so Close takes milliseconds rather than etcd's request
// timeout. It is safe to call more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		s.closing.Store(true)
		s.streams.endAll()
		s.etcd.Close()
		s.log.Debug("embedded etcd stopped", "client_urls", s.endpoints)
	})
}

// addr is one of the member's listen addresses.
type addr struct {
	kind   string // "client" or "peer", for error messages
	host   string
	port   int
	auto   bool // configured with port 0
	tls    bool // https:// rather than http://
	picked bool // port chosen by pick, so losing it to a race is retryable
}

func parseAddr(kind, hostPort string) (*addr, error) {
	host, portStr, err := net.SplitHostPort(hostPort)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %s address %q: %w", kind, hostPort, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("embedded etcd: %s address %q: port must be a number 0-65535", kind, hostPort)
	}
	return &addr{kind: kind, host: host, port: port, auto: port == 0}, nil
}

// pick chooses a free port for an address configured with port 0, by
// binding :0 and releasing it. The port is free only until etcd binds it;
// Start retries if it loses that race.
func (a *addr) pick() error {
	if !a.auto {
		return nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(a.host, "0"))
	if err != nil {
		return fmt.Errorf("embedded etcd: pick a free %s port on %q: %w", a.kind, a.host, err)
	}
	a.port = ln.Addr().(*net.TCPAddr).Port
	a.picked = true
	if err := ln.Close(); err != nil {
		return fmt.Errorf("embedded etcd: release probe listener for %s port: %w", a.kind, err)
	}
	return nil
}

func (a *addr) hostPort() string { return net.JoinHostPort(a.host, strconv.Itoa(a.port)) }

func (a *addr) scheme() string {
	if a.tls {
		return "https"
	}
	return "http"
}

func (a *addr) listenURL() url.URL {
	return url.URL{Scheme: a.scheme(), Host: a.hostPort()}
}

// advertiseURL is what clients and peers are told to dial. A wildcard
// listen address cannot be dialled, and etcd would advertise it verbatim, so
// loopback stands in for it: the embedded member serves this host only.
func (a *addr) advertiseURL() url.URL {
	host := a.host
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
		if ip != nil && ip.To4() == nil {
			host = "::1"
		}
	}
	return url.URL{Scheme: a.scheme(), Host: net.JoinHostPort(host, strconv.Itoa(a.port))}
}

type addrInUseError struct {
	addr *addr
	err  error
}

func (e *addrInUseError) Error() string {
	flag := "--embedded-etcd-addr"
	if e.addr.kind == "peer" {
		flag = "--embedded-etcd-peer-addr"
	}
	return fmt.Sprintf("embedded etcd: %s address %s is in use; pass %s with a free port", e.addr.kind, e.addr.hostPort(), flag)
}

func (e *addrInUseError) Unwrap() error { return e.err }

// describeStartError turns etcd's bind failure into a message that names the
// address and the flag that moves it; other errors get the data dir as
// context, since that is what most of them are about.
func describeStartError(err error, cfg Config, client, peer *addr) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		var op *net.OpError
		if errors.As(err, &op) && op.Addr != nil {
			if tcp, ok := op.Addr.(*net.TCPAddr); ok {
				switch tcp.Port {
				case client.port:
					return &addrInUseError{addr: client, err: err}
				case peer.port:
					return &addrInUseError{addr: peer, err: err}
				}
			}
		}
		// etcd binds peers first; without an address in the error, say both.
		return fmt.Errorf("embedded etcd: client address %s or peer address %s is in use: %w", client.hostPort(), peer.hostPort(), err)
	}
	return fmt.Errorf("embedded etcd: start member %q in %s: %w", cfg.Name, cfg.Dir, err)
}
