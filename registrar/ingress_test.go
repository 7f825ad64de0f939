package registrar_test

import (
	"context"
	"fmt"
	"github.com/aethermesh/aether/internal/testutil/prototest"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// The tests here talk to a real registrar over real etcd the way a hostile
// or merely newer client would: through a codec that sends the bytes it is
// given and hands back the bytes it gets, so nothing on the client side
// validates, drops or re-encodes anything.

// rawMsg is a message on the wire, undecoded.
type rawMsg []byte

// rawCodec sends a *rawMsg's bytes as they are and returns a reply's bytes
// as they came. Named "proto" so the request's content-subtype is the one
// a protobuf client sends.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*rawMsg), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*v.(*rawMsg) = append(rawMsg(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// rawClient is a connection that sends raw bytes.
type rawClient struct{ cc *grpc.ClientConn }

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return &rawClient{cc: cc}
}

// call invokes a unary method of the Registrar with req's bytes.
func (c *rawClient) call(t *testing.T, method string, req []byte) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	in, out := rawMsg(req), rawMsg(nil)
	err := c.cc.Invoke(ctx, "/aether.registrar.v1.Registrar/"+method, &in, &out)
	return out, err
}

// stream opens a stream of the Registrar, sends msgs, and returns how it
// ended: the first error RecvMsg reports (io.EOF or a status).
func (c *rawClient) stream(t *testing.T, method string, clientStreams bool, msgs ...[]byte) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: clientStreams}, "/aether.registrar.v1.Registrar/"+method)
	if err != nil {
		return err
	}
	for _, m := range msgs {
		in := rawMsg(m)
		if err := s.SendMsg(&in); err != nil {
			break // the server ended the stream; RecvMsg says how
		}
	}
	if !clientStreams {
		_ = s.CloseSend()
	}
	for {
		var out rawMsg
		if err := s.RecvMsg(&out); err != nil {
			return err
		}
	}
}

// unknown999 is field 999, length-delimited, of n bytes: a field of a newer
// API version.
func unknown999(n int) []byte {
	b := protowire.AppendTag(nil, 999, protowire.BytesType)
	return protowire.AppendBytes(b, make([]byte, n))
}

func addUnknown(m proto.Message, n int) {
	r := m.ProtoReflect()
	r.SetUnknown(append(r.GetUnknown(), unknown999(n)...))
}

func mustMarshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// freeEP is an endpoint on no node: it counts against no node's limit and
// needs no node record.
func freeEP(svc, ip string) *registryv1.ServiceEndpoint {
	e := ep(svc, ip, 80)
	e.Node = ""
	return e
}

// rawValue is the bytes etcd holds at key (nil if none).
func rawValue(t *testing.T, cli *clientv3.Client, key string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	return resp.Kvs[0].Value
}

// storedClean waits for e to be persisted and checks what etcd holds: a
// value of at most max bytes carrying no unknown field.
func storedClean(t *testing.T, cli *clientv3.Client, e *registryv1.ServiceEndpoint, max int) {
	t.Helper()
	key := endpointKey(t, e)
	var raw []byte
	waitFor(t, key+" persisted", 10*time.Second, func() bool { raw = rawValue(t, cli, key); return raw != nil })
	if len(raw) > max {
		t.Fatalf("etcd holds %d bytes at %s; at most %d were expected", len(raw), key, max)
	}
	var got registryv1.ServiceEndpoint
	if err := proto.Unmarshal(raw, &got); err != nil { // keeps whatever unknown fields there are
		t.Fatal(err)
	}
	if n := prototest.UnknownBytes(t, &got); n != 0 {
		t.Fatalf("etcd's value at %s carries %d bytes of unknown fields", key, n)
	}
}

// persistsPromptly registers ordinary endpoints and requires every one in
// etcd within a few flush intervals: nothing before them holds the write
// path back.
func persistsPromptly(t *testing.T, c registrarv1.RegistrarClient, cli *clientv3.Client, interval time.Duration, tag string) {
	t.Helper()
	var keys []string
	for i := 0; i < 20; i++ {
		e := freeEP("after-"+tag, fmt.Sprintf("10.200.0.%d", i+1))
		register(t, c, e)
		keys = append(keys, endpointKey(t, e))
	}
	start := time.Now()
	bound := 5 * interval
	waitFor(t, fmt.Sprintf("20 ordinary writes after %s persisted within %v (5 flush intervals)", tag, bound), bound, func() bool {
		for _, k := range keys {
			if rawValue(t, cli, k) == nil {
				return false
			}
		}
		return true
	})
	t.Logf("20 ordinary writes after %s persisted %v after the last acknowledgement", tag, time.Since(start).Round(time.Millisecond))
}

