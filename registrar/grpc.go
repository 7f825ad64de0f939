package registrar

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/registry"
)

// snapshotChunk bounds the endpoints per FULL_SNAPSHOT message, keeping each
// message far below gRPC's default 4 MiB receive limit.
const snapshotChunk = 1000

// service adapts a Registrar to the gRPC API. It owns nothing but the
// mapping of errors to status codes.
// With authorization configured (GRPCConfig.Authorize) every call is
// authenticated and authorized by g first (see guard); without one g is nil
// and nothing is checked.
type service struct {
	registrarv1.UnimplementedRegistrarServer
	r       *Registrar
	g       *guard
	streams *streamLimiter
	cfg     GRPCConfig // defaults filled in
	// wire, when the server has wireCodec, shares each event's encoding
	// among the streams it goes to (wire.go); nil sends plainly.
	wire *wireCache
}

// RegisterGRPC registers the Registrar API on s.
// Nobody is authenticated and the limits are DefaultGRPCConfig's.
func (r *Registrar) RegisterGRPC(s grpc.ServiceRegistrar) { r.registerGRPC(s, nil, GRPCConfig{}) }

func (r *Registrar) registerGRPC(s grpc.ServiceRegistrar, wire *wireCache, c GRPCConfig) {
	c = c.withDefaults()
	registerIngress(s, &service{r: r, g: newGuard(r, c), cfg: c, wire: wire, streams: newStreamLimiter(c.MaxStreamsPerIdentity, func() {
		r.metrics.rejected.WithLabelValues("stream_limit").Inc()
	})}, func() { r.metrics.rejected.WithLabelValues("malformed").Inc() }) // ingress.go
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
	resp := &registrarv1.RegisterEndpointResponse{Endpoint: ep, Version: v}
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
	// removed only for that node (ownership.go).
	owner, err := s.r.ownerCheck(req.GetOwnerNode(), s.g.nodeIdentity(ctx))
	if err != nil {
		return nil, s.status("UnregisterEndpoint", "unregister", err)
	}
	check = bothChecks(check, owner)
	v, w, err := s.r.UnregisterStamped(registry.EndpointID{
		Region:   req.GetRegion(),
		Cluster:  req.GetCluster(),
		Service:  req.GetService(),
		Protocol: req.GetProtocol(),
		IP:       req.GetIp(),
	}, check)
	if st, ok := s.ownedStatus("unregister", err); ok {
		return nil, st
	}
	if err != nil {
		return nil, s.status("UnregisterEndpoint", "unregister", err)
	}
	resp := &registrarv1.UnregisterEndpointResponse{Version: v}
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
	defer s.r.unsubscribe(sub.w)
	return s.serve(stream, sub, req)
}

