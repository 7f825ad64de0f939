package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registry"
)

// rpcTimeout bounds one unary call (a write or a fallback read attempt), so
// a registrar that stopped answering costs a retry, not a stuck writer.
const rpcTimeout = 10 * time.Second

type opKind int

const (
	opRegister opKind = iota + 1
	opUnregister
	opDrain
)

func (o opKind) String() string {
	switch o {
	case opRegister:
		return "register"
	case opUnregister:
		return "unregister"
	case opDrain:
		return "drain"
	}
	return "none"
}

type writeState int

const (
	writeQueued   writeState = iota + 1 // waiting for the writer (again, after a failure or a newer intent)
	writeInflight                       // the writer is sending gen
	writeAcked                          // acknowledged; kept in the overlay until the stream catches up
)

// write is the agent's latest intent for one endpoint. Coalescing is
// structural: there is one write per endpoint and a new intent replaces
// the old one, bumping gen so that an RPC still carrying the old intent
// does not acknowledge the new one.
type write struct {
	id    registry.EndpointID
	op    opKind
	ep    *registryv1.ServiceEndpoint // opRegister: the normalized endpoint
	gen   uint64
	state writeState
	since uint64 // state.writeSeq when it last became unacknowledged

	ackedAt time.Time
	// ackAt is the position of the event the write produced, as the
	// acknowledging registrar named it; no epoch when it named none, and
	// then it compares with no stream (sameIncarnation).
	ackAt registry.Position

	// reassert marks a register the client sent on its own to restore an
	// owned endpoint (reassert.go), not a caller's intent: its
	// acknowledgement leaves the ownership as it was.
	reassert bool
	// owner is the node an unregister is sent for (owner_node).
	owner string

	// Memo of apply for opDrain, so recomputing yields the same pointer and
	// republishes nothing.
	drainedFrom, drainedTo *registryv1.ServiceEndpoint
}

// apply is the write's effect on the registrar's value cur (nil: absent).
func (w *write) apply(cur *registryv1.ServiceEndpoint) *registryv1.ServiceEndpoint {
	switch w.op {
	case opRegister:
		return w.ep
	case opDrain:
		if cur == nil {
			return nil // nothing to drain; the registrar will say NotFound
		}
		if w.drainedFrom != cur {
			w.drainedFrom, w.drainedTo = cur, drained(cur)
		}
		return w.drainedTo
	}
	return nil
}

// unacked reports whether the write still has to reach a registrar.
func (w *write) unacked() bool { return w.state == writeQueued || w.state == writeInflight }

// intend records a new intent. Drain composes with a pending Register (the
// registrar may not have the endpoint yet, so a bare Drain could be
// rejected as NotFound) and is moot after a pending Unregister; otherwise
// the latest intent wins.
func (s *state) intend(id registry.EndpointID, op opKind, ep *registryv1.ServiceEndpoint) {
	w := s.writes[id]
	if w == nil {
		w = &write{id: id}
		s.writes[id] = w
	}
	if op == opDrain {
		switch w.op {
		case opRegister:
			op, ep = opRegister, drained(w.ep)
		case opUnregister:
			op = opUnregister
		}
	}
	if op == opUnregister && w.op != opUnregister {
		// The intent ends here: nothing is re-asserted for this endpoint
		// from now on. The owner named is the node the endpoint was
		// registered for, by default the client's.
		w.owner = s.node
		if o := s.owned[id]; o != nil && o.ep.GetNode() != "" {
			w.owner = o.ep.GetNode()
		}
		if w.op == opRegister && w.ep.GetNode() != "" {
			w.owner = w.ep.GetNode()
		}
		delete(s.owned, id)
	}
	// A new write supersedes a scheduled re-assertion; reconcile looks
	// again once it settles.
	delete(s.due, id)
	w.op, w.ep = op, ep
	w.reassert = false
	w.drainedFrom, w.drainedTo = nil, nil
	w.gen++
	s.writeSeq++
	if !w.unacked() {
		w.state = writeQueued
		w.since = s.writeSeq
		s.queue = append(s.queue, id)
	}
	// A queued write keeps its place; an in-flight one is requeued when its
	// RPC returns and finds a newer gen.
}

