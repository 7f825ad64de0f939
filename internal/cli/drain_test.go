package cli

import (
	"regexp"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

func TestDrainAgainstRegistrar(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd)
	web := &registryv1.ServiceEndpoint{
		Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1",
		Ports: []*registryv1.Port{{Name: "http", Port: 8080}}, Zone: "z1", Weight: 2,
		Cluster: testCluster, Region: testRegion, State: registryv1.State_STATE_SERVING,
		Metadata: map[string]string{"version": "1.4.2"},
	}
	r.register(t, web, &registryv1.ServiceEndpoint{Service: "api", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "10.0.0.2", Ports: []*registryv1.Port{{Port: 9090}}})
	draining := regexp.MustCompile(`^draining web 10\.0\.0\.1 \(http\) version (\S+)\n$`)

	// Phase one: the endpoint stays listed, DRAINING, everything else kept.
	res := runCLI(t, nil, nil, "drain", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1")
	m := draining.FindStringSubmatch(res.stdout)
	if res.err != nil || m == nil {
		t.Fatalf("got %v, %q", res.err, res.stdout)
	}
	want := proto.Clone(web).(*registryv1.ServiceEndpoint)
	want.State = registryv1.State_STATE_DRAINING
	got := r.find(t, "web", registryv1.Protocol_PROTOCOL_HTTP1, "10.0.0.1")
	if got == nil || !sameEndpoint(got, want) {
		t.Fatalf("registrar has %v\nwant %v", got, want)
	}
	if _, v := r.list(t); !atOrAfter(t, v, m[1]) {
		t.Errorf("drain printed version %s; the registrar is at %s", m[1], v)
	}
	res = runCLI(t, nil, nil, "list", "--registrar", r.addr(), "--service", "web")
	if lines := strings.Split(res.stdout, "\n"); res.err != nil || len(lines) != 3 || !strings.Contains(lines[1], " DRAINING ") {
		t.Errorf("list after drain: %v\n%s", res.err, res.stdout)
	}

	// Draining a draining endpoint changes nothing and is no error.
	res = runCLI(t, nil, nil, "drain", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1")
	if res.err != nil || !draining.MatchString(res.stdout) {
		t.Errorf("drain again: %v, %q", res.err, res.stdout)
	}

	// The wrong protocol (http is the default) is not found, with the hint.
	res = runCLI(t, nil, nil, "drain", "--registrar", r.addr(), "--service", "api", "--ip", "10.0.0.2")
	wantErr := "drain api 10.0.0.2 (http): endpoint is not registered: /aether/v1/regions/eu/clusters/c1/services/api/protocols/http1/endpoints/10.0.0.2" +
		" (check --protocol; see what is registered with: aether list --service api)"
	if res.err == nil || res.err.Error() != wantErr {
		t.Errorf("error %v\nwant %s", res.err, wantErr)
	}
	if res.stdout != "" {
		t.Errorf("stdout %q on error", res.stdout)
	}
	if got := r.find(t, "api", registryv1.Protocol_PROTOCOL_GRPC, "10.0.0.2"); got.GetState() != registryv1.State_STATE_SERVING {
		t.Errorf("api after a failed drain: %v", got)
	}
	res = runCLI(t, nil, nil, "drain", "--registrar", r.addr(), "--service", "api", "--ip", "10.0.0.2", "--protocol", "grpc")
	if !regexp.MustCompile(`^draining api 10\.0\.0\.2 \(grpc\) version \S+\n$`).MatchString(res.stdout) || res.err != nil {
		t.Errorf("drain with --protocol: %v, %q", res.err, res.stdout)
	}
	if got := r.find(t, "api", registryv1.Protocol_PROTOCOL_GRPC, "10.0.0.2"); got.GetState() != registryv1.State_STATE_DRAINING {
		t.Errorf("api after drain: %v", got)
	}

	// Phase two.
	res = runCLI(t, nil, nil, "deregister", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1")
	if res.err != nil || r.find(t, "web", registryv1.Protocol_PROTOCOL_HTTP1, "10.0.0.1") != nil {
		t.Errorf("deregister after drain: %v, %q; endpoint still listed: %v", res.err, res.stdout, r.find(t, "web", registryv1.Protocol_PROTOCOL_HTTP1, "10.0.0.1"))
	}
}
