package edge

import (
	"context"
	"errors"
	"io"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/edge/internal/core"
)

type leaseServer struct {
	pb.UnimplementedLeaseServer
	s *Server
}

func (l *leaseServer) LeaseGrant(ctx context.Context, r *pb.LeaseGrantRequest) (*pb.LeaseGrantResponse, error) {
	if err := l.s.checkSize(&pb.InternalRaftRequest{LeaseGrant: r}); err != nil {
		return nil, err
	}
	if err := l.s.checkQuota(leaseOverhead); err != nil {
		return nil, err
	}
	var resp *pb.LeaseGrantResponse
	var expiry time.Time
	rev, err := l.s.write(ctx, func(now time.Time) (ap *core.Applied, err error) {
		resp, ap, err = l.s.st.LeaseGrant(now, r)
		if err == nil {
			expiry = now.Add(time.Duration(resp.TTL) * time.Second)
		}
		return ap, err
	})
	if err != nil {
		return nil, err
	}
	// The expiry timer needs re-arming only when the new lease expires
	// before the one it waits for (each wake scans the leases).
	if expiry.UnixNano() < l.s.leaseDeadline.Load() {
		l.s.kickLeases()
	}
	resp.Header = l.s.header(resp.Header, rev)
	return resp, nil
}

func (l *leaseServer) LeaseRevoke(ctx context.Context, r *pb.LeaseRevokeRequest) (*pb.LeaseRevokeResponse, error) {
	if err := l.s.checkSize(&pb.InternalRaftRequest{LeaseRevoke: r}); err != nil {
		return nil, err
	}
	var resp *pb.LeaseRevokeResponse
	rev, err := l.s.write(ctx, func(now time.Time) (ap *core.Applied, err error) {
		resp, ap, err = l.s.st.LeaseRevoke(now, r.ID)
		return ap, err
	})
	if err != nil {
		return nil, err
	}
	resp.Header = l.s.header(resp.Header, rev)
	return resp, nil
}

// LeaseTimeToLive answers TTL -1 for an unknown lease, as etcd's v3rpc does.
func (l *leaseServer) LeaseTimeToLive(ctx context.Context, r *pb.LeaseTimeToLiveRequest) (*pb.LeaseTimeToLiveResponse, error) {
	var resp *pb.LeaseTimeToLiveResponse
	rev, err := l.s.write(ctx, func(now time.Time) (*core.Applied, error) {
		var err error
		resp, err = l.s.st.LeaseTimeToLive(now, r)
		if errors.Is(err, rpctypes.ErrGRPCLeaseNotFound) {
			resp, err = &pb.LeaseTimeToLiveResponse{ID: r.ID, TTL: -1}, nil
		}
		return nil, err
	})
	if err != nil {
		return nil, err
	}
	resp.Header = l.s.header(resp.Header, rev)
	return resp, nil
}

func (l *leaseServer) LeaseLeases(ctx context.Context, r *pb.LeaseLeasesRequest) (*pb.LeaseLeasesResponse, error) {
	var resp *pb.LeaseLeasesResponse
	rev, err := l.s.read(ctx, func() error {
		resp = l.s.st.Leases()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if resp.Leases == nil {
		resp.Leases = []*pb.LeaseStatus{}
	}
	resp.Header = l.s.header(resp.Header, rev)
	return resp, nil
}

// LeaseKeepAlive renews in the core (a renewal is not a change: after a
// restart every lease gets its full TTL again anyway). As in etcd, an
// unknown lease answers TTL 0 and the header is taken before the renewal.
func (l *leaseServer) LeaseKeepAlive(stream pb.Lease_LeaseKeepAliveServer) error {
	s := l.s
	ctx := stream.Context()
	errc := make(chan error, 1)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		errc <- l.keepAlive(ctx, stream)
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.closing:
		return status.Error(codes.Unavailable, "edge: server is shutting down")
	}
}

func (l *leaseServer) keepAlive(ctx context.Context, stream pb.Lease_LeaseKeepAliveServer) error {
	s := l.s
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.failure(); err != nil {
			return err
		}
		s.mu.Lock()
		resp := &pb.LeaseKeepAliveResponse{ID: req.ID, Header: s.header(nil, s.st.Rev())}
		ttl, err := s.st.LeaseRenew(s.now(), req.ID)
		b := s.commit.last()
		s.mu.Unlock()
		if errors.Is(err, rpctypes.ErrGRPCLeaseNotFound) {
			ttl, err = 0, nil
		}
		if err != nil {
			return togRPC(err)
		}
		if err := b.wait(ctx); err != nil {
			return togRPC(err)
		}
		resp.TTL = ttl
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

// kickLeases makes the expiry loop recompute its timer.
func (s *Server) kickLeases() {
	select {
	case s.leaseKick <- struct{}{}:
	default:
	}
}

// leaseLoop expires leases by this replica's clock: a timer set to the
// core's next expiry (no polling), re-armed whenever a lease is granted.
// Each expired lease is one change through the usual commit path; nobody
// waits for it, the watchers see its deletions once durable.
func (s *Server) leaseLoop(ctx context.Context) {
	// Any timer value will do before the first computation below.
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		if s.failure() == nil {
			s.mu.Lock()
			now := s.now()
			for _, ap := range s.st.ExpireLeases(now) {
				s.commit.add(ap)
			}
			next, ok := s.st.NextLeaseExpiry()
			d := time.Hour
			if ok {
				// At least a millisecond: a lease the core did not expire
				// at `now` must not make this loop spin.
				d = max(next.Sub(now), time.Millisecond)
			}
			// Stored under the state lock: a grant applied after this
			// sees it, one applied before is in NextLeaseExpiry.
			s.leaseDeadline.Store(now.Add(d).UnixNano())
			s.mu.Unlock()
			t.Reset(d)
		}
		select {
		case <-t.C:
		case <-s.leaseKick:
		case <-ctx.Done():
			return
		}
	}
}