// requeueFront puts a write back at the head of the queue, so a retry or a
// newer intent does not lose its turn.
func (s *state) requeueFront(w *write) {
	w.state = writeQueued
	s.queue = slices.Insert(s.queue, 0, w.id)
}

// authMatches reports whether the registrar's state already shows what an
// acknowledged write asked for.
func (s *state) authMatches(w *write) bool {
	a := s.auth[w.id.Service][w.id]
	switch w.op {
	case opRegister:
		return a != nil && registry.SameAttributes(a, w.ep)
	case opDrain:
		return a == nil || a.State == registryv1.State_STATE_DRAINING
	}
	return a == nil
}

// settle retires acknowledged writes the stream has caught up with. When
// the write and the stream are on the same registrar incarnation, that is
// when the stream has delivered the write's version: the state alone could
// match an older write of the agent's and bring a stale one back. Otherwise
// it is when the stream shows the written state. Either way settleTimeout
// bounds the wait.
func (s *state) settle(now time.Time) {
	s.resendLost(now)
	for id, w := range s.writes {
		if w.state != writeAcked {
			continue
		}
		var caughtUp bool
		if s.sameIncarnation(w) {
			caughtUp = s.at.Seq >= w.ackAt.Seq
		} else {
			caughtUp = s.authMatches(w)
		}
		if caughtUp || now.Sub(w.ackedAt) >= settleTimeout {
			delete(s.writes, id)
			s.reconcile(id, now, false)
			s.recompute(id)
		}
	}
}

// nextSettle is when the oldest acknowledged write times out of the
// overlay; zero if none is waiting.
func (s *state) nextSettle() time.Time {
	var t time.Time
	for _, w := range s.writes {
		if w.state == writeAcked {
			if d := w.ackedAt.Add(settleTimeout); t.IsZero() || d.Before(t) {
				t = d
			}
		}
	}
	return t
}

// Register adds or updates an endpoint. Empty Region and Cluster are the
// client's, empty Node is Config.Node; the endpoint is then normalized and
// validated as the registrar would, and a validation error is returned. The
// change is in the cache when Register returns; it reaches a registrar in
// the background (see Flush and PendingWrites). ep is not retained.
func (c *Client) Register(ep *registryv1.ServiceEndpoint) error {
	if ep == nil {
		return errors.New("client: register: endpoint must be set")
	}
	in := proto.Clone(ep).(*registryv1.ServiceEndpoint)
	if in.Node == "" {
		in.Node = c.cfg.Node
	}
	if err := c.origin().Claim(&in.Region, &in.Cluster, "endpoint."); err != nil {
		return fmt.Errorf("client: register: %w", err)
	}
	norm, err := registry.NormalizeEndpoint(in, registry.DefaultLimits)
	if err != nil {
		return fmt.Errorf("client: register: %w", err)
	}
	return c.enqueue(registry.IDOf(norm), opRegister, norm)
}

// Unregister removes an endpoint (empty Region and Cluster are the
// client's). Like Register it is applied to the cache at once and sent in
// the background; an endpoint the registrar does not know counts as removed.
func (c *Client) Unregister(id registry.EndpointID) error {
	id, err := c.normalizeID(id)
	if err != nil {
		return fmt.Errorf("client: unregister: %w", err)
	}
	return c.enqueue(id, opUnregister, nil)
}

// Drain marks an endpoint DRAINING (empty Region and Cluster are the
// client's), at once in the cache and in the background at the registrar.
// Draining an endpoint the registrar does not know is a permanent error:
// it is logged and counted as dropped.
func (c *Client) Drain(id registry.EndpointID) error {
	id, err := c.normalizeID(id)
	if err != nil {
		return fmt.Errorf("client: drain: %w", err)
	}
	return c.enqueue(id, opDrain, nil)
}

