package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// snapshotChunk bounds the endpoints per FULL_SNAPSHOT message, keeping each
// message far below gRPC's default 4 MiB receive limit.
const snapshotChunk = 1000

// service adapts a replica to the gRPC API. It owns nothing but the
// mapping of requests and errors.
// With Config.Authz every call is authenticated and authorized by g first
// (see guard); without it g is nil and nothing is checked.
type service struct {
	registrarv1.UnimplementedRegistrarServer
	r           Replica
	g           *guard
	log         *slog.Logger
	m           *metrics
	replication func() ([]*registrarv1.PeerReplicationStatus, bool)
	streams     *streamLimiter
	// wire, with Config.SharedEncoding, shares each event's encoding
	// among the streams it goes to (wire.go); nil sends plainly.
	wire *wireCache
	// senders counts the streams' sender goroutines (see Service.Wait).
	senders sync.WaitGroup
}

func (s *service) RegisterEndpoint(ctx context.Context, req *registrarv1.RegisterEndpointRequest) (*registrarv1.RegisterEndpointResponse, error) {
	check, err := s.g.endpoint(ctx, "RegisterEndpoint", authz.OpRegister)
	if err != nil {
		return nil, err
	}
	ep, v, err := s.r.RegisterChecked(req.GetEndpoint(), check)
	if err != nil {
		return nil, s.status("RegisterEndpoint", "register", err)
	}
	pos := positionOf(v)
	resp := &registrarv1.RegisterEndpointResponse{Endpoint: ep, Version: v, Epoch: pos.Epoch, Sequence: pos.Seq}
	if req.GetWaitPersisted() {
		if err := s.r.WaitPersisted(ctx, registry.IDOf(ep), ep.GetStamp()); err != nil {
			return nil, s.status("RegisterEndpoint", "register", err)
		}
		resp.Persisted = true
	}
	return resp, nil
}

func (s *service) UnregisterEndpoint(ctx context.Context, req *registrarv1.UnregisterEndpointRequest) (*registrarv1.UnregisterEndpointResponse, error) {
	check, err := s.g.endpoint(ctx, "UnregisterEndpoint", authz.OpUnregister)
	if err != nil {
		return nil, err
	}
	// Authorization first, then ownership: a live node's endpoint is
	// removed only for that node (registrar/ownership.go).
	owner, err := s.r.OwnerCheck(req.GetOwnerNode(), s.g.nodeIdentity(ctx))
	if err != nil {
		return nil, s.status("UnregisterEndpoint", "unregister", err)
	}
	check = bothChecks(check, owner)
	id, err := namedEndpoint(req.GetEndpoint(), req.GetRegion(), req.GetCluster(), req.GetService(), req.GetProtocol(), req.GetIp())
	if err != nil {
		return nil, s.status("UnregisterEndpoint", "unregister", err)
	}
	v, w, err := s.r.UnregisterStamped(id, check)
	if err != nil {
		return nil, s.status("UnregisterEndpoint", "unregister", err)
	}
	pos := positionOf(v)
	resp := &registrarv1.UnregisterEndpointResponse{Version: v, Epoch: pos.Epoch, Sequence: pos.Seq}
	if req.GetWaitPersisted() {
		if err := s.r.WaitPersisted(ctx, w.ID, w.Stamp); err != nil {
			return nil, s.status("UnregisterEndpoint", "unregister", err)
		}
		resp.Persisted = true
	}
	return resp, nil
}

func (s *service) ListAllEndpoints(ctx context.Context, req *registrarv1.ListAllEndpointsRequest) (*registrarv1.ListAllEndpointsResponse, error) {
	if err := s.g.read(ctx, "ListAllEndpoints"); err != nil {
		return nil, err
	}
	eps, v, err := s.r.List(req.GetServices())
	if err != nil {
		return nil, s.status("ListAllEndpoints", "list", err)
	}
	return &registrarv1.ListAllEndpointsResponse{Endpoints: eps, Version: v}, nil
}

