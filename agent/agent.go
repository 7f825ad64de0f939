package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/client"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registry"
)

// Config configures an agent.
type Config struct {
	Node    string
	Zone    string
	Region  string // default "default", like the registrar
	Cluster string // default "default"
	Address string // the node's own IP, optional
	Labels  map[string]string

	Registrars []string

	// Endpoints to keep registered: the fixed ones, plus whatever
	// EndpointsFile lists (re-read when it changes).
	Endpoints        []*registryv1.ServiceEndpoint
	EndpointsFile    string
	FilePollInterval time.Duration // default 1s

	// DrainPeriod is how long an endpoint stays DRAINING before it is
	// removed. Default 5s.
	DrainPeriod time.Duration

	// XDSAddr, if set, is where the agent serves xDS (host:port; a
	// loopback address keeps it to the node's own proxies) from its
	// client cache, in its own zone and region for nodes that send none.
	// Empty means off.
	XDSAddr string
	// XDSLinger is how long a service no xDS client names any more stays
	// in the agent's subscription (default DefaultXDSLinger).
	XDSLinger time.Duration
	// XDSTLS, if set, makes XDSAddr serve TLS with it (ClientAuth
	// RequireAndVerifyClientCert for mutual TLS); nil serves plaintext,
	// which is meant for a loopback XDSAddr: on any other address the
	// agent warns at start.
	XDSTLS *tls.Config

	// DialOptions for the registrar connections, as client.Config's: nil
	// means plaintext.
	DialOptions []grpc.DialOption
	Registerer  prometheus.Registerer
	Logger      *slog.Logger
}

// Agent keeps one node and its endpoints registered.
type Agent struct {
	cfg Config
	log *slog.Logger
	// cli is the agent's one set of registrar connections: its endpoint
	// writes, its cache of its own services and its node calls all go
	// through it, so they share one failover cursor and one rule for what
	// is worth retrying.
	cli *client.Client
	xds *xdsPlane // nil without XDSAddr

	mu      sync.Mutex
	desired map[registry.EndpointID]*registryv1.ServiceEndpoint
	// draining endpoints were dropped from the desired set and wait out
	// the drain period before removal.
	draining map[registry.EndpointID]time.Time
	fileMod  time.Time
	fileSize int64
}

