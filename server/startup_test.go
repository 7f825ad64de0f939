package server_test

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// syncBuf is a log sink that tests read while the registrar writes.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestServeUnreachableEtcdAnswersUnavailable starts a registrar the way
// `aether registrar` does (Serve) against an etcd endpoint where nothing
// listens. Its first RPC must come back UNAVAILABLE within a second,
// saying what the registrar waits for, rather than hang on a port that
// accepts connections and never answers; the log, gRPC health and /readyz
// must say the same.
func TestServeUnreachableEtcdAnswersUnavailable(t *testing.T) {
	// Not parallel: its one-second bound is on the registrar's own start,
	// which tests starting etcds beside it would slow on a small machine;
	// and its ports are picked free here and bound by Serve later, which
	// other tests binding ports meanwhile could take.
	etcdAddr := regtest.FreeAddr(t) // closed: connections are refused
	grpcAddr, httpAddr := regtest.FreeAddr(t), regtest.FreeAddr(t)
	logs := &syncBuf{}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	began := time.Now()
	go func() {
		served <- server.Serve(ctx, server.Config{
			EtcdEndpoints: []string{"http://" + etcdAddr},
			GRPCAddr:      grpcAddr,
			HTTPAddr:      httpAddr,
			Options: registrar.Options{
				ClusterName: "c1",
				Region:      "r1",
				Logger:      slog.New(slog.NewTextHandler(logs, nil)),
			},
		})
	}()
	t.Cleanup(func() {
		stop()
		select {
		case <-served:
		case <-time.After(20 * time.Second):
			t.Error("Serve did not return within 20s of its context ending")
		}
	})

	// The second starts with Serve. The client dials once the port is
	// bound (milliseconds in), since a refused first dial would put gRPC's
	// reconnect backoff, not the registrar, on the clock.
	waitFor(t, "the gRPC port to be bound", time.Second, func() bool {
		conn, err := net.Dial("tcp", grpcAddr)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := registrarv1.NewRegistrarClient(cc)
	rpcCtx, cancel := context.WithDeadline(context.Background(), began.Add(time.Second))
	defer cancel()
	_, err = c.ListAllEndpoints(rpcCtx, &registrarv1.ListAllEndpointsRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("first RPC %v after start: %v; want UNAVAILABLE within 1s", time.Since(began).Round(time.Millisecond), err)
	}
	want := "registrar is loading its snapshot from etcd at http://" + etcdAddr
	if msg := status.Convert(err).Message(); !strings.Contains(msg, want) || !strings.Contains(msg, "retry") {
		t.Fatalf("UNAVAILABLE message %q; want it to contain %q and say to retry", msg, want)
	}
	t.Logf("UNAVAILABLE after %v: %s", time.Since(began).Round(time.Millisecond), status.Convert(err).Message())

	// Soon the reason is the connection's own error, on every path.
	waitFor(t, "the reason to name the refused connection", 5*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
		return status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "connection refused")
	})
	sctx, scancel := context.WithTimeout(context.Background(), time.Second)
	defer scancel()
	stream, err := c.WatchEndpoints(sctx, &registrarv1.WatchEndpointsRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), want) {
		t.Errorf("WatchEndpoints: %v; want UNAVAILABLE containing %q", err, want)
	}
	hresp, err := healthpb.NewHealthClient(cc).Check(sctx, &healthpb.HealthCheckRequest{Service: registrarv1.Registrar_ServiceDesc.ServiceName})
	if err != nil || hresp.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health = %v, %v; want NOT_SERVING", hresp.GetStatus(), err)
	}
	code, body := get(t, "http://"+httpAddr+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "[-]snapshot failed: "+want) || !strings.Contains(body, "connection refused") {
		t.Errorf("/readyz = %d %q; want 503 with the reason", code, body)
	}
	waitFor(t, "the log to give the reason", 5*time.Second, func() bool {
		return strings.Contains(logs.String(), want) && strings.Contains(logs.String(), "connection refused")
	})
}

// TestStartEmbeddedEtcdServes: with no etcd endpoints the registrar
// starts its own etcd in the background of a start and serves once that
// and the snapshot are up.
func TestStartEmbeddedEtcdServes(t *testing.T) {
	t.Parallel()
	s := regtest.Start(t, server.Config{
		DataDir:              t.TempDir(),
		EmbeddedEtcdAddr:     "127.0.0.1:0",
		EmbeddedEtcdPeerAddr: "127.0.0.1:0",
		Options: registrar.Options{
			ClusterName: "c1",
			Region:      "r1",
		},
	})
	c := dial(t, s.GRPCAddr())
	register(t, c, ep("web", "10.0.0.1", 80))
	if n := len(s.EtcdEndpoints()); n != 1 {
		t.Fatalf("EtcdEndpoints = %v, want the embedded member's URL", s.EtcdEndpoints())
	}
	code, body := get(t, "http://"+s.HTTPAddr()+"/readyz")
	if code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/readyz = %d %q, want 200 ok", code, body)
	}
}

// TestStartHonoursContextWhileEtcdUnreachable: Start returns the reason
// it was waiting for once its context ends, and leaves nothing serving.
func TestStartHonoursContextWhileEtcdUnreachable(t *testing.T) {
	t.Parallel()
	// Nothing binds port 1: it is privileged, and below the range that
	// port 0 (and FreeAddr) draws from, so no test running beside this
	// one can be given it. Connections are refused for the whole wait.
	etcdAddr, grpcAddr := "127.0.0.1:1", regtest.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	_, err := server.Start(ctx, server.Config{
		EtcdEndpoints: []string{"http://" + etcdAddr},
		GRPCAddr:      grpcAddr,
		HTTPAddr:      "127.0.0.1:0",
		Options: registrar.Options{
			ClusterName: "c1",
			Region:      "r1",
			Logger:      quietLogger(),
		},
	})
	if err == nil || !strings.Contains(err.Error(), "loading its snapshot from etcd at http://"+etcdAddr) {
		t.Fatalf("Start = %v; want the reason it waited", err)
	}
	// Start closed what it opened: the port is free again.
	l, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		t.Fatalf("the gRPC address is still held after Start failed: %v", err)
	}
	l.Close()
}
