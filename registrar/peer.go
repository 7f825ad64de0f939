package registrar

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registrar/internal/core"
	"github.com/aethermesh/aether/registry"
)

// Peer-watch (Options.PeerWatch, --peer-watch): the replicas of one cluster
// stream their local writes to each other, so a watcher of one replica
// sees a write made through another within a round trip instead of after
// the writer's write-behind flush and the backend's change feed.
//
//   - Membership: each replica keeps a member record (its epoch and gRPC
//     address) under a lease of its own in the backend
//     (backend.Members); the others list the records every
//     PeerDiscoveryInterval and open a PeerWatch stream to each member
//     that is not themselves. A replica that dies stops renewing and drops
//     out with its lease.
//   - Sending: act, the one place effects are carried out, hands every
//     acknowledged local write (core.Effects.Peer) to the open peer
//     streams, under the same lock as the write, so each stream carries a
//     replica's writes in the order it applied them. A stream that falls
//     behind (its buffer full) is cut: peer-watch only ever loses
//     freshness, never correctness, so nothing waits for a slow peer.
//   - Receiving: core.State.ApplyPeer applies a peer's writes at once,
//     provisionally; the backend's echo of each is recognised by its stamp
//     and changes nothing; a write never confirmed is judged by the
//     backstop after PeerGrace (see core/peer.go).

// peerBuffer is how many batches of writes a peer stream may have queued
// before it is cut.
const peerBuffer = 1024

// Peer-watch timing defaults.
const (
	defaultPeerMemberTTL  = 10 * time.Second
	defaultPeerDiscovery  = time.Second
	peerGraceFloor        = 2 * time.Second
	peerGraceBatchFactor  = 3
	peerReconnectBase     = 100 * time.Millisecond
	peerReconnectCeiling  = 5 * time.Second
	peerMemberCallTimeout = 5 * time.Second
)

// peerGrace is how long a peer write is given to reach the backend before
// a backstop listing may judge it: a few of its writer's batch intervals
// (the replicas of a cluster run with the same flags) and a floor for the
// flush itself.
func (o Options) peerGrace() time.Duration {
	return peerGraceFloor + peerGraceBatchFactor*o.WriteBatchInterval
}

// peerHub is the open peer-watch streams this replica serves.
type peerHub struct {
	mu   sync.Mutex
	subs map[*peerSub]struct{}
}

type peerSub struct {
	ch   chan []core.PeerWrite
	lost chan struct{} // closed when the stream fell behind and was cut
}

func newPeerHub() *peerHub { return &peerHub{subs: map[*peerSub]struct{}{}} }

func (h *peerHub) add() *peerSub {
	s := &peerSub{ch: make(chan []core.PeerWrite, peerBuffer), lost: make(chan struct{})}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s
}

func (h *peerHub) remove(s *peerSub) {
	h.mu.Lock()
	delete(h.subs, s)
	h.mu.Unlock()
}

// publish hands ws to every stream without blocking; called under r.mu.
// The writes' endpoints are the snapshot's immutable values, shared.
func (h *peerHub) publish(ws []core.PeerWrite) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		select {
		case s.ch <- ws:
		default:
			delete(h.subs, s)
			close(s.lost)
		}
	}
}

// peerMetrics are peer-watch's metrics.
type peerMetrics struct {
	connected prometheus.Gauge
	applied   prometheus.Counter
	echoes    prometheus.Counter
	sent      prometheus.Counter
}

func newPeerMetrics(reg *prometheus.Registry) *peerMetrics {
	m := &peerMetrics{
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "registrar_peer_streams_connected",
			Help: "Peer-watch streams this replica receives from other replicas of its cluster, connected now.",
		}),
		applied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "registrar_peer_events_applied_total",
			Help: "Writes received from peer replicas and applied to the snapshot (stale ones, and ones a local write overrides, are not counted).",
		}),
		echoes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "registrar_peer_echoes_total",
			Help: "Backend reports recognised as the echo of a peer write already applied: they changed nothing.",
		}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "registrar_peer_writes_sent_total",
			Help: "Local writes handed to peer-watch streams (one per stream).",
		}),
	}
	reg.MustRegister(m.connected, m.applied, m.echoes, m.sent)
	return m
}

// SetPeerAddr sets the gRPC address this replica's member record
// advertises to its peers, and the client TLS it dials them with (nil:
// plaintext); call it before Start. The composition root knows both only
// once it has bound its listener.
func (r *Registrar) SetPeerAddr(addr string, clientTLS *tls.Config) {
	r.peerAddr, r.peerTLS = addr, clientTLS
}

// peerMembers is the backend's membership and leases, or an error naming
// what is missing.
func (r *Registrar) peerMembers() (backend.Members, backend.Leases, error) {
	m, ok := r.backend.(backend.Members)
	if !ok || r.leases == nil {
		return nil, nil, errors.New("--peer-watch: the configured backend keeps no member records (backend.Members and backend.Leases)")
	}
	if r.peerAddr == "" {
		return nil, nil, errors.New("--peer-watch: no address to advertise to peers (--peer-advertise-addr)")
	}
	return m, r.leases, nil
}