// New validates cfg and connects (lazily) to the registrars.
func New(cfg Config) (*Agent, error) {
	if cfg.Region == "" {
		cfg.Region = "default"
	}
	if cfg.Cluster == "" {
		cfg.Cluster = "default"
	}
	if cfg.FilePollInterval <= 0 {
		cfg.FilePollInterval = time.Second
	}
	if cfg.DrainPeriod <= 0 {
		cfg.DrainPeriod = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.XDSLinger <= 0 {
		cfg.XDSLinger = DefaultXDSLinger
	}
	if err := registry.ValidateName("--node", cfg.Node); err != nil {
		return nil, err
	}
	if len(cfg.Registrars) == 0 {
		return nil, errors.New("--registrar: at least one registrar address is required")
	}
	a := &Agent{
		cfg:      cfg,
		log:      cfg.Logger.With("component", "agent", "node", cfg.Node),
		desired:  map[registry.EndpointID]*registryv1.ServiceEndpoint{},
		draining: map[registry.EndpointID]time.Time{},
	}
	initial, err := a.wanted()
	if err != nil {
		return nil, err
	}
	for _, ep := range initial {
		a.desired[registry.IDOf(ep)] = ep
	}
	// Validate the node record up front so a bad flag fails at start.
	if _, err := registry.NormalizeNode(a.nodeRecord(), registry.DefaultLimits); err != nil {
		return nil, err
	}
	ccfg := client.Config{
		Addrs:    cfg.Registrars,
		Region:   cfg.Region,
		Cluster:  cfg.Cluster,
		Node:     cfg.Node,
		Services: a.services(),
		// Exactly its own services and its proxies' (xDS demand), even
		// when that is none: an agent never watches the whole mesh.
		OnlySubscribed: true,
		DialOptions:    cfg.DialOptions,
		Registerer:     cfg.Registerer,
		Logger:         cfg.Logger,
	}
	if cfg.XDSAddr != "" {
		if a.xds, err = newXDSPlane(cfg, a.ownService); err != nil {
			return nil, err
		}
		ccfg.OnChange = a.xds.onChange
	}
	a.cli, err = client.New(ccfg)
	if err != nil {
		if a.xds != nil {
			a.xds.stop()
		}
		return nil, err
	}
	if a.xds != nil {
		a.xds.cli = a.cli
	}
	return a, nil
}

// wanted reads the configured endpoints, filling in the node's identity.
func (a *Agent) wanted() ([]*registryv1.ServiceEndpoint, error) {
	eps := slices.Clone(a.cfg.Endpoints)
	if a.cfg.EndpointsFile != "" {
		fromFile, err := ReadEndpointsFile(a.cfg.EndpointsFile)
		if err != nil {
			return nil, fmt.Errorf("--endpoints-file: %w", err)
		}
		eps = append(eps, fromFile...)
	}
	seen := map[registry.EndpointID]bool{}
	out := make([]*registryv1.ServiceEndpoint, 0, len(eps))
	for _, in := range eps {
		ep := proto.Clone(in).(*registryv1.ServiceEndpoint)
		ep.Node, ep.Zone, ep.Region, ep.Cluster = a.cfg.Node, a.cfg.Zone, a.cfg.Region, a.cfg.Cluster
		norm, err := registry.NormalizeEndpoint(ep, registry.DefaultLimits)
		if err != nil {
			return nil, fmt.Errorf("endpoint %s %s: %w", in.GetService(), in.GetIp(), err)
		}
		id := registry.IDOf(norm)
		if seen[id] {
			return nil, fmt.Errorf("endpoint %s is given twice", id)
		}
		seen[id] = true
		out = append(out, norm)
	}
	return out, nil
}

// XDSAddr is the address xDS is served on ("" without Config.XDSAddr).
func (a *Agent) XDSAddr() string {
	if a.xds == nil {
		return ""
	}
	return a.xds.lis.Addr().String()
}

// Watched are the services the agent's cache watches (its client's
// Services), sorted: its own, and with XDSAddr those its proxies ask for.
// Empty when it has neither: then it holds no registrar stream at all.
func (a *Agent) Watched() []string { return a.cli.Services() }

// XDSStatusHandler serves the status of the agent's xDS clients as JSON
// (xds.StatusDocument, what `aether xds status` reads from /xds/status),
// the same document a registrar serves; nil without Config.XDSAddr.
func (a *Agent) XDSStatusHandler() http.Handler {
	if a.xds == nil {
		return nil
	}
	return a.xds.srv.StatusHandler()
}

// ownService says whether the agent registers (or still drains) an
// endpoint of service: such a service stays subscribed whatever xDS asks.
func (a *Agent) ownService(service string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id := range a.desired {
		if id.Service == service {
			return true
		}
	}
	for id := range a.draining {
		if id.Service == service {
			return true
		}
	}
	return false
}

func (a *Agent) services() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.servicesLocked()
}

