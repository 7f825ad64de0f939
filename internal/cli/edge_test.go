package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/edge"
	"github.com/aethermesh/aether/pki"
)

// edgeRun is one in-process run of "aether edge" with a runEdge that
// records the settings and returns at once.
type edgeRun struct {
	stdout, stderr string
	err            error
	settings       *edgeSettings
}

func runEdgeCLI(t *testing.T, env map[string]string, args ...string) edgeRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	var res edgeRun
	root := newRoot(deps{
		stdout: &stdout,
		stderr: &stderr,
		lookupEnv: func(name string) (string, bool) {
			v, ok := env[name]
			return v, ok
		},
		runEdge: func(_ context.Context, s *edgeSettings) error {
			res.settings = s
			return nil
		},
	})
	root.SetArgs(append([]string{"edge"}, args...))
	res.err = root.ExecuteContext(ctx)
	res.stdout, res.stderr = stdout.String(), stderr.String()
	return res
}

func mustEdge(t *testing.T, env map[string]string, args ...string) edgeRun {
	t.Helper()
	res := runEdgeCLI(t, env, args...)
	if res.err != nil {
		t.Fatalf("aether edge %q: %v\nstderr: %s", args, res.err, res.stderr)
	}
	if res.settings == nil {
		t.Fatalf("aether edge %q did not run the server", args)
	}
	return res
}

func mustURLs(t *testing.T, ss ...string) []url.URL {
	t.Helper()
	var out []url.URL
	for _, s := range ss {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, *u)
	}
	return out
}

// logLines decodes the JSON log lines on stderr.
func logLines(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(stderr))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line is not JSON: %q: %v", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out
}

func TestEdgeDefaultsAreEtcds(t *testing.T) {
	res := mustEdge(t, nil)
	s := res.settings
	if s.Name != "default" || s.DataDir != "default.etcd" {
		t.Errorf("name, data dir = %q, %q; want etcd's default, default.etcd", s.Name, s.DataDir)
	}
	for name, got := range map[string][]url.URL{
		"listen-client-urls":          s.ListenClientURLs,
		"advertise-client-urls":       s.AdvertiseClientURLs,
		"listen-peer-urls":            s.ListenPeerURLs,
		"initial-advertise-peer-urls": s.AdvertisePeerURLs,
	} {
		want := "http://localhost:2380"
		if strings.Contains(name, "client") {
			want = "http://localhost:2379"
		}
		if !reflect.DeepEqual(got, mustURLs(t, want)) {
			t.Errorf("--%s = %v, want %s", name, got, want)
		}
	}
	if want := map[string][]url.URL{"default": mustURLs(t, "http://localhost:2380")}; !reflect.DeepEqual(s.InitialCluster, want) {
		t.Errorf("initial cluster = %v, want %v", s.InitialCluster, want)
	}
	if s.InitialClusterState != "new" || s.InitialClusterToken != "etcd-cluster" {
		t.Errorf("state, token = %q, %q", s.InitialClusterState, s.InitialClusterToken)
	}
	if s.MaxRequestBytes != 1572864 || s.MaxTxnOps != 128 {
		t.Errorf("max request bytes, txn ops = %d, %d", s.MaxRequestBytes, s.MaxTxnOps)
	}
	if s.ClientTLS != nil || s.PeerTLS != nil {
		t.Error("plaintext URLs got a TLS config")
	}
	if len(s.Ignored) != 0 || strings.Contains(res.stderr, "ignoring") {
		t.Errorf("nothing to ignore, but: %v %s", s.Ignored, res.stderr)
	}
}

// harnessArgs is the command line etcd's e2e harness
// (tests/v3/framework/e2e/cluster.go, EtcdServerProcessConfig) builds for
// member 0 of a one-member cluster with StrictReconfigCheck off, a quota,
// and a non-default snapshot-catchup-entries.
func harnessArgs(dataDir string) []string {
	return []string{
		"--name=TestKVPut-test-0",
		"--listen-client-urls=http://localhost:20000",
		"--advertise-client-urls=http://localhost:20000",
		"--listen-peer-urls=http://localhost:20001",
		"--initial-advertise-peer-urls=http://localhost:20001",
		"--initial-cluster-token=new",
		"--data-dir=" + dataDir,
		"--snapshot-count=10000",
		"--quota-backend-bytes=8589934592",
		"--strict-reconfig-check=false",
		"--initial-cluster-token=new", // values() repeats the token
		"--snapshot-catchup-entries=100",
		"--initial-cluster=TestKVPut-test-0=http://localhost:20001",
		"--initial-cluster-state=new",
	}
}

