package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/xdstest"
	"github.com/aethermesh/aether/server"
	"github.com/aethermesh/aether/xds"
)

func TestXDSBootstrapPrintsAFileForTheNode(t *testing.T) {
	res := runCLI(t, nil, nil, "xds", "bootstrap", "--node", "node-a", "--region", "eu", "--zone", "eu-1a", "--server", "127.0.0.1:15011")
	if res.err != nil {
		t.Fatalf("%v\n%s", res.err, res.stderr)
	}
	var f struct {
		XDSServers []struct {
			ServerURI string `json:"server_uri"`
		} `json:"xds_servers"`
		Node struct {
			ID       string            `json:"id"`
			Locality map[string]string `json:"locality"`
		} `json:"node"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &f); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, res.stdout)
	}
	if len(f.XDSServers) != 1 || f.XDSServers[0].ServerURI != "127.0.0.1:15011" || f.Node.ID != "node-a" ||
		f.Node.Locality["region"] != "eu" || f.Node.Locality["zone"] != "eu-1a" {
		t.Fatalf("bootstrap %+v", f)
	}

	out := filepath.Join(t.TempDir(), "xds.json")
	if res := runCLI(t, nil, nil, "xds", "bootstrap", "--node", "node-a", "-o", out); res.err != nil || res.stdout != "" {
		t.Fatalf("--out: err %v, stdout %q", res.err, res.stdout)
	}
	if b, err := os.ReadFile(out); err != nil || !strings.Contains(string(b), `"id": "node-a"`) {
		t.Fatalf("--out file: %v %s", err, b)
	}
}

func TestXDSBootstrapNamesTheFlagToFix(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--node a node id is required"},
		{[]string{"--node", "n", "--server", "15010"}, `--server "15010": want host:port`},
		{[]string{"--node", "n", "--cert", "c.pem"}, "--cert the client certificate and its key go together"},
		{[]string{"--node", "n", "--cert", "c.pem", "--key", "k.pem"}, "--ca a client certificate needs the CA"},
	} {
		res := runCLI(t, nil, nil, append([]string{"xds", "bootstrap"}, tc.args...)...)
		if res.err == nil || !strings.Contains(res.err.Error(), tc.want) || res.stdout != "" {
			t.Errorf("%v: err %v, stdout %q; want an error containing %q and no output", tc.args, res.err, res.stdout, tc.want)
		}
	}
}

// TestXDSStatusShowsAConnectedClient: against a real registrar with
// --xds-addr and a real grpc-go client doing RPCs through it, "aether xds
// status" lists the client SYNCED on every type, in a table and as JSON.
func TestXDSStatusShowsAConnectedClient(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd, func(o *server.Config) { o.XDSAddr = "127.0.0.1:0"; o.Zone = "eu-1a" })
	b := xdstest.StartBackends(t, 1)[0]
	if _, _, err := r.srv.Registrar().Register(&registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC,
		Ip: b.Host(), Ports: []*registryv1.Port{{Name: "grpc", Port: b.Port()}}, Zone: "eu-1a"}); err != nil {
		t.Fatal(err)
	}
	cc := xdstest.Client(t, "web", xdstest.Bootstrap(r.srv.XDSAddr(), "cli-node", xdstest.Locality{Region: testRegion, Zone: "eu-1a"}))
	xdstest.WaitSpread(t, cc, xdstest.Only(b), 10*time.Second)

	var res result
	wait.ForState(t, "the client SYNCED on CDS, EDS, LDS and RDS", 10*time.Second, func() (bool, string) {
		res = runCLI(t, nil, nil, "xds", "status", "--http-addr", r.srv.HTTPAddr())
		return res.err == nil && strings.Count(res.stdout, "SYNCED") == 4, res.stdout + errString(res.err)
	})
	t.Logf("aether xds status:\n%s", res.stdout)
	lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
	if len(lines) != 2 || strings.Join(strings.Fields(lines[0]), " ") != "NODE LOCALITY VARIANT CDS EDS LDS RDS" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "cli-node eu/eu-1a sotw SYNCED ") {
		t.Fatalf("table:\n%s", res.stdout)
	}

	res = runCLI(t, nil, nil, "xds", "status", "--http-addr", r.srv.HTTPAddr(), "-o", "json")
	var doc xds.StatusDocument
	if err := json.Unmarshal([]byte(res.stdout), &doc); res.err != nil || err != nil {
		t.Fatalf("-o json: %v, %v\n%s", res.err, err, res.stdout)
	}
	if len(doc.Clients) != 1 || doc.Clients[0].Node != "cli-node" || doc.Clients[0].Types[resourcev3.EndpointType].State != xds.Synced {
		t.Fatalf("-o json: %+v", doc)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestXDSStatusErrorsNameTheFlag: a registrar that is not there, one
// without --xds-addr, and bad flags each fail with what to change.
func TestXDSStatusErrorsNameTheFlag(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	noXDS := startRegistrar(t, etcd)
	down := unusedAddr(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--http-addr", down}, "cannot reach the HTTP port at " + down},
		{[]string{"--http-addr", down}, "set --http-addr or AETHER_HTTP_ADDR"},
		{[]string{"--http-addr", noXDS.srv.HTTPAddr()}, "serves no xDS (no /xds/status): start it with --xds-addr"},
		{[]string{"--http-addr", noXDS.srv.HTTPAddr(), "--cacert", "/nonexistent/ca.pem"}, "--cacert/--cert/--key"},
		{[]string{"--http-addr", "8081"}, `--http-addr "8081": want host:port`},
		{[]string{"-o", "yaml"}, `-o/--output "yaml": use table or json`},
		{[]string{"--timeout", "0s"}, "--timeout 0s: must be positive"},
	} {
		res := runCLI(t, nil, nil, append([]string{"xds", "status"}, tc.args...)...)
		if res.err == nil || !strings.Contains(res.err.Error(), tc.want) || res.stdout != "" {
			t.Errorf("%v: err %v, stdout %q; want an error containing %q and no output", tc.args, res.err, res.stdout, tc.want)
		}
	}
}

// TestXDSStatusTableShowsNACKs: a NACKED type shows the version rejected,
// and the error detail and the version kept follow the table.
func TestXDSStatusTableShowsNACKs(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 1, 23, 0, 0, 0, time.UTC)
	doc := &xds.StatusDocument{Clients: []xds.ClientStatus{{Node: "n1", Variant: "sotw", Service: "eds", Types: map[string]xds.TypeStatus{
		resourcev3.EndpointType: {State: xds.NACKed, SentVersion: "e-3", AckedVersion: "e-2",
			LastNACK: &xds.NACK{Version: "e-3", Nonce: "4", Detail: "priority 1 missing", At: at}},
	}}}}
	var out bytes.Buffer
	if err := writeXDSStatus(&out, doc); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{"n1", "-  ", "sotw eds", "NACKED e-3", "n1 EDS: version e-3 rejected at 2026-12-01T23:00:00Z (runs on e-2): priority 1 missing"} {
		if !strings.Contains(got, want) {
			t.Errorf("table lacks %q:\n%s", want, got)
		}
	}
}

// TestXDSStatusOverTLS: with --tls-cert the HTTP port, /xds/status
// included, is TLS: --cacert reaches it, and without it the error says to
// pass it.
func TestXDSStatusOverTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mustRun(t, nil, "certs", "init", "--trust-domain", "example.org", "--out", dir)
	mustRun(t, nil, "certs", "issue", "--dir", dir, "--server", "localhost")
	ca := filepath.Join(dir, "ca.pem")
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd, func(o *server.Config) {
		o.TLSCertFile, o.TLSKeyFile = filepath.Join(dir, "server-localhost.pem"), filepath.Join(dir, "server-localhost-key.pem")
		o.XDSAddr = "127.0.0.1:0"
	})
	addr := strings.Replace(r.srv.HTTPAddr(), "127.0.0.1", "localhost", 1) // the certificate's name
	res := runCLI(t, nil, map[string]string{"AETHER_CACERT": ca}, "xds", "status", "--http-addr", addr)
	if res.err != nil || !strings.HasPrefix(res.stdout, "NODE") || !strings.Contains(res.stderr, "no xDS client is connected") {
		t.Fatalf("over TLS with AETHER_CACERT: %v\n%s%s", res.err, res.stdout, res.stderr)
	}
	res = runCLI(t, nil, nil, "xds", "status", "--http-addr", addr)
	if res.err == nil || !strings.Contains(res.err.Error(), "serves TLS: pass --cacert (or AETHER_CACERT)") {
		t.Fatalf("plaintext to the TLS port: %v", res.err)
	}
}