// openStream admits a new watch stream: the caller may read, and is under
// its limit of open streams. release must be called when the stream ends.
func (s *service) openStream(ctx context.Context, method string) (release func(), err error) {
	if err := s.g.read(ctx, method); err != nil {
		return nil, err
	}
	return s.streams.acquire(ctx, s.g, method)
}

func (s *service) WatchEndpoints(req *registrarv1.WatchEndpointsRequest, stream grpc.ServerStreamingServer[registrarv1.EndpointEvent]) error {
	release, err := s.openStream(stream.Context(), "WatchEndpoints")
	if err != nil {
		return err
	}
	defer release()
	sub, err := s.start(req)
	if err != nil {
		return err
	}
	defer sub.Close()
	return s.serve(stream, sub, req)
}

func (s *service) DrainEndpoint(ctx context.Context, req *registrarv1.DrainEndpointRequest) (*registrarv1.DrainEndpointResponse, error) {
	check, err := s.g.endpoint(ctx, "DrainEndpoint", authz.OpDrain)
	if err != nil {
		return nil, err
	}
	id, err := namedEndpoint(req.GetEndpoint(), req.GetRegion(), req.GetCluster(), req.GetService(), req.GetProtocol(), req.GetIp())
	if err != nil {
		return nil, s.status("DrainEndpoint", "drain", err)
	}
	ep, v, err := s.r.DrainChecked(id, check)
	if err != nil {
		return nil, s.status("DrainEndpoint", "drain", err)
	}
	pos := positionOf(v)
	resp := &registrarv1.DrainEndpointResponse{Endpoint: ep, Version: v, Epoch: pos.Epoch, Sequence: pos.Seq}
	if req.GetWaitPersisted() {
		if err := s.r.WaitPersisted(ctx, registry.IDOf(ep), ep.GetStamp()); err != nil {
			return nil, s.status("DrainEndpoint", "drain", err)
		}
		resp.Persisted = true
	}
	return resp, nil
}

func (s *service) Subscribe(stream grpc.BidiStreamingServer[registrarv1.SubscribeRequest, registrarv1.EndpointEvent]) error {
	release, err := s.openStream(stream.Context(), "Subscribe")
	if err != nil {
		return err
	}
	defer release()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	req := first.GetStart()
	if req == nil {
		return status.Error(codes.InvalidArgument, "the first Subscribe message must set start (a WatchEndpointsRequest)")
	}
	sub, err := s.start(req)
	if err != nil {
		return err
	}
	defer sub.Close()
	// Updates are read on their own goroutine; the stream's events keep
	// flowing meanwhile. A bad update ends the stream with its status.
	// Its Recv returns only once the client sends or the RPC ends, which
	// is after this handler returns, so it is not joined here but by
	// Service.Wait; it touches only sub, whose Update after Close does
	// nothing.
	failed := make(chan error, 1)
	s.senders.Add(1)
	go func() {
		defer s.senders.Done()
		for {
			msg, err := stream.Recv()
			if status.Code(err) == codes.InvalidArgument {
				failed <- err // an update that did not decode (ingress.go)
				return
			}
			if err != nil {
				return // the client closed its side or the stream ended
			}
			if err := s.update(sub, msg); err != nil {
				failed <- err
				return
			}
		}
	}()
	return s.serveUntil(stream, sub, req, failed)
}

func (s *service) update(sub *replica.Subscription, msg *registrarv1.SubscribeRequest) error {
	u := msg.GetUpdate()
	if u == nil {
		return status.Error(codes.InvalidArgument, "after the first message, Subscribe messages must set update")
	}
	err := sub.Update(u.GetAdd(), u.GetRemove())
	var fe *registry.FieldError
	var le *replica.ServiceLimitError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, replica.ErrWatchesAll):
		return status.Error(codes.InvalidArgument, "this stream watches all services; to choose services, start it with a service list")
	case errors.As(err, &fe):
		return status.Error(codes.InvalidArgument, "update."+fe.Error())
	case errors.As(err, &le):
		return status.Error(codes.InvalidArgument, fmt.Sprintf(
			"update: the stream would watch %d services, more than the limit of %d (--max-watch-services); nothing was changed",
			le.Services, le.Limit))
	}
	return status.Error(codes.Internal, "update: "+err.Error())
}