func TestEdgeAcceptsTheE2EHarnessCommandLine(t *testing.T) {
	dir := t.TempDir()
	res := mustEdge(t, nil, harnessArgs(dir)...)
	s := res.settings
	if s.Name != "TestKVPut-test-0" || s.DataDir != dir || s.InitialClusterToken != "new" || s.QuotaBackendBytes != 8589934592 {
		t.Errorf("settings = %+v", s)
	}
	if !reflect.DeepEqual(s.ListenClientURLs, mustURLs(t, "http://localhost:20000")) {
		t.Errorf("listen client urls = %v", s.ListenClientURLs)
	}
	if want := map[string][]url.URL{"TestKVPut-test-0": mustURLs(t, "http://localhost:20001")}; !reflect.DeepEqual(s.InitialCluster, want) {
		t.Errorf("initial cluster = %v", s.InitialCluster)
	}
	wantIgnored := []string{"--snapshot-catchup-entries", "--snapshot-count", "--strict-reconfig-check"}
	if !reflect.DeepEqual(s.Ignored, wantIgnored) {
		t.Errorf("ignored = %v, want %v", s.Ignored, wantIgnored)
	}
	// One log line names them all.
	var found int
	for _, l := range logLines(t, res.stderr) {
		if strings.HasPrefix(l["msg"].(string), "ignoring flags") {
			found++
			if l["level"] != "info" {
				t.Errorf("level = %v, want info (etcd's lower case)", l["level"])
			}
			if !reflect.DeepEqual(toStrings(l["flags"]), wantIgnored) {
				t.Errorf("logged flags = %v", l["flags"])
			}
		}
	}
	if found != 1 {
		t.Errorf("%d log lines about ignored flags, want 1:\n%s", found, res.stderr)
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// etcd parses with Go's flag package: -flag value, -flag=value, --flag
// value and a bare boolean all work.
func TestEdgeFlagSpellings(t *testing.T) {
	dir := t.TempDir()
	res := mustEdge(t, nil,
		"-name", "e1",
		"-data-dir="+dir,
		"--initial-cluster-token", "tok",
		"-client-cert-auth",
		"--heartbeat-interval", "50",
		"-election-timeout=500",
		"-watch-progress-notify-interval", "250ms",
		"-v", // etcd's IgnoredFlag: boolean-style, takes no value
	)
	s := res.settings
	if s.Name != "e1" || s.DataDir != dir || s.InitialClusterToken != "tok" || s.WatchProgressNotifyInterval != 250*time.Millisecond {
		t.Errorf("settings = %+v", s)
	}
	// --name alone makes a one-member cluster of that name, as in etcd.
	if want := map[string][]url.URL{"e1": mustURLs(t, "http://localhost:2380")}; !reflect.DeepEqual(s.InitialCluster, want) {
		t.Errorf("initial cluster = %v, want %v", s.InitialCluster, want)
	}
	if want := []string{"--election-timeout", "--heartbeat-interval", "--v"}; !reflect.DeepEqual(s.Ignored, want) {
		t.Errorf("ignored = %v, want %v", s.Ignored, want)
	}
}

func TestEdgeEnvironmentIsEtcds(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{
		"ETCD_NAME":           "from-env",
		"ETCD_DATA_DIR":       dir,
		"ETCD_SNAPSHOT_COUNT": "5",
		"ETCD_MAX_TXN_OPS":    "64",
		"AETHER_NAME":         "not-this", // the edge command reads etcd's variables only
	}
	res := mustEdge(t, env, "--max-txn-ops=32")
	s := res.settings
	if s.Name != "from-env" || s.DataDir != dir {
		t.Errorf("name, data dir = %q, %q; want the ETCD_* values", s.Name, s.DataDir)
	}
	if s.MaxTxnOps != 32 {
		t.Errorf("max txn ops = %d: the command line must win over ETCD_MAX_TXN_OPS", s.MaxTxnOps)
	}
	if !reflect.DeepEqual(s.Ignored, []string{"--snapshot-count"}) {
		t.Errorf("ignored = %v: a flag from the environment is named like one from the command line", s.Ignored)
	}
	if !strings.Contains(res.stderr, "ETCD_MAX_TXN_OPS") {
		t.Errorf("no warning about the shadowed ETCD_MAX_TXN_OPS:\n%s", res.stderr)
	}

	res = runEdgeCLI(t, map[string]string{"ETCD_MAX_TXN_OPS": "many"})
	if res.err == nil || !strings.Contains(res.err.Error(), "ETCD_MAX_TXN_OPS") {
		t.Errorf("bad ETCD_MAX_TXN_OPS: err = %v, want it named", res.err)
	}
}

func TestEdgeRefusesMissingFeaturesByName(t *testing.T) {
	res := runEdgeCLI(t, nil, "--auth-token=jwt,pub-key=x", "--force-new-cluster", "--discovery-srv=example.com", "--snapshot-count=5")
	if res.err == nil || res.settings != nil {
		t.Fatal("refused flags were accepted")
	}
	for _, name := range []string{"--auth-token", "--force-new-cluster", "--discovery-srv"} {
		if !strings.Contains(res.err.Error(), name) {
			t.Errorf("error %q does not name %s", res.err, name)
		}
	}
	if strings.Contains(res.err.Error(), "snapshot-count") {
		t.Errorf("error %q names an ignored flag", res.err)
	}
	// etcd's default value asks for nothing aether edge lacks.
	mustEdge(t, nil, "--auth-token=simple", "--force-new-cluster=0", "--cors=*")
	// A refused feature from the environment is refused too.
	res = runEdgeCLI(t, map[string]string{"ETCD_LISTEN_METRICS_URLS": "http://localhost:2381"})
	if res.err == nil || !strings.Contains(res.err.Error(), "--listen-metrics-urls") {
		t.Errorf("ETCD_LISTEN_METRICS_URLS: err = %v, want --listen-metrics-urls refused", res.err)
	}
}

// --enable-pprof is etcd's flag and variable, off by default.
func TestEdgeEnablePprof(t *testing.T) {
	if mustEdge(t, nil).settings.EnablePprof {
		t.Error("pprof on by default")
	}
	if !mustEdge(t, nil, "--enable-pprof").settings.EnablePprof {
		t.Error("--enable-pprof did not turn it on")
	}
	if !mustEdge(t, map[string]string{"ETCD_ENABLE_PPROF": "true"}).settings.EnablePprof {
		t.Error("ETCD_ENABLE_PPROF=true did not turn it on")
	}
}

// --peer-commit-delay: the default, 0 meaning none (negative in
// edge.Config, where 0 is the default), and a bound.
func TestEdgePeerCommitDelay(t *testing.T) {
	if got := mustEdge(t, nil).settings.PeerCommitDelay; got != edge.DefaultPeerCommitDelay {
		t.Errorf("default delay %v, want %v", got, edge.DefaultPeerCommitDelay)
	}
	if got := mustEdge(t, nil, "--peer-commit-delay=25ms").settings.PeerCommitDelay; got != 25*time.Millisecond {
		t.Errorf("--peer-commit-delay=25ms gave %v", got)
	}
	if got := mustEdge(t, nil, "--peer-commit-delay=0").settings.PeerCommitDelay; got >= 0 {
		t.Errorf("--peer-commit-delay=0 gave %v, want a negative (no wait) delay", got)
	}
	for _, bad := range []string{"--peer-commit-delay=-1ms", "--peer-commit-delay=2s"} {
		res := runEdgeCLI(t, nil, bad)
		if res.err == nil || res.settings != nil || !strings.Contains(res.err.Error(), "--peer-commit-delay") {
			t.Errorf("%s: err = %v, want it refused naming the flag", bad, res.err)
		}
	}
}

// Tools written for etcd before 3.6 pass --experimental-<name> spellings.
func TestEdgeExperimentalFlags(t *testing.T) {
	res := mustEdge(t, nil, "--experimental-snapshot-catchup-entries=100", "--experimental-watch-progress-notify-interval=1s", "--experimental-initial-corrupt-check")
	want := []string{"--experimental-initial-corrupt-check", "--experimental-snapshot-catchup-entries", "--experimental-watch-progress-notify-interval"}
	if !reflect.DeepEqual(res.settings.Ignored, want) {
		t.Errorf("ignored = %v, want %v", res.settings.Ignored, want)
	}
	res = runEdgeCLI(t, nil, "--experimental-enable-distributed-tracing=true")
	if res.err == nil || !strings.Contains(res.err.Error(), "--experimental-enable-distributed-tracing") {
		t.Errorf("err = %v, want the tracing flag refused by name", res.err)
	}
}

// etcd compares advertised and initial-cluster peer URLs (resolving host
// names, but not "localhost") only when bootstrapping a new cluster.
func TestEdgeInitialClusterCheck(t *testing.T) {
	res := runEdgeCLI(t, nil, "--initial-cluster=default=http://127.0.0.1:2380")
	if res.err == nil || !strings.Contains(res.err.Error(), "missing from --initial-advertise-peer-urls") {
		t.Errorf("localhost against 127.0.0.1: err = %v, want etcd's refusal", res.err)
	}
	mustEdge(t, nil, "--initial-cluster=default=http://10.9.9.9:2380", "--initial-cluster-state=existing")
}

func TestEdgeBadCommandLines(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"stray"}, `"stray" is not a valid flag`},
		{[]string{"--listen-client-urls=http://127.0.0.1:1"}, "--advertise-client-urls is required when --listen-client-urls is set explicitly"},
		{[]string{"--listen-client-urls=localhost:1", "--advertise-client-urls=http://localhost:1"}, "--listen-client-urls"},
		{[]string{"--advertise-client-urls=http://localhost:1/path"}, "URL must not contain a path"},
		{[]string{"--initial-cluster=other=http://localhost:2380"}, `couldn't find local name "default" in the initial cluster configuration`},
		{[]string{"--initial-cluster=default=http://localhost:9999"}, "missing from --initial-advertise-peer-urls"},
		{[]string{"--initial-cluster-state=old"}, "--initial-cluster-state"},
		{[]string{"--listen-client-urls=https://localhost:1", "--advertise-client-urls=https://localhost:1"}, "TLS key/cert (--cert-file, --key-file) must be provided"},
		{[]string{"--log-level=loud"}, "log level"},
		{[]string{"--logger=capnslog"}, `unknown logger option "capnslog"`},
		{[]string{"--max-txn-ops=0"}, "--max-txn-ops"},
		{[]string{"--quota-backend-bytes=-1"}, "--quota-backend-bytes"},
		{[]string{"--auto-compaction-mode=hourly"}, "--auto-compaction-mode"},
		{[]string{"--auto-compaction-mode=revision", "--auto-compaction-retention=5m"}, "in revision mode it is a number of revisions"},
		{[]string{"--auto-compaction-retention=soon"}, "--auto-compaction-retention"},
		{[]string{"--auto-compaction-retention=-3"}, "--auto-compaction-retention must not be negative"},
	} {
		res := runEdgeCLI(t, nil, tc.args...)
		if res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want it to contain %q", tc.args, res.err, tc.want)
		}
		if res.settings != nil {
			t.Errorf("%q: the server was started", tc.args)
		}
	}
}

