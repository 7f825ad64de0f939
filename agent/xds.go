package agent

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/client"
	"github.com/aethermesh/aether/xds"
)

// DefaultXDSLinger is how long a service no xDS client names any more
// stays in the agent's subscription (Config.XDSLinger).
const DefaultXDSLinger = 30 * time.Second

// xdsPlane serves xDS to the node's proxies from the agent's client cache.
//
// Feed: the client's OnChange is the feed's only input. OnChange must not
// block (the client delivers every change from one goroutine, in view
// order), so it only appends the change to a queue; one goroutine takes
// whatever queued while the last Apply ran and applies it as one batch,
// one rebuild for a burst such as a subscribed service's snapshot. The
// feed's map is the one copy beside the client's cache; nothing polls.
// While every registrar is down the cache keeps what it last knew, so the
// feed does too, and a proxy connecting meanwhile is served from it.
//
// Demand: the services the xDS streams name join the client's
// subscription at once (Want) and leave it when no stream has named them
// for linger (Unwant, then the linger loop), so a proxy that reconnects
// or restarts finds its services still cached. A service never leaves
// while the client is not connected to a registrar (it could not be
// fetched back), nor when the agent registers endpoints of it (the
// agent's own services are its subscription for its own sake). The
// client is OnlySubscribed: an agent with no endpoints of its own and no
// proxy asking holds no registrar stream, and the last service leaving
// ends the stream, so the subscription is never "all services".
type xdsPlane struct {
	log    *slog.Logger
	linger time.Duration
	own    func(service string) bool
	cli    *client.Client // set by New once the client exists
	srv    *xds.Server
	lis    net.Listener
	tls    *tls.Config // nil: plaintext
	g      *grpc.Server

	qmu  sync.Mutex
	q    []*registrarv1.EndpointEvent
	kick chan struct{}

	// dmu orders Subscribe and Unsubscribe calls: a Want must not be
	// overtaken by the linger loop's Unsubscribe of the same service.
	dmu   sync.Mutex
	idle  map[string]time.Time // unwanted services → when they may leave
	lkick chan struct{}

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newXDSPlane(cfg Config, own func(string) bool) (*xdsPlane, error) {
	x := &xdsPlane{
		log: cfg.Logger.With("component", "agent-xds"), linger: cfg.XDSLinger, own: own, tls: cfg.XDSTLS,
		kick: make(chan struct{}, 1), idle: map[string]time.Time{}, lkick: make(chan struct{}, 1),
	}
	srv, err := xds.New(xds.Config{
		// No Source: the feed is driven by Apply from the client's cache.
		Locality:   xds.Locality{Region: cfg.Region, Zone: cfg.Zone},
		Logger:     cfg.Logger,
		Registerer: cfg.Registerer,
		Demand:     x,
	})
	if err != nil {
		return nil, err
	}
	x.srv = srv
	// Bound here, not in Run, so a taken address fails at start and the
	// address is known (XDSAddr) before Run.
	x.lis, err = net.Listen("tcp", cfg.XDSAddr)
	if err != nil {
		srv.Close()
		return nil, fmt.Errorf("--xds-addr %s: %w (choose a free address; loopback keeps it to the node's proxies)", cfg.XDSAddr, err)
	}
	if x.tls == nil && !loopback(x.lis.Addr()) {
		// As the registrar does for a plaintext port: allowed (a lab, a
		// pod network the operator trusts), but never silently.
		x.log.Warn("PLAINTEXT xDS on a non-loopback address: any host that reaches it reads the endpoints of the services it asks for, and nothing authenticates this agent to the proxies; serve TLS (--xds-tls-cert/--xds-tls-key, with --xds-tls-client-ca for mutual TLS) or listen on loopback",
			"addr", x.lis.Addr().String())
	}
	return x, nil
}

// loopback reports whether a is a loopback address (an unspecified one,
// ":15010", listens on every interface and is not).
func loopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// mutual reports whether the xDS port requires client certificates.
func (x *xdsPlane) mutual() bool {
	return x.tls != nil && x.tls.ClientAuth == tls.RequireAndVerifyClientCert
}

// onChange is the client's OnChange.
func (x *xdsPlane) onChange(ch client.Change) {
	t := registrarv1.EndpointEvent_ENDPOINT_ADDED
	switch ch.Type {
	case client.ChangeUpdated:
		t = registrarv1.EndpointEvent_ENDPOINT_UPDATED
	case client.ChangeRemoved:
		t = registrarv1.EndpointEvent_ENDPOINT_REMOVED
	}
	x.qmu.Lock()
	x.q = append(x.q, &registrarv1.EndpointEvent{Type: t, Endpoint: ch.Endpoint})
	x.qmu.Unlock()
	x.wake(x.kick)
}

func (x *xdsPlane) wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// start serves xDS and runs the feed and linger loops until stop.
func (x *xdsPlane) start() {
	ctx, cancel := context.WithCancel(context.Background())
	x.cancel = cancel
	// Keepalive as on the registrar's xDS port: pings every 5s are
	// allowed (proxies keep idle ADS streams alive), and a proxy gone
	// without a FIN is found within 40s, its stream (and demand) closed.
	opts := []grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
	if x.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(x.tls)))
	}
	x.g = grpc.NewServer(opts...)
	x.srv.Register(x.g)
	x.wg.Add(4)
	go func() {
		defer x.wg.Done()
		if err := x.g.Serve(x.lis); err != nil {
			x.log.Error("xds: serve failed; proxies get no configuration from this agent", "addr", x.lis.Addr().String(), "err", err)
		}
	}()
	go func() { defer x.wg.Done(); x.runFeed(ctx) }()
	go func() { defer x.wg.Done(); x.runLinger(ctx) }()
	go func() {
		defer x.wg.Done()
		// The first sync may bring no change at all (nothing registered):
		// an empty Apply still gives waiting clients a first snapshot.
		if x.cli.WaitSynced(ctx) == nil {
			x.wake(x.kick)
		}
	}()
	x.log.Info("serving xDS from the agent's cache", "addr", x.lis.Addr().String(), "tls", x.tls != nil, "mtls", x.mutual())
}

