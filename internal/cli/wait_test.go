package cli

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// persistedIn reads what etcd holds of a testRegion/testCluster endpoint
// (nil: nothing).
func persistedIn(t *testing.T, cli *clientv3.Client, service string, proto registryv1.Protocol, ip string) *registryv1.ServiceEndpoint {
	t.Helper()
	k, err := registry.EndpointID{Region: testRegion, Cluster: testCluster, Service: service, Protocol: proto, IP: ip}.Key()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	ep, err := registry.DecodeEndpoint(k, resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// TestWaitAgainstRegistrar: with --wait, register, drain and deregister
// return once the write is in etcd, and say so. The registrar flushes
// seldom here, and each command runs right after a flush, so a write that
// is merely acknowledged is not yet in etcd when the command returns.
func TestWaitAgainstRegistrar(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	r := startRegistrar(t, etcd, func(o *server.Config) { o.WriteBatchInterval = 2 * time.Second })
	// The first write after a quiet spell is flushed at once; this one
	// takes that flush, so the commands below each wait for a later one.
	r.register(t, &registryv1.ServiceEndpoint{Service: "db", Protocol: registryv1.Protocol_PROTOCOL_TCP, Ip: "10.0.0.9", Ports: []*registryv1.Port{{Port: 5432}}})
	const http1 = registryv1.Protocol_PROTOCOL_HTTP1

	res := runCLI(t, nil, nil, "register", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1", "--port", "8080", "--weight", "7", "--wait")
	if res.err != nil || !regexp.MustCompile(`^registered web 10\.0\.0\.1 \(http\) version \S+, persisted\n$`).MatchString(res.stdout) {
		t.Fatalf("register --wait: %v, %q", res.err, res.stdout)
	}
	if got := persistedIn(t, cli, "web", http1, "10.0.0.1"); got.GetWeight() != 7 {
		t.Fatalf("register --wait returned; etcd holds %v", got)
	}

	res = runCLI(t, nil, nil, "drain", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1", "--wait")
	if res.err != nil || !regexp.MustCompile(`^draining web 10\.0\.0\.1 \(http\) version \S+, persisted\n$`).MatchString(res.stdout) {
		t.Fatalf("drain --wait: %v, %q", res.err, res.stdout)
	}
	if got := persistedIn(t, cli, "web", http1, "10.0.0.1"); got.GetState() != registryv1.State_STATE_DRAINING {
		t.Fatalf("drain --wait returned; etcd holds %v", got)
	}

	res = runCLI(t, nil, nil, "deregister", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1", "--wait")
	if res.err != nil || !regexp.MustCompile(`^deregistered web 10\.0\.0\.1 \(http\) version \S+, persisted\n$`).MatchString(res.stdout) {
		t.Fatalf("deregister --wait: %v, %q", res.err, res.stdout)
	}
	if got := persistedIn(t, cli, "web", http1, "10.0.0.1"); got != nil {
		t.Fatalf("deregister --wait returned; etcd still holds %v", got)
	}

	// Without --wait nothing claims persistence.
	res = runCLI(t, nil, nil, "register", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.2", "--port", "8080")
	if res.err != nil || !regexp.MustCompile(`^registered web 10\.0\.0\.2 \(http\) version \S+\n$`).MatchString(res.stdout) {
		t.Fatalf("register: %v, %q", res.err, res.stdout)
	}
}

// TestWaitTimeoutWithBackendDown: with etcd down, --wait gives up after
// --wait-timeout (not --timeout), says the write is not persisted, and the
// write stands: acknowledged, listed, and persisted once etcd is back.
func TestWaitTimeoutWithBackendDown(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd, func(o *server.Config) { o.WriteBatchInterval = 50 * time.Millisecond })
	etcd.Stop()

	start := time.Now()
	res := runCLI(t, nil, nil, "register", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1", "--port", "8080",
		"--timeout", "30s", "--wait", "--wait-timeout", "700ms")
	elapsed := time.Since(start)
	want := "register web 10.0.0.1 (http): not persisted within 700ms (--wait-timeout): "
	if res.err == nil || !strings.HasPrefix(res.err.Error(), want) || !strings.Contains(res.err.Error(), "acknowledged") {
		t.Fatalf("register --wait with etcd down: %v, %q\nwant an error starting %q that says what was acknowledged", res.err, res.stdout, want)
	}
	if res.stdout != "" {
		t.Errorf("stdout %q on error", res.stdout)
	}
	// The registrar gives up a tenth of the deadline early (at most
	// 500ms), so that its definite "acknowledged, queued" answer beats
	// the client's own deadline.
	if elapsed < 600*time.Millisecond || elapsed > 10*time.Second {
		t.Errorf("gave up after %s; --wait-timeout is 700ms", elapsed)
	}
	if r.find(t, "web", registryv1.Protocol_PROTOCOL_HTTP1, "10.0.0.1") == nil {
		t.Fatal("the write that timed out waiting is not applied on the registrar")
	}

	etcd.Restart(t)
	cli := etcd.Client(t)
	waitFor(t, "the write persisted once etcd is back", 30*time.Second, func() bool {
		return persistedIn(t, cli, "web", registryv1.Protocol_PROTOCOL_HTTP1, "10.0.0.1") != nil
	})
}

func TestWaitFlagErrors(t *testing.T) {
	t.Parallel()
	s := newSentinel(t)
	for _, args := range [][]string{
		{"register", "--service", "web", "--ip", "10.0.0.1", "--port", "80"},
		{"drain", "--service", "web", "--ip", "10.0.0.1"},
		{"deregister", "--service", "web", "--ip", "10.0.0.1"},
	} {
		for _, tc := range []struct{ value, want string }{
			{"0s", "--wait-timeout 0s: must be positive (e.g. 10s)"},
			{"-1s", "--wait-timeout -1s: must be positive (e.g. 10s)"},
		} {
			res := runCLI(t, nil, nil, append(args, "--registrar", s.addr(), "--wait", "--wait-timeout", tc.value)...)
			if res.err == nil || res.err.Error() != tc.want {
				t.Errorf("%s --wait-timeout %s: error %v, want %s", args[0], tc.value, res.err, tc.want)
			}
		}
	}
	if n := s.conns.Load(); n != 0 {
		t.Errorf("%d connections made for refused flags", n)
	}
}