// --auto-compaction-* read as etcd reads them: a bare number is hours in
// periodic mode and revisions in revision mode, a duration is periodic.
func TestEdgeAutoCompactionFlags(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		mode      string
		retention time.Duration
	}{
		{nil, "periodic", 0},
		{[]string{"--auto-compaction-retention=2"}, "periodic", 2 * time.Hour},
		{[]string{"--auto-compaction-retention=5m"}, "periodic", 5 * time.Minute},
		{[]string{"--auto-compaction-mode=revision", "--auto-compaction-retention=1000"}, "revision", time.Duration(1000)},
	} {
		s := mustEdge(t, nil, tc.args...).settings
		if s.AutoCompactionMode != tc.mode || s.AutoCompactionRetention != tc.retention {
			t.Errorf("%q: mode %q retention %v, want %q %v", tc.args, s.AutoCompactionMode, s.AutoCompactionRetention, tc.mode, tc.retention)
		}
	}
}

func TestEdgeVersionInEtcdsFormat(t *testing.T) {
	for _, arg := range []string{"--version", "-version"} {
		res := runEdgeCLI(t, map[string]string{"ETCD_NAME": "x"}, arg)
		if res.err != nil || res.settings != nil {
			t.Fatalf("%s: err %v, started %v", arg, res.err, res.settings != nil)
		}
		lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
		prefixes := []string{"etcd Version: ", "Git SHA: ", "Go Version: ", "Go OS/Arch: "}
		if len(lines) < len(prefixes) {
			t.Fatalf("%s printed %q", arg, res.stdout)
		}
		for i, p := range prefixes {
			if !strings.HasPrefix(lines[i], p) {
				t.Errorf("line %d = %q, want prefix %q", i, lines[i], p)
			}
		}
		// The harness: strings.SplitAfter(line, ":")[1], trimmed, as semver.
		v := strings.TrimSpace(strings.SplitAfter(lines[0], ":")[1])
		if v != "3.7.3" {
			t.Errorf("etcd version = %q, want the API version 3.7.3", v)
		}
	}
	// ETCD_VERSION does not turn a run into --version (etcd ignores it).
	res := mustEdge(t, map[string]string{"ETCD_VERSION": "true"})
	if res.stdout != "" {
		t.Errorf("ETCD_VERSION printed %q", res.stdout)
	}
}

