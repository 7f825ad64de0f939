package grpcapi_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registrar/grpcapi"
)

// rawCodec sends and receives messages as the bytes they are, so a test
// speaks the wire format by field number, as a client built from another
// copy of the .proto would, and not through this build's generated code.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// rawServer is a registrar over the model store, its API served as the
// process serves it (grpcapi.Register on a server with ServerCodec), and
// a connection to it that sends raw bytes.
func rawServer(t *testing.T) *grpc.ClientConn {
	t.Helper()
	r := startedRegistrar(t)
	srv := grpc.NewServer(grpcapi.ServerCodec())
	api, err := grpcapi.Register(srv, r, grpcapi.Config{Logger: quietLog(), SharedEncoding: true})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served; api.Wait() })
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func call(t *testing.T, cc *grpc.ClientConn, method string, req []byte) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var resp []byte
	err := cc.Invoke(ctx, "/aether.registrar.v1.Registrar/"+method, &req, &resp)
	return resp, err
}

// msg builds a message from fields given by number: a string, a varint
// (int) or a nested message ([]byte).
func msg(fields ...any) []byte {
	var b []byte
	for i := 0; i < len(fields); i += 2 {
		num := protowire.Number(fields[i].(int))
		switch v := fields[i+1].(type) {
		case string:
			b = protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v)
		case []byte:
			b = protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
		case int:
			b = protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), uint64(v))
		}
	}
	return b
}

// fields reads a message's top-level fields by number: strings and
// messages as their bytes, varints as uint64; the last occurrence wins.
func fields(t *testing.T, b []byte) map[protowire.Number]any {
	t.Helper()
	out := map[protowire.Number]any{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			t.Fatalf("bad tag: %v", protowire.ParseError(n))
		}
		b = b[n:]
		switch typ {
		case protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			out[num], b = string(v), b[m:]
		case protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			out[num], b = v, b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			b = b[m:]
		}
	}
	return out
}

// position checks that a response carries epoch and sequence (at the
// given field numbers) and that they are its version token's.
func position(t *testing.T, what string, f map[protowire.Number]any, version, epoch, seq protowire.Number) (string, uint64) {
	t.Helper()
	v, _ := f[version].(string)
	e, _ := f[epoch].(string)
	s, _ := f[seq].(uint64)
	if e == "" || s == 0 || v != fmt.Sprintf("%s:%d", e, s) {
		t.Fatalf("%s: version %q, epoch %q, sequence %d; want the epoch and sequence of the version", what, v, e, s)
	}
	return e, s
}

const http1 = int(registryv1.Protocol_PROTOCOL_HTTP1)

