package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/server"
)

// TestReadyzFailsWhilePersistenceIsStuck: /readyz passes while writes
// persist, fails once the oldest acknowledged write has waited longer than
// max(10 x --write-batch-interval, 10s) (etcd is stopped), saying how old
// and how many, passes again with ?exclude=persistence, and recovers once
// the writes are persisted. Reads keep being served meanwhile. The lag
// metric follows the same write.
func TestReadyzFailsWhilePersistenceIsStuck(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.WriteBatchInterval = 20 * time.Millisecond })
	c := dial(t, s.GRPCAddr())
	ready := "http://" + s.HTTPAddr() + "/readyz"

	register(t, c, ep("web", "10.0.0.1", 80))
	waitFor(t, "the write to persist", 10*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })
	code, body := get(t, ready+"?verbose")
	want := "[+]snapshot ok\n[+]persistence ok: every acknowledged write is persisted\nreadyz check passed\n"
	if code != http.StatusOK || body != want {
		t.Fatalf("/readyz?verbose = %d %q, want 200 %q", code, body, want)
	}
	if lag := metricValue(t, s.HTTPAddr(), "registrar_persistence_lag_seconds"); lag != 0 {
		t.Fatalf("registrar_persistence_lag_seconds = %v with nothing pending, want 0", lag)
	}

	etcd.Stop()
	stoppedAt := time.Now()
	register(t, c, ep("web", "10.0.0.2", 80)) // acknowledged, cannot persist
	waitFor(t, "/readyz to fail on the stuck write", 30*time.Second, func() bool {
		code, _ := get(t, ready)
		return code == http.StatusServiceUnavailable
	})
	if waited := time.Since(stoppedAt); waited < 10*time.Second {
		t.Fatalf("/readyz failed %v after the write, before the 10s limit", waited)
	}
	code, body = get(t, ready)
	t.Logf("/readyz while stuck (%d):\n%s", code, body)
	for _, w := range []string{"[+]snapshot ok\n", "[-]persistence failed: oldest unpersisted write ", "(limit 10s), 1 pending", ", last flush error ", "readyz check failed\n"} {
		if !strings.Contains(body, w) {
			t.Errorf("/readyz body %q lacks %q", body, w)
		}
	}
	if lag := metricValue(t, s.HTTPAddr(), "registrar_persistence_lag_seconds"); lag < 10 {
		t.Errorf("registrar_persistence_lag_seconds = %v, want the stuck write's age (over 10)", lag)
	}
	if code, body := get(t, ready+"?exclude=persistence"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/readyz?exclude=persistence = %d %q, want 200 ok", code, body)
	}
	if code, body := get(t, ready+"?exclude=etcd"); code != http.StatusBadRequest || !strings.Contains(body, "the checks are snapshot, persistence") {
		t.Errorf("/readyz?exclude=etcd = %d %q, want 400 naming the checks", code, body)
	}
	// Not ready is not down: the snapshot still answers.
	lctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if l, err := c.ListAllEndpoints(lctx, &registrarv1.ListAllEndpointsRequest{}); err != nil || len(l.GetEndpoints()) != 2 {
		t.Errorf("list while not ready: %d endpoints, %v; want 2", len(l.GetEndpoints()), err)
	}

	etcd.Restart(t)
	waitFor(t, "/readyz to pass once the write persisted", 30*time.Second, func() bool {
		code, _ := get(t, ready)
		return code == http.StatusOK
	})
	if p := s.Registrar().PendingWrites(); p != 0 {
		t.Errorf("ready again with %d writes pending", p)
	}
}