func TestEdgeHelp(t *testing.T) {
	res := runEdgeCLI(t, nil, "--help")
	if res.err != nil || res.settings != nil {
		t.Fatalf("err %v", res.err)
	}
	for _, want := range []string{"-listen-client-urls", "-snapshot-count", "Ignored", "ETCD_"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

func TestEdgeTLS(t *testing.T) {
	dir := t.TempDir()
	if err := pki.InitCA(dir, "example.org"); err != nil {
		t.Fatal(err)
	}
	srv, err := pki.Issue(dir, pki.Server, "localhost")
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(dir, "ca.pem")
	res := mustEdge(t, nil,
		"--listen-client-urls=https://localhost:0", "--advertise-client-urls=https://localhost:0",
		"--cert-file", srv.CertFile, "--key-file", srv.KeyFile, "--trusted-ca-file", ca, "--client-cert-auth",
		"--tls-min-version=TLS1.3",
	)
	c := res.settings.ClientTLS
	if c == nil {
		t.Fatal("https client URL without a TLS config")
	}
	if c.ClientAuth != tls.RequireAndVerifyClientCert || c.ClientCAs == nil {
		t.Errorf("client auth = %v, CAs %v; want certificates required", c.ClientAuth, c.ClientCAs != nil)
	}
	if c.MinVersion != tls.VersionTLS13 {
		t.Errorf("min version = %x", c.MinVersion)
	}
	if !strings.Contains(strings.Join(c.NextProtos, ","), "h2") || !strings.Contains(strings.Join(c.NextProtos, ","), "http/1.1") {
		t.Errorf("ALPN = %v: gRPC (h2) and /metrics over HTTP/1 share the port", c.NextProtos)
	}
	if res.settings.PeerTLS != nil {
		t.Error("plaintext peer URL got a TLS config")
	}

	// Certificates with http URLs are ignored with a warning, as in etcd.
	res = mustEdge(t, nil, "--cert-file", srv.CertFile, "--key-file", srv.KeyFile)
	if res.settings.ClientTLS != nil || !strings.Contains(res.stderr, "ignoring key and cert files") {
		t.Errorf("http URL with certs: TLS %v, stderr %s", res.settings.ClientTLS != nil, res.stderr)
	}

	// --auto-tls writes a self-signed pair under the data dir, as etcd.
	data := t.TempDir()
	res = mustEdge(t, nil, "--data-dir", data, "--auto-tls",
		"--listen-client-urls=https://localhost:0", "--advertise-client-urls=https://localhost:0",
		"--peer-auto-tls", "--listen-peer-urls=https://localhost:0", "--initial-advertise-peer-urls=https://localhost:0",
		"--initial-cluster=default=https://localhost:0")
	if res.settings.ClientTLS == nil || res.settings.PeerTLS == nil {
		t.Fatal("auto TLS gave no TLS config")
	}
	for _, kind := range []string{"client", "peer"} {
		if _, err := os.Stat(filepath.Join(data, "fixtures", kind, "cert.pem")); err != nil {
			t.Errorf("auto TLS %s cert: %v", kind, err)
		}
	}
}

func TestEdgeLogOutputsFile(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "edge.log")
	res := mustEdge(t, nil, "--log-outputs="+logFile, "--snapshot-count=1")
	if res.stderr != "" {
		t.Errorf("logged to stderr with --log-outputs=file: %s", res.stderr)
	}
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if lines := logLines(t, string(b)); len(lines) != 1 || lines[0]["msg"] == nil || lines[0]["ts"] == nil {
		t.Errorf("log file = %q", b)
	}
}

func TestEdgeLogOutputsStdoutAndStderr(t *testing.T) {
	res := mustEdge(t, nil, "--log-outputs=stdout,stderr", "--snapshot-count=1")
	for name, out := range map[string]string{"stdout": res.stdout, "stderr": res.stderr} {
		if lines := logLines(t, out); len(lines) != 1 {
			t.Errorf("%s has %d log lines, want the one: %q", name, len(lines), out)
		}
	}
}
