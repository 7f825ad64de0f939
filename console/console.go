// Package console is the registrar's status page (/ui on its HTTP port)
// and the JSON model behind it and `aether status`: the overview of this
// replica, its backend and the plane it holds, the services and their
// endpoints, the nodes, the xDS clients. It is built on the registrar's
// in-process API only (registrar/api.go): it reads the replica's snapshot
// and node records, and follows the replica's own event stream
// (Registrar.Subscribe) to count events per second and to tell open pages
// that something changed, over server-sent events. It never calls the
// registrar's gRPC API or scrapes its /metrics.
//
// The page is read-only: it serves GET and HEAD only, and nothing it
// serves writes. Its assets (assets/) are embedded in the binary and need
// no network: no CDN, no build step.
package console

import (
	"context"
	"log/slog"
	"sync"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/xds"
)

// Config is what the console reads, beyond the replica itself: the parts
// of the process only the composition root (package server) knows.
type Config struct {
	Registrar *registrar.Registrar
	// Checks are the process's readiness checks (what /readyz runs); the
	// replica is ready when every one passes. Nil: ready once the
	// replica's snapshot is loaded.
	Checks func() []Check
	// Backend names the store's kind ("etcd", "etcd (embedded)") and its
	// endpoints.
	Backend func() (kind string, endpoints []string)
	// Replication is the replicator's status of its peers; nil or
	// enabled=false without --peer-etcd.
	Replication func() (peers []*registrarv1.PeerReplicationStatus, enabled bool)
	// XDS is the xDS feed's per-client status; nil when the feed is off.
	XDS func() []xds.ClientStatus
	// StuckAfter is how old the oldest unpersisted write may be before
	// persistence counts as stuck (the process's readiness limit).
	StuckAfter time.Duration
	// Authz, when set (mTLS with authorization on), admits to the console
	// only clients whose verified certificate is an operator's.
	Authz *Authz
	// The process's bound addresses, shown on the overview.
	GRPCAddr, HTTPAddr, XDSAddr string
	Logger                      *slog.Logger
}

// Authz is the trust domain and operator prefix identities are read with
// (package authz).
type Authz struct {
	TrustDomain, OperatorPrefix string
}

// Console follows the replica's event stream for as long as it runs.
type Console struct {
	cfg  Config
	rate *rate
	hub  *hub

	stop context.CancelFunc
	done chan struct{} // closed when run has returned; SSE handlers end on it
	wg   sync.WaitGroup
}

// New starts a console: it subscribes to the replica once the replica's
// snapshot is loaded, and keeps following it until Close.
func New(cfg Config) *Console {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Console{cfg: cfg, rate: newRate(), hub: newHub(), stop: cancel, done: make(chan struct{})}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(c.done)
		c.run(ctx)
	}()
	return c
}

// Close stops following the replica and ends the open event streams.
func (c *Console) Close() {
	c.stop()
	c.wg.Wait()
}

// waitStep is how often the console looks again at a replica that is not
// ready to be subscribed to (loading its snapshot).
const waitStep = 100 * time.Millisecond

// run subscribes to every service and counts the events, resuming after
// a cut from the last version it saw (exactly the missed events when the
// replica still has them, a snapshot otherwise), until ctx ends.
func (c *Console) run(ctx context.Context) {
	r := c.cfg.Registrar
	from := ""
	tick := time.NewTicker(waitStep)
	defer tick.Stop()
	for ctx.Err() == nil {
		sub, err := r.Subscribe(nil, from)
		if err != nil {
			// Not ready (loading) or shutting down: look again shortly;
			// a shutdown ends with Close.
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			continue
		}
		from = c.follow(ctx, sub, from)
		sub.Close()
	}
}

// follow consumes one subscription until it is cut or ctx ends; it
// returns the version to resume from.
func (c *Console) follow(ctx context.Context, sub *registrar.Subscription, from string) string {
	st := sub.TakeStart()
	from = st.At.String()
	c.count(st.Missed) // At is the version after them
	c.hub.notify(from)
	for {
		evs, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.cfg.Logger.Debug("console: event stream cut; resuming", "err", err, "from", from)
			}
			return from
		}
		c.count(evs)
		if len(evs) > 0 {
			if v := evs[len(evs)-1].GetVersion(); v != "" {
				from = v
			}
		}
		c.hub.notify(from)
	}
}

// count adds the endpoint changes among evs to the rate; snapshots and
// progress notices are not changes.
func (c *Console) count(evs []*registrarv1.EndpointEvent) {
	n := 0
	for _, e := range evs {
		switch e.GetType() {
		case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_REMOVED, registrarv1.EndpointEvent_ENDPOINT_UPDATED:
			n++
		}
	}
	if n > 0 {
		c.rate.add(c.cfg.Registrar.Now(), n)
	}
}

// RateWindow is how many seconds of events per second the console keeps.
const RateWindow = 300

// rate counts events per second over the last RateWindow seconds.
type rate struct {
	mu     sync.Mutex
	total  uint64
	secs   [RateWindow]int64 // the unix second each bucket holds
	counts [RateWindow]int
}

func newRate() *rate { return &rate{} }

func (r *rate) add(now time.Time, n int) {
	sec := now.Unix()
	i := int(sec % RateWindow)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.secs[i] != sec {
		r.secs[i], r.counts[i] = sec, 0
	}
	r.counts[i] += n
	r.total += uint64(n)
}

func (r *rate) summary(now time.Time) EventsSummary {
	sec := now.Unix()
	out := EventsSummary{PerSecond: make([]int, RateWindow)}
	r.mu.Lock()
	defer r.mu.Unlock()
	out.Total = r.total
	for k := 0; k < RateWindow; k++ {
		s := sec - int64(RateWindow-1-k)
		if i := int(((s % RateWindow) + RateWindow) % RateWindow); r.secs[i] == s {
			out.PerSecond[k] = r.counts[i]
		}
	}
	return out
}

// hub tells the open event streams that the replica changed. Each stream
// has a one-slot signal, so a burst of changes coalesces into one
// notice: a slow browser costs nothing and misses nothing, since it
// re-reads the current state on a notice.
type hub struct {
	mu      sync.Mutex
	version string
	streams map[chan struct{}]struct{}
}

func newHub() *hub { return &hub{streams: map[chan struct{}]struct{}{}} }

func (h *hub) notify(version string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.version = version
	for ch := range h.streams {
		select {
		case ch <- struct{}{}:
		default: // a notice is already waiting
		}
	}
}

func (h *hub) add() chan struct{} {
	ch := make(chan struct{}, 1)
	h.mu.Lock()
	h.streams[ch] = struct{}{}
	h.mu.Unlock()
	return ch
}

func (h *hub) remove(ch chan struct{}) {
	h.mu.Lock()
	delete(h.streams, ch)
	h.mu.Unlock()
}

func (h *hub) current() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.version
}