func (s *service) AnnounceNode(ctx context.Context, req *registrarv1.AnnounceNodeRequest) (*registrarv1.AnnounceNodeResponse, error) {
	if err := s.g.node(ctx, "AnnounceNode", authz.OpAnnounce, req.GetNode().GetName()); err != nil {
		return nil, err
	}
	n, err := s.r.AnnounceNode(ctx, req.GetNode())
	if err != nil {
		return nil, s.status("AnnounceNode", "announce node", err)
	}
	return &registrarv1.AnnounceNodeResponse{Node: n, HeartbeatIntervalMs: s.r.HeartbeatInterval().Milliseconds()}, nil
}

func (s *service) Heartbeat(ctx context.Context, req *registrarv1.HeartbeatRequest) (*registrarv1.HeartbeatResponse, error) {
	if err := s.g.node(ctx, "Heartbeat", authz.OpHeartbeat, req.GetNode()); err != nil {
		return nil, err
	}
	ttl, err := s.r.Heartbeat(ctx, req.GetNode(), req.GetRegion(), req.GetCluster())
	if err != nil {
		return nil, s.status("Heartbeat", "heartbeat", err)
	}
	return &registrarv1.HeartbeatResponse{LeaseTtlSeconds: int64(ttl / time.Second)}, nil
}

func (s *service) LeaveNode(ctx context.Context, req *registrarv1.LeaveNodeRequest) (*registrarv1.LeaveNodeResponse, error) {
	if err := s.g.node(ctx, "LeaveNode", authz.OpLeave, req.GetNode()); err != nil {
		return nil, err
	}
	if err := s.r.LeaveNode(ctx, req.GetNode(), req.GetRegion(), req.GetCluster()); err != nil {
		return nil, s.status("LeaveNode", "leave", err)
	}
	return &registrarv1.LeaveNodeResponse{}, nil
}

func (s *service) ListNodes(ctx context.Context, _ *registrarv1.ListNodesRequest) (*registrarv1.ListNodesResponse, error) {
	if err := s.g.read(ctx, "ListNodes"); err != nil {
		return nil, err
	}
	return &registrarv1.ListNodesResponse{Nodes: s.r.ListNodes(ctx)}, nil
}

func (s *service) ReplicationStatus(ctx context.Context, _ *registrarv1.ReplicationStatusRequest) (*registrarv1.ReplicationStatusResponse, error) {
	if err := s.g.read(ctx, "ReplicationStatus"); err != nil {
		return nil, err
	}
	resp := &registrarv1.ReplicationStatusResponse{Region: s.r.Identity().Region}
	if s.replication != nil {
		resp.Peers, resp.Enabled = s.replication()
	}
	return resp, nil
}

// start validates a watch request and subscribes.
func (s *service) start(req *registrarv1.WatchEndpointsRequest) (*replica.Subscription, error) {
	sub, err := s.r.Subscribe(req.GetServices(), req.GetLastVersion())
	var fe *registry.FieldError
	var le *replica.ServiceLimitError
	switch {
	case err == nil:
		return sub, nil
	case errors.As(err, &fe):
		return nil, status.Error(codes.InvalidArgument, fe.Error())
	case errors.As(err, &le):
		return nil, status.Error(codes.InvalidArgument, fmt.Sprintf(
			"services: %d distinct services exceed the limit of %d per watch (--max-watch-services); split them over several streams, or watch all services with an empty list",
			le.Services, le.Limit))
	case errors.Is(err, replica.ErrBadVersion):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, replica.ErrShuttingDown):
		return nil, status.Errorf(codes.Unavailable, "registrar is shutting down; reconnect and resume with last_version=%q", req.GetLastVersion())
	case errors.Is(err, replica.ErrNotReady):
		return nil, status.Error(codes.Unavailable, err.Error()+"; retry, or watch through another registrar")
	}
	return nil, status.Error(codes.Internal, "watch: "+err.Error())
}

type sender interface {
	Send(*registrarv1.EndpointEvent) error
	SendMsg(m any) error
	Context() context.Context
}