// PendingWrites counts the endpoints whose latest write no registrar has
// acknowledged yet.
func (c *Client) PendingWrites() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, w := range c.st.writes {
		if w.unacked() {
			n++
		}
	}
	return n
}

// Flush waits until every write made before the call has been acknowledged
// by a registrar (or superseded by a later write to the same endpoint that
// was, or dropped as permanently rejected), or ctx ends. Writes made during
// the wait do not extend it.
func (c *Client) Flush(ctx context.Context) error {
	c.mu.Lock()
	target := c.st.writeSeq
	c.mu.Unlock()
	for {
		c.mu.Lock()
		pending := 0
		for _, w := range c.st.writes {
			if w.unacked() && w.since <= target {
				pending++
			}
		}
		changed := c.acked
		c.mu.Unlock()
		if pending == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("client: flush: %d writes not acknowledged yet: %w", pending, ctx.Err())
		case <-c.ctx.Done():
			return ErrClosed
		}
	}
}

// origin is the client's own region and cluster (Config.Region and
// Config.Cluster): the registrar would refuse any other, and the cache
// files an endpoint under the identity the registrar will give it.
func (c *Client) origin() registry.Origin {
	return registry.Origin{Region: c.cfg.Region, Cluster: c.cfg.Cluster, Refusal: clientRefusal}
}

// clientRefusal names the setting that fixes the client's origin, since a
// client cannot write through another registrar the way a caller of the
// registrar can.
func clientRefusal(part, got, own string) string {
	setting := "Config.Region"
	if part == "cluster" {
		setting = "Config.Cluster"
	}
	return fmt.Sprintf("%q is not this client's %s %q (%s)", got, part, own, setting)
}

// normalizeID fills in the client's origin and the canonical IP and checks
// every part as the registrar does, so the identity matches the cache's and
// the registrar's.
func (c *Client) normalizeID(id registry.EndpointID) (registry.EndpointID, error) {
	return c.origin().NormalizeID(id)
}

// enqueue records an intent, applies it to the cache and wakes the writer.
func (c *Client) enqueue(id registry.EndpointID, op opKind, ep *registryv1.ServiceEndpoint) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	c.st.enqueue(id, op, ep)
	c.commitLocked()
	select {
	case c.writeKick <- struct{}{}:
	default:
	}
	return nil
}

// enqueue records an intent and shows it in the cache at once.
func (s *state) enqueue(id registry.EndpointID, op opKind, ep *registryv1.ServiceEndpoint) {
	s.intend(id, op, ep)
	s.recompute(id)
}

// writeReq is what the writer sends: a copy of one intent.
type writeReq struct {
	id    registry.EndpointID
	op    opKind
	ep    *registryv1.ServiceEndpoint
	gen   uint64
	owner string
}

// runWriter sends queued writes one at a time, in order. One at a time is
// enough for an agent's handful of endpoints and keeps the order trivially
// right; coalescing means a burst of intents for one endpoint costs one RPC.
func (c *Client) runWriter(ctx context.Context) {
	defer c.wg.Done()
	attempt := 0
	for {
		req, ok := c.nextWrite(ctx)
		if !ok {
			return
		}
		at, stored, err := c.sendWrite(ctx, req)
		if ctx.Err() != nil {
			return // closing: the write stays unacknowledged and Close reports it
		}
		if !c.finishWrite(req, at, stored, err) {
			attempt = 0
			continue
		}
		d := c.backoff(attempt)
		lvl := c.log.Debug
		if attempt == 0 {
			lvl = c.log.Warn
		}
		lvl("write not acknowledged; retrying", "op", req.op, "endpoint", req.id, "err", err, "in", d, "attempt", attempt+1)
		attempt++
		// A stream that syncs proves a registrar is reachable again: retry
		// at once instead of sitting out the rest of the backoff.
		if !retry.Sleep(ctx, d, c.syncKick) {
			if ctx.Err() != nil {
				return
			}
			attempt = 0
		}
	}
}