func (a *Agent) servicesLocked() []string {
	set := map[string]bool{}
	for id := range a.desired {
		set[id.Service] = true
	}
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// nodeRecord is what the agent announces: where the node is, what it
// offers, and a health summary of its endpoints.
func (a *Agent) nodeRecord() *registryv1.Node {
	a.mu.Lock()
	defer a.mu.Unlock()
	total := uint32(len(a.desired) + len(a.draining))
	serving := uint32(len(a.desired))
	h := &registryv1.HealthSummary{Status: registryv1.Health_HEALTH_HEALTHY, EndpointsServing: serving, EndpointsTotal: total,
		Message: fmt.Sprintf("%d/%d endpoints serving", serving, total)}
	if serving < total {
		h.Status = registryv1.Health_HEALTH_DEGRADED
	}
	return &registryv1.Node{
		Name: a.cfg.Node, Zone: a.cfg.Zone, Region: a.cfg.Region, Cluster: a.cfg.Cluster,
		Address: a.cfg.Address, Labels: a.cfg.Labels, Services: a.servicesLocked(), Health: h,
	}
}

// Run announces the node, registers its endpoints and keeps both alive
// until ctx ends; then it drains, deregisters, leaves and returns nil.
func (a *Agent) Run(ctx context.Context) error {
	defer a.cli.Close()
	if a.xds != nil {
		// Serving from the cache needs no registrar, so it starts first;
		// it stops after the drain (its proxies see the DRAINING) and
		// before the client closes (deferred in that order).
		a.xds.start()
		defer a.xds.stop()
	}

	interval, err := a.announce(ctx)
	if err != nil {
		return a.shutdown(err)
	}
	a.registerAll()
	a.log.Info("agent running", "endpoints", len(a.desired), "registrars", a.cfg.Registrars)

	hb := time.NewTimer(interval)
	defer hb.Stop()
	poll := time.NewTicker(a.cfg.FilePollInterval)
	defer poll.Stop()
	drainTick := time.NewTicker(max(a.cfg.DrainPeriod/4, 100*time.Millisecond))
	defer drainTick.Stop()
	for {
		select {
		case <-ctx.Done():
			return a.shutdown(nil)
		case <-hb.C:
			interval = a.heartbeat(ctx, interval)
			hb.Reset(interval)
		case <-poll.C:
			if a.reloadFile() {
				// Services or health changed: the node record says so.
				if iv, err := a.announce(ctx); err == nil {
					interval = iv
				}
			}
		case <-drainTick.C:
			if a.finishDrains() {
				_, _ = a.announce(ctx)
			}
		}
	}
}

// announce records the node, retrying across registrars until it works or
// ctx ends, and returns the heartbeat interval.
func (a *Agent) announce(ctx context.Context) (time.Duration, error) {
	for attempt := 0; ; attempt++ {
		interval, err := a.cli.AnnounceNode(ctx, a.nodeRecord())
		if err == nil {
			return interval, nil
		}
		if client.Permanent(err) {
			return 0, fmt.Errorf("announcing node %s: %w", a.cfg.Node, err)
		}
		a.log.Warn("announce failed; retrying", "err", err)
		if !retry.Sleep(ctx, announceBackoff.Delay(attempt), nil) {
			return 0, ctx.Err()
		}
	}
}

// announceBackoff spaces announce attempts. Its cap is below the client's
// reconnect cap: nothing of the node's is registered until an announce
// gets through, so the agent asks again sooner.
var announceBackoff = retry.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}

// heartbeat renews the lease. A lapsed lease means the node was presumed
// gone: announce afresh and register everything again.
func (a *Agent) heartbeat(ctx context.Context, interval time.Duration) time.Duration {
	err := a.cli.Heartbeat(ctx)
	switch {
	case err == nil:
		return interval
	case status.Code(err) == codes.NotFound:
		a.log.Warn("node lease lapsed; announcing again and re-registering endpoints")
		iv, err := a.announce(ctx)
		if err != nil {
			return time.Second
		}
		a.registerAll()
		return iv
	default:
		// Try again soon, well inside the TTL (the interval is a third of it).
		a.log.Warn("heartbeat failed; retrying", "err", err)
		return min(interval/3, time.Second)
	}
}

func (a *Agent) registerAll() {
	a.mu.Lock()
	eps := make([]*registryv1.ServiceEndpoint, 0, len(a.desired))
	for _, ep := range a.desired {
		eps = append(eps, ep)
	}
	a.mu.Unlock()
	for _, ep := range eps {
		if err := a.cli.Register(ep); err != nil {
			a.log.Error("endpoint rejected", "endpoint", registry.IDOf(ep).String(), "err", err)
		}
	}
}

