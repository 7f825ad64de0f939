package difftest

import (
	"context"
	"flag"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

var (
	flagSeed  = flag.Uint64("difftest.seed", 0, "seed of the sequence (0: one from the clock, printed)")
	flagOps   = flag.Int("difftest.ops", 3000, "requests per differential run")
	flagTrace = flag.Bool("difftest.trace", false, "log every request before it is sent")
)

func seed(t *testing.T) uint64 {
	s := *flagSeed
	if s == 0 {
		s = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (repeat with -difftest.seed=%d)", s, s)
	return s
}

func runDiff(t *testing.T, a, b *etcdtestConn, s uint64, ops int) (Stats, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cfg := Config{Seed: s, Ops: ops, A: a.cc, B: b.cc}
	if *flagTrace {
		cfg.Trace = func(step int, kind, req string) { t.Logf("request %d (%s): %s", step, kind, req) }
	}
	return Run(ctx, cfg)
}

// TestEtcdVsEtcd: two real etcds given the same sequence answer alike; if
// not, the normalisation or the generator depends on something other than
// the requests.
func TestEtcdVsEtcd(t *testing.T) {
	a := connect(t, etcdtest.Start(t).Endpoints()...)
	b := connect(t, etcdtest.Start(t).Endpoints()...)
	stats, err := runDiff(t, a, b, seed(t), *flagOps)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("requests by kind: %v", stats)
	// The sequence must exercise what it claims to (a generator bug that
	// stopped producing watches would otherwise pass silently).
	for _, k := range []string{"put", "range", "delete", "txn", "compact", "lease-grant", "lease-revoke", "lease-ttl", "lease-keepalive", "lease-leases", "hashkv", "watch", "bad", "bad (refused)", "compact (refused)"} {
		if stats[k] == 0 && *flagOps >= 1000 {
			t.Errorf("no %s request in %d", k, *flagOps)
		}
	}
}

// TestCatchesAlteredField: a real etcd behind a proxy that adds one to the
// version of the first key of every Range response is caught, with the
// seed, the request and both responses in the report.
func TestCatchesAlteredField(t *testing.T) {
	a := connect(t, etcdtest.Start(t).Endpoints()...)
	bEtcd := etcdtest.Start(t)
	proxy := startProxy(t, bEtcd.ClientAddr(), func(t testing.TB, method string, msg []byte) []byte {
		if method != "/etcdserverpb.KV/Range" {
			return msg
		}
		var r pb.RangeResponse
		if err := proto.Unmarshal(msg, &r); err != nil {
			t.Errorf("proxy: %v", err)
			return msg
		}
		if len(r.Kvs) == 0 {
			return msg
		}
		r.Kvs[0].Version++
		out, err := proto.Marshal(&r)
		if err != nil {
			t.Errorf("proxy: %v", err)
			return msg
		}
		return out
	})
	b := connect(t, proxy)
	s := seed(t)
	_, err := runDiff(t, a, b, s, *flagOps)
	m := mustMismatch(t, err, s)
	if m.Kind != "range" {
		t.Errorf("mismatch on a %s request, want range (only Range responses were altered)", m.Kind)
	}
	if !strings.Contains(m.B, "version:") {
		t.Errorf("report does not show B's altered response:\n%v", err)
	}
}

// TestCatchesExtraWrite: an etcd that was given one write before the
// sequence is one revision ahead; the checker must say so at the first
// request whose answer carries a revision (every answer but an error).
func TestCatchesExtraWrite(t *testing.T) {
	a := connect(t, etcdtest.Start(t).Endpoints()...)
	bEtcd := etcdtest.Start(t)
	b := connect(t, bEtcd.Endpoints()...)
	if _, err := pb.NewKVClient(b.cc).Put(t.Context(), &pb.PutRequest{Key: []byte("extra"), Value: []byte("1")}); err != nil {
		t.Fatal(err)
	}
	s := seed(t)
	_, err := runDiff(t, a, b, s, *flagOps)
	m := mustMismatch(t, err, s)
	// Every answer but an error carries the revision.
	if m.Step > 20 {
		t.Errorf("first mismatch at request %d, want one of the first (every answer but an error has the revision)", m.Step)
	}
}

// TestCatchesAlteredWatch: a proxy that drops the prev_kv of watch events
// (a subtle watch bug) is caught on a watch.
func TestCatchesAlteredWatch(t *testing.T) {
	a := connect(t, etcdtest.Start(t).Endpoints()...)
	bEtcd := etcdtest.Start(t)
	proxy := startProxy(t, bEtcd.ClientAddr(), func(t testing.TB, method string, msg []byte) []byte {
		if method != "/etcdserverpb.Watch/Watch" {
			return msg
		}
		var r pb.WatchResponse
		if err := proto.Unmarshal(msg, &r); err != nil {
			t.Errorf("proxy: %v", err)
			return msg
		}
		altered := false
		for _, ev := range r.Events {
			if ev.PrevKv != nil {
				ev.PrevKv, altered = nil, true
			}
		}
		if !altered {
			return msg
		}
		out, err := proto.Marshal(&r)
		if err != nil {
			t.Errorf("proxy: %v", err)
			return msg
		}
		return out
	})
	b := connect(t, proxy)
	s := seed(t)
	_, err := runDiff(t, a, b, s, *flagOps)
	m := mustMismatch(t, err, s)
	if m.Kind != "watch" {
		t.Errorf("mismatch on a %s request, want watch", m.Kind)
	}
}

func mustMismatch(t *testing.T, err error, s uint64) *Mismatch {
	t.Helper()
	if err == nil {
		t.Fatalf("the checker passed a broken peer (%d requests, seed %d)", *flagOps, s)
	}
	m, ok := err.(*Mismatch)
	if !ok {
		t.Fatalf("want a *Mismatch, got %T: %v", err, err)
	}
	msg := err.Error()
	for _, want := range []string{"seed " + uintStr(s), "request:", "A (reference):", "B (under test):"} {
		if !strings.Contains(msg, want) {
			t.Errorf("report lacks %q:\n%s", want, msg)
		}
	}
	t.Logf("caught, as it must be:\n%s", msg)
	return m
}

// TestProxyTransparent: the proxy of the tests above, altering nothing, is
// not a difference by itself (so what they catch is their alteration).
func TestProxyTransparent(t *testing.T) {
	a := connect(t, etcdtest.Start(t).Endpoints()...)
	bEtcd := etcdtest.Start(t)
	b := connect(t, startProxy(t, bEtcd.ClientAddr(), func(_ testing.TB, _ string, msg []byte) []byte { return msg }))
	if _, err := runDiff(t, a, b, seed(t), min(*flagOps, 1000)); err != nil {
		t.Fatal(err)
	}
}
