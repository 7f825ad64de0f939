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
// expected delivery arrives on both paths, with positive latencies.
func TestXDSFanoutQuickRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := XDSFanout(ctx, XDSFanoutConfig{Clients: 10, Services: 20, PerClient: 4, Rate: 50, Duration: time.Second, Conns: 2}, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []XDSFanoutPath{res.XDS, res.Native} {
		t.Logf("%+v", p)
		if p.Expected == 0 || p.Delivered != p.Expected || p.Latency.N != int(p.Expected) || p.Latency.P50 <= 0 || p.CPUCores <= 0 {
			t.Errorf("%s: implausible %+v", p.Path, p)
		}
	}
}