// nextWrite takes the head of the queue, waiting for one; meanwhile it
// retires acknowledged writes whose settle timeout passed.
func (c *Client) nextWrite(ctx context.Context) (writeReq, bool) {
	for {
		c.mu.Lock()
		if req, ok := c.st.nextReq(); ok {
			c.mu.Unlock()
			return req, true
		}
		due := c.st.nextSettle()
		if t := c.st.nextDue(); !t.IsZero() && (due.IsZero() || t.Before(due)) {
			due = t
		}
		c.mu.Unlock()

		var timer *time.Timer
		var timeout <-chan time.Time
		if !due.IsZero() {
			timer = time.NewTimer(max(time.Until(due), 0))
			timeout = timer.C
		}
		select {
		case <-ctx.Done():
		case <-c.writeKick:
		case <-timeout:
			c.mu.Lock()
			c.st.tick(time.Now())
			c.commitLocked()
			c.mu.Unlock()
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return writeReq{}, false
		}
	}
}

// nextReq takes the head of the queue and marks it in flight.
func (s *state) nextReq() (writeReq, bool) {
	for len(s.queue) > 0 {
		id := s.queue[0]
		s.queue = s.queue[1:]
		w := s.writes[id]
		if w == nil || w.state != writeQueued {
			continue // defensive: the queue only holds queued writes
		}
		w.state = writeInflight
		return writeReq{id: id, op: w.op, ep: w.ep, gen: w.gen, owner: w.owner}, true
	}
	return writeReq{}, false
}

// tick is the writer's timer going off at now: acknowledged writes whose
// settle timeout passed leave the overlay, and re-assertions whose backoff
// is over are queued.
func (s *state) tick(now time.Time) {
	s.settle(now)
	s.fireDue(now)
}

// sendWrite performs one write RPC against the current registrar and returns
// the position the registrar gave the write. Unregister and Drain name the
// endpoint twice, by reference and by the flat fields: a registrar that
// predates EndpointRef reads only the flat ones, a newer one checks that the
// two agree.
func (c *Client) sendWrite(ctx context.Context, req writeReq) (at registry.Position, stored *registryv1.ServiceEndpoint, err error) {
	idx := c.current()
	rpc := c.rpc[idx]
	ctx, cancel := context.WithTimeout(ctx, rpcTimeout)
	defer cancel()
	switch req.op {
	case opRegister:
		var resp *registrarv1.RegisterEndpointResponse
		if resp, err = rpc.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: req.ep}); err == nil {
			at, stored = registry.Position{Epoch: resp.GetEpoch(), Seq: resp.GetSequence()}, resp.GetEndpoint()
		}
	case opUnregister:
		var resp *registrarv1.UnregisterEndpointResponse
		if resp, err = rpc.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{
			Endpoint: req.id.Ref(),
			Service:  req.id.Service, Protocol: req.id.Protocol, Ip: req.id.IP, Cluster: req.id.Cluster, Region: req.id.Region,
			OwnerNode: req.owner,
		}); err == nil {
			at = registry.Position{Epoch: resp.GetEpoch(), Seq: resp.GetSequence()}
		}
	case opDrain:
		var resp *registrarv1.DrainEndpointResponse
		if resp, err = rpc.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{
			Endpoint: req.id.Ref(),
			Service:  req.id.Service, Protocol: req.id.Protocol, Ip: req.id.IP, Cluster: req.id.Cluster, Region: req.id.Region,
		}); err == nil {
			at = registry.Position{Epoch: resp.GetEpoch(), Seq: resp.GetSequence()}
		}
	}
	if err != nil {
		err = fmt.Errorf("%s %s at %s: %w", req.op, req.id, c.cfg.Addrs[idx], err)
	}
	return at, stored, err
}

