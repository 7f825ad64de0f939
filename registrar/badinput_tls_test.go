package registrar_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/aethermesh/aether/internal/testutil/meshtest"
	"io"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// badInputCase is one bad request and the exact status it must get.
type badInputCase struct {
	name string
	call func(context.Context) error
	code codes.Code
	msg  string // a substring of the status message
}

// runBadInput runs cases, each with its own deadline, and checks every
// status code and message.
func runBadInput(t *testing.T, cases []badInputCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := tc.call(ctx)
			st, _ := status.FromError(err)
			if err == nil || st.Code() != tc.code || !strings.Contains(st.Message(), tc.msg) {
				t.Fatalf("got %v %q, want %v containing %q", st.Code(), st.Message(), tc.code, tc.msg)
			}
		})
	}
}

// watchErr opens a WatchEndpoints stream and returns the status it ends with
// (a refused request fails on the first Recv).
func watchErr(ctx context.Context, c registrarv1.RegistrarClient, req *registrarv1.WatchEndpointsRequest) error {
	st, err := c.WatchEndpoints(ctx, req)
	if err != nil {
		return err
	}
	_, err = st.Recv()
	return err
}

// subscribeErr sends msgs on a new Subscribe stream and returns the status
// it ends with. After a valid start the snapshot arrives first; events are
// read until the stream fails.
func subscribeErr(ctx context.Context, c registrarv1.RegistrarClient, msgs ...*registrarv1.SubscribeRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Subscribe(ctx)
	if err != nil {
		return err
	}
	for i, m := range msgs {
		if i > 0 {
			// Send an update only once the start was accepted (its
			// snapshot arrived), so it is judged as an update.
			if _, err := st.Recv(); err != nil {
				return err
			}
		}
		// A stream the server already ended fails Send with io.EOF; its
		// status comes from Recv.
		if err := st.Send(m); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}
	for {
		if _, err := st.Recv(); err != nil {
			return err
		}
	}
}

func subStart(services ...string) *registrarv1.SubscribeRequest {
	return &registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Start{Start: &registrarv1.WatchEndpointsRequest{Services: services}}}
}

func subUpdate(add, remove []string) *registrarv1.SubscribeRequest {
	return &registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Update{Update: &registrarv1.SubscriptionUpdate{Add: add, Remove: remove}}}
}

