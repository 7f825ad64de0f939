package registrar_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

func TestBadInputIsRejectedAndChangesNothing(t *testing.T) {
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	w := watch(t, c, &registrarv1.WatchEndpointsRequest{})
	w.waitSnapshot(t)

	good := func(mut func(*registryv1.ServiceEndpoint)) *registrarv1.RegisterEndpointRequest {
		e := ep("web", "10.0.0.1", 80)
		mut(e)
		return &registrarv1.RegisterEndpointRequest{Endpoint: e}
	}
	manyMeta := map[string]string{}
	for i := 0; i < 40; i++ {
		manyMeta[fmt.Sprintf("k%d", i)] = "v"
	}
	type call func(context.Context) error
	reg := func(req *registrarv1.RegisterEndpointRequest) call {
		return func(ctx context.Context) error { _, err := c.RegisterEndpoint(ctx, req); return err }
	}
	unreg := func(req *registrarv1.UnregisterEndpointRequest) call {
		return func(ctx context.Context) error { _, err := c.UnregisterEndpoint(ctx, req); return err }
	}
	cases := []struct {
		name string
		call call
		code codes.Code
		msg  string
	}{
		{"no endpoint", reg(&registrarv1.RegisterEndpointRequest{}), codes.InvalidArgument, "endpoint: must be set"},
		{"empty service", reg(good(func(e *registryv1.ServiceEndpoint) { e.Service = "" })), codes.InvalidArgument, "endpoint.service: service must not be empty"},
		{"oversized service", reg(good(func(e *registryv1.ServiceEndpoint) { e.Service = strings.Repeat("s", 129) })), codes.InvalidArgument, "129 bytes long; the limit is 128"},
		{"slash in service", reg(good(func(e *registryv1.ServiceEndpoint) { e.Service = "web/../../x" })), codes.InvalidArgument, "must not contain '/'"},
		{"NUL in service", reg(good(func(e *registryv1.ServiceEndpoint) { e.Service = "we\x00b" })), codes.InvalidArgument, "NUL"},
		{"dotdot service", reg(good(func(e *registryv1.ServiceEndpoint) { e.Service = ".." })), codes.InvalidArgument, "start and end with a letter or digit"},
		{"slash in node", reg(good(func(e *registryv1.ServiceEndpoint) { e.Node = "n/1" })), codes.InvalidArgument, "endpoint.node"},
		{"NUL in zone", reg(good(func(e *registryv1.ServiceEndpoint) { e.Zone = "z\x00" })), codes.InvalidArgument, "endpoint.zone"},
		{"bad ip", reg(good(func(e *registryv1.ServiceEndpoint) { e.Ip = "10.0.0" })), codes.InvalidArgument, `endpoint.ip: ip "10.0.0" is not an IPv4 or IPv6 address`},
		{"hostname as ip", reg(good(func(e *registryv1.ServiceEndpoint) { e.Ip = "web.local" })), codes.InvalidArgument, "not an IPv4 or IPv6"},
		{"cidr as ip", reg(good(func(e *registryv1.ServiceEndpoint) { e.Ip = "10.0.0.1/24" })), codes.InvalidArgument, "not an IPv4 or IPv6"},
		{"unspecified ip", reg(good(func(e *registryv1.ServiceEndpoint) { e.Ip = "::" })), codes.InvalidArgument, "unspecified address"},
		{"port 0", reg(good(func(e *registryv1.ServiceEndpoint) { e.Ports[0].Port = 0 })), codes.InvalidArgument, "endpoint.ports[0].port: 0 is not a port number"},
		{"port 65536", reg(good(func(e *registryv1.ServiceEndpoint) { e.Ports[0].Port = 65536 })), codes.InvalidArgument, "65536 is not a port number (1-65535)"},
		{"no ports", reg(good(func(e *registryv1.ServiceEndpoint) { e.Ports = nil })), codes.InvalidArgument, "at least one port"},
		{"unspecified protocol", reg(good(func(e *registryv1.ServiceEndpoint) { e.Protocol = 0 })), codes.InvalidArgument, "endpoint.protocol: protocol must be set"},
		{"unknown protocol", reg(good(func(e *registryv1.ServiceEndpoint) { e.Protocol = 99 })), codes.InvalidArgument, "unknown protocol 99"},
		{"unknown state", reg(good(func(e *registryv1.ServiceEndpoint) { e.State = 5 })), codes.InvalidArgument, "unknown state 5"},
		{"too much metadata", reg(good(func(e *registryv1.ServiceEndpoint) { e.Metadata = manyMeta })), codes.InvalidArgument, "40 entries exceed the limit of 32 (--max-metadata-entries)"},
		{"oversized metadata value", reg(good(func(e *registryv1.ServiceEndpoint) { e.Metadata = map[string]string{"k": strings.Repeat("v", 1000)} })), codes.InvalidArgument, "1000 bytes; the limit is 256"},
		{"foreign region", reg(good(func(e *registryv1.ServiceEndpoint) { e.Region = "r2" })), codes.InvalidArgument, `endpoint.region: "r2" is not this registrar's region "r1"`},
		{"foreign cluster", reg(good(func(e *registryv1.ServiceEndpoint) { e.Cluster = "c9" })), codes.InvalidArgument, `endpoint.cluster: "c9" is not this registrar's cluster "c1"`},
		{"unregister unknown", unreg(&registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.9.9.9"}), codes.NotFound,
			"endpoint is not registered: /aether/v1/regions/r1/clusters/c1/services/web/protocols/http1/endpoints/10.9.9.9"},
		{"unregister bad ip", unreg(&registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "nope"}), codes.InvalidArgument, "ip: ip \"nope\" is not"},
		{"unregister slash service", unreg(&registrarv1.UnregisterEndpointRequest{Service: "a/b", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1"}), codes.InvalidArgument, "service: service \"a/b\" must not contain '/'"},
		{"unregister no protocol", unreg(&registrarv1.UnregisterEndpointRequest{Service: "web", Ip: "10.0.0.1"}), codes.InvalidArgument, "protocol: protocol must be set"},
		{"list bad service", func(ctx context.Context) error {
			_, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: []string{"ok", "bad/one"}})
			return err
		}, codes.InvalidArgument, "services[1]"},
		{"watch bad service", func(ctx context.Context) error {
			st, err := c.WatchEndpoints(ctx, &registrarv1.WatchEndpointsRequest{Services: []string{""}})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}, codes.InvalidArgument, "services[0]: service must not be empty"},
		{"watch malformed version", func(ctx context.Context) error {
			st, err := c.WatchEndpoints(ctx, &registrarv1.WatchEndpointsRequest{LastVersion: "yesterday"})
			if err != nil {
				return err
			}
			_, err = st.Recv()
			return err
		}, codes.InvalidArgument, `last_version "yesterday" is not a version token`},
	}
	if len(cases) < 20 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := tc.call(ctx)
			st, _ := status.FromError(err)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}

	// Nothing was written: no event reached the watcher, the snapshot is
	// empty, and after a flush interval etcd holds no key.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// A valid write afterwards proves the pipeline was live all along.
	marker := register(t, c, ep("marker", "10.0.0.200", 80))
	waitFor(t, "marker persisted", 10*time.Second, func() bool { return countKeys(t, cli) >= 1 })
	if n := countKeys(t, cli); n != 1 {
		t.Fatalf("etcd holds %d keys, want only the marker", n)
	}
	l, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{})
	if err != nil || len(l.Endpoints) != 1 || !proto.Equal(l.Endpoints[0], marker.Endpoint) {
		t.Fatalf("snapshot = %v, %v; want only the marker", l.GetEndpoints(), err)
	}
	waitFor(t, "watcher sees the marker", 5*time.Second, func() bool { return w.has("ADDED marker 10.0.0.200") })
	if got := w.changes(); len(got) != 1 {
		t.Fatalf("watcher saw %v; bad input produced events", got)
	}
}