// sendEvent sends a published event, in its shared encoding when the
// service has one.
func (s *service) sendEvent(stream sender, ev *registrarv1.EndpointEvent) error {
	if s.wire == nil {
		return stream.Send(ev)
	}
	b, err := s.wire.encode(ev)
	if err != nil {
		return status.Error(codes.Internal, err.Error())
	}
	return stream.SendMsg(b)
}

func (s *service) serve(stream sender, sub *replica.Subscription, req *registrarv1.WatchEndpointsRequest) error {
	return s.serveUntil(stream, sub, req, nil)
}

// serveUntil sends the stream's start (snapshot, or missed events and a
// bookmark) and then its events, until the client goes, the subscription
// is cut (shutdown, or the client fell behind), or stop delivers an error.
func (s *service) serveUntil(stream sender, sub *replica.Subscription, req *registrarv1.WatchEndpointsRequest, stop <-chan error) error {
	log := s.log.With("node", req.GetNodeName(), "watcher_cluster", req.GetClusterName())
	// Taken, not read: once sent the stream lets the start go. The stream
	// lives on with sub, and a snapshot is a slice of every endpoint it
	// follows: kept for every stream's life, thousands of streams would
	// hold copies of the registry that every collection marks again.
	start := sub.TakeStart()
	last := start.At.String()
	if start.Resumed {
		for _, ev := range start.Missed {
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
		// Tell the client it is current even if it missed nothing.
		if err := stream.Send(&registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_PROGRESS, Version: last, Sequence: start.At.Seq, Epoch: start.At.Epoch}); err != nil {
			return err
		}
	} else {
		if err := sendSnapshot(stream, registrarv1.EndpointEvent_FULL_SNAPSHOT, nil, start.Snapshot, start.At); err != nil {
			return err
		}
	}
	log.Debug("watch started", "resumed", start.Resumed, "missed", len(start.Missed), "snapshot", len(start.Snapshot), "version", last)
	start.Snapshot, start.Missed = nil, nil // sent: let them go

	// Events are sent from their own goroutine so that the handler can end
	// the stream (eviction, shutdown) even while a Send is blocked on a
	// client that stopped reading: returning ends the RPC, which releases
	// the blocked Send. etcd's watch server does the same. The sender is
	// joined before returning unless it is inside such a Send: gRPC aborts
	// a Send only by ending the RPC, which happens when this handler
	// returns, so waiting for it here would wait forever. That sender ends
	// right after, and Service.Wait joins it. state says which: the sender
	// enters a Send only from idle, and the handler's stop wins the race
	// for it, so a sender never starts a Send the handler did not see.
	const (
		idle = iota
		sending
		stopped
	)
	var state atomic.Int32
	epoch := start.At.Epoch
	var lastSent atomic.Pointer[string]
	lastSent.Store(&last)
	ctx, cancel := context.WithCancel(stream.Context())
	senderDone := make(chan struct{})
	sendErr := make(chan error, 1)
	s.senders.Add(1)
	go func() {
		defer s.senders.Done()
		defer close(senderDone)
		for {
			batch, err := sub.Next(ctx)
			if err != nil {
				return // ctx ended or the subscription was cut: the handler sees why
			}
			for _, ev := range batch {
				if !state.CompareAndSwap(idle, sending) {
					return // the handler is returning
				}
				if ev.Type == registrarv1.EndpointEvent_SERVICES_SNAPSHOT {
					// Stored whole in the replica; chunked on the wire.
					err = sendSnapshot(stream, ev.Type, ev.Services, ev.Endpoints, registry.Position{Epoch: epoch, Seq: ev.Sequence})
				} else {
					err = s.sendEvent(stream, ev)
				}
				if !state.CompareAndSwap(sending, idle) {
					return // the handler returned during the Send
				}
				if err != nil {
					sendErr <- err
					return
				}
				v := ev.Version
				lastSent.Store(&v)
			}
		}
	}()
	defer func() {
		cancel()
		if state.Swap(stopped) != sending {
			<-senderDone
		}
	}()

	select {
	case <-ctx.Done():
		return nil
	case err := <-sendErr:
		return err
	case err := <-stop:
		return err
	case <-sub.Done():
	}
	last = *lastSent.Load()
	switch err := sub.Err(); {
	case errors.Is(err, replica.ErrShuttingDown):
		return status.Errorf(codes.Unavailable, "registrar is shutting down; reconnect and resume with last_version=%q", last)
	case errors.Is(err, replica.ErrSlowConsumer):
		// Whatever is still buffered was never sent; the client resumes
		// from the last version it did receive.
		s.m.evictions.Inc()
		buffer := s.r.Limits().WatchBuffer
		log.Warn("watch stream evicted: consumer too slow", "last_version", last, "buffer", buffer)
		return status.Errorf(codes.ResourceExhausted,
			"watch stream evicted: the client fell %d messages behind (--watch-buffer); resume with last_version=%q",
			buffer, last)
	default:
		return status.Errorf(codes.Unavailable, "watch ended: %v; resume with last_version=%q", err, last)
	}
}