// flushInterval is the tests' --write-batch-interval: short enough that a
// few of them bound "promptly", long enough to be more than scheduling
// noise on a loaded machine.
const flushInterval = 250 * time.Millisecond

func TestIngressUnknownFieldsAreDropped(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.WriteBatchInterval = flushInterval })
	raw := dialRaw(t, s.GRPCAddr())
	c := dial(t, s.GRPCAddr())

	for _, tc := range []struct {
		name string
		size int // of the endpoint's unknown field
	}{{"small", 16}, {"1MB", 1 << 20}, {"3MB", 3 << 20}} {
		t.Run(tc.name, func(t *testing.T) {
			e := freeEP("unknown-"+strings.ToLower(tc.name), "10.1.0.1")
			e.Ports = []*registryv1.Port{{Name: "a", Port: 80}, {Name: "b", Port: 81}}
			e.Metadata = map[string]string{"k": "v"}
			req := &registrarv1.RegisterEndpointRequest{Endpoint: proto.Clone(e).(*registryv1.ServiceEndpoint)}
			addUnknown(req, 8)
			addUnknown(req.Endpoint, tc.size)
			addUnknown(req.Endpoint.Ports[1], 8)
			// With gRPC's default receive limit (4 MiB) even the 3 MB one
			// is received; it is stripped like the rest.
			out, err := raw.call(t, "RegisterEndpoint", mustMarshal(t, req))
			if err != nil {
				t.Fatalf("register with a %s unknown field: %v", tc.name, err)
			}
			if len(out) > 1024 {
				t.Fatalf("the response is %d bytes: the unknown field was echoed", len(out))
			}
			var resp registrarv1.RegisterEndpointResponse
			if err := proto.Unmarshal(out, &resp); err != nil {
				t.Fatal(err)
			}
			if n := prototest.UnknownBytes(t, &resp); n != 0 {
				t.Fatalf("the response carries %d bytes of unknown fields", n)
			}
			if got := resp.GetEndpoint(); got.GetMetadata()["k"] != "v" || len(got.GetPorts()) != 2 {
				t.Fatalf("known fields lost with the unknown ones: %v", got)
			}
			storedClean(t, cli, e, 1024)
		})
	}

	// Beyond the receive limit gRPC refuses the request itself.
	big := &registrarv1.RegisterEndpointRequest{Endpoint: freeEP("unknown-5mb", "10.1.0.1")}
	addUnknown(big.Endpoint, 5<<20)
	_, err := raw.call(t, "RegisterEndpoint", mustMarshal(t, big))
	wantCode(t, "5 MB unknown field", err, codes.ResourceExhausted, "received message larger than max")

	// A node record's unknown fields go the same way; it is written to etcd
	// before the announcement is answered.
	n := &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "n1", Address: "10.1.0.9", Services: []string{"web"},
		Health: &registryv1.HealthSummary{Message: "ok"}}}
	addUnknown(n, 8)
	addUnknown(n.Node, 1<<20)
	addUnknown(n.Node.Health, 8)
	out, err := raw.call(t, "AnnounceNode", mustMarshal(t, n))
	if err != nil {
		t.Fatal(err)
	}
	var nresp registrarv1.AnnounceNodeResponse
	if err := proto.Unmarshal(out, &nresp); err != nil {
		t.Fatal(err)
	}
	if b := prototest.UnknownBytes(t, &nresp); b != 0 || len(out) > 1024 {
		t.Fatalf("the node response is %d bytes with %d of unknown fields", len(out), b)
	}
	key, err := registry.NodeID{Region: "r1", Cluster: "c1", Name: "n1"}.Key()
	if err != nil {
		t.Fatal(err)
	}
	val := rawValue(t, cli, key)
	var stored registryv1.Node
	if err := proto.Unmarshal(val, &stored); err != nil || val == nil {
		t.Fatalf("node record at %s: %v (%d bytes)", key, err, len(val))
	}
	if b := prototest.UnknownBytes(t, &stored); b != 0 || len(val) > 1024 {
		t.Fatalf("etcd holds a %d-byte node record with %d bytes of unknown fields", len(val), b)
	}

	persistsPromptly(t, c, cli, flushInterval, "unknown-fields")
}

