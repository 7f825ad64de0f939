package etcd

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend/backendtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registry"
)

// testCtx bounds each test's etcd calls so a hang fails instead of eating
// the suite's timeout.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// logSink records log lines for assertions and echoes them to t.Log.
type logSink struct {
	t  *testing.T
	mu sync.Mutex
	b  strings.Builder
}

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.b.Write(p)
	l.mu.Unlock()
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func (l *logSink) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func newStore(t *testing.T, cli *clientv3.Client, opts Options) (*Store, *logSink) {
	sink := &logSink{t: t}
	opts.Logger = slog.New(slog.NewTextHandler(sink, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return New(cli, opts), sink
}

// endpoint i of a service, with an attribute that changes with gen so
// updates are visible.
func endpoint(service string, i, gen int) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service:  service,
		Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
		Ip:       fmt.Sprintf("10.%d.%d.%d", i>>16&0xff, i>>8&0xff, i&0xff),
		Ports:    []*registryv1.Port{{Name: "http", Port: 8080}},
		Node:     fmt.Sprintf("node-%d", gen),
		Cluster:  "c1",
		Region:   "r1",
		State:    registryv1.State_STATE_SERVING,
		Weight:   1,
	}
}

// v1Key spells the schema out by hand rather than through registry, so a
// change to the key layout is caught here.
func v1Key(ep *registryv1.ServiceEndpoint) string {
	return fmt.Sprintf("/aether/v1/regions/%s/clusters/%s/services/%s/protocols/http1/endpoints/%s",
		ep.Region, ep.Cluster, ep.Service, ep.Ip)
}

func put(ep *registryv1.ServiceEndpoint) Mutation {
	return Mutation{ID: registry.IDOf(ep), Endpoint: ep}
}
func del(ep *registryv1.ServiceEndpoint) Mutation { return Mutation{ID: registry.IDOf(ep)} }

func mustApply(t *testing.T, s *Store, muts ...Mutation) int64 {
	t.Helper()
	rev, err := s.Apply(testCtx(t), muts)
	if err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return rev
}

func currentRev(t *testing.T, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(testCtx(t), "/")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

func sameEndpoint(a, b *registryv1.ServiceEndpoint) bool { return proto.Equal(a, b) }

// watcher is the suite's feed collector with this package's waits.
type watcher struct {
	*backendtest.Collector
	t *testing.T
}

func startWatch(t *testing.T, s *Store, afterRev int64) *watcher {
	return &watcher{Collector: backendtest.Watch(t, s, afterRev), t: t}
}

func (w *watcher) snapshot() ([]WatchBatch, bool) { return w.Snapshot() }

func (w *watcher) events() []Event {
	bs, _ := w.snapshot()
	var evs []Event
	for _, b := range bs {
		evs = append(evs, b.Events...)
	}
	return evs
}

// waitFor polls until cond holds on what the watcher has seen.
func (w *watcher) waitFor(what string, timeout time.Duration, cond func(bs []WatchBatch, closed bool) bool) {
	w.t.Helper()
	wait.ForState(w.t, what, timeout, func() (bool, string) {
		bs, closed := w.snapshot()
		if cond(bs, closed) {
			return true, ""
		}
		return false, fmt.Sprintf("got %d batches (closed=%v): %s", len(bs), closed, describe(bs))
	})
}

func (w *watcher) waitRevision(rev int64) {
	w.t.Helper()
	w.waitFor(fmt.Sprintf("revision %d", rev), 15*time.Second, func(bs []WatchBatch, _ bool) bool {
		return len(bs) > 0 && bs[len(bs)-1].Revision >= rev
	})
}

func describe(bs []WatchBatch) string { return backendtest.DescribeBatches(bs) }

// checkStream asserts the invariants every consumer relies on (the
// suite's CheckOrder); a Compacted batch is allowed, as these tests compact.
func checkStream(t *testing.T, bs []WatchBatch, afterRev int64) {
	t.Helper()
	backendtest.CheckOrder(t, bs, afterRev)
}

// putAndCompact writes endpoint i of svc (generation 1) and compacts
// physically at that write's revision, as auto-compaction might in the
// middle of a listing; it returns the revision, 0 after a failure
// (reported).
func putAndCompact(ctx context.Context, t *testing.T, cli *clientv3.Client, i int) int64 {
	ep := endpoint("svc", i, 1)
	resp, err := cli.Put(ctx, v1Key(ep), mustEncode(t, ep))
	if err != nil {
		t.Errorf("put: %v", err)
		return 0
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Errorf("compact: %v", err)
	}
	return resp.Header.Revision
}