// reloadFile re-reads the endpoints file when it changed and applies the
// difference; it reports whether the desired set changed.
func (a *Agent) reloadFile() bool {
	if a.cfg.EndpointsFile == "" {
		return false
	}
	fi, err := os.Stat(a.cfg.EndpointsFile)
	if err != nil {
		a.log.Warn("cannot stat endpoints file; keeping the current endpoints", "err", err)
		return false
	}
	a.mu.Lock()
	unchanged := fi.ModTime().Equal(a.fileMod) && fi.Size() == a.fileSize
	a.fileMod, a.fileSize = fi.ModTime(), fi.Size()
	a.mu.Unlock()
	if unchanged {
		return false
	}
	eps, err := a.wanted()
	if err != nil {
		a.log.Error("endpoints file is invalid; keeping the current endpoints", "err", err)
		return false
	}
	next := map[registry.EndpointID]*registryv1.ServiceEndpoint{}
	for _, ep := range eps {
		next[registry.IDOf(ep)] = ep
	}
	a.mu.Lock()
	var add, drop []*registryv1.ServiceEndpoint
	for id, ep := range next {
		if old, ok := a.desired[id]; !ok || !registry.SameAttributes(old, ep) {
			add = append(add, ep)
		}
		delete(a.draining, id) // back before its drain finished
	}
	for id, ep := range a.desired {
		if _, ok := next[id]; !ok {
			drop = append(drop, ep)
			a.draining[id] = time.Now().Add(a.cfg.DrainPeriod)
		}
	}
	changed := len(add) > 0 || len(drop) > 0
	a.desired = next
	services := a.servicesLocked()
	a.mu.Unlock()
	if !changed {
		return false
	}
	a.log.Info("endpoints file changed", "added_or_updated", len(add), "draining", len(drop))
	if err := a.cli.Subscribe(services...); err != nil {
		a.log.Debug("subscribe", "err", err)
	}
	for _, ep := range add {
		if err := a.cli.Register(ep); err != nil {
			a.log.Error("endpoint rejected", "endpoint", registry.IDOf(ep).String(), "err", err)
		}
	}
	for _, ep := range drop {
		if err := a.cli.Drain(registry.IDOf(ep)); err != nil {
			a.log.Error("drain", "endpoint", registry.IDOf(ep).String(), "err", err)
		}
	}
	return true
}

// finishDrains removes endpoints whose drain period is over.
func (a *Agent) finishDrains() bool {
	now := time.Now()
	var done []registry.EndpointID
	a.mu.Lock()
	for id, until := range a.draining {
		if now.After(until) {
			done = append(done, id)
			delete(a.draining, id)
		}
	}
	a.mu.Unlock()
	for _, id := range done {
		if err := a.cli.Unregister(id); err != nil {
			a.log.Error("deregister", "endpoint", id.String(), "err", err)
		}
	}
	return len(done) > 0
}

// shutdown drains every endpoint, waits the drain period, deregisters them,
// waits (bounded) for the registrar to acknowledge, and leaves.
func (a *Agent) shutdown(cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.DrainPeriod+15*time.Second)
	defer cancel()
	a.mu.Lock()
	ids := make([]registry.EndpointID, 0, len(a.desired)+len(a.draining))
	for id := range a.desired {
		ids = append(ids, id)
	}
	for id := range a.draining {
		ids = append(ids, id)
	}
	a.mu.Unlock()
	if cause == nil && len(ids) > 0 {
		a.log.Info("shutting down: draining endpoints", "endpoints", len(ids), "drain_period", a.cfg.DrainPeriod)
		for _, id := range ids {
			_ = a.cli.Drain(id)
		}
		if err := a.cli.Flush(ctx); err != nil {
			a.log.Warn("drain not acknowledged", "err", err)
		}
		retry.Sleep(ctx, a.cfg.DrainPeriod, nil)
		for _, id := range ids {
			_ = a.cli.Unregister(id)
		}
		if err := a.cli.Flush(ctx); err != nil {
			a.log.Warn("deregistration not acknowledged", "err", err)
		}
	}
	if cause != nil {
		return cause
	}
	if err := a.cli.LeaveNode(ctx); err != nil {
		a.log.Warn("leave failed; the node record will lapse with its lease", "err", err)
	}
	a.log.Info("agent stopped")
	return nil
}