func TestIngressOversizedKnownFieldsAreRefused(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	// Metadata limits raised far beyond the byte bound: the bound still
	// holds, because it comes from what a backend transaction carries.
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) {
		o.WriteBatchInterval = flushInterval
		o.MaxMetadataEntries, o.MaxMetadataBytes = 1000, 1<<20
	})
	raw := dialRaw(t, s.GRPCAddr())
	c := dial(t, s.GRPCAddr())

	meta := func(entries int) map[string]string {
		md := map[string]string{}
		for i := 0; i < entries; i++ {
			k := fmt.Sprintf("key-%03d-", i)
			md[k+strings.Repeat("k", 63-len(k))] = strings.Repeat("v", 256)
		}
		return md
	}
	heavy := freeEP("oversized", "10.2.0.1")
	heavy.Metadata = meta(100) // within the raised metadata limits, beyond the endpoint bound
	size := proto.Size(heavy)
	_, err := raw.call(t, "RegisterEndpoint", mustMarshal(t, &registrarv1.RegisterEndpointRequest{Endpoint: heavy}))
	wantCode(t, "endpoint beyond the byte bound", err, codes.InvalidArgument,
		"endpoint: encodes to", fmt.Sprintf("more than the limit of %d for one stored endpoint", registry.DefaultMaxEndpointBytes))
	t.Logf("refused: %d-byte endpoint: %v", size, status.Convert(err).Message())

	tooMany := freeEP("oversized", "10.2.0.2")
	tooMany.Metadata = meta(1001)
	_, err = raw.call(t, "RegisterEndpoint", mustMarshal(t, &registrarv1.RegisterEndpointRequest{Endpoint: tooMany}))
	wantCode(t, "metadata beyond its limits", err, codes.InvalidArgument,
		"endpoint.metadata: 1001 entries exceed the limit of 1000 (--max-metadata-entries)")

	heavyNode := &registryv1.Node{Name: "n-heavy", Labels: meta(300)}
	_, err = raw.call(t, "AnnounceNode", mustMarshal(t, &registrarv1.AnnounceNodeRequest{Node: heavyNode}))
	wantCode(t, "node beyond the byte bound", err, codes.InvalidArgument,
		"node: encodes to", fmt.Sprintf("more than the limit of %d for one stored node record", registry.DefaultMaxNodeBytes))

	persistsPromptly(t, c, cli, flushInterval, "oversized")
	if n := countKeys(t, cli); n != 20 {
		t.Fatalf("etcd holds %d keys, want only the 20 ordinary endpoints", n)
	}
}

// Endpoints just under the byte bound, many at once, all in one flush:
// what an acknowledgement promises holds only if the flusher's
// transactions of them fit etcd's request size limit.
func TestIngressEndpointsAtTheBoundPersistInFullBatches(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	// One interval long enough for every registration to be pending when
	// the flush after the first (leading-edge) one runs, and no early
	// flush by count: the batch is as large as it gets.
	const interval = time.Second
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) {
		o.WriteBatchInterval, o.WriteBatchSize = interval, 100000
		o.MaxMetadataEntries, o.MaxMetadataBytes = 1000, 1<<20
	})
	c := dial(t, s.GRPCAddr())

	const total = 300
	var mu sync.Mutex
	largest := 0
	var wg sync.WaitGroup
	for w := 0; w < 10; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < total; i += 10 {
				e := freeEP("at-the-bound", fmt.Sprintf("10.3.%d.%d", i/250, i%250+1))
				e.Service, e.Region, e.Cluster = strings.Repeat("s", 128), "r1", "c1" // the longest key of its origin
				e.Metadata = map[string]string{}
				for j := 0; proto.Size(e) < registry.DefaultMaxEndpointBytes-400; j++ {
					k := fmt.Sprintf("key-%03d-", j)
					e.Metadata[k+strings.Repeat("k", 63-len(k))] = strings.Repeat("v", 256)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				resp, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e})
				cancel()
				if err != nil {
					t.Errorf("register %s: %v", e.Ip, err)
					return
				}
				mu.Lock()
				largest = max(largest, proto.Size(resp.Endpoint))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	waitFor(t, fmt.Sprintf("%d endpoints at the byte bound persisted within 5 flush intervals", total), 5*interval, func() bool { return countKeys(t, cli) == total })
	t.Logf("%d endpoints of up to %d bytes each persisted", total, largest)
	persistsPromptly(t, c, cli, interval, "burst")
}