func (s *service) DrainEndpoint(ctx context.Context, req *registrarv1.DrainEndpointRequest) (*registrarv1.DrainEndpointResponse, error) {
	check, err := s.g.endpoint(ctx, "DrainEndpoint", authz.OpDrain)
	if err != nil {
		return nil, err
	}
	ep, v, err := s.r.DrainChecked(registry.EndpointID{
		Region:   req.GetRegion(),
		Cluster:  req.GetCluster(),
		Service:  req.GetService(),
		Protocol: req.GetProtocol(),
		IP:       req.GetIp(),
	}, check)
	if err != nil {
		return nil, s.status("DrainEndpoint", "drain", err)
	}
	resp := &registrarv1.DrainEndpointResponse{Endpoint: ep, Version: v}
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
	defer s.r.unsubscribe(sub.w)
	// Updates are read on their own goroutine; the stream's events keep
	// flowing meanwhile. A bad update ends the stream with its status.
	failed := make(chan error, 1)
	go func() {
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

func (s *service) update(sub *subscription, msg *registrarv1.SubscribeRequest) error {
	u := msg.GetUpdate()
	if u == nil {
		return status.Error(codes.InvalidArgument, "after the first message, Subscribe messages must set update")
	}
	if sub.w.f.all() {
		return status.Error(codes.InvalidArgument, "this stream watches all services; to choose services, start it with a service list")
	}
	add, err := newFilter(u.GetAdd())
	if err != nil {
		return status.Error(codes.InvalidArgument, "update.add: "+err.Error())
	}
	remove, err := newFilter(u.GetRemove())
	if err != nil {
		return status.Error(codes.InvalidArgument, "update.remove: "+err.Error())
	}
	if n, ok := s.r.updateFilter(sub.w, add, remove, s.cfg.MaxWatchServices); !ok {
		return status.Error(codes.InvalidArgument, fmt.Sprintf(
			"update: the stream would watch %d services, more than the limit of %d (--max-watch-services); nothing was changed",
			n, s.cfg.MaxWatchServices))
	}
	return nil
}

func (s *service) AnnounceNode(ctx context.Context, req *registrarv1.AnnounceNodeRequest) (*registrarv1.AnnounceNodeResponse, error) {
	if err := s.g.node(ctx, "AnnounceNode", authz.OpAnnounce, req.GetNode().GetName()); err != nil {
		return nil, err
	}
	n, err := s.r.AnnounceNode(ctx, req.GetNode())
	if err != nil {
		return nil, s.status("AnnounceNode", "announce node", err)
	}
	return &registrarv1.AnnounceNodeResponse{Node: n, HeartbeatIntervalMs: (s.r.opts.NodeTTL / 3).Milliseconds()}, nil
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
	resp := &registrarv1.ReplicationStatusResponse{Region: s.r.opts.Region, Enabled: s.r.repl != nil}
	if s.r.repl == nil {
		return resp, nil
	}
	resp.Peers = s.r.repl.ReplicationPeers()
	return resp, nil
}

// start validates a watch request and subscribes.
func (s *service) start(req *registrarv1.WatchEndpointsRequest) (*subscription, error) {
	f, err := newFilter(req.GetServices())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, "services: "+err.Error())
	}
	if max := s.cfg.MaxWatchServices; len(f) > max {
		return nil, status.Error(codes.InvalidArgument, fmt.Sprintf(
			"services: %d distinct services exceed the limit of %d per watch (--max-watch-services); split them over several streams, or watch all services with an empty list",
			len(f), max))
	}
	from, err := parseVersion(req.GetLastVersion())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return s.r.subscribe(f, from), nil
}

type sender interface {
	Send(*registrarv1.EndpointEvent) error
	SendMsg(m any) error
	Context() context.Context
}

// sendEvent sends a published event, in its shared encoding when the
// server has one.
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

func (s *service) serve(stream sender, sub *subscription, req *registrarv1.WatchEndpointsRequest) error {
	return s.serveUntil(stream, sub, req, nil)
}

// serveUntil sends the stream's start (snapshot, or missed events and a
// bookmark) and then its events, until the client goes, the registrar shuts
// down, the stream is evicted, or stop delivers an error.
func (s *service) serveUntil(stream sender, sub *subscription, req *registrarv1.WatchEndpointsRequest, stop <-chan error) error {
	log := s.r.log.With("node", req.GetNodeName(), "watcher_cluster", req.GetClusterName())
	last := sub.at.String()
	if sub.resumed {
		for _, ev := range sub.missed {
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
		// Tell the client it is current even if it missed nothing.
		if err := stream.Send(&registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_PROGRESS, Version: last, Sequence: sub.at.seq}); err != nil {
			return err
		}
	} else {
		if err := sendSnapshot(stream, registrarv1.EndpointEvent_FULL_SNAPSHOT, nil, sub.snapshot, sub.at); err != nil {
			return err
		}
		s.r.metrics.delivered(registrarv1.EndpointEvent_FULL_SNAPSHOT, 1)
	}
	log.Debug("watch started", "resumed", sub.resumed, "missed", len(sub.missed), "snapshot", len(sub.snapshot), "version", last)
	// Sent: let them go. The stream lives on with sub, and a snapshot is
	// a slice of every endpoint it follows: kept for every stream's life,
	// thousands of streams would hold copies of the registry that every
	// collection marks again.
	sub.snapshot, sub.missed = nil, nil

	// Events are sent from their own goroutine so that the handler can end
	// the stream (eviction, shutdown) even while a Send is blocked on a
	// client that stopped reading: returning ends the RPC, which releases
	// the blocked Send. etcd's watch server does the same.
	var lastSent atomic.Pointer[string]
	lastSent.Store(&last)
	done := make(chan struct{})
	defer close(done)
	sendErr := make(chan error, 1)
	go func() {
		for {
			select {
			case <-done:
				return
			case <-sub.w.ready:
			}
			for {
				batch, ok := sub.w.next()
				if !ok {
					break
				}
				for _, ev := range batch {
					select {
					case <-done:
						return
					default:
					}
					var err error
					if ev.Type == registrarv1.EndpointEvent_SERVICES_SNAPSHOT {
						// Stored whole in the hub; chunked on the wire.
						err = sendSnapshot(stream, ev.Type, ev.Services, ev.Endpoints, version{epoch: sub.at.epoch, seq: ev.Sequence})
					} else {
						err = s.sendEvent(stream, ev)
					}
					if err != nil {
						sendErr <- err
						return
					}
					v := ev.Version
					lastSent.Store(&v)
				}
			}
		}
	}()

	ctx := stream.Context()
	select {
	case <-ctx.Done():
		return nil
	case err := <-sendErr:
		return err
	case err := <-stop:
		return err
	case <-s.r.closing:
		return status.Errorf(codes.Unavailable, "registrar is shutting down; reconnect and resume with last_version=%q", *lastSent.Load())
	case <-sub.w.evicted:
		// Whatever is still buffered was never sent; the client resumes
		// from the last version it did receive.
		last := *lastSent.Load()
		s.r.metrics.evictions.Inc()
		log.Warn("watch stream evicted: consumer too slow", "last_version", last, "buffer", s.r.opts.WatchBuffer)
		return status.Errorf(codes.ResourceExhausted,
			"watch stream evicted: the client fell %d messages behind (--watch-buffer); resume with last_version=%q",
			s.r.opts.WatchBuffer, last)
	}
}