// sendSnapshot sends a snapshot in chunks, each carrying the snapshot's
// position (version, epoch and sequence) so that any chunk stands on its
// own.
func sendSnapshot(stream sender, typ registrarv1.EndpointEvent_EventType, services []string, eps []*registryv1.ServiceEndpoint, at registry.Position) error {
	v := at.String()
	for i := 0; ; i += snapshotChunk {
		end := min(i+snapshotChunk, len(eps))
		if err := stream.Send(&registrarv1.EndpointEvent{
			Type:              typ,
			Version:           v,
			Epoch:             at.Epoch,
			Sequence:          at.Seq,
			Endpoints:         eps[i:end],
			SnapshotContinues: end < len(eps),
			Services:          services,
		}); err != nil {
			return err
		}
		if end == len(eps) {
			return nil
		}
	}
}

// status maps a replica error to a precise gRPC status. method names the
// RPC for the log of an authorization refusal (from a WriteCheck).
func (s *service) status(method, op string, err error) error {
	var fe *registry.FieldError
	var ae *authz.Error
	switch {
	case errors.Is(err, replica.ErrOwned):
		// The request is fine; the endpoint's state forbids it.
		s.m.rejected.WithLabelValues("owned").Inc()
		return status.Error(codes.FailedPrecondition, fmt.Sprintf("%s: %v", op, err))
	case errors.Is(err, replica.ErrNodeFull):
		s.m.rejected.WithLabelValues("node_limit").Inc()
		return status.Error(codes.ResourceExhausted, fmt.Sprintf("%s: %v", op, err))
	case errors.As(err, &ae):
		return s.g.denied(method, ae)
	case errors.As(err, &fe):
		s.m.rejected.WithLabelValues("invalid").Inc()
		return status.Error(codes.InvalidArgument, fe.Error())
	case errors.Is(err, replica.ErrNotFound):
		s.m.rejected.WithLabelValues("not_found").Inc()
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, replica.ErrNoLeases):
		return status.Error(codes.FailedPrecondition, fmt.Sprintf("%s: %v", op, err))
	case errors.Is(err, replica.ErrBackendUnavailable):
		s.m.rejected.WithLabelValues("backend").Inc()
		return status.Error(codes.Unavailable, fmt.Sprintf("%s: %v; retry", op, err))
	case errors.Is(err, replica.ErrNotPersisted):
		return status.Error(codes.DeadlineExceeded, fmt.Sprintf("%s: %v", op, err))
	case errors.Is(err, replica.ErrRefused):
		s.m.rejected.WithLabelValues("refused_by_backend").Inc()
		return status.Error(codes.FailedPrecondition, fmt.Sprintf("%s: acknowledged but %v; change the request (see the registrar's log) and write it again", op, err))
	case errors.Is(err, replica.ErrQueueFull):
		s.m.rejected.WithLabelValues("queue_full").Inc()
		return status.Error(codes.ResourceExhausted, fmt.Sprintf(
			"%s: write queue is full (%d endpoints waiting to be persisted, --write-queue-limit); the backend is not keeping up, retry later",
			op, s.r.Limits().WriteQueueLimit))
	}
	return status.Error(codes.Internal, fmt.Sprintf("%s: %v", op, err))
}
