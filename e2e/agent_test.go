package e2e

import (
	"context"
	"fmt"
	"github.com/aethermesh/aether/internal/testutil/logbuf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
)

const nodeTTL = 3 * time.Second

// startExternalRegistrar runs "aether registrar" against a shared etcd.
func startExternalRegistrar(t *testing.T, etcdEndpoints []string, grpcAddr, httpAddr string) *registrarProc {
	t.Helper()
	p := &registrarProc{grpcAddr: grpcAddr, httpAddr: httpAddr, logs: &logbuf.Buffer{}, exited: make(chan error, 1)}
	p.cmd = exec.Command(aetherBin, "registrar",
		"--etcd-endpoints", strings.Join(etcdEndpoints, ","),
		"--grpc-addr", grpcAddr, "--http-addr", httpAddr,
		"--cluster-name", "east-1", "--region", "us-east",
		"--node-ttl", nodeTTL.String())
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	return p.launch(t)
}

type agentProc struct {
	cmd    *exec.Cmd
	logs   *logbuf.Buffer
	exited chan error
}

func startAgent(t *testing.T, args ...string) *agentProc {
	t.Helper()
	a := &agentProc{logs: &logbuf.Buffer{}, exited: make(chan error, 1)}
	a.cmd = exec.Command(aetherBin, append([]string{"agent", "--cluster", "east-1", "--region", "us-east", "--zone", "us-east-1a"}, args...)...)
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.exited <- a.cmd.Wait() }()
	t.Cleanup(func() {
		_ = a.cmd.Process.Kill()
		select {
		case <-a.exited:
		case <-time.After(10 * time.Second):
		}
		if t.Failed() {
			t.Logf("agent logs:\n%s", a.logs)
		}
	})
	return a
}

func grpcClient(t *testing.T, addr string) registrarv1.RegistrarClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return registrarv1.NewRegistrarClient(cc)
}

func listed(t *testing.T, c registrarv1.RegistrarClient) map[string]*registryv1.ServiceEndpoint {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil {
		return nil
	}
	out := map[string]*registryv1.ServiceEndpoint{}
	for _, ep := range resp.Endpoints {
		out[ep.Service+" "+ep.Ip] = ep
	}
	return out
}

func nodeNames(t *testing.T, c registrarv1.RegistrarClient) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := c.ListNodes(ctx, &registrarv1.ListNodesRequest{})
	if err != nil {
		return nil
	}
	var out []string
	for _, n := range resp.Nodes {
		out = append(out, n.Node.Name)
	}
	return out
}

