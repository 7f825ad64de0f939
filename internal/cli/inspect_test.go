package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend/etcd/replicator"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// inspectDoc runs aether inspect -o json with args and decodes it.
func inspectDoc(t *testing.T, args ...string) (inspectJSON, result) {
	t.Helper()
	res := runCLI(t, nil, nil, append([]string{"inspect", "-o", "json"}, args...)...)
	var doc inspectJSON
	if res.err != nil {
		return doc, res
	}
	if err := json.Unmarshal([]byte(res.stdout), &doc); err != nil {
		t.Fatalf("inspect -o json printed no document (%v): %q", err, res.stdout)
	}
	return doc, res
}

func byKey(doc inspectJSON) map[string]*inspectedKey {
	m := map[string]*inspectedKey{}
	for _, k := range doc.Keys {
		m[k.Key] = k
	}
	return m
}

// TestInspectRegistrarAndReplicatorKeys: a real registrar of region eu
// writes endpoints, a node under its lease and a tombstone to its etcd, and
// its replicator mirrors them into region us's etcd under the origin lease.
// aether inspect on either etcd shows them decoded, with leases and TTLs,
// marks the mirrored ones, filters by region, service and kind, and shows
// a value that does not decode as such without failing.
func TestInspectRegistrarAndReplicatorKeys(t *testing.T) {
	t.Parallel()
	home, peer := etcdtest.Start(t), etcdtest.Start(t)
	r := startRegistrar(t, home, func(o *server.Config) {
		o.PeerEtcd = []string{"us=" + peer.Endpoints()[0]}
		o.ReplicationLeaseTTL = 10 * time.Second
		o.Options.NodeTTL = 20 * time.Second
	})
	reg := r.srv.Registrar()
	for _, e := range []*registryv1.ServiceEndpoint{regtest.EP("web", "10.0.0.1", 8080), regtest.EP("web", "10.0.0.2", 8080), regtest.EP("api", "10.0.0.3", 9090)} {
		if _, _, err := reg.Register(e); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := reg.AnnounceNode(ctx, &registryv1.Node{Name: "n1", Zone: "z1", Address: "10.0.0.9", Services: []string{"web"}}); err != nil {
		t.Fatal(err)
	}
	gone := registry.EndpointID{Region: testRegion, Cluster: testCluster, Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.0.0.2"}
	if _, err := reg.Unregister(gone); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "writes persisted", 10*time.Second, func() bool { return reg.PendingWrites() == 0 })

	web1, _ := registry.EndpointID{Region: testRegion, Cluster: testCluster, Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.0.0.1"}.Key()
	api3, _ := registry.EndpointID{Region: testRegion, Cluster: testCluster, Service: "api", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.0.0.3"}.Key()
	node1, _ := registry.NodeID{Region: testRegion, Cluster: testCluster, Name: "n1"}.Key()
	tomb, _ := registry.TombstoneKey(gone)
	gone2, _ := gone.Key()

	t.Run("home etcd", func(t *testing.T) {
		var doc inspectJSON
		var keys map[string]*inspectedKey
		// The replicator's home key appears once it has been elected.
		wait.For(t, "home key written", 15*time.Second, func() bool {
			doc, _ = inspectDoc(t, "--etcd-endpoints", home.Endpoints()[0])
			keys = byKey(doc)
			return keys[replicator.HomeKey(testRegion)] != nil
		})
		if doc.Revision <= 0 || doc.Prefix != "/aether/" {
			t.Errorf("revision %d prefix %q", doc.Revision, doc.Prefix)
		}
		ep := keys[web1]
		if ep == nil || ep.Kind != kindEndpoint || ep.Service != "web" || ep.Region != testRegion || ep.Cluster != testCluster || ep.Node != "n1" || ep.Error != "" || ep.Mirrored || ep.Lease != "" {
			t.Fatalf("endpoint %s: %+v", web1, ep)
		}
		var decoded registryv1.ServiceEndpoint
		if err := protojson.Unmarshal(ep.Value, &decoded); err != nil || decoded.GetIp() != "10.0.0.1" || decoded.GetPorts()[0].GetPort() != 8080 || decoded.GetStamp() == nil {
			t.Errorf("endpoint value %s: %v %v", ep.Value, &decoded, err)
		}
		if !strings.Contains(ep.Summary, "http 10.0.0.1 http:8080 node=n1 zone=z1 SERVING") {
			t.Errorf("endpoint summary %q", ep.Summary)
		}
		if keys[gone2] != nil {
			t.Errorf("unregistered endpoint still listed: %+v", keys[gone2])
		}
		n := keys[node1]
		if n == nil || n.Kind != kindNode || n.Node != "n1" || n.Lease == "" || n.TTLSeconds == nil || *n.TTLSeconds <= 0 || *n.TTLSeconds > 20 || *n.GrantedTTL != 20 {
			t.Fatalf("node %s: %+v", node1, n)
		}
		if !strings.Contains(n.Summary, "addr=10.0.0.9 zone=z1 services=web") {
			t.Errorf("node summary %q", n.Summary)
		}
		tb := keys[tomb]
		if tb == nil || tb.Kind != kindTombstone || tb.Service != "web" || tb.Lease == "" || tb.TTLSeconds == nil || !strings.HasPrefix(tb.Summary, "deleted ") {
			t.Errorf("tombstone %s: %+v", tomb, tb)
		}
		if h := keys[replicator.HomeKey(testRegion)]; h.Kind != kindHome || h.Region != testRegion {
			t.Errorf("home key: %+v", h)
		}
		var election bool
		for _, k := range doc.Keys {
			election = election || (k.Kind == kindElection && k.Region == testRegion && k.Lease != "" && k.TTLSeconds != nil)
		}
		if !election {
			t.Errorf("no replicator election key under a lease in %+v", doc.Keys)
		}

		// Filters.
		doc, _ = inspectDoc(t, "--etcd-endpoints", home.Endpoints()[0], "--service", "web")
		for _, k := range doc.Keys {
			if k.Service != "web" {
				t.Errorf("--service web lists %+v", k)
			}
		}
		if len(doc.Keys) != 2 { // web 10.0.0.1 and the tombstone of 10.0.0.2
			t.Errorf("--service web: %d keys, want 2: %+v", len(doc.Keys), doc.Keys)
		}
		doc, _ = inspectDoc(t, "--etcd-endpoints", home.Endpoints()[0], "--kind", "node")
		if len(doc.Keys) != 1 || doc.Keys[0].Key != node1 {
			t.Errorf("--kind node: %+v", doc.Keys)
		}
		doc, _ = inspectDoc(t, "--etcd-endpoints", home.Endpoints()[0], "--prefix", registry.ServicePrefix(testRegion, testCluster, "api"))
		if len(doc.Keys) != 1 || doc.Keys[0].Key != api3 {
			t.Errorf("--prefix of api: %+v", doc.Keys)
		}
		doc, _ = inspectDoc(t, "--etcd-endpoints", home.Endpoints()[0], "--region", "nowhere")
		if len(doc.Keys) != 0 {
			t.Errorf("--region nowhere: %+v", doc.Keys)
		}
	})

	t.Run("peer etcd", func(t *testing.T) {
		// The replicator mirrors eu's subtree into us's etcd under one
		// origin lease of 10s and fences it.
		var keys map[string]*inspectedKey
		wait.For(t, "eu's keys mirrored into us", 15*time.Second, func() bool {
			doc, _ := inspectDoc(t, "--etcd-endpoints", peer.Endpoints()[0])
			keys = byKey(doc)
			return keys[web1] != nil && keys[api3] != nil && keys[node1] != nil && keys[replicator.FenceKey(testRegion)] != nil
		})
		lease := keys[web1].Lease
		for _, k := range []string{web1, api3, node1} {
			m := keys[k]
			if !m.Mirrored || m.Region != testRegion || m.Lease == "" || m.Lease != lease || m.TTLSeconds == nil || *m.TTLSeconds <= 0 || *m.GrantedTTL != 10 || m.Error != "" {
				t.Errorf("mirrored %s: %+v (lease %s)", k, m, lease)
			}
		}
		if keys[tomb] != nil {
			t.Errorf("a tombstone was mirrored: %+v", keys[tomb])
		}
		if f := keys[replicator.FenceKey(testRegion)]; f.Kind != kindFence || f.Region != testRegion || !json.Valid(f.Value) {
			t.Errorf("fence: %+v", f)
		}

		res := runCLI(t, nil, nil, "inspect", "--etcd-endpoints", peer.Endpoints()[0], "--region", testRegion, "--service", "web")
		if res.err != nil {
			t.Fatal(res.err)
		}
		t.Logf("aether inspect on us's etcd:\n%s", runCLI(t, nil, nil, "inspect", "--etcd-endpoints", peer.Endpoints()[0]).stdout)
		lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
		if len(lines) != 3 || !strings.HasPrefix(lines[0], "revision ") || !strings.Contains(lines[0], ": 1 keys (1 endpoint)") ||
			!strings.HasPrefix(squash(lines[1]), "KIND REGION CLUSTER NAME LEASE TTL VALUE KEY") {
			t.Fatalf("table:\n%s", res.stdout)
		}
		row := squash(lines[2])
		if !strings.HasPrefix(row, "endpoint eu c1 web "+lease+" (mirrored) ") || !strings.HasSuffix(row, " "+web1) || !strings.Contains(row, "s/10s http 10.0.0.1") {
			t.Errorf("row %q", row)
		}
	})

	t.Run("undecodable", func(t *testing.T) {
		// Garbage where an endpoint of another region belongs, and an
		// endpoint whose value names another endpoint: shown, not fatal.
		cli := peer.Client(t)
		bad, _ := registry.EndpointID{Region: "zz", Cluster: "c9", Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.9.9.9"}.Key()
		liar, _ := registry.EndpointID{Region: "zz", Cluster: "c9", Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.9.9.8"}.Key()
		other, _ := registry.EncodeEndpoint(&registryv1.ServiceEndpoint{Service: "db", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.9.9.8", Region: "zz", Cluster: "c9"})
		pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := cli.Put(pctx, bad, "\xff\xfe not protobuf"); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(pctx, liar, string(other)); err != nil {
			t.Fatal(err)
		}
		doc, res := inspectDoc(t, "--etcd-endpoints", peer.Endpoints()[0], "--region", "zz")
		if res.err != nil {
			t.Fatalf("undecodable keys made inspect fail: %v", res.err)
		}
		keys := byKey(doc)
		if k := keys[bad]; k == nil || k.Kind != kindEndpoint || k.Error == "" || k.Raw == "" || !strings.HasPrefix(k.Summary, "UNDECODABLE: ") || k.Value != nil {
			t.Errorf("garbage value: %+v", k)
		}
		if k := keys[liar]; k == nil || !strings.Contains(k.Error, "names a different endpoint") {
			t.Errorf("value naming another endpoint: %+v", k)
		}
		res = runCLI(t, nil, nil, "inspect", "--etcd-endpoints", peer.Endpoints()[0], "--region", "zz")
		if res.err != nil || strings.Count(res.stdout, "UNDECODABLE: ") != 2 {
			t.Errorf("table of undecodable keys: %v\n%s", res.err, res.stdout)
		}
	})
}

// TestInspectErrors: each misuse names the flag and the fix, before
// anything is dialled where it can be.
func TestInspectErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no endpoints", nil, "--etcd-endpoints is required"},
		{"bad output", []string{"--etcd-endpoints", "http://127.0.0.1:1", "-o", "yaml"}, `-o/--output "yaml": use table or json`},
		{"bad region", []string{"--etcd-endpoints", "http://127.0.0.1:1", "--region", "a/b"}, "--region: "},
		{"bad kind", []string{"--etcd-endpoints", "http://127.0.0.1:1", "--kind", "pod"}, `--kind "pod": use one of endpoint, node`},
		{"empty prefix", []string{"--etcd-endpoints", "http://127.0.0.1:1", "--prefix", ""}, "--prefix is empty"},
		{"tls on plaintext", []string{"--etcd-endpoints", "http://127.0.0.1:1", "--etcd-cacert", "ca.pem"}, "use https://127.0.0.1:1"},
		{"cert without key", []string{"--etcd-endpoints", "https://127.0.0.1:1", "--etcd-cert", "c.pem"}, "--etcd-cert and --etcd-key go together"},
		{"unreachable", []string{"--etcd-endpoints", "http://" + unusedAddr(t), "--timeout", "500ms"}, "did not answer within 500ms (check --etcd-endpoints"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := runCLI(t, nil, nil, append([]string{"inspect"}, tc.args...)...)
			if res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
				t.Errorf("inspect %v: error %v, want it to contain %q", tc.args, res.err, tc.want)
			}
		})
	}
}

// TestInspectOverTLS: the etcd TLS flags (and their AETHER_ETCD_*
// variables) reach an etcd that requires client certificates; without
// one the error points at the flags. The key is in the legacy schema,
// which inspect decodes too.
func TestInspectOverTLS(t *testing.T) {
	t.Parallel()
	e := startTLSEtcd(t)
	ep := &registryv1.ServiceEndpoint{Service: "pay", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1", Region: "eu", Cluster: "c1",
		Ports: []*registryv1.Port{{Name: "http", Port: 80}}}
	b, err := registry.EncodeEndpoint(ep)
	if err != nil {
		t.Fatal(err)
	}
	const legacy = "/aether/services/pay/protocols/http1/endpoints/10.0.0.1"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.admin.Put(ctx, legacy, string(b)); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"AETHER_ETCD_CACERT": e.ca, "AETHER_ETCD_CERT": e.cert, "AETHER_ETCD_KEY": e.key}
	res := runCLI(t, nil, env, "inspect", "--etcd-endpoints", e.endpoint)
	if res.err != nil || !strings.Contains(res.stdout, "1 keys (1 legacy)") || !strings.Contains(res.stdout, "legacy schema (aether migrate --from-legacy): pay 10.0.0.1 (http) http:80") {
		t.Fatalf("inspect over TLS: %v\n%s", res.err, res.stdout)
	}
	res = runCLI(t, nil, nil, "inspect", "--etcd-endpoints", e.endpoint, "--etcd-cacert", e.ca, "--timeout", "2s")
	t.Logf("without a client certificate: %v", res.err)
	if res.err == nil || !strings.Contains(res.err.Error(), "--etcd-cert") {
		t.Fatalf("inspect without a client certificate: %v\n%s", res.err, res.stdout)
	}
}
