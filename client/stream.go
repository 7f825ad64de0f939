package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/retry"
)

// maxBatch bounds how many received messages are applied, and published, as
// one cache update. Folding a burst into one publication pays the
// copy-on-write of the view once per burst rather than once per event.
const maxBatch = 256

type subscribeStream = grpc.BidiStreamingClient[registrarv1.SubscribeRequest, registrarv1.EndpointEvent]

// runStream keeps one Subscribe stream open, moving to the next registrar
// after every failure and backing off with full jitter. The backoff starts
// over once a stream has synced, so a registrar restart costs a short wait
// while a dead cluster is not hammered.
func (c *Client) runStream(ctx context.Context) {
	defer c.wg.Done()
	n := uint32(len(c.cfg.Addrs))
	attempt := 0
	reconnect := false
	for {
		if c.waitWanted(ctx) {
			reconnect = false // a first stream for new services, not a reconnect
		}
		if ctx.Err() != nil {
			return
		}
		if reconnect {
			c.metrics.reconnects.Inc()
		}
		reconnect = true
		idx := c.addr.Load() % n
		synced, err := c.session(ctx, int(idx))
		if errors.Is(err, errIdle) && ctx.Err() == nil {
			// The last service was unsubscribed: no failure, so no
			// backoff and no move to another registrar.
			attempt = 0
			continue
		}
		c.markStale()
		if ctx.Err() != nil {
			return
		}
		if status.Code(err) == codes.InvalidArgument {
			// The registrar refused the start, and the only part of it not
			// validated here is the resume token. Retrying it would fail
			// forever; without it the stream starts with a snapshot, which
			// is diffed against the cache like any other.
			c.mu.Lock()
			tok := c.st.version
			c.st.forgetVersion()
			c.mu.Unlock()
			c.log.Warn("registrar refused the stream; starting over without the resume token", "addr", c.cfg.Addrs[idx], "token", tok, "err", err)
		}
		if synced {
			attempt = 0
		}
		d := c.backoff(attempt)
		attempt++
		next := (idx + 1) % n
		if synced {
			c.log.Warn("registrar stream lost; serving the cache and reconnecting", "addr", c.cfg.Addrs[idx], "err", err, "next", c.cfg.Addrs[next], "in", d)
		} else {
			c.log.Info("registrar stream attempt failed", "addr", c.cfg.Addrs[idx], "err", err, "next", c.cfg.Addrs[next], "in", d, "cache_age", c.CacheAge())
		}
		c.addr.Store(next)
		if !retry.Sleep(ctx, d, nil) {
			return
		}
	}
}

// errIdle ends a session of an OnlySubscribed client that wants no service
// any more: its stream would mean all services on the wire.
var errIdle = errors.New("no service is wanted")

// waitWanted returns at once while the client wants some service (or all
// of them). An OnlySubscribed client that wants none holds no stream: its
// empty cache is complete, so it counts as synced, and it waits until
// Subscribe adds a service or ctx ends. It reports whether it waited.
func (c *Client) waitWanted(ctx context.Context) bool {
	waited := false
	for {
		c.mu.Lock()
		idle := !c.st.all && len(c.st.wanted) == 0
		c.mu.Unlock()
		if !idle {
			return waited
		}
		if !waited {
			c.log.Debug("no service wanted: no registrar stream until one is subscribed")
			c.markSynced()
		}
		waited = true
		select {
		case <-ctx.Done():
			return waited
		case <-c.subKick:
		}
	}
}

// session is one stream's bookkeeping.
type session struct {
	covered []string // !all: the services a FULL_SNAPSHOT on this stream stands for
	sent    []string // !all: the stream's service set as the registrar knows it
	synced  bool     // a snapshot or the resume bookmark has arrived

	snapType     registrarv1.EndpointEvent_EventType
	snapBuf      []*registryv1.ServiceEndpoint // chunks of a snapshot in progress
	snapServices []string
	snapOpen     bool
}

type recvResult struct {
	ev  *registrarv1.EndpointEvent
	err error
}