func TestIngressMalformedMessagesAreInvalidArgument(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	cli := etcd.Client(t)
	s := startRegistrar(t, etcd.Endpoints(), func(o *server.Config) { o.WriteBatchInterval = flushInterval })
	raw := dialRaw(t, s.GRPCAddr())
	c := dial(t, s.GRPCAddr())
	malformed := func() float64 {
		v, _ := scrapeMetric(t, "http://"+s.HTTPAddr()+"/metrics", `registrar_requests_rejected_total{reason="malformed"}`)
		return v
	}

	// An endpoint whose service (field 1) holds bytes that are not UTF-8;
	// fields may come in any order.
	badUTF8 := mustMarshal(t, freeEP("", "10.4.0.1"))
	badUTF8 = protowire.AppendTag(badUTF8, 1, protowire.BytesType)
	badUTF8 = protowire.AppendBytes(badUTF8, []byte("w\xffb"))
	withEndpoint := func(epBytes []byte) []byte {
		b := protowire.AppendTag(nil, 1, protowire.BytesType)
		return protowire.AppendBytes(b, epBytes)
	}
	valid := mustMarshal(t, &registrarv1.RegisterEndpointRequest{Endpoint: freeEP("x", "10.4.0.1")})

	unary := []struct {
		name, method string
		req          []byte
		want         []string
	}{
		{"garbage", "RegisterEndpoint", []byte("\xff\xff\xff\xff garbage"), []string{"field 1107296255: the value at byte 0 is cut short or malformed"}},
		{"truncated varint", "RegisterEndpoint", []byte{0x10, 0x80, 0x80}, []string{"wait_persisted: the value at byte 0 is cut short or malformed (unexpected EOF)"}},
		{"truncated message", "RegisterEndpoint", valid[:len(valid)-3], []string{"endpoint: the value at byte 0 is cut short or malformed (unexpected EOF)"}},
		{"invalid UTF-8", "RegisterEndpoint", withEndpoint(badUTF8), []string{"endpoint.service is not valid UTF-8 (the string at byte"}},
		{"garbage drain", "DrainEndpoint", []byte{0x0a, 0x7f, 0x01}, []string{"service: the value at byte 0 is cut short or malformed (unexpected EOF)"}},
		{"garbage announce", "AnnounceNode", []byte{0xff}, []string{"message: byte 0 is not a valid field tag (unexpected EOF)"}},
	}
	before := malformed()
	for _, tc := range unary {
		_, err := raw.call(t, tc.method, tc.req)
		msg := tc.method + ": the request is not a valid aether.registrar.v1." + tc.method + "Request message"
		wantCode(t, tc.name, err, codes.InvalidArgument, append([]string{msg, "registrar.proto"}, tc.want...)...)
		t.Logf("%s: %s", tc.name, status.Convert(err).Message())
	}

	// Streams: a malformed WatchEndpoints request, a malformed first
	// Subscribe message, and a malformed update on a Subscribe stream that
	// started well, which ends the stream with the same status.
	start := mustMarshal(t, &registrarv1.SubscribeRequest{Request: &registrarv1.SubscribeRequest_Start{Start: &registrarv1.WatchEndpointsRequest{Services: []string{"web"}}}})
	for _, tc := range []struct {
		name, method string
		bidi         bool
		msgs         [][]byte
	}{
		{"garbage watch", "WatchEndpoints", false, [][]byte{{0xff, 0xff}}},
		{"garbage subscribe start", "Subscribe", true, [][]byte{{0x0a, 0x05, 0x01}}},
		{"garbage subscribe update", "Subscribe", true, [][]byte{start, {0x12, 0x09, 0x0a}}},
	} {
		err := raw.stream(t, tc.method, tc.bidi, tc.msgs...)
		wantCode(t, tc.name, err, codes.InvalidArgument, tc.method+": the request is not a valid aether.registrar.v1.")
	}

	want := before + float64(len(unary)+3)
	waitFor(t, fmt.Sprintf("registrar_requests_rejected_total{reason=\"malformed\"} at %v", want), 5*time.Second, func() bool { return malformed() == want })
	if n := countKeys(t, cli); n != 0 {
		t.Fatalf("malformed requests wrote %d keys", n)
	}
	persistsPromptly(t, c, cli, flushInterval, "malformed")
}