// Write responses carry the position of their version as fields, and
// unregister and drain name their endpoint by reference, by the flat
// fields, or by both when they agree; both disagreeing is refused.
func TestWireWritePositionsAndEndpointRef(t *testing.T) {
	cc := rawServer(t)
	register := func(ip string) (string, uint64) {
		ep := msg(1, "web", 2, http1, 3, ip, 4, msg(1, "http", 2, 80)) // service, protocol, ip, ports
		resp, err := call(t, cc, "RegisterEndpoint", msg(1, ep))
		if err != nil {
			t.Fatalf("register %s: %v", ip, err)
		}
		return position(t, "RegisterEndpointResponse", fields(t, resp), 2, 4, 5)
	}
	epoch, s1 := register("10.0.0.1")
	if _, s2 := register("10.0.0.2"); s2 != s1+1 {
		t.Fatalf("sequences %d then %d, want consecutive", s1, s2)
	}
	register("fd00::1")

	// Drain by reference alone (DrainEndpointRequest.endpoint = 7).
	resp, err := call(t, cc, "DrainEndpoint", msg(7, msg(1, "web", 2, http1, 3, "10.0.0.1")))
	if err != nil {
		t.Fatalf("drain by reference: %v", err)
	}
	f := fields(t, resp)
	if e, _ := position(t, "DrainEndpointResponse", f, 2, 4, 5); e != epoch {
		t.Fatalf("drain's epoch %q, want the registrar's %q", e, epoch)
	}
	var drained registryv1.ServiceEndpoint
	if err := proto.Unmarshal([]byte(f[1].(string)), &drained); err != nil || drained.GetIp() != "10.0.0.1" || drained.GetState() != registryv1.State_STATE_DRAINING {
		t.Fatalf("drained %v (%v), want 10.0.0.1 draining", &drained, err)
	}

	// Both, agreeing: the flat fields name the same endpoint, the address
	// in another spelling of the same canonical form.
	if _, err := call(t, cc, "DrainEndpoint", msg(1, "web", 2, http1, 3, "fd00:0::1", 7, msg(1, "web", 3, "fd00::1"))); err != nil {
		t.Fatalf("drain by reference and agreeing flat fields: %v", err)
	}

	// Both, disagreeing: refused, naming the field, and nothing changes.
	for _, tc := range []struct {
		method string
		req    []byte
		field  string
	}{
		{"UnregisterEndpoint", msg(1, "db", 2, http1, 3, "10.0.0.2", 8, msg(1, "web", 2, http1, 3, "10.0.0.2")), "endpoint.service"},
		{"UnregisterEndpoint", msg(3, "10.0.0.1", 8, msg(1, "web", 2, http1, 3, "10.0.0.2")), "endpoint.ip"},
		{"DrainEndpoint", msg(2, int(registryv1.Protocol_PROTOCOL_GRPC), 7, msg(1, "web", 2, http1, 3, "10.0.0.2")), "endpoint.protocol"},
		{"DrainEndpoint", msg(4, "c9", 7, msg(1, "web", 2, http1, 3, "10.0.0.2", 4, "c1")), "endpoint.cluster"},
	} {
		_, err := call(t, cc, tc.method, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.field) || !strings.Contains(err.Error(), "two endpoints") {
			t.Errorf("%s naming two endpoints (%s): %v; want INVALID_ARGUMENT naming %s", tc.method, tc.field, err, tc.field)
		}
	}
	list, err := call(t, cc, "ListAllEndpoints", nil)
	if err != nil {
		t.Fatal(err)
	}
	var all registrarv1.ListAllEndpointsResponse
	if err := proto.Unmarshal(list, &all); err != nil || len(all.GetEndpoints()) != 3 {
		t.Fatalf("after the refusals %d endpoints (%v), want all 3", len(all.GetEndpoints()), err)
	}

	// Unregister by the flat fields alone, as older clients do, and by
	// reference alone (UnregisterEndpointRequest.endpoint = 8); the
	// response's epoch and sequence are fields 3 and 4.
	resp, err = call(t, cc, "UnregisterEndpoint", msg(1, "web", 2, http1, 3, "10.0.0.2"))
	if err != nil {
		t.Fatalf("unregister by flat fields: %v", err)
	}
	position(t, "UnregisterEndpointResponse", fields(t, resp), 1, 3, 4)
	resp, err = call(t, cc, "UnregisterEndpoint", msg(8, msg(1, "web", 2, http1, 3, "10.0.0.1", 4, "c1", 5, "r1")))
	if err != nil {
		t.Fatalf("unregister by reference: %v", err)
	}
	position(t, "UnregisterEndpointResponse", fields(t, resp), 1, 3, 4)
	if _, err := call(t, cc, "UnregisterEndpoint", msg(8, msg(1, "web", 2, http1, 3, "10.0.0.1"))); status.Code(err) != codes.NotFound {
		t.Fatalf("unregister of a removed endpoint by reference: %v, want NOT_FOUND", err)
	}
}

// Snapshot chunks and bookmarks carry the epoch (EndpointEvent.epoch = 8)
// beside their version; an endpoint event's epoch is the stream's.
func TestWireEventEpochs(t *testing.T) {
	cc := rawServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	watch := func(req []byte) grpc.ClientStream {
		st, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/aether.registrar.v1.Registrar/WatchEndpoints")
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SendMsg(&req); err != nil {
			t.Fatal(err)
		}
		if err := st.CloseSend(); err != nil {
			t.Fatal(err)
		}
		return st
	}
	recv := func(st grpc.ClientStream) map[protowire.Number]any {
		var b []byte
		if err := st.RecvMsg(&b); err != nil {
			t.Fatalf("receive: %v", err)
		}
		f := fields(t, b)
		if _, ok := f[1]; !ok {
			f[1] = uint64(0) // the type's default, which proto3 does not send
		}
		return f
	}
	ep := msg(1, "web", 2, http1, 3, "10.0.0.1", 4, msg(1, "http", 2, 80))
	resp, err := call(t, cc, "RegisterEndpoint", msg(1, ep))
	if err != nil {
		t.Fatal(err)
	}
	epoch, seq := position(t, "RegisterEndpointResponse", fields(t, resp), 2, 4, 5)

	f := recv(watch(msg(4, "web"))) // services
	if f[1] != uint64(registrarv1.EndpointEvent_FULL_SNAPSHOT) || f[8] != epoch || f[3] != fmt.Sprintf("%s:%d", epoch, seq) {
		t.Fatalf("first event %v, want a FULL_SNAPSHOT at %s:%d with epoch %q", f, epoch, seq, epoch)
	}
	// Resumed: the bookmark that says the stream is current has the epoch.
	f = recv(watch(msg(3, fmt.Sprintf("%s:%d", epoch, seq), 4, "web")))
	if f[1] != uint64(registrarv1.EndpointEvent_PROGRESS) || f[8] != epoch {
		t.Fatalf("first event of a resumed stream %v, want a PROGRESS with epoch %q", f, epoch)
	}
}
