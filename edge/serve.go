package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/soheilhy/cmux"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	edgev1 "github.com/aethermesh/aether/api/edge/v1"
)

// How gRPC and HTTP/1 share a port, as etcd v3.7.3's embed/serve.go does:
//
//   - Plaintext: cmux sniffs the first bytes of each connection. The HTTP/2
//     client preface goes to the gRPC server's own transport (grpc.Serve),
//     everything else to the HTTP/1 server. Routing by content-type inside
//     one net/http HTTP/2 server would also work, but then every RPC runs
//     through grpc-go's ServeHTTP handler transport, which is markedly
//     slower than its native one; plaintext is what the benchmark and most
//     deployments use.
//   - TLS: one net/http server terminates TLS (ALPN picks h2 or
//     http/1.1) and hands HTTP/2 requests with a gRPC content-type to
//     grpc's ServeHTTP, the rest to the HTTP mux. This is etcd's secure
//     path too; it keeps the peer's certificate visible to both sides.
func (s *Server) serve() error {
	s.grpc = s.newGRPCServer()
	mux := http.NewServeMux()
	s.mountHTTP(mux)

	for _, u := range s.cfg.ListenClientURLs {
		secure := u.Scheme == "https" || u.Scheme == "unixs"
		if secure && s.cfg.ClientTLS == nil {
			return fmt.Errorf("edge: listen client URL %s is https but no client TLS is configured", u.String())
		}
		network, addr := "tcp", u.Host
		if u.Scheme == "unix" || u.Scheme == "unixs" {
			// etcd's resolveURL, and like etcd's unix listener remove a
			// socket file a previous run left behind.
			network, addr = "unix", u.Host+u.Path
			if err := os.Remove(addr); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("edge: remove stale socket %s: %w", addr, err)
			}
		}
		l, err := net.Listen(network, addr)
		if err != nil {
			return fmt.Errorf("edge: listen on %s: %w", u.String(), err)
		}
		s.listeners = append(s.listeners, l)
		if secure {
			s.serveTLS(l, mux)
		} else {
			s.servePlain(l, mux)
		}
	}
	return nil
}

func (s *Server) servePlain(l net.Listener, mux http.Handler) {
	m := cmux.New(l)
	httpl := m.Match(cmux.HTTP1())
	grpcl := m.Match(cmux.HTTP2())
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Minute}
	s.http = append(s.http, hs)
	s.goServe(func() error { return hs.Serve(httpl) })
	s.goServe(func() error { return s.grpc.Serve(grpcl) })
	s.goServe(m.Serve)
}

func (s *Server) serveTLS(l net.Listener, mux http.Handler) {
	cfg := s.cfg.ClientTLS.Clone()
	if !containsString(cfg.NextProtos, "h2") {
		cfg.NextProtos = append([]string{"h2"}, cfg.NextProtos...)
	}
	if !containsString(cfg.NextProtos, "http/1.1") {
		cfg.NextProtos = append(cfg.NextProtos, "http/1.1")
	}
	hs := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ProtoMajor == 2 && strings.Contains(r.Header.Get("Content-Type"), "application/grpc") {
				s.grpc.ServeHTTP(w, r)
				return
			}
			mux.ServeHTTP(w, r)
		}),
		TLSConfig:         cfg,
		ReadHeaderTimeout: 5 * time.Minute,
		// etcd lifts net/http's default of 250 concurrent streams.
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: math.MaxInt32},
	}
	s.http = append(s.http, hs)
	s.goServe(func() error { return hs.Serve(tls.NewListener(l, cfg)) })
}

func containsString(xs []string, x string) bool {
	for _, v := range xs {
		if v == x {
			return true
		}
	}
	return false
}

// goServe runs an accept loop until the listener closes.
func (s *Server) goServe(fn func() error) {
	s.serveWG.Add(1)
	go func() {
		defer s.serveWG.Done()
		err := fn()
		if err != nil && !isClosedErr(err) {
			s.log.Warn("serving stopped", "err", err)
		}
	}()
}

func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) ||
		errors.Is(err, grpc.ErrServerStopped) || errors.Is(err, cmux.ErrListenerClosed) ||
		errors.Is(err, cmux.ErrServerClosed) || strings.Contains(err.Error(), "use of closed network connection")
}

// newGRPCServer registers etcd's services and the extension, with etcd's
// server options: receive limit MaxRequestBytes plus etcd's gRPC overhead
// allowance, unlimited send size and concurrent streams.
func (s *Server) newGRPCServer() *grpc.Server {
	g := grpc.NewServer(
		grpc.MaxRecvMsgSize(s.maxRequestBytes+grpcOverheadBytes),
		grpc.MaxSendMsgSize(math.MaxInt32),
		grpc.MaxConcurrentStreams(math.MaxUint32),
		grpc.ChainUnaryInterceptor(s.metrics.unary, s.unaryInterceptor),
		grpc.ChainStreamInterceptor(s.metrics.stream),
		// etcd's keepalive defaults (--grpc-keepalive-min-time 5s,
		// -interval 2h, -timeout 20s). grpc-go's own enforcement minimum
		// is 5 minutes: clients that ping more often, as clientv3 users
		// with DialKeepAliveTime do, would be cut off with too_many_pings.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Hour, Timeout: 20 * time.Second}),
		// Close relies on no handler running once the gRPC server has
		// stopped: the committer and storage close after it.
		grpc.WaitForHandlers(true),
	)
	pb.RegisterKVServer(g, &kvServer{s: s})
	pb.RegisterWatchServer(g, &watchServer{s: s})
	pb.RegisterLeaseServer(g, &leaseServer{s: s})
	pb.RegisterClusterServer(g, &clusterServer{s: s})
	pb.RegisterMaintenanceServer(g, &maintenanceServer{s: s})
	pb.RegisterAuthServer(g, &authServer{s: s})
	edgev1.RegisterEdgeServer(g, &extServer{s: s})
	s.registerLockElection(g)
	// etcd serves the standard gRPC health service too (clients' health
	// checking uses it).
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(g, hs)
	return g
}

// unaryInterceptor gives the Auth methods that are not implemented a clear
// message instead of grpc's generic one.
func (s *Server) unaryInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if err != nil && strings.HasPrefix(info.FullMethod, "/etcdserverpb.Auth/") && status.Code(err) == codes.Unimplemented {
		return nil, status.Error(codes.Unimplemented, authMsg)
	}
	return resp, err
}