// badInputCatalog is the shared catalog of malformed requests, for every
// RPC, that must be refused with INVALID_ARGUMENT or NOT_FOUND and change
// nothing. It assumes a registrar of region r1, cluster c1, default limits
// (except --max-watch-services, which it does not exercise), no node
// "ghost" and no endpoint 10.9.9.9, and a caller allowed to do everything
// (plaintext, or an operator).
func badInputCatalog(c registrarv1.RegistrarClient) []badInputCase {
	good := func(mut func(*registryv1.ServiceEndpoint)) *registrarv1.RegisterEndpointRequest {
		e := ep("web", "10.0.0.1", 80)
		mut(e)
		return &registrarv1.RegisterEndpointRequest{Endpoint: e}
	}
	manyMeta := map[string]string{}
	for i := 0; i < 40; i++ {
		manyMeta[fmt.Sprintf("k%d", i)] = "v"
	}
	type call = func(context.Context) error
	reg := func(req *registrarv1.RegisterEndpointRequest) call {
		return func(ctx context.Context) error { _, err := c.RegisterEndpoint(ctx, req); return err }
	}
	unreg := func(req *registrarv1.UnregisterEndpointRequest) call {
		return func(ctx context.Context) error { _, err := c.UnregisterEndpoint(ctx, req); return err }
	}
	drain := func(req *registrarv1.DrainEndpointRequest) call {
		return func(ctx context.Context) error { _, err := c.DrainEndpoint(ctx, req); return err }
	}
	announceReq := func(n *registryv1.Node) call {
		return func(ctx context.Context) error {
			_, err := c.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: n})
			return err
		}
	}
	heartbeat := func(req *registrarv1.HeartbeatRequest) call {
		return func(ctx context.Context) error { _, err := c.Heartbeat(ctx, req); return err }
	}
	leave := func(req *registrarv1.LeaveNodeRequest) call {
		return func(ctx context.Context) error { _, err := c.LeaveNode(ctx, req); return err }
	}
	const http1 = registryv1.Protocol_PROTOCOL_HTTP1
	return []badInputCase{
		// RegisterEndpoint
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
		// UnregisterEndpoint
		{"unregister unknown", unreg(&registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: http1, Ip: "10.9.9.9"}), codes.NotFound,
			"endpoint is not registered: /aether/v1/regions/r1/clusters/c1/services/web/protocols/http1/endpoints/10.9.9.9"},
		{"unregister bad ip", unreg(&registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: http1, Ip: "nope"}), codes.InvalidArgument, "ip: ip \"nope\" is not"},
		{"unregister slash service", unreg(&registrarv1.UnregisterEndpointRequest{Service: "a/b", Protocol: http1, Ip: "10.0.0.1"}), codes.InvalidArgument, "service: service \"a/b\" must not contain '/'"},
		{"unregister no protocol", unreg(&registrarv1.UnregisterEndpointRequest{Service: "web", Ip: "10.0.0.1"}), codes.InvalidArgument, "protocol: protocol must be set"},
		// DrainEndpoint
		{"drain unknown", drain(&registrarv1.DrainEndpointRequest{Service: "web", Protocol: http1, Ip: "10.9.9.9"}), codes.NotFound,
			"endpoint is not registered: /aether/v1/regions/r1/clusters/c1/services/web/protocols/http1/endpoints/10.9.9.9"},
		{"drain bad ip", drain(&registrarv1.DrainEndpointRequest{Service: "web", Protocol: http1, Ip: "nope"}), codes.InvalidArgument, "ip: ip \"nope\" is not"},
		{"drain no protocol", drain(&registrarv1.DrainEndpointRequest{Service: "web", Ip: "10.0.0.1"}), codes.InvalidArgument, "protocol: protocol must be set"},
		{"drain foreign region", drain(&registrarv1.DrainEndpointRequest{Region: "r2", Service: "web", Protocol: http1, Ip: "10.0.0.1"}), codes.InvalidArgument, `region: "r2" is not this registrar's region "r1"`},
		// ListAllEndpoints
		{"list bad service", func(ctx context.Context) error {
			_, err := c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: []string{"ok", "bad/one"}})
			return err
		}, codes.InvalidArgument, "services[1]"},
		// WatchEndpoints
		{"watch bad service", func(ctx context.Context) error {
			return watchErr(ctx, c, &registrarv1.WatchEndpointsRequest{Services: []string{""}})
		}, codes.InvalidArgument, "services[0]: service must not be empty"},
		{"watch malformed version", func(ctx context.Context) error {
			return watchErr(ctx, c, &registrarv1.WatchEndpointsRequest{LastVersion: "yesterday"})
		}, codes.InvalidArgument, `last_version "yesterday" is not a version token`},
		// Subscribe
		{"subscribe empty first message", func(ctx context.Context) error {
			return subscribeErr(ctx, c, &registrarv1.SubscribeRequest{})
		}, codes.InvalidArgument, "the first Subscribe message must set start (a WatchEndpointsRequest)"},
		{"subscribe update as first message", func(ctx context.Context) error {
			return subscribeErr(ctx, c, subUpdate([]string{"web"}, nil))
		}, codes.InvalidArgument, "the first Subscribe message must set start"},
		{"subscribe bad start service", func(ctx context.Context) error {
			return subscribeErr(ctx, c, subStart("web", "bad/one"))
		}, codes.InvalidArgument, "services: services[1]"},
		{"subscribe malformed version", func(ctx context.Context) error {
			return subscribeErr(ctx, c, &registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Start{Start: &registrarv1.WatchEndpointsRequest{LastVersion: "yesterday"}}})
		}, codes.InvalidArgument, `last_version "yesterday" is not a version token`},
		{"subscribe second start", func(ctx context.Context) error {
			return subscribeErr(ctx, c, subStart("web"), subStart("api"))
		}, codes.InvalidArgument, "after the first message, Subscribe messages must set update"},
		{"subscribe update of an all-services stream", func(ctx context.Context) error {
			return subscribeErr(ctx, c, subStart(), subUpdate([]string{"api"}, nil))
		}, codes.InvalidArgument, "this stream watches all services; to choose services, start it with a service list"},
		{"subscribe update bad add", func(ctx context.Context) error {
			return subscribeErr(ctx, c, subStart("web"), subUpdate([]string{"a/b"}, nil))
		}, codes.InvalidArgument, "update.add: services[0]"},
		{"subscribe update bad remove", func(ctx context.Context) error {
			return subscribeErr(ctx, c, subStart("web"), subUpdate(nil, []string{"we\x00b"}))
		}, codes.InvalidArgument, "update.remove: services[0]"},
		// AnnounceNode
		{"announce no node", announceReq(nil), codes.InvalidArgument, "node: must be set"},
		{"announce slash name", announceReq(&registryv1.Node{Name: "a/b"}), codes.InvalidArgument, `node.name: node "a/b" must not contain '/'`},
		{"announce foreign cluster", announceReq(&registryv1.Node{Name: "ghost", Cluster: "other"}), codes.InvalidArgument, `node.cluster: "other" is not this registrar's cluster "c1"`},
		{"announce bad address", announceReq(&registryv1.Node{Name: "ghost", Address: "nope"}), codes.InvalidArgument, `node.address: ip "nope" is not an IPv4 or IPv6 address`},
		{"announce too many labels", announceReq(&registryv1.Node{Name: "ghost", Labels: manyMeta}), codes.InvalidArgument, "node.labels: 40 entries exceed the limit of 32 (--max-metadata-entries)"},
		// Heartbeat
		{"heartbeat unknown node", heartbeat(&registrarv1.HeartbeatRequest{Node: "ghost"}), codes.NotFound, `node "ghost" has no record (never announced, or its lease lapsed); announce it again`},
		{"heartbeat bad name", heartbeat(&registrarv1.HeartbeatRequest{Node: "a/b"}), codes.InvalidArgument, `node: node "a/b" must not contain '/'`},
		{"heartbeat foreign region", heartbeat(&registrarv1.HeartbeatRequest{Node: "ghost", Region: "r2"}), codes.InvalidArgument, `region: "r2" is not this registrar's region "r1"`},
		// LeaveNode
		{"leave unknown node", leave(&registrarv1.LeaveNodeRequest{Node: "ghost"}), codes.NotFound, `node "ghost" has no record`},
		{"leave empty name", leave(&registrarv1.LeaveNodeRequest{Node: ""}), codes.InvalidArgument, "node: node must not be empty"},
		{"leave foreign cluster", leave(&registrarv1.LeaveNodeRequest{Node: "ghost", Cluster: "c9"}), codes.InvalidArgument, `cluster: "c9" is not this registrar's cluster "c1"`},
	}
}

