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
	"github.com/aethermesh/aether/registry"
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

// Console serves the page and keeps its two live feeds: the events per
// second, sampled from the replica's version every second, and, while at
// least one page is open, a subscription to the replica's event stream
// whose deliveries tell the open pages to re-read what they show.
//
// The subscription is a watch stream like an agent's and counts as one
// (registrar_connected_agents, registrar_event_broadcast_total), so it is
// held only while a page is open: a registrar nobody looks at has none.
type Console struct {
	cfg  Config
	rate *rate
	lat  *latency
	hub  *hub

	mu      sync.Mutex
	viewers int                // open event streams (pages)
	session context.CancelFunc // ends the current subscription; nil when none
	wake    chan struct{}      // one slot: viewers went from 0 to 1

	stop      context.CancelFunc
	done      chan struct{} // closed by Close; SSE handlers end on it
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// New starts a console. It subscribes to the replica when the first page
// opens (once the replica's snapshot is loaded) and samples its version
// every second until Close.
func New(cfg Config) *Console {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Console{cfg: cfg, rate: newRate(), lat: &latency{}, hub: newHub(), stop: cancel,
		done: make(chan struct{}), wake: make(chan struct{}, 1)}
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		c.run(ctx)
	}()
	go func() {
		defer c.wg.Done()
		c.sample(ctx)
	}()
	return c
}

// Close stops the console's goroutines and ends the open event streams.
func (c *Console) Close() {
	c.closeOnce.Do(func() {
		c.stop()
		c.wg.Wait()
		close(c.done)
	})
}

// join and leave count the open pages; the first opens the subscription,
// the last one out ends it.
func (c *Console) join() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.viewers++
	if c.viewers == 1 {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

func (c *Console) leave() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.viewers--
	if c.viewers == 0 && c.session != nil {
		c.session()
		c.session = nil
	}
}

// waitStep is how often the console looks again at a replica that is not
// ready to be subscribed to (loading its snapshot).
const waitStep = 100 * time.Millisecond

// run holds a subscription to every service while pages are open,
// resuming after a cut from the last version it saw (exactly the missed
// events when the replica still has them, a snapshot otherwise), until
// ctx ends.
func (c *Console) run(ctx context.Context) {
	r := c.cfg.Registrar
	from := ""
	tick := time.NewTicker(waitStep)
	defer tick.Stop()
	for ctx.Err() == nil {
		c.mu.Lock()
		if c.viewers == 0 {
			c.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-c.wake:
			}
			continue
		}
		sctx, cancel := context.WithCancel(ctx)
		c.session = cancel
		c.mu.Unlock()

		sub, err := r.Subscribe(nil, from)
		if err != nil {
			// Not ready (loading) or shutting down: look again shortly;
			// a shutdown ends with Close.
			select {
			case <-sctx.Done():
			case <-tick.C:
			}
			cancel()
			continue
		}
		from = c.follow(sctx, sub)
		sub.Close()
		cancel()
	}
}

// follow consumes one subscription until it is cut or ctx ends (the last
// page closed, or Close); it returns the version to resume from.
func (c *Console) follow(ctx context.Context, sub *registrar.Subscription) string {
	from := sub.TakeStart().At.String()
	c.hub.notify()
	for {
		evs, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.cfg.Logger.Debug("console: event stream cut; resuming", "err", err, "from", from)
			}
			return from
		}
		if len(evs) > 0 {
			if v := evs[len(evs)-1].GetVersion(); v != "" {
				from = v
			}
		}
		c.propagation(evs)
		c.hub.notify()
	}
}