// permanentWrite reports whether a registrar's answer means that retrying
// the same write can never succeed (see Permanent). Draining an endpoint
// the registrar does not hold is such an answer too: there is nothing to
// drain, and resending changes nothing.
func permanentWrite(err error, op opKind) bool {
	return Permanent(err) || (status.Code(err) == codes.NotFound && op == opDrain)
}

// finishWrite records the outcome of an RPC and reports whether to back off
// and retry.
func (c *Client) finishWrite(req writeReq, at registry.Position, stored *registryv1.ServiceEndpoint, err error) (retry bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	reassert := c.st.writes[req.id].reassert // in flight, so present; a drop deletes it
	out := c.st.finish(req, at, stored, err, time.Now())
	switch out {
	case writeRedrain:
		c.log.Info("drain of an endpoint the registrar does not hold; registering it again as DRAINING", "endpoint", req.id)
	case writeDropped:
		c.metrics.dropped.Inc()
		c.log.Error("write rejected by the registrar; dropped", "op", req.op, "endpoint", req.id, "code", status.Code(err), "err", err, "reassertion", reassert)
	}
	c.commitLocked()
	if out != writeRetry {
		close(c.acked)
		c.acked = make(chan struct{})
	}
	return out == writeRetry
}

// writeOutcome is what became of a write RPC's answer.
type writeOutcome int

const (
	writeAcknowledged writeOutcome = iota + 1 // acknowledged; in the overlay until it settles
	writeSuperseded                           // a newer intent arrived during the RPC: queued again at the front
	writeRedrain                              // a drain of an owned endpoint the registrar lost: registered again DRAINING
	writeDropped                              // rejected for good: dropped, and the endpoint no longer owned
	writeRetry                                // not acknowledged: queued again at the front, to be retried after a backoff
)

func (o writeOutcome) String() string {
	switch o {
	case writeAcknowledged:
		return "acknowledged"
	case writeSuperseded:
		return "superseded"
	case writeRedrain:
		return "redrain"
	case writeDropped:
		return "dropped"
	case writeRetry:
		return "retry"
	}
	return "none"
}

// finish records the answer to the RPC of req at now: at is the position the
// registrar gave the write and stored its copy of the endpoint (when err is
// nil). Acknowledged writes the stream has already caught up with settle.
func (s *state) finish(req writeReq, at registry.Position, stored *registryv1.ServiceEndpoint, err error, now time.Time) (out writeOutcome) {
	code := status.Code(err)
	w := s.writes[req.id] // in flight, so nothing else removed it
	current := w.gen == req.gen
	switch {
	case err == nil || (code == codes.NotFound && req.op == opUnregister):
		if !current {
			s.requeueFront(w) // a newer intent arrived meanwhile
			out = writeSuperseded
			break
		}
		w.state, w.ackedAt, w.ackAt = writeAcked, now, at
		if stored != nil && registry.SameAttributes(stored, w.ep) {
			w.ep = stored // the registrar's copy carries the timestamps
		}
		s.acknowledged(w)
		s.recompute(req.id)
		out = writeAcknowledged
	case permanentWrite(err, req.op):
		if !current {
			s.requeueFront(w)
			out = writeSuperseded
			break
		}
		delete(s.writes, req.id)
		if s.lostOnDrain(w, code) {
			// The registrar lost an endpoint the client owns and is
			// draining: the intent is DRAINING, and reconcile registers it
			// so.
			out = writeRedrain
		} else {
			delete(s.owned, req.id)
			out = writeDropped
		}
		s.reconcile(req.id, now, false)
		s.recompute(req.id)
	default:
		s.requeueFront(w)
		out = writeRetry
	}
	s.settle(now)
	return out
}