func TestAgentKilledDisappearsAfterTTLNotBefore(t *testing.T) {
	etcd := etcdtest.Start(t)
	r := startExternalRegistrar(t, etcd.Endpoints(), freeAddr(t), freeAddr(t))
	c := grpcClient(t, r.grpcAddr)
	a := startAgent(t, "--node", "node-k", "--registrar", r.grpcAddr,
		"--endpoint", "web=10.1.0.1:8080", "--endpoint", "api=10.1.0.1:9090/grpc")
	waitFor(t, "agent's endpoints listed", func() bool { return len(listed(t, c)) == 2 && len(nodeNames(t, c)) == 1 })
	// Let at least one heartbeat pass so the kill lands mid-lease.
	time.Sleep(nodeTTL / 2)

	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	// The last heartbeat was at most a third of the TTL before the kill, so
	// nothing may go before two thirds of the TTL have passed.
	for time.Since(killed) < nodeTTL*2/3-200*time.Millisecond {
		if len(listed(t, c)) != 2 || len(nodeNames(t, c)) != 1 {
			t.Fatalf("node or endpoints gone %v after SIGKILL, before the %v TTL", time.Since(killed), nodeTTL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	deadline := killed.Add(nodeTTL + 10*time.Second)
	for len(listed(t, c)) != 0 || len(nodeNames(t, c)) != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("node %v and endpoints %v still there %v after SIGKILL", nodeNames(t, c), listed(t, c), time.Since(killed))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("node and endpoints removed %v after SIGKILL (TTL %v)", time.Since(killed).Round(100*time.Millisecond), nodeTTL)
}

func TestAgentSIGTERMDrainsThenDeregistersAndFileChanges(t *testing.T) {
	etcd := etcdtest.Start(t)
	r := startExternalRegistrar(t, etcd.Endpoints(), freeAddr(t), freeAddr(t))
	c := grpcClient(t, r.grpcAddr)
	file := filepath.Join(t.TempDir(), "endpoints")
	if err := os.WriteFile(file, []byte("# web tier\nweb=10.2.0.1:8080\nweb=10.2.0.2:8080\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Record every event the registrar sends about web.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := c.WatchEndpoints(ctx, &registrarv1.WatchEndpointsRequest{Services: []string{"web", "api"}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []string
	go func() {
		for {
			ev, err := st.Recv()
			if err != nil {
				return
			}
			if ev.Endpoint != nil {
				mu.Lock()
				events = append(events, fmt.Sprintf("%s %s %s", ev.Type, ev.Endpoint.Ip, ev.Endpoint.State))
				mu.Unlock()
			}
		}
	}()
	seen := func(e string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, x := range events {
			if x == e {
				return true
			}
		}
		return false
	}

	a := startAgent(t, "--node", "node-t", "--registrar", r.grpcAddr, "--endpoints-file", file,
		"--endpoint", "api=10.2.0.1:9090/grpc", "--drain-period", "1s")
	waitFor(t, "three endpoints", func() bool { return len(listed(t, c)) == 3 })
	if n := listed(t, c)["web 10.2.0.1"]; n.Node != "node-t" || n.Zone != "us-east-1a" || n.Cluster != "east-1" {
		t.Fatalf("endpoint identity: %v", n)
	}

	// The file changes: one endpoint goes (drained, then removed), one comes.
	if err := os.WriteFile(file, []byte("web=10.2.0.1:8080\nweb=10.2.0.3:8080\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "file change applied", func() bool {
		l := listed(t, c)
		_, gone := l["web 10.2.0.2"]
		_, added := l["web 10.2.0.3"]
		return added && !gone
	})
	// List answers from the snapshot at once; the watch's copy of the
	// removal may still be on its way.
	waitFor(t, "the removal on the watch", func() bool { return seen("ENDPOINT_REMOVED 10.2.0.2 STATE_DRAINING") })
	mu.Lock()
	drained, removed := -1, -1
	for i, e := range events {
		switch e {
		case "ENDPOINT_UPDATED 10.2.0.2 STATE_DRAINING":
			drained = i
		case "ENDPOINT_REMOVED 10.2.0.2 STATE_DRAINING":
			removed = i
		}
	}
	mu.Unlock()
	if drained < 0 || drained > removed {
		t.Fatalf("dropped endpoint was not drained before removal: %v", events)
	}

	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-a.exited:
		a.exited <- err
		if err != nil {
			t.Fatalf("agent exited with %v after SIGTERM\n%s", err, a.logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("agent did not exit after SIGTERM")
	}
	for _, ip := range []string{"10.2.0.1", "10.2.0.3"} {
		if !seen("ENDPOINT_UPDATED "+ip+" STATE_DRAINING") || !seen("ENDPOINT_REMOVED "+ip+" STATE_DRAINING") {
			t.Fatalf("endpoint %s not drained then removed on SIGTERM: %v", ip, events)
		}
	}
	if l := listed(t, c); len(l) != 0 {
		t.Fatalf("endpoints left after SIGTERM: %v", l)
	}
	if n := nodeNames(t, c); len(n) != 0 {
		t.Fatalf("node record left after SIGTERM: %v", n)
	}
}

func TestRollingRestartOfRegistrarsRemovesNothing(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	addrs := [][2]string{{freeAddr(t), freeAddr(t)}, {freeAddr(t), freeAddr(t)}}
	regs := []*registrarProc{
		startExternalRegistrar(t, etcd.Endpoints(), addrs[0][0], addrs[0][1]),
		startExternalRegistrar(t, etcd.Endpoints(), addrs[1][0], addrs[1][1]),
	}
	list := addrs[0][0] + "," + addrs[1][0]
	startAgent(t, "--node", "node-1", "--registrar", list, "--endpoint", "web=10.3.0.1:8080", "--endpoint", "db=10.3.0.1:5432/tcp")
	startAgent(t, "--node", "node-2", "--registrar", list, "--endpoint", "web=10.3.0.2:8080")

	endpointKeys := func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, registry.ServicesPrefix("us-east", "east-1"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	nodeKeys := func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, registry.NodesPrefix("us-east", "east-1"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count
	}
	waitFor(t, "all endpoints and nodes in etcd", func() bool { return endpointKeys() == 3 && nodeKeys() == 2 })

	// Watch etcd for the whole roll: nothing may disappear.
	stop := make(chan struct{})
	violations := make(chan string, 1)
	go func() {
		for {
			select {
			case <-stop:
				close(violations)
				return
			case <-time.After(50 * time.Millisecond):
			}
			if e, n := endpointKeys(), nodeKeys(); e != 3 || n != 2 {
				select {
				case violations <- fmt.Sprintf("%d endpoints and %d nodes in etcd during the roll", e, n):
				default:
				}
			}
		}
	}()
	// Each replica stays down longer than the node TTL, so only heartbeats
	// that fail over to the other replica keep the leases alive.
	for i := range regs {
		regs[i].stop(t)
		time.Sleep(nodeTTL + time.Second)
		regs[i] = startExternalRegistrar(t, etcd.Endpoints(), addrs[i][0], addrs[i][1])
	}
	time.Sleep(nodeTTL)
	close(stop)
	if v, ok := <-violations; ok {
		t.Fatal(v)
	}
	c := grpcClient(t, addrs[1][0])
	if n := nodeNames(t, c); len(n) != 2 {
		t.Fatalf("after the roll the registrar knows nodes %v", n)
	}
}
