package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net/url"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	edgesyncv1 "github.com/aethermesh/aether/api/edgesync/v1"
	"github.com/aethermesh/aether/edge/internal/core"
	"github.com/aethermesh/aether/internal/retry"
)

// peer is the sending side towards one peer: a Push stream, reopened with
// backoff whenever it ends.
type peer struct {
	y      *syncer
	m      member
	conn   *grpc.ClientConn
	client edgesyncv1.EdgeSyncClient

	mu        sync.Mutex
	connected bool
	acked     vector    // the peer's durable vector, as last acked
	heard     vector    // changes the peer sent us: it holds them
	lastSync  time.Time // last ack (a completed exchange)
	probeSeq  uint64
	probes    map[uint64]probe // each probe in flight
	// released is, on the current stream, the durable index of the last
	// probe the peer answered (at first, when the stream opened): the
	// relayed changes up to it may go (synclog.go, take).
	released uint64
	// ackc wakes the pusher when an ack arrives: what the peer holds, or
	// released, grew.
	ackc chan struct{}
	// behind: the peer was found lacking changes GC dropped (gc.go).
	behind bool
	// snapshotAsked: the peer refused our changes for parents it
	// collected; the next stream starts with a snapshot
	// (snapshot_transfer.go).
	snapshotAsked bool
	// wentBack: the peer's last answer held fewer of its own changes than
	// it had reported (checkNotBack).
	wentBack bool
}

func newPeer(y *syncer, m member) (*peer, error) {
	if len(m.peerURLs) == 0 {
		return nil, fmt.Errorf("edge: peer %s has no peer URL", m.name)
	}
	// The first URL: members list them sorted, so every replica picks the
	// same one. (Several URLs per member are for etcd's raft transport;
	// failing over between them is left for when it is needed.)
	u, err := url.Parse(m.peerURLs[0])
	if err != nil {
		return nil, fmt.Errorf("edge: peer %s URL %q: %w", m.name, m.peerURLs[0], err)
	}
	creds := insecure.NewCredentials()
	if u.Scheme == "https" {
		if y.s.cfg.PeerTLS == nil {
			return nil, fmt.Errorf("edge: peer %s is at %s but no peer TLS is configured", m.name, u)
		}
		creds = credentials.NewTLS(peerClientTLS(y.s.cfg.PeerTLS))
	}
	host := u.Host
	if a, ok := y.s.cfg.peerDial[m.name]; ok {
		host = a
	}
	conn, err := grpc.NewClient(host,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(math.MaxInt32), grpc.MaxCallSendMsgSize(math.MaxInt32)),
		// A peer cut off without a FIN (a partition) must end the stream,
		// so the next one starts from the peer's vector again.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		// grpc's default reconnect backoff starts at a second; a peer
		// that comes back (a restart, a healed link) should be caught up
		// as soon as it listens, so it follows ours.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: minBackoff, Multiplier: 1.6, Jitter: 0.2, MaxDelay: maxBackoff},
			MinConnectTimeout: 5 * time.Second,
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("edge: peer %s: %w", m.name, err)
	}
	return &peer{y: y, m: m, conn: conn, client: edgesyncv1.NewEdgeSyncClient(conn), probes: map[uint64]probe{}, heard: vector{},
		ackc: make(chan struct{}, 1)}, nil
}

// probe is what a probe in flight was sent after: the changes the stream
// had sent (the answer must cover them), and the log's durable index (the
// answer tells which relayed changes up to it the peer lacks).
type probe struct {
	sent    vector
	durable uint64
}

// peerClientTLS turns the peer TLS config, which etcd's flags build as a
// server config, into the client side of mTLS: the same certificate, and
// the trusted CA (the server side's client CAs) as roots.
func peerClientTLS(c *tls.Config) *tls.Config {
	cc := c.Clone()
	if cc.RootCAs == nil {
		cc.RootCAs = cc.ClientCAs
	}
	if cc.GetClientCertificate == nil && len(cc.Certificates) == 0 && cc.GetCertificate != nil {
		get := c.GetCertificate
		cc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return get(&tls.ClientHelloInfo{})
		}
	}
	cc.NextProtos = []string{"h2"}
	return cc
}

