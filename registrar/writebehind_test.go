package registrar_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/server"
)

// A sync that lists etcd before a local write is flushed must not revert
// it. The first write is flushed at once (the spacing is leading-edge); the
// second then waits for the next flush an hour away, while the registrar
// re-lists etcd every 50ms.
func TestUnflushedWritesSurviveSync(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) {
		o.WriteBatchInterval = time.Hour
		o.WriteBatchSize = 1000
		o.SyncInterval = 50 * time.Millisecond
		o.SyncDebounce = time.Millisecond
	})
	c := dial(t, s.GRPCAddr())
	register(t, c, ep("web", "10.0.0.1", 80))
	waitFor(t, "first write flushed", 10*time.Second, func() bool { return countKeys(t, cli) == 1 })
	register(t, c, ep("web", "10.0.0.2", 80))
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	w.waitSnapshot(t)
	polls := metricValue(t, s.HTTPAddr(), "registrar_sync_duration_seconds_count")
	waitFor(t, "several re-lists", 10*time.Second, func() bool {
		return metricValue(t, s.HTTPAddr(), "registrar_sync_duration_seconds_count") >= polls+5
	})
	if n := countKeys(t, cli); n != 1 {
		t.Fatalf("etcd has %d keys; the second write should not have been flushed yet", n)
	}
	if got := w.changes(); len(got) != 0 {
		t.Fatalf("re-lists of an etcd without the write produced %v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil || len(l.Endpoints) != 2 {
		t.Fatalf("list = %v, %v", l.GetEndpoints(), err)
	}
	if p := s.Registrar().PendingWrites(); p != 1 {
		t.Fatalf("pending writes = %d, want 1", p)
	}
}

// Beyond --write-queue-limit, writes are refused whole while etcd is down,
// and everything acknowledged before is persisted once it is back.
func TestWriteQueueLimitRefusesWholeRequests(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.WriteQueueLimit = 5 })
	c := dial(t, s.GRPCAddr())
	etcd.Stop()
	for i := 1; i <= 5; i++ {
		register(t, c, ep("web", fmt.Sprintf("10.0.0.%d", i), 80))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: ep("web", "10.0.0.6", 80)})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--write-queue-limit") {
		t.Fatalf("sixth write: %v, want RESOURCE_EXHAUSTED naming --write-queue-limit", err)
	}
	l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil || len(l.Endpoints) != 5 {
		t.Fatalf("refused write was half-applied: %d endpoints listed, %v", len(l.GetEndpoints()), err)
	}
	// Updates to endpoints already queued still fit.
	upd := ep("web", "10.0.0.1", 81)
	register(t, c, upd)

	etcd.Restart(t)
	cli := etcd.Client(t)
	waitFor(t, "queue drains", 30*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })
	if n := countKeys(t, cli); n != 5 {
		t.Fatalf("etcd holds %d endpoints, want 5", n)
	}
	if _, v := etcdKey(t, cli, upd); v == nil || v.Ports[0].Port != 81 {
		t.Fatalf("latest write of 10.0.0.1 not persisted: %v", v)
	}
	register(t, c, ep("web", "10.0.0.6", 80)) // room again
}

func TestEnablePprofServesProfiles(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.EnablePprof = true })
	for path, want := range map[string]string{
		"/debug/pprof/":                  "goroutine",
		"/debug/pprof/goroutine?debug=1": "goroutine profile: total",
		"/debug/pprof/profile?seconds=1": "", // a gzipped CPU profile
		"/debug/pprof/heap?debug=1":      "heap profile",
		"/debug/pprof/cmdline":           "",
		"/debug/pprof/symbol":            "num_symbols",
	} {
		r, err := http.Get("http://" + s.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 || len(body) == 0 || !strings.Contains(string(body), want) {
			t.Errorf("GET %s = %d, %d bytes; want 200 containing %q", path, r.StatusCode, len(body), want)
		}
	}
}

func TestHealthReflectionAndMetrics(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints())
	cc, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, svc := range []string{"", "aether.registrar.v1.Registrar"} {
		h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health %q = %v, %v", svc, h, err)
		}
	}
	rs, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rs.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.Name)
	}
	if !strings.Contains(strings.Join(names, ","), "aether.registrar.v1.Registrar") {
		t.Fatalf("reflection lists %v", names)
	}

	c := dial(t, s.GRPCAddr())
	register(t, c, ep("web", "10.0.0.1", 80))
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	w.waitSnapshot(t)
	waitFor(t, "flush", 10*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })

	// Profiles are served only with EnablePprof.
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 200, "/debug/pprof/": 404} {
		r, err := http.Get("http://" + s.HTTPAddr() + path)
		if err != nil || r.StatusCode != want {
			t.Fatalf("GET %s = %v, %v", path, r, err)
		}
		r.Body.Close()
	}
	r, err := http.Get("http://" + s.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{
		"registrar_connected_agents 1",
		`registrar_endpoints{cluster="c1"} 1`,
		"registrar_sync_duration_seconds_count",
		"registrar_sync_errors_total 0",
		"registrar_write_batch_size_count 1",
		"registrar_write_queue_depth 0",
		`registrar_event_broadcast_total{type="FULL_SNAPSHOT"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