// etcdKV is everything etcd keeps about one key.
type etcdKV struct {
	value                     string
	create, mod, version, lse int64
}

// etcdDump reads every key of etcd with its value, revisions and lease,
// and the store's revision.
func etcdDump(t *testing.T, cli *clientv3.Client) (rev int64, kvs map[string]etcdKV) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "\x00", clientv3.WithFromKey())
	if err != nil {
		t.Fatal(err)
	}
	kvs = map[string]etcdKV{}
	for _, kv := range resp.Kvs {
		kvs[string(kv.Key)] = etcdKV{string(kv.Value), kv.CreateRevision, kv.ModRevision, kv.Version, kv.Lease}
	}
	return resp.Header.Revision, kvs
}

func endpointKey(t *testing.T, e *registryv1.ServiceEndpoint) string {
	t.Helper()
	id := registry.IDOf(e)
	id.Region, id.Cluster = "r1", "c1"
	k, err := id.Key()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestBadInputOverTLSWithAuthz runs the bad-input catalog over mTLS with
// authorization on: as an operator, so that validation is what refuses;
// plus limits and, as a node, authorization refusals. Every case gets its
// precise status, and etcd is byte-for-byte unchanged afterwards.
func TestBadInputOverTLSWithAuthz(t *testing.T) {
	t.Parallel()
	start := time.Now()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	m := meshtest.New(t, "example.org")
	srv, _ := startSecure(t, etcd, m, func(o *server.Config) { o.MaxWatchServices = 3 })
	op := tlsClient(t, srv.GRPCAddr(), m.CA, m, "operator-alice")
	nodeA := tlsClient(t, srv.GRPCAddr(), m.CA, m, "node-node-a")

	// Warm-up: node-b's endpoint and node record, persisted, so there is
	// state for bad input to damage.
	theirs := nodeEP("web", "10.0.0.2", "node-b")
	register(t, op, theirs)
	register(t, op, nodeEP("api", "10.0.0.3", ""))
	if _, err := op.AnnounceNode(callCtx(t), &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "node-b", Address: "10.0.0.2"}}); err != nil {
		t.Fatalf("announce node-b: %v", err)
	}
	theirsKey := endpointKey(t, theirs)
	waitFor(t, "warm-up persisted", 10*time.Second, func() bool {
		if srv.Registrar().PendingWrites() != 0 {
			return false
		}
		_, kvs := etcdDump(t, cli)
		_, ok := kvs[theirsKey]
		return ok
	})
	revBefore, before := etcdDump(t, cli)
	if len(before) < 3 {
		t.Fatalf("warm-up left %d keys in etcd, want at least 3: %v", len(before), before)
	}

	cases := badInputCatalog(op)

	// Limits: --max-watch-services 3.
	const tooMany = "services: 4 distinct services exceed the limit of 3 per watch (--max-watch-services)"
	cases = append(cases,
		badInputCase{"watch too many services", func(ctx context.Context) error {
			return watchErr(ctx, op, &registrarv1.WatchEndpointsRequest{Services: []string{"a", "b", "c", "d"}})
		}, codes.InvalidArgument, tooMany},
		badInputCase{"subscribe start with too many services", func(ctx context.Context) error {
			return subscribeErr(ctx, op, subStart("a", "b", "c", "d"))
		}, codes.InvalidArgument, tooMany},
		badInputCase{"subscribe update to too many services", func(ctx context.Context) error {
			return subscribeErr(ctx, op, subStart("a", "b", "c"), subUpdate([]string{"d"}, nil))
		}, codes.InvalidArgument, "update: the stream would watch 4 services, more than the limit of 3 (--max-watch-services); nothing was changed"},
	)

	// Authorization: node-a may not touch node-b's endpoint or record.
	const idA = "spiffe://example.org/node/node-a"
	cases = append(cases,
		badInputCase{"node registers another node's endpoint", func(ctx context.Context) error {
			_, err := nodeA.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: nodeEP("web", "10.0.0.9", "node-b")})
			return err
		}, codes.PermissionDenied, `"node-a" (` + idA + `) may only register endpoints of its own node; this endpoint's node is "node-b"`},
		badInputCase{"node re-registers over another node's endpoint", func(ctx context.Context) error {
			_, err := nodeA.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: nodeEP("web", "10.0.0.2", "node-a")})
			return err
		}, codes.PermissionDenied, `node is "node-b"`},
		badInputCase{"node unregisters another node's endpoint", func(ctx context.Context) error {
			_, err := nodeA.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: theirs.Protocol, Ip: theirs.Ip})
			return err
		}, codes.PermissionDenied, `"node-a" (` + idA + `) may only unregister endpoints of its own node; this endpoint's node is "node-b"`},
		badInputCase{"node drains another node's endpoint", func(ctx context.Context) error {
			_, err := nodeA.DrainEndpoint(ctx, &registrarv1.DrainEndpointRequest{Service: "web", Protocol: theirs.Protocol, Ip: theirs.Ip})
			return err
		}, codes.PermissionDenied, `"node-a" (` + idA + `) may only drain endpoints of its own node; this endpoint's node is "node-b"`},
		badInputCase{"node announces another node", func(ctx context.Context) error {
			_, err := nodeA.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "node-b"}})
			return err
		}, codes.PermissionDenied, `may only announce, heartbeat and leave as itself (node "node-a"); this announce is for node "node-b"`},
		badInputCase{"node heartbeats another node", func(ctx context.Context) error {
			_, err := nodeA.Heartbeat(ctx, &registrarv1.HeartbeatRequest{Node: "node-b"})
			return err
		}, codes.PermissionDenied, `may only announce, heartbeat and leave as itself (node "node-a"); this heartbeat is for node "node-b"`},
		badInputCase{"node leaves as another node", func(ctx context.Context) error {
			_, err := nodeA.LeaveNode(ctx, &registrarv1.LeaveNodeRequest{Node: "node-b"})
			return err
		}, codes.PermissionDenied, `may only announce, heartbeat and leave as itself (node "node-a"); this leave is for node "node-b"`},
	)
	if len(cases) < 30 {
		t.Fatalf("only %d cases, the catalog needs at least 30", len(cases))
	}
	runBadInput(t, cases)

	// A valid marker write made after the catalog: once it is in etcd,
	// and the write queue is empty, anything the catalog queued would
	// have been persisted before it.
	marker := ep("marker", "10.0.0.200", 80)
	register(t, op, marker)
	markerKey := endpointKey(t, marker)
	var (
		revAfter int64
		after    map[string]etcdKV
	)
	waitFor(t, "marker persisted and the write queue empty", 10*time.Second, func() bool {
		if srv.Registrar().PendingWrites() != 0 {
			return false
		}
		revAfter, after = etcdDump(t, cli)
		_, ok := after[markerKey]
		return ok
	})
	if m := after[markerKey]; m.create != revAfter || m.mod != revAfter {
		t.Errorf("marker at create/mod revision %d/%d, want %d: another write followed it", m.create, m.mod, revAfter)
	}
	if revAfter != revBefore+1 {
		t.Errorf("etcd revision went from %d to %d; want exactly one revision, the marker's", revBefore, revAfter)
	}
	delete(after, markerKey)
	for k, v := range before {
		if w, ok := after[k]; !ok {
			t.Errorf("key %q was deleted", k)
		} else if w != v {
			t.Errorf("key %q changed:\n before %+v\n after  %+v", k, v, w)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("key %q was created", k)
		}
	}
	t.Logf("%d bad-input cases over mTLS with authz; etcd before: %d keys at revision %d; %v", len(cases), len(before), revBefore, time.Since(start).Round(time.Millisecond))
}