// run keeps a stream to the peer until ctx ends.
func (p *peer) run(ctx context.Context) {
	b := retry.Backoff{Base: minBackoff, Max: maxBackoff}
	attempt := 0
	for ctx.Err() == nil {
		start := time.Now()
		err := p.session(ctx)
		p.mu.Lock()
		p.connected = false
		clear(p.probes)
		p.released = 0
		p.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		p.y.s.log.Debug("sync stream ended", "peer", p.m.name, "err", err)
		if time.Since(start) > maxBackoff {
			attempt = 0 // it lived: the peer was reachable
		}
		// A spread around the exponential step rather than full jitter:
		// the replicas that lost one peer together drift apart, yet each
		// still comes back within about maxBackoff of a heal.
		if !retry.Sleep(ctx, b.Spread(attempt, 20), nil) {
			return
		}
		attempt++
	}
}

// session is one Push stream: hello, the peer's vector, then the walk of
// the log (sync.go).
func (p *peer) session(ctx context.Context) error {
	s := p.y.s
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Waiting for the connection leaves reconnecting to grpc's backoff
	// (ours, set in newPeer) instead of stacking run's on top of it.
	stream, err := p.client.Push(s.withValueMerge(ctx), grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("open push stream: %w", err)
	}
	// The peer's vector, the answer to the hello, is newer than every
	// change durable here now: the relayed ones among them that it lacks
	// go at once (take).
	openedAt := p.y.log.durableIndex()
	hello := &edgesyncv1.PushRequest{Hello: &edgesyncv1.Hello{
		MemberId: s.memberID, ClusterId: s.clusterID, Name: s.cfg.Name, Version: syncVersion,
	}}
	if err := stream.Send(hello); err != nil {
		return fmt.Errorf("send hello: %w", err)
	}
	first, err := stream.Recv()
	if err != nil {
		if isValueMergeRefusal(err) {
			s.log.Warn("peer refuses to sync: value merge settings differ", "peer", p.m.name, "err", err)
		}
		return fmt.Errorf("receive vector: %w", err)
	}
	if first.GetMemberId() != p.m.id {
		return fmt.Errorf("peer %s answered as member %x, want %x", p.m.name, first.GetMemberId(), p.m.id)
	}
	if err := p.checkNotBack(vectorOf(first.GetVector())); err != nil {
		return err
	}
	p.mu.Lock()
	p.released = openedAt
	p.mu.Unlock()
	p.noteAck(first)
	p.mu.Lock()
	p.connected = true
	p.mu.Unlock()
	p.y.metrics.rounds.WithLabelValues(p.m.name).Inc()
	pv := p.knownHeld(vectorOf(first.GetVector()))
	if ok, why := p.wantsSnapshot(pv, vectorOf(first.GetGcPoint())); ok {
		if pv, err = p.sendSnapshot(stream, why); err != nil {
			p.refuseBehind(err)
			return err
		}
	}
	cur, err := p.y.log.newCursor(pv)
	if errors.Is(err, errBehindGC) {
		// As in the walk below: a trim since knownHeld read the reports.
		cur, err = p.y.log.newCursor(p.knownHeld(pv))
	}
	if err != nil {
		p.refuseBehind(err)
		return err
	}
	p.caughtUp()
	cur.forward, cur.self, cur.peer = true, core.ReplicaID(s.memberID), core.ReplicaID(p.m.id)

	errc := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		errc <- p.readAcks(stream)
	}()
	defer func() {
		cancel()
		wg.Wait()
	}()

	tick := time.NewTicker(p.y.interval)
	defer tick.Stop()
	var pace relayPacer
	pacer := time.NewTimer(time.Hour)
	pacer.Stop()
	defer pacer.Stop()
	for {
		// What the peer holds besides what this stream sent: changes it
		// sent us, and its acked vector, which includes what other peers
		// gave it (so two senders catching it up share the work).
		st := p.state()
		cur.released = st.released
		batch, wake, err := p.y.log.take(cur, st.acked, syncBatchChanges, syncBatchBytes)
		if errors.Is(err, errBehindGC) {
			// GC may have trimmed, between the state read and take, up to
			// a report of the peer noted after the read: the report is
			// noted before the trim it allows, so a fresh read covers it.
			// Still behind then, the peer really lacks what was trimmed.
			st = p.state()
			batch, wake, err = p.y.log.take(cur, st.acked, syncBatchChanges, syncBatchBytes)
		}
		if errors.Is(err, errMergedAhead) {
			s.log.Info("peer lacks changes a merged snapshot brought here: reopening the stream to send it a snapshot", "peer", p.m.name, "err", err)
			return err
		}
		if err != nil {
			p.refuseBehind(err)
			return err
		}
		pace.took(cur.relayed)
		if len(batch) > 0 {
			req := &edgesyncv1.PushRequest{Changes: batch}
			if err := stream.Send(req); err != nil {
				return fmt.Errorf("send changes: %w", err)
			}
			p.y.metrics.changesSent.WithLabelValues(p.m.name).Add(float64(len(batch)))
			p.y.metrics.bytesSent.WithLabelValues(p.m.name).Add(float64(proto.Size(req)))
			continue
		}
		// A relayed change waits (take): ask the peer what it holds now.
		// One probe in flight at a time is enough: its answer releases
		// every change durable before it was sent, so the changes that
		// became durable meanwhile wait at most one more round trip, and
		// a steady stream of relayed changes costs one small message each
		// way per round trip instead of a copy of each change; fewer
		// while the answers keep showing the peer gets them directly
		// (relayPacer).
		var paced <-chan time.Time
		if cur.holding && st.probes == 0 {
			now := time.Now()
			if d := pace.due(now); d > 0 {
				pacer.Reset(d)
				paced = pacer.C
			} else {
				pace.probed(now)
				if err := p.sendProbe(stream, cur); err != nil {
					return err
				}
			}
		}
		select {
		case <-wake:
		case <-p.ackc:
		case <-paced:
		case <-tick.C:
			pace.probed(time.Now())
			if err := p.sendProbe(stream, cur); err != nil {
				return err
			}
		case err := <-errc:
			p.noteRefusal(err)
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Bounds of the wait before a probe that would release relayed changes
// (relayPacer).
const (
	relayProbeMin = 5 * time.Millisecond
	relayProbeMax = 250 * time.Millisecond
)

// relayPacer spaces the probes a pusher sends to release relayed changes
// (take's forwarding). In a healthy complete graph every answer shows the
// peer already got the change from its author, and probing every round
// trip on each of the (N-1)(N-2) links between non-authors was half of a
// seven-member cluster's sync messages under a steady write load, for
// nothing. So while answers keep releasing nothing the wait before the
// next such probe doubles, from relayProbeMin up to relayProbeMax; as soon
// as an answer shows the peer lacking a relayed change (the author's link
// to it is cut or slow, and this replica is its path) the wait drops to
// nothing, and relaying runs one round trip per hop again. The cost: the
// first change relayed after a link to its author breaks waits up to
// relayProbeMax more. Times are passed in, so it reads no clock.
type relayPacer struct {
	wait   time.Duration // before the next probe, from the last
	last   time.Time     // when the last probe went
	needed bool          // a relayed change went since the last probe
}

// took records what a take returned: relayed changes the peer lacked.
func (r *relayPacer) took(relayed int) {
	if relayed > 0 {
		r.needed, r.wait = true, 0
	}
}

// due is how long from now until the next probe may go (<= 0: now).
func (r *relayPacer) due(now time.Time) time.Duration { return r.wait - now.Sub(r.last) }

// probed records a probe sent at now: the answer to the previous one
// released nothing if no relayed change went since, and the wait grows.
func (r *relayPacer) probed(now time.Time) {
	if !r.needed {
		r.wait = min(max(2*r.wait, relayProbeMin), relayProbeMax)
	}
	r.needed, r.last = false, now
}

// sendProbe asks the peer for its vector once everything sent so far is
// durable there.
func (p *peer) sendProbe(stream edgesyncv1.EdgeSync_PushClient, cur *cursor) error {
	durable := p.y.log.durableIndex()
	p.mu.Lock()
	p.probeSeq++
	id := p.probeSeq
	p.probes[id] = probe{sent: cur.sent.clone(), durable: durable}
	p.mu.Unlock()
	if err := stream.Send(&edgesyncv1.PushRequest{Probe: id}); err != nil {
		return fmt.Errorf("send probe: %w", err)
	}
	return nil
}

// readAcks records the peer's acks; a probe answered with a vector short
// of what was sent before it ends the stream (the next starts from the
// peer's vector).
func (p *peer) readAcks(stream edgesyncv1.EdgeSync_PushClient) error {
	for {
		ack, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receive ack: %w", err)
		}
		p.noteAck(ack)
		if ack.GetProbe() == 0 {
			continue
		}
		p.y.metrics.rounds.WithLabelValues(p.m.name).Inc()
		p.mu.Lock()
		pr, ok := p.probes[ack.GetProbe()]
		delete(p.probes, ack.GetProbe())
		if ok {
			// noteAck already recorded the answer's vector: a relayed
			// change it lacks may go now.
			p.released = max(p.released, pr.durable)
		}
		p.mu.Unlock()
		p.wakePusher()
		got := vectorOf(ack.GetVector())
		if n := pr.sent.lacks(got); n > 0 {
			return fmt.Errorf("peer %s lacks %d changes sent before probe %d", p.m.name, n, ack.GetProbe())
		}
	}
}

// noteHeard records that the peer holds change seq of replica r (it sent
// it to us).
func (p *peer) noteHeard(r core.ReplicaID, seq uint64) {
	p.mu.Lock()
	p.heard[r] = max(p.heard[r], seq)
	p.mu.Unlock()
}

func (p *peer) noteAck(ack *edgesyncv1.Ack) {
	v := vectorOf(ack.GetVector())
	p.mu.Lock()
	p.acked = v
	p.lastSync = p.y.s.now()
	p.mu.Unlock()
	p.y.noteReports(p.m.id, ack)
	p.wakePusher()
	p.y.kick()
	p.y.gc()
}

// wakePusher tells the pusher that an ack arrived; it never blocks (one
// pending wake-up covers any number of acks: the pusher reads the state
// afresh).
func (p *peer) wakePusher() {
	select {
	case p.ackc <- struct{}{}:
	default:
	}
}

// peerState is a snapshot of what the sender knows of its peer.
type peerState struct {
	connected bool
	acked     vector // acked or heard: what the peer is known to hold
	lastSync  time.Time
	released  uint64 // see peer.released
	probes    int    // in flight
}

func (p *peer) state() peerState {
	// The newest report of the peer known here (direct or relayed by
	// another member) can be newer than this stream's last ack: GC may
	// have trimmed up to it already, so the behind checks must count it.
	held := p.y.stab.newestOf(p.m.id)
	p.mu.Lock()
	defer p.mu.Unlock()
	for r, n := range p.acked {
		held[r] = max(held[r], n)
	}
	for r, n := range p.heard {
		held[r] = max(held[r], n)
	}
	return peerState{connected: p.connected, acked: held, lastSync: p.lastSync, released: p.released, probes: len(p.probes)}
}

// checkNotBack refuses a peer whose answer to a hello holds fewer of its
// own changes than it reported before. Durable vectors never go back
// under one member id, and what this replica sends rests on that
// (knownHeld); a member whose data directory was lost or replaced does go
// back, and would be sent nothing it lacks. It must rejoin under a new
// name, as an etcd member is removed and added (sync.go). Logged once per
// episode; the stream retries with backoff.
func (p *peer) checkNotBack(hv vector) error {
	self := core.ReplicaID(p.m.id)
	known := p.y.stab.newestOf(p.m.id)
	p.mu.Lock()
	first := !p.wentBack
	p.wentBack = hv[self] < known[self]
	back := p.wentBack
	p.mu.Unlock()
	if !back {
		return nil
	}
	err := fmt.Errorf("peer %s holds %d of its own changes and reported %d before: its data directory was lost or replaced; a member that lost its data must rejoin under a new name (a new member id)",
		p.m.name, hv[self], known[self])
	if first {
		p.y.s.log.Error("refusing to sync with a peer whose history went back", "peer", p.m.name, "err", err)
	}
	return err
}

// knownHeld is pv (the peer's answer to a hello) joined with every
// report of the peer known here. The answer was the peer's durable vector
// when it sent it; a report relayed since may be newer, and GC may have
// trimmed up to it (its stable point is a minimum of such reports). A
// durable vector never goes back under one member id, so the join is
// still a lower bound of what the peer holds.
func (p *peer) knownHeld(pv vector) vector {
	v := p.state().acked
	for r, n := range pv {
		v[r] = max(v[r], n)
	}
	return v
}

// holds reports whether the peer is known to hold the change at (r, seq).
func (st peerState) holds(r core.ReplicaID, seq uint64) bool { return st.acked[r] >= seq }

var errNoPeerTLS = errors.New("edge: a listen peer URL is https but no peer TLS is configured")