// startPeers starts the membership and discovery loops; r.wg joins them.
func (r *Registrar) startPeers(ctx context.Context) error {
	members, leases, err := r.peerMembers()
	if err != nil {
		return err
	}
	// A store that only forwards (the server's, until it is connected)
	// says here whether the one behind it keeps member records.
	pctx, cancel := context.WithTimeout(ctx, peerMemberCallTimeout)
	_, err = members.ListMembers(pctx, r.opts.Region, r.opts.ClusterName)
	cancel()
	if errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	r.wg.Add(2)
	go func() { defer r.wg.Done(); r.runMembership(ctx, members, leases) }()
	go func() { defer r.wg.Done(); r.runPeerDiscovery(ctx, members) }()
	return nil
}

// runMembership keeps this replica's member record alive: written under a
// lease of PeerMemberTTL, renewed every third of it, written again under
// a new lease if the old one lapsed (a long pause, a backend outage). On
// the way out it revokes the lease, so peers stop dialing at once.
func (r *Registrar) runMembership(ctx context.Context, members backend.Members, leases backend.Leases) {
	ttl := r.opts.PeerMemberTTL
	me := backend.Member{Epoch: r.st.Epoch(), Addr: r.peerAddr}
	var lease int64
	join := func() {
		cctx, cancel := context.WithTimeout(ctx, peerMemberCallTimeout)
		defer cancel()
		id, err := leases.GrantLease(cctx, ttl)
		if err == nil {
			err = members.PutMember(cctx, r.opts.Region, r.opts.ClusterName, me, id)
		}
		if err != nil {
			if !isClosed(ctx, err) {
				r.log.Warn("peer-watch: writing the member record failed; retrying", "err", err)
			}
			return
		}
		lease = id
	}
	defer func() {
		if lease != 0 {
			cctx, cancel := context.WithTimeout(context.Background(), peerMemberCallTimeout)
			defer cancel()
			_, _ = leases.RevokeLease(cctx, lease)
		}
	}()
	join()
	t := r.clock.NewTicker(max(ttl/3, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		if lease == 0 {
			join()
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, peerMemberCallTimeout)
		_, err := leases.KeepAliveOnce(cctx, lease)
		cancel()
		if errors.Is(err, backend.ErrLeaseNotFound) {
			lease = 0
			join()
		} else if err != nil && !isClosed(ctx, err) {
			r.log.Warn("peer-watch: renewing the member lease failed", "err", err)
		}
	}
}

// runPeerDiscovery lists the members every PeerDiscoveryInterval and keeps
// one receiving stream per other member, ending the streams of members
// that left. Every stream's goroutine is joined before it returns.
func (r *Registrar) runPeerDiscovery(ctx context.Context, members backend.Members) {
	type conn struct {
		cancel context.CancelFunc
		done   chan struct{}
	}
	conns := map[backend.Member]conn{}
	defer func() {
		for _, c := range conns {
			c.cancel()
			<-c.done
		}
	}()
	t := r.clock.NewTicker(r.opts.PeerDiscoveryInterval)
	defer t.Stop()
	self := r.st.Epoch()
	for {
		cctx, cancel := context.WithTimeout(ctx, peerMemberCallTimeout)
		ms, err := members.ListMembers(cctx, r.opts.Region, r.opts.ClusterName)
		cancel()
		if err != nil {
			if !isClosed(ctx, err) {
				r.log.Warn("peer-watch: listing members failed; keeping the streams open", "err", err)
			}
		} else {
			live := map[backend.Member]bool{}
			for _, m := range ms {
				if m.Epoch == self {
					continue
				}
				live[m] = true
				if _, ok := conns[m]; !ok {
					r.peerView.found(m, r.now())
					pctx, pcancel := context.WithCancel(ctx)
					c := conn{cancel: pcancel, done: make(chan struct{})}
					conns[m] = c
					go func() { defer close(c.done); r.receivePeer(pctx, m) }()
				}
			}
			for m, c := range conns {
				if !live[m] {
					c.cancel()
					<-c.done
					delete(conns, m)
					r.peerView.gone(m)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
	}
}

// receivePeer streams member m's writes into the snapshot until ctx ends,
// reconnecting with backoff. What it misses while disconnected arrives
// through the backend, as without peer-watch.
func (r *Registrar) receivePeer(ctx context.Context, m backend.Member) {
	creds := insecure.NewCredentials()
	if r.peerTLS != nil {
		creds = credentials.NewTLS(r.peerTLS)
	}
	cc, err := grpc.NewClient(m.Addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		r.log.Warn("peer-watch: bad peer address", "peer", m.Epoch, "addr", m.Addr, "err", err)
		return
	}
	defer cc.Close()
	client := registrarv1.NewRegistrarPeersClient(cc)
	backoff := retry.Backoff{Base: peerReconnectBase, Max: peerReconnectCeiling}
	for attempt := 0; ctx.Err() == nil; attempt++ {
		got, err := r.peerStream(ctx, client, m)
		if ctx.Err() != nil {
			return
		}
		if got {
			attempt = 0
		}
		r.log.Debug("peer-watch stream ended; reconnecting", "peer", m.Epoch, "addr", m.Addr, "err", err)
		if !retry.Sleep(ctx, backoff.Delay(attempt), nil) {
			return
		}
	}
}

// peerStream runs one PeerWatch stream; got reports whether it received
// anything (a healthy stream, for the backoff).
func (r *Registrar) peerStream(ctx context.Context, client registrarv1.RegistrarPeersClient, m backend.Member) (got bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.PeerWatch(sctx, &registrarv1.PeerWatchRequest{Epoch: r.st.Epoch()})
	if err != nil {
		return false, err
	}
	// The stream's first message (an empty one) says it is open.
	first := true
	for {
		msg, err := stream.Recv()
		if err != nil {
			if !first {
				r.metrics.peer.connected.Dec()
				r.peerView.connected(m, false, r.now())
			}
			return got, err
		}
		if msg.GetEpoch() != m.Epoch {
			// Another incarnation now serves that address: its own member
			// record brings it in.
			if !first {
				r.metrics.peer.connected.Dec()
				r.peerView.connected(m, false, r.now())
			}
			return got, fmt.Errorf("peer at %s is %s, not %s", m.Addr, msg.GetEpoch(), m.Epoch)
		}
		if first {
			first = false
			r.metrics.peer.connected.Inc()
			r.peerView.connected(m, true, r.now())
		}
		got = true
		ws := r.fromWire(msg.GetWrites())
		if len(ws) == 0 {
			continue
		}
		r.peerView.received(m, len(ws))
		r.mu.Lock()
		r.act(r.st.ApplyPeer(ws, r.now()))
		r.mu.Unlock()
	}
}

// fromWire converts a peer's writes, dropping any not of this replica's
// origin (a peer of the cluster writes only its, and our, origin).
func (r *Registrar) fromWire(in []*registrarv1.PeerWrite) []core.PeerWrite {
	out := make([]core.PeerWrite, 0, len(in))
	for _, w := range in {
		ep := w.GetEndpoint()
		if ep == nil || ep.GetRegion() != r.opts.Region || ep.GetCluster() != r.opts.ClusterName {
			continue
		}
		if _, err := registry.IDOf(ep).Key(); err != nil {
			continue
		}
		out = append(out, core.PeerWrite{Endpoint: ep, Deleted: w.GetDeleted(), Stamp: w.GetStamp()})
	}
	return out
}

// PeerWatch serves one peer's stream of this replica's local writes
// (grpcapi.PeerSource). It sends an empty message first, so the peer
// knows the stream is open, then every write from then on; what came
// before reaches the peer through the backend.
func (r *Registrar) PeerWatch(ctx context.Context, caller string, send func(*registrarv1.PeerWrites) error) error {
	if !r.opts.PeerWatch {
		return status.Error(codes.FailedPrecondition, "peer-watch is off on this replica (--peer-watch)")
	}
	if !r.Ready() {
		return status.Error(codes.Unavailable, "registrar not started")
	}
	sub := r.peerHub.add()
	defer r.peerHub.remove(sub)
	epoch := r.st.Epoch()
	if err := send(&registrarv1.PeerWrites{Epoch: epoch}); err != nil {
		return err
	}
	for {
		var batch []core.PeerWrite
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-r.closing:
			return status.Error(codes.Unavailable, "registrar shutting down")
		case <-sub.lost:
			return status.Errorf(codes.ResourceExhausted, "peer-watch stream to %s fell behind; reconnect (the backend has every write)", caller)
		case ws := <-sub.ch:
			// A copy: every stream is handed the same slice, and
			// appending to it in place would race with the others.
			batch = append([]core.PeerWrite(nil), ws...)
		}
	more:
		for len(batch) < peerBuffer {
			select {
			case ws := <-sub.ch:
				batch = append(batch, ws...)
			default:
				break more
			}
		}
		msg := &registrarv1.PeerWrites{Epoch: epoch, Writes: make([]*registrarv1.PeerWrite, len(batch))}
		for i, w := range batch {
			msg.Writes[i] = &registrarv1.PeerWrite{Endpoint: w.Endpoint, Deleted: w.Deleted, Stamp: w.Stamp}
		}
		if err := send(msg); err != nil {
			return err
		}
		r.metrics.peer.sent.Add(float64(len(batch)))
	}
}

// actPeer carries out the peer-watch part of an effect: local writes to
// the peer streams, counts to the metrics. r.mu is held (act).
func (r *Registrar) actPeer(eff core.Effects) {
	if len(eff.Peer) > 0 && r.opts.PeerWatch {
		r.peerHub.publish(eff.Peer)
	}
	if eff.PeerApplied > 0 {
		r.metrics.peer.applied.Add(float64(eff.PeerApplied))
	}
	if eff.Echoes > 0 {
		r.metrics.peer.echoes.Add(float64(eff.Echoes))
	}
}