// session runs one stream against registrar idx until it fails or ctx ends.
// It reports whether the stream got as far as syncing.
func (c *Client) session(ctx context.Context, idx int) (bool, error) {
	addr := c.cfg.Addrs[idx]
	sctx, cancel := context.WithCancel(ctx)
	var recv sync.WaitGroup
	defer func() { cancel(); recv.Wait() }()

	c.mu.Lock()
	start, add, covered, sent := c.st.startRequest(&c.cfg)
	c.mu.Unlock()
	if !c.st.all && len(sent) == 0 {
		return false, errIdle // unsubscribed since waitWanted
	}
	stream, err := c.rpc[idx].Subscribe(sctx)
	if err != nil {
		return false, fmt.Errorf("opening a Subscribe stream to %s: %w", addr, err)
	}
	sess := &session{covered: covered, sent: sent}
	if err := send(stream, &registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Start{Start: start}}); err != nil {
		return false, fmt.Errorf("starting the stream at %s: %w", addr, err)
	}
	if len(add) > 0 {
		if err := send(stream, update(add, nil)); err != nil {
			return false, fmt.Errorf("subscribing at %s: %w", addr, err)
		}
	}
	c.log.Debug("registrar stream started", "addr", addr, "last_version", start.GetLastVersion(), "services", start.GetServices(), "adding", add)

	// Recv runs on its own goroutine so the loop below can also send
	// subscription updates, and can fold a burst of messages into one
	// cache update.
	msgs := make(chan recvResult, maxBatch)
	recv.Add(1)
	go func() {
		defer recv.Done()
		for {
			ev, err := stream.Recv()
			if err == io.EOF {
				err = errors.New("the registrar ended the stream")
			}
			select {
			case msgs <- recvResult{ev, err}:
			case <-sctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	for {
		select {
		case <-ctx.Done():
			return sess.synced, ctx.Err()
		case <-c.subKick:
			if err := c.updateSubscriptions(stream, sess); err != nil {
				return sess.synced, fmt.Errorf("updating subscriptions at %s: %w", addr, err)
			}
		case r := <-msgs:
			batch := make([]*registrarv1.EndpointEvent, 0, 1)
			err := r.err
		collect:
			for err == nil {
				batch = append(batch, r.ev)
				if len(batch) == maxBatch {
					break
				}
				select {
				case r = <-msgs:
					err = r.err
				default:
					break collect
				}
			}
			if len(batch) > 0 {
				c.apply(sess, addr, batch)
			}
			if err != nil {
				return sess.synced, fmt.Errorf("stream from %s: %w", addr, err)
			}
		}
	}
}

// send sends on the stream. io.EOF means the stream has ended; its status
// comes from Recv, which the session loop is about to see.
func send(stream subscribeStream, req *registrarv1.SubscribeRequest) error {
	if err := stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

func update(add, remove []string) *registrarv1.SubscribeRequest {
	return &registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Update{
		Update: &registrarv1.SubscriptionUpdate{Add: add, Remove: remove},
	}}
}

// updateSubscriptions sends the difference between the wanted services and
// what the stream was last told. Diffing (rather than forwarding each call)
// makes it idempotent, so kicks that race a stream start do no harm.
func (c *Client) updateSubscriptions(stream subscribeStream, sess *session) error {
	c.mu.Lock()
	wanted := sortedKeys(c.st.wanted)
	c.mu.Unlock()
	if len(wanted) == 0 && !c.st.all {
		return errIdle // removing the last service would leave "all" on the wire
	}
	var add, remove []string
	for _, svc := range wanted {
		if !slices.Contains(sess.sent, svc) {
			add = append(add, svc)
		}
	}
	for _, svc := range sess.sent {
		if !slices.Contains(wanted, svc) {
			remove = append(remove, svc)
		}
	}
	sess.sent = wanted
	if len(add)+len(remove) == 0 {
		return nil
	}
	c.log.Debug("updating subscriptions", "add", add, "remove", remove)
	return send(stream, update(add, remove))
}

// apply folds a batch of stream messages into the cache and publishes once.
func (c *Client) apply(sess *session, addr string, batch []*registrarv1.EndpointEvent) {
	c.mu.Lock()
	r := c.st.applyStream(sess, batch, time.Now())
	c.commitLocked()
	c.mu.Unlock()
	for _, d := range r.discarded {
		c.log.Warn("snapshot chunks interleaved; discarding the partial one", "addr", addr, "partial", d[0], "new", d[1])
	}
	for _, t := range r.unknown {
		c.log.Debug("ignoring an event type this client does not know", "type", t, "addr", addr)
	}
	c.stats.fullSnapshots.Add(int64(r.fullSnapshots))
	if r.resumed {
		c.stats.resumes.Add(1)
	}
	if r.becameSynced {
		c.log.Debug("registrar stream synced", "addr", addr, "version", c.version())
		c.markSynced()
	}
}

// streamResult is what a batch of stream messages did that the Client
// reports (logs, counters, the synced signal); the state change itself is
// done by applyStream.
type streamResult struct {
	fullSnapshots int  // complete FULL_SNAPSHOTs applied
	becameSynced  bool // the stream synced in this batch
	resumed       bool // it synced by the bookmark after a resume, not by a snapshot
	// discarded: a partial snapshot of type [0] dropped when a chunk of
	// type [1] arrived.
	discarded [][2]registrarv1.EndpointEvent_EventType
	unknown   []registrarv1.EndpointEvent_EventType // event types this client does not know, ignored
}

// applyStream folds a batch of one stream's messages into the state at now:
// snapshot chunks are gathered in sess until the last one, each message's
// position is recorded once applied, and acknowledged writes the batch
// caught up with settle. It does no I/O, so the stream's rules can be driven
// message by message.
func (s *state) applyStream(sess *session, batch []*registrarv1.EndpointEvent, now time.Time) streamResult {
	var r streamResult
	for _, ev := range batch {
		switch t := ev.GetType(); t {
		case registrarv1.EndpointEvent_FULL_SNAPSHOT, registrarv1.EndpointEvent_SERVICES_SNAPSHOT:
			if sess.snapOpen && sess.snapType != t {
				// The registrar never interleaves snapshots; if one did,
				// the partial one is unusable.
				r.discarded = append(r.discarded, [2]registrarv1.EndpointEvent_EventType{sess.snapType, t})
				sess.snapBuf = nil
			}
			if !sess.snapOpen || sess.snapType != t {
				sess.snapType, sess.snapServices, sess.snapOpen = t, ev.GetServices(), true
			}
			sess.snapBuf = append(sess.snapBuf, ev.GetEndpoints()...)
			if ev.GetSnapshotContinues() {
				continue
			}
			if t == registrarv1.EndpointEvent_FULL_SNAPSHOT {
				s.replace(sess.snapBuf, sess.covered, s.all, now)
				r.fullSnapshots++
				if !sess.synced {
					sess.synced, r.becameSynced = true, true
				}
			} else {
				s.replace(sess.snapBuf, sess.snapServices, false, now)
			}
			sess.snapBuf, sess.snapServices, sess.snapOpen = nil, nil, false
			s.setVersion(ev)
		case registrarv1.EndpointEvent_ENDPOINT_ADDED, registrarv1.EndpointEvent_ENDPOINT_UPDATED, registrarv1.EndpointEvent_ENDPOINT_REMOVED:
			s.applyEvent(ev, now)
			s.setVersion(ev)
		case registrarv1.EndpointEvent_PROGRESS:
			s.setVersion(ev)
			if !sess.synced {
				// The bookmark after a resume's missed events.
				sess.synced, r.becameSynced, r.resumed = true, true, true
			}
		default:
			r.unknown = append(r.unknown, t)
		}
	}
	s.settle(now)
	return r
}

// version is the last resume token the stream delivered.
func (c *Client) version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st.version
}
