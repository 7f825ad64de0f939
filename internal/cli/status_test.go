package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/aethermesh/aether/console"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// squash collapses runs of blanks, so that expectations do not depend on
// the table's column widths.
func squash(s string) string { return blanks.ReplaceAllString(s, " ") }

var blanks = regexp.MustCompile(`[ \t]+`)

// statusJSON runs `aether status -o json` and decodes what it printed.
func statusJSON(t *testing.T, args ...string) (console.Overview, result) {
	t.Helper()
	res := runCLI(t, nil, nil, append([]string{"status", "-o", "json"}, args...)...)
	var ov console.Overview
	if err := json.Unmarshal([]byte(res.stdout), &ov); err != nil {
		t.Fatalf("aether status -o json printed no overview (%v): %q; err %v", err, res.stdout, res.err)
	}
	return ov, res
}

// TestStatusReady: against a ready registrar the table and the JSON show
// the replica, its backend and the plane, and the exit status is 0.
func TestStatusReady(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	srv := regtest.Start(t, server.Config{EtcdEndpoints: etcd.Endpoints(),
		Options: registrar.Options{ClusterName: "c1", Region: "eu-west", Zone: "eu-west-1a"}})
	for _, ip := range []string{"10.0.0.1", "10.0.0.2"} {
		if _, _, err := srv.Registrar().Register(regtest.EP("web", ip, 8080)); err != nil {
			t.Fatal(err)
		}
	}
	drained := regtest.EP("web", "10.0.0.2", 8080)
	drained.Cluster, drained.Region = "c1", "eu-west"
	if _, _, err := srv.Registrar().Drain(registry.IDOf(drained)); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "writes persisted", 10*time.Second, func() bool { return srv.Registrar().PendingWrites() == 0 })
	addr := "--http-addr=" + srv.HTTPAddr()

	res := runCLI(t, nil, nil, "status", addr)
	if res.err != nil {
		t.Fatalf("status of a ready registrar: %v\n%s", res.err, res.stdout)
	}
	for _, want := range []string{
		"REPLICA eu-west/c1 zone eu-west-1a",
		"READY yes\n [+]snapshot\n [+]persistence: every acknowledged write is persisted\n",
		"BACKEND etcd " + etcd.Endpoints()[0] + " healthy\n",
		"PERSISTENCE lag 0s 0 pending stuck no (limit 10s) 0 isolated\n",
		"PLANE 1 services 2 endpoints (1 serving, 1 draining) 0 nodes\n",
		"REGION CLUSTER ENDPOINTS SERVING DRAINING NODES\neu-west c1 2 1 1 0\n",
	} {
		if !strings.Contains(squash(res.stdout), want) {
			t.Errorf("table lacks %q:\n%s", want, res.stdout)
		}
	}

	ov, res := statusJSON(t, addr)
	if res.err != nil {
		t.Fatalf("status -o json: %v", res.err)
	}
	if !ov.Replica.Ready || ov.Backend.Stuck || ov.Totals.Endpoints != 2 || ov.Totals.Draining != 1 ||
		ov.Backend.Kind != "etcd" || len(ov.Regions) != 1 || ov.Regions[0].Clusters[0].Endpoints != 2 {
		t.Errorf("overview: %+v", ov)
	}
}