func sendSnapshot(stream sender, typ registrarv1.EndpointEvent_EventType, services []string, eps []*registryv1.ServiceEndpoint, at version) error {
	v := at.String()
	for i := 0; ; i += snapshotChunk {
		end := min(i+snapshotChunk, len(eps))
		if err := stream.Send(&registrarv1.EndpointEvent{
			Type:              typ,
			Version:           v,
			Sequence:          at.seq,
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

// status maps a registrar error to a precise gRPC status. method names the
// RPC for the log of an authorization refusal (from a WriteCheck).
func (s *service) status(method, op string, err error) error {
	var fe *registry.FieldError
	var ae *authz.Error
	var nf *nodeFullError
	switch {
	case errors.As(err, &nf):
		s.r.metrics.rejected.WithLabelValues("node_limit").Inc()
		return status.Error(codes.ResourceExhausted, fmt.Sprintf("%s: %v", op, nf))
	case errors.As(err, &ae):
		return s.g.denied(method, ae)
	case errors.As(err, &fe):
		s.r.metrics.rejected.WithLabelValues("invalid").Inc()
		return status.Error(codes.InvalidArgument, fe.Error())
	case errors.Is(err, errNotFound):
		s.r.metrics.rejected.WithLabelValues("not_found").Inc()
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, errNoLeases):
		return status.Error(codes.FailedPrecondition, fmt.Sprintf("%s: %v", op, err))
	case errors.Is(err, errBackend):
		s.r.metrics.rejected.WithLabelValues("backend").Inc()
		return status.Error(codes.Unavailable, fmt.Sprintf("%s: %v; retry", op, err))
	case errors.Is(err, errPersistWait):
		return status.Error(codes.DeadlineExceeded, fmt.Sprintf("%s: %v", op, err))
	case errors.Is(err, errRefused):
		s.r.metrics.rejected.WithLabelValues("refused_by_backend").Inc()
		return status.Error(codes.FailedPrecondition, fmt.Sprintf("%s: acknowledged but %v; change the request (see the registrar's log) and write it again", op, err))
	case errors.Is(err, errQueueFull):
		s.r.metrics.rejected.WithLabelValues("queue_full").Inc()
		return status.Error(codes.ResourceExhausted, fmt.Sprintf(
			"%s: write queue is full (%d endpoints waiting to be persisted, --write-queue-limit); the backend is not keeping up, retry later",
			op, s.r.opts.WriteQueueLimit))
	}
	return status.Error(codes.Internal, fmt.Sprintf("%s: %v", op, err))
}