// propagation records, for each write another replica acknowledged that
// this replica's stream now delivers, how long it took to get here: from
// the write's stamp (the acknowledging replica's hybrid clock, its wall
// time in milliseconds) to now on this replica's clock. Only added and
// updated endpoints carry the stamp of the write that made the event; a
// removal's endpoint is the old value. The replicas' clocks must agree
// for the figure to mean anything (as for any cross-host latency); this
// replica's own writes are not propagation and are left out.
func (c *Console) propagation(evs []*registrarv1.EndpointEvent) {
	r := c.cfg.Registrar
	own := r.Version().Epoch
	now := r.Now()
	for _, e := range evs {
		switch e.GetType() {
		case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_UPDATED:
		default:
			continue
		}
		st := e.GetEndpoint().GetStamp()
		if st.GetHlc() == 0 || st.GetWriter() == own {
			continue
		}
		c.lat.add(now, max(now.Sub(registry.HLCTime(st.GetHlc())), 0))
	}
}

// sampleEvery is the resolution of the events-per-second chart.
const sampleEvery = time.Second

// sample counts the replica's events: its version's sequence grows by
// one per endpoint event, so the growth between two readings is the
// events between them. A new epoch (a restart of the replica) starts
// over.
func (c *Console) sample(ctx context.Context) {
	r := c.cfg.Registrar
	tick := time.NewTicker(sampleEvery)
	defer tick.Stop()
	var last registry.Position
	for {
		if r.Ready() {
			p := r.Version()
			if p.Epoch == last.Epoch && p.Seq > last.Seq {
				c.rate.add(r.Now(), int(p.Seq-last.Seq), p.String())
			} else {
				c.rate.at(p.String())
			}
			last = p
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// RateWindow is how many seconds of events per second the console keeps.
const RateWindow = 300

// rate counts events per second over the last RateWindow seconds.
type rate struct {
	mu      sync.Mutex
	version string // the replica's version at the last sample
	total   uint64
	secs    [RateWindow]int64 // the unix second each bucket holds
	counts  [RateWindow]int
}

func newRate() *rate { return &rate{} }

func (r *rate) add(now time.Time, n int, version string) {
	sec := now.Unix()
	i := int(sec % RateWindow)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.version = version
	if r.secs[i] != sec {
		r.secs[i], r.counts[i] = sec, 0
	}
	r.counts[i] += n
	r.total += uint64(n)
}

// at records a sample without events.
func (r *rate) at(version string) {
	r.mu.Lock()
	r.version = version
	r.mu.Unlock()
}

func (r *rate) summary(now time.Time) EventsSummary {
	sec := now.Unix()
	out := EventsSummary{PerSecond: make([]int, RateWindow)}
	r.mu.Lock()
	defer r.mu.Unlock()
	out.Total, out.Version = r.total, r.version
	for k := 0; k < RateWindow; k++ {
		s := sec - int64(RateWindow-1-k)
		if i := int(((s % RateWindow) + RateWindow) % RateWindow); r.secs[i] == s {
			out.PerSecond[k] = r.counts[i]
		}
	}
	return out
}

// latency keeps the largest cross-replica propagation latency of each of
// the last RateWindow seconds.
type latency struct {
	mu      sync.Mutex
	samples uint64
	secs    [RateWindow]int64
	maxes   [RateWindow]time.Duration
}

func (l *latency) add(now time.Time, d time.Duration) {
	sec := now.Unix()
	i := int(sec % RateWindow)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.secs[i] != sec {
		l.secs[i], l.maxes[i] = sec, 0
	}
	l.maxes[i] = max(l.maxes[i], d)
	l.samples++
}

func (l *latency) summary(now time.Time) PropagationSummary {
	sec := now.Unix()
	out := PropagationSummary{MaxMillis: make([]float64, RateWindow)}
	l.mu.Lock()
	defer l.mu.Unlock()
	out.Samples = l.samples
	for k := 0; k < RateWindow; k++ {
		s := sec - int64(RateWindow-1-k)
		if i := int(((s % RateWindow) + RateWindow) % RateWindow); l.secs[i] == s {
			out.MaxMillis[k] = float64(l.maxes[i].Microseconds()) / 1000
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
	streams map[chan struct{}]struct{}
}

func newHub() *hub { return &hub{streams: map[chan struct{}]struct{}{}} }

func (h *hub) notify() {
	h.mu.Lock()
	defer h.mu.Unlock()
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