// TestStatusLoading: a registrar that cannot load its snapshot (its etcd
// is not there) answers, not ready, and status exits non-zero saying so.
func TestStatusLoading(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := server.Launch(ctx, server.Config{
		EtcdEndpoints: []string{"http://" + unusedAddr(t)},
		GRPCAddr:      "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Options: registrar.Options{ClusterName: "c1", Region: "r1", Logger: regtest.QuietLogger()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	res := runCLI(t, nil, nil, "status", "--http-addr="+srv.HTTPAddr())
	if res.err == nil || !strings.Contains(res.err.Error(), "registrar not ready: snapshot:") {
		t.Fatalf("status of a loading registrar: err %v, want \"registrar not ready: snapshot: ...\"\n%s", res.err, res.stdout)
	}
	if !strings.Contains(squash(res.stdout), "READY no\n [-]snapshot: registrar is loading its snapshot from etcd") {
		t.Errorf("table of a loading registrar:\n%s", res.stdout)
	}
	ov, res := statusJSON(t, "--http-addr="+srv.HTTPAddr())
	if res.err == nil || ov.Replica.Ready {
		t.Errorf("json of a loading registrar: ready %v, err %v", ov.Replica.Ready, res.err)
	}
}

// TestStatusPersistenceStuck pauses a real etcd process (SIGSTOP): the
// registrar keeps acknowledging writes it cannot persist, and once the
// oldest is older than its limit (10s here) status exits non-zero with
// "persistence stuck"; after SIGCONT the writes land and status is 0
// again.
func TestStatusPersistenceStuck(t *testing.T) {
	t.Parallel()
	etcd := startEtcdProcess(t)
	srv := regtest.Start(t, server.Config{EtcdEndpoints: []string{etcd.url},
		Options: registrar.Options{ClusterName: "c1", Region: "r1"}})
	r := srv.Registrar()
	addr := "--http-addr=" + srv.HTTPAddr()
	if _, _, err := r.Register(regtest.EP("web", "10.0.0.1", 8080)); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "first write persisted", 10*time.Second, func() bool { return r.PendingWrites() == 0 })
	if res := runCLI(t, nil, nil, "status", addr); res.err != nil {
		t.Fatalf("before the pause: %v\n%s", res.err, res.stdout)
	}

	etcd.signal(t, syscall.SIGSTOP)
	paused := time.Now()
	if _, _, err := r.Register(regtest.EP("web", "10.0.0.2", 8080)); err != nil {
		t.Fatal(err) // write-behind: acknowledged without etcd
	}
	var last result
	wait.ForState(t, "status reports persistence stuck", 30*time.Second, func() (bool, string) {
		last = runCLI(t, nil, nil, "status", addr)
		return last.err != nil && strings.Contains(last.err.Error(), "persistence stuck"), fmt.Sprintf("err %v\n%s", last.err, last.stdout)
	})
	t.Logf("stuck reported %s after SIGSTOP: %v", time.Since(paused).Round(time.Millisecond), last.err)
	if since := time.Since(paused); since < 10*time.Second {
		t.Errorf("stuck after %s, before the 10s limit", since)
	}
	for _, want := range []string{"READY no\n [+]snapshot\n [-]persistence: oldest unpersisted write", "BACKEND etcd " + etcd.url + " flush failing: ",
		"stuck yes (limit 10s)", " 1 pending ", "PLANE 1 services 2 endpoints (2 serving, 0 draining)"} {
		if !strings.Contains(squash(last.stdout), want) {
			t.Errorf("stuck table lacks %q:\n%s", want, last.stdout)
		}
	}
	ov, res := statusJSON(t, addr)
	if res.err == nil || !ov.Backend.Stuck || ov.Backend.Pending != 1 || ov.Backend.OldestUnpersistedSeconds < 10 || ov.Replica.Ready {
		t.Errorf("stuck json: %+v, err %v", ov.Backend, res.err)
	}

	etcd.signal(t, syscall.SIGCONT)
	wait.ForState(t, "status ready after SIGCONT", 30*time.Second, func() (bool, string) {
		last = runCLI(t, nil, nil, "status", addr)
		return last.err == nil, fmt.Sprintf("err %v\n%s", last.err, last.stdout)
	})
}

// etcdProcess is a real etcd server process, built from tools/etcd
// (etcd's own main), so that a test can pause it with SIGSTOP: an etcd
// that accepts connections and answers nothing, the way a hung disk or a
// stalled VM looks to its clients.
type etcdProcess struct {
	cmd *exec.Cmd
	url string
}

// etcdBinary is $AETHER_ETCD, or etcd built from tools/etcd into dir.
func etcdBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("AETHER_ETCD"); p != "" {
		return p
	}
	bin := filepath.Join(t.TempDir(), "etcd")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join("..", "..", "tools", "etcd")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build tools/etcd (or set AETHER_ETCD to an etcd binary): %v\n%s", err, out)
	}
	return bin
}

func startEtcdProcess(t *testing.T) *etcdProcess {
	t.Helper()
	bin := etcdBinary(t)
	client, peer := "http://"+unusedAddr(t), "http://"+unusedAddr(t)
	cmd := exec.Command(bin, "--name", "s1", "--data-dir", filepath.Join(t.TempDir(), "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "s1="+peer, "--log-level", "error")
	logPath := filepath.Join(t.TempDir(), "etcd.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // the process has its own descriptor
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &etcdProcess{cmd: cmd, url: client}
	t.Cleanup(func() {
		// A stopped process must be continued to act on SIGKILL's exit.
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	wait.ForState(t, "etcd process serving", 30*time.Second, func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Get(ctx, "health")
		logs, _ := os.ReadFile(logPath)
		return err == nil, fmt.Sprintf("%v; etcd's output: %s", err, logs)
	})
	return p
}

func (p *etcdProcess) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("etcd: %s: %v", sig, err)
	}
}

// TestStatusMTLS: with mTLS the console is an operator's; status says
// which certificate to pass when it has none or a node's.
func TestStatusMTLS(t *testing.T) {
	t.Parallel()
	m := meshtest.New(t, "example.org")
	etcd := etcdtest.Start(t)
	srv := regtest.Start(t, server.Config{EtcdEndpoints: etcd.Endpoints(),
		TLSCertFile: m.ServerCert, TLSKeyFile: m.ServerKey, TLSClientCAFile: m.CA, TrustDomain: "example.org",
		Options: registrar.Options{ClusterName: "c1", Region: "r1"}})
	addr := "--http-addr=" + srv.HTTPAddr()
	op, node := m.Certs["operator-alice"], m.Certs["node-node-a"]

	if res := runCLI(t, nil, nil, "status", addr, "--cacert", m.CA, "--cert", op[0], "--key", op[1]); res.err != nil {
		t.Fatalf("operator: %v", res.err)
	}
	for name, args := range map[string][]string{
		"no certificate": {"--cacert", m.CA},
		"a node's":       {"--cacert", m.CA, "--cert", node[0], "--key", node[1]},
	} {
		res := runCLI(t, nil, nil, append([]string{"status", addr}, args...)...)
		if res.err == nil || !strings.Contains(res.err.Error(), "pass --cert and --key of an operator certificate") {
			t.Errorf("%s: err %v", name, res.err)
		}
	}
	if res := runCLI(t, nil, nil, "status", addr); res.err == nil || !strings.Contains(res.err.Error(), "serves TLS: pass --cacert") {
		t.Errorf("plaintext to TLS: err %v", res.err)
	}
}