// stop ends the streams and the grpc.Server, then joins the loops.
func (x *xdsPlane) stop() {
	if x.cancel == nil {
		_ = x.lis.Close()
		x.srv.Close()
		return
	}
	x.g.Stop()
	x.srv.Close()
	x.cancel()
	x.wg.Wait()
}

func (x *xdsPlane) runFeed(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-x.kick:
		}
		x.qmu.Lock()
		batch := x.q
		x.q = nil
		x.qmu.Unlock()
		x.srv.Feed().Apply(batch)
	}
}

// Want is xds.Demand's: a first stream names service.
func (x *xdsPlane) Want(service string) {
	x.dmu.Lock()
	defer x.dmu.Unlock()
	delete(x.idle, service)
	if err := x.cli.Subscribe(service); err != nil {
		x.log.Warn("xds: cannot subscribe to a service a proxy asks for", "service", service, "err", err)
	}
}

// Unwant is xds.Demand's: no stream names service any more.
func (x *xdsPlane) Unwant(service string) {
	x.dmu.Lock()
	x.idle[service] = time.Now().Add(x.linger)
	x.dmu.Unlock()
	x.wake(x.lkick)
}

// runLinger unsubscribes the services idle past their linger, sleeping
// until the earliest deadline.
func (x *xdsPlane) runLinger(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-x.lkick:
		case <-t.C:
		}
		next := x.sweep(time.Now())
		t.Reset(next)
	}
}

// sweep unsubscribes what is due and returns how long until the next
// deadline (an hour when none).
func (x *xdsPlane) sweep(now time.Time) time.Duration {
	x.dmu.Lock()
	defer x.dmu.Unlock()
	next := time.Hour
	for svc, at := range x.idle {
		if at.After(now) {
			next = min(next, at.Sub(now))
			continue
		}
		if !x.cli.Connected() {
			// Gone now, it could not come back until a registrar does.
			x.idle[svc] = now.Add(x.linger)
			next = min(next, x.linger)
			continue
		}
		delete(x.idle, svc)
		if x.own(svc) {
			continue
		}
		if err := x.cli.Unsubscribe(svc); err != nil {
			x.log.Debug("xds: unsubscribe", "service", svc, "err", err)
		}
	}
	return next
}
