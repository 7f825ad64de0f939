package bench

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestXDSQuickRun runs the xds scenario at a tiny size, with background
// churn, against a real registrar, etcd and grpc-go xDS client: every
// registration must be reached, each after a positive latency, and the
// section must render into its own marks.
func TestXDSQuickRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := XDS(ctx, XDSConfig{Registrations: 5, ChurnRate: 50})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", res)
	l := res.FirstRPC
	if l.N != 5 {
		t.Fatalf("%d of 5 registrations timed", l.N)
	}
	if l.P50 <= 0 || l.P99 < l.P50 || l.Max < l.P99 || res.ConnectMs <= 0 || res.RPCPerSec <= 0 {
		t.Fatalf("implausible figures %+v", res)
	}
	if res.ChurnPerSec <= 0 {
		t.Fatalf("background churn made no change: %+v", res)
	}
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	r := Report{Date: "d1", Command: "aether bench --scenario xds", XDS: &res}
	if err := r.UpdateFile(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if doc := string(b); !strings.Contains(doc, xdsBeginMark) || !strings.Contains(doc, "| 5 | ") {
		t.Fatalf("section not rendered:\n%s", doc)
	}
}

// TestXDSFanoutQuickRun runs the fan-out comparison at a tiny size: every
// expected delivery arrives on all three paths, with positive latencies,
// and the state-of-the-world and delta xDS streams are sent only what
// they watch (per-resource versions): a registration is one message to
// each stream watching its service, never one to every stream. The
// section renders with a ratio row per xDS path.
func TestXDSFanoutQuickRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rs, err := XDSFanout(ctx, []XDSFanoutConfig{{Clients: 10, Services: 20, PerClient: 4, Rate: 50, Duration: time.Second, Conns: 2}}, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 1 {
		t.Fatalf("%d results for one size", len(rs))
	}
	res := rs[0]
	for _, p := range []XDSFanoutPath{res.XDS, res.Delta, res.Native} {
		t.Logf("%+v", p)
		if p.Error != "" || p.Expected == 0 || p.Delivered != p.Expected || p.Latency.N != int(p.Expected) || p.Latency.P50 <= 0 || p.CPUCores <= 0 {
			t.Errorf("%s: implausible %+v", p.Path, p)
		}
	}
	for _, p := range []XDSFanoutPath{res.XDS, res.Delta} {
		// At most one message per delivery (two registrations the feed
		// applies in one batch share one): with one version per snapshot,
		// each registration was a message to all 10 streams, 2.5× the
		// deliveries here.
		if p.Messages > p.Expected {
			t.Errorf("%s: %d messages for %d deliveries; want at most one each", p.Path, p.Messages, p.Expected)
		}
	}
	var b strings.Builder
	xdsFanoutMarkdown(&b, rs)
	if doc := b.String(); strings.Count(doc, "| 10 | xds (") != 4 || !strings.Contains(doc, "| 10 | native (WatchEndpoints) |") {
		t.Errorf("fan-out section lacks a row per path and a ratio row per xDS path:\n%s", doc)
	}
}
