package xdstest

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"

	"github.com/aethermesh/aether/internal/testutil/wait"
)

// Backend is one real gRPC server on loopback serving grpc.testing's
// TestService. Its UnaryCall answers with the backend's own address in
// server_id, so a client learns from each response which backend served it
// without any side channel, and the backend counts what it served.
type Backend struct {
	// Addr is "127.0.0.1:port" (or the host StartBackendsAt was given),
	// the identity in every response and the address an EDS endpoint
	// names it by.
	Addr string

	srv    *grpc.Server
	served atomic.Int64
	once   sync.Once
}

// Host is Addr's host, as a ClusterLoadAssignment's SocketAddress wants it.
func (b *Backend) Host() string { h, _, _ := net.SplitHostPort(b.Addr); return h }

// Port is Addr's port, as a SocketAddress's port_value wants it.
func (b *Backend) Port() uint32 {
	_, p, _ := net.SplitHostPort(b.Addr)
	n, _ := strconv.ParseUint(p, 10, 16)
	return uint32(n)
}

// Served is how many UnaryCalls this backend has answered: the server's own
// count, against which a client's Spread can be checked.
func (b *Backend) Served() int64 { return b.served.Load() }

// Stop stops the server at once (connections closed): a backend that dies.
// Idempotent; t.Cleanup calls it too.
func (b *Backend) Stop() { b.once.Do(b.srv.Stop) }

type testService struct {
	testgrpc.UnimplementedTestServiceServer
	b *Backend
}

func (s testService) UnaryCall(context.Context, *testgrpc.SimpleRequest) (*testgrpc.SimpleResponse, error) {
	s.b.served.Add(1)
	return &testgrpc.SimpleResponse{ServerId: s.b.Addr, Hostname: s.b.Addr}, nil
}

// StartBackends starts n backends, each on its own 127.0.0.1:0 listener,
// stopped on t.Cleanup.
func StartBackends(t testing.TB, n int) []*Backend {
	t.Helper()
	hosts := make([]string, n)
	for i := range hosts {
		hosts[i] = "127.0.0.1"
	}
	return StartBackendsAt(t, hosts...)
}

// StartBackendsAt starts one backend per host, each on host:0, stopped on
// t.Cleanup. It is for control planes whose endpoint identity is the IP
// alone (Aether's registry keys an endpoint by service, protocol and IP),
// where backends sharing 127.0.0.1 would be one endpoint: each gets an IP
// of its own in 127.0.0.0/8, all of which is loopback on Linux.
func StartBackendsAt(t testing.TB, hosts ...string) []*Backend {
	t.Helper()
	bs := make([]*Backend, 0, len(hosts))
	for _, host := range hosts {
		lis, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			t.Fatalf("backend listen on %s: %v", host, err)
		}
		b := &Backend{Addr: lis.Addr().String(), srv: grpc.NewServer()}
		testgrpc.RegisterTestServiceServer(b.srv, testService{b: b})
		go b.srv.Serve(lis) //nolint:errcheck // returns when stopped
		t.Cleanup(b.Stop)
		bs = append(bs, b)
	}
	return bs
}

// rpcTimeout bounds one RPC of a Spread. RPCs wait for ready: the first
// ones of a new channel wait while the xDS client fetches LDS, RDS, CDS and
// EDS and the balancer connects, which is not a failure of the RPC.
const rpcTimeout = 5 * time.Second

// spread sends n UnaryCalls in turn and counts them by the server_id each
// response carries. It stops at the first error, returning what it had.
func spread(ctx context.Context, cc *grpc.ClientConn, n int) (map[string]int, error) {
	c := testgrpc.NewTestServiceClient(cc)
	got := map[string]int{}
	for i := range n {
		rctx, cancel := context.WithTimeout(ctx, rpcTimeout)
		resp, err := c.UnaryCall(rctx, &testgrpc.SimpleRequest{FillServerId: true}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			return got, fmt.Errorf("rpc %d of %d: %w", i+1, n, err)
		}
		got[resp.GetServerId()]++
	}
	return got, nil
}

// Spread sends n RPCs on cc and returns how many each backend served, by
// the identity (address) each response carries. Any failed RPC fails t.
func Spread(t testing.TB, cc *grpc.ClientConn, n int) map[string]int {
	t.Helper()
	got, err := spread(context.Background(), cc, n)
	if err != nil {
		t.Fatalf("spread over %s: %v (served so far %s)", cc.Target(), err, Format(got))
	}
	return got
}

// WaitSpread repeats rounds of n RPCs (n = roundSize) until one round's
// spread satisfies cond, and returns that round's spread; it fails t with
// the last round seen when timeout passes first. A round that straddles a
// config change is simply not the one that satisfies cond, and a round
// with a failed RPC counts as not satisfied (the error is the evidence), so
// the condition is judged on whole rounds taken after the change.
func WaitSpread(t testing.TB, cc *grpc.ClientConn, cond func(map[string]int) bool, timeout time.Duration) map[string]int {
	t.Helper()
	var last map[string]int
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	wait.ForState(t, "spread over "+cc.Target(), timeout, func() (bool, string) {
		got, err := spread(ctx, cc, roundSize)
		if err != nil {
			return false, fmt.Sprintf("%v; served %s", err, Format(got))
		}
		last = got
		return cond(got), "last round " + Format(got)
	})
	return last
}

// roundSize is the RPCs in one WaitSpread round: with round robin over up
// to a handful of backends, 30 reaches each of them several times, so "a
// backend got none" means it is out of the picker, not unlucky.
const roundSize = 30

// Only is a WaitSpread condition: traffic reached exactly these backends
// (each at least once) and no other.
func Only(bs ...*Backend) func(map[string]int) bool {
	want := map[string]bool{}
	for _, b := range bs {
		want[b.Addr] = true
	}
	return func(got map[string]int) bool {
		if len(got) != len(want) {
			return false
		}
		for a, n := range got {
			if !want[a] || n == 0 {
				return false
			}
		}
		return true
	}
}

// Format renders a spread in address order, for failure messages and logs.
func Format(s map[string]int) string {
	var b strings.Builder
	b.WriteString("{")
	for i, a := range slices.Sorted(maps.Keys(s)) {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s:%d", a, s[a])
	}
	b.WriteString("}")
	return b.String()
}
