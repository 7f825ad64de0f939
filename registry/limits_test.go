package registry

import (
	"fmt"
	"github.com/aethermesh/aether/internal/testutil/prototest"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// unknownField is field 999, length-delimited, holding n bytes: a field
// of a newer API version, as its client would send it.
func unknownField(n int) []byte {
	b := protowire.AppendTag(nil, 999, protowire.BytesType)
	return protowire.AppendBytes(b, []byte(strings.Repeat("u", n)))
}

func withUnknown(m proto.Message, n int) {
	r := m.ProtoReflect()
	r.SetUnknown(append(r.GetUnknown(), unknownField(n)...))
}

func TestNormalizeEndpointDropsUnknownFields(t *testing.T) {
	in := validEndpoint()
	in.Ports = []*registryv1.Port{{Name: "a", Port: 1}, {Name: "b", Port: 2}}
	in.Metadata = map[string]string{"k": "v"}
	in.Stamp = &registryv1.WriteStamp{Hlc: 1, Writer: "w"}
	withUnknown(in, 1<<20) // as large as the limits on known fields are small
	withUnknown(in.Ports[0], 10)
	withUnknown(in.Ports[1], 10)
	withUnknown(in.Stamp, 10)
	before := proto.Clone(in)

	ep, err := NormalizeEndpoint(in, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if n := prototest.UnknownBytes(t, ep); n != 0 {
		t.Fatalf("normalized endpoint carries %d bytes of unknown fields", n)
	}
	val, err := EncodeEndpoint(ep)
	if err != nil {
		t.Fatal(err)
	}
	if len(val) > 200 {
		t.Fatalf("stored value is %d bytes; the unknown field was kept", len(val))
	}
	if !proto.Equal(in, before) {
		t.Fatal("NormalizeEndpoint modified its input")
	}
	if len(ep.Ports) != 2 || ep.Ports[0].Port != 1 || ep.Metadata["k"] != "v" {
		t.Fatalf("known fields lost with the unknown ones: %v", ep)
	}
	if ep.Stamp != nil {
		t.Fatalf("the caller's stamp %v was kept; the registrar owns it", ep.Stamp)
	}
}

func TestNormalizeNodeDropsUnknownFields(t *testing.T) {
	in := &registryv1.Node{Name: "n1", Region: "r", Cluster: "c", Services: []string{"web"},
		Labels: map[string]string{"k": "v"}, Health: &registryv1.HealthSummary{Message: "ok"},
		AnnouncedAt: timestamppb.Now(), Stamp: &registryv1.WriteStamp{Hlc: 1}}
	withUnknown(in, 1<<20)
	withUnknown(in.Health, 10)
	withUnknown(in.Stamp, 10)

	n, err := NormalizeNode(in, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if b := prototest.UnknownBytes(t, n); b != 0 {
		t.Fatalf("normalized node carries %d bytes of unknown fields", b)
	}
	if prototest.UnknownBytes(t, in) == 0 {
		t.Fatal("NormalizeNode modified its input")
	}
	if n.Health.GetMessage() != "ok" || n.Labels["k"] != "v" {
		t.Fatalf("known fields lost with the unknown ones: %v", n)
	}
	if n.Stamp != nil || n.AnnouncedAt != nil {
		t.Fatalf("the caller's stamp %v or announced_at %v was kept; the registrar owns them", n.Stamp, n.AnnouncedAt)
	}
}

// The registry's own messages have no map of messages; a well-known type
// that does covers that branch of the walk, and repeated messages in it.
func TestDiscardUnknownReachesMapValuesAndLists(t *testing.T) {
	list := structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("x")}})
	s := &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStringValue("v"), "l": list}}
	withUnknown(s, 5)
	withUnknown(s.Fields["a"], 5)
	withUnknown(s.Fields["l"].GetListValue(), 5)
	withUnknown(s.Fields["l"].GetListValue().Values[0], 5)
	if prototest.UnknownBytes(t, s) == 0 {
		t.Fatal("test setup: no unknown fields")
	}
	DiscardUnknown(s)
	if n := prototest.UnknownBytes(t, s); n != 0 {
		t.Fatalf("%d bytes of unknown fields left", n)
	}
	if s.Fields["a"].GetStringValue() != "v" || s.Fields["l"].GetListValue().Values[0].GetStringValue() != "x" {
		t.Fatalf("known fields lost: %v", s)
	}
	DiscardUnknown(nil) // no message, nothing to do
}

func name(c byte, i int) string {
	s := fmt.Sprintf("%c%d", c, i)
	return s + strings.Repeat("x", MaxNameLen-len(s))
}

// maximalEndpoint is the largest endpoint lim's other limits admit.
func maximalEndpoint(lim Limits) *registryv1.ServiceEndpoint {
	ep := &registryv1.ServiceEndpoint{
		Service: name('s', 0), Region: name('r', 0), Cluster: name('c', 0), Node: name('n', 0), Zone: name('z', 0),
		Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "1111:2222:3333:4444:5555:6666:7777:8888",
		State: registryv1.State_STATE_DRAINING, Weight: lim.MaxWeight, Metadata: maximalMetadata(lim),
	}
	for i := 0; i < lim.MaxPorts; i++ {
		ep.Ports = append(ep.Ports, &registryv1.Port{Name: name('p', i), Port: uint32(65535 - i)})
	}
	return ep
}

// maximalMetadata spends lim's metadata bytes evenly over its entries, keys
// as long as allowed, which maximizes the per-entry overhead too.
func maximalMetadata(lim Limits) map[string]string {
	md := map[string]string{}
	per := lim.MaxMetadataBytes / lim.MaxMetadataEntries
	for i := 0; i < lim.MaxMetadataEntries; i++ {
		k := fmt.Sprintf("k%d", i)
		k += strings.Repeat("k", min(lim.MaxMetadataKeyLen, per-1)-len(k))
		md[k] = strings.Repeat("v", min(lim.MaxMetadataValueLen, per-len(k)))
	}
	return md
}

func maximalNode(lim Limits) *registryv1.Node {
	n := &registryv1.Node{
		Name: name('n', 0), Region: name('r', 0), Cluster: name('c', 0), Zone: name('z', 0),
		Address: "1111:2222:3333:4444:5555:6666:7777:8888", Labels: maximalMetadata(lim),
		Health: &registryv1.HealthSummary{Status: registryv1.Health_HEALTH_DEGRADED, Message: strings.Repeat("m", lim.MaxMetadataValueLen),
			EndpointsServing: ^uint32(0), EndpointsTotal: ^uint32(0), EndpointsHeld: ^uint32(0), EndpointsHeldServing: ^uint32(0)},
	}
	for i := 0; i < MaxNodeServices; i++ {
		n.Services = append(n.Services, name('s', i))
	}
	return n
}

// The byte bounds refuse nothing the other default limits allow: they are
// a backstop for values the parts' limits do not cover (and for limits an
// operator raised), not a tighter rule hidden behind them.
func TestDefaultByteBoundsAdmitEveryDefaultMaximalValue(t *testing.T) {
	ep, err := NormalizeEndpoint(maximalEndpoint(DefaultLimits), DefaultLimits)
	if err != nil {
		t.Fatalf("the largest endpoint the default limits admit is refused: %v", err)
	}
	if n := proto.Size(ep); n > DefaultMaxEndpointBytes || n < DefaultMaxEndpointBytes/4 {
		t.Fatalf("maximal endpoint encodes to %d bytes; the bound is %d (is the builder maximal?)", n, DefaultMaxEndpointBytes)
	} else {
		t.Logf("maximal endpoint under the default limits: %d bytes (bound %d)", n, DefaultMaxEndpointBytes)
	}
	n, err := NormalizeNode(maximalNode(DefaultLimits), DefaultLimits)
	if err != nil {
		t.Fatalf("the largest node record the default limits admit is refused: %v", err)
	}
	if size := proto.Size(n); size > DefaultMaxNodeBytes || size < DefaultMaxNodeBytes/4 {
		t.Fatalf("maximal node encodes to %d bytes; the bound is %d (is the builder maximal?)", size, DefaultMaxNodeBytes)
	} else {
		t.Logf("maximal node under the default limits: %d bytes (bound %d)", size, DefaultMaxNodeBytes)
	}
}

// Exactly at the bound is accepted, one byte over is refused, naming the
// size and the limit.
func TestByteBoundIsExact(t *testing.T) {
	lim := DefaultLimits
	ep, err := NormalizeEndpoint(maximalEndpoint(lim), lim)
	if err != nil {
		t.Fatal(err)
	}
	size := proto.Size(ep)
	lim.MaxEndpointBytes = size
	if _, err := NormalizeEndpoint(maximalEndpoint(lim), lim); err != nil {
		t.Fatalf("an endpoint of exactly the limit is refused: %v", err)
	}
	lim.MaxEndpointBytes = size - 1
	_, err = NormalizeEndpoint(maximalEndpoint(lim), lim)
	wantFieldError(t, err, "endpoint", fmt.Sprintf("encodes to %d bytes, more than the limit of %d for one stored endpoint", size, size-1))

	lim = DefaultLimits
	n, err := NormalizeNode(maximalNode(lim), lim)
	if err != nil {
		t.Fatal(err)
	}
	size = proto.Size(n)
	lim.MaxNodeBytes = size
	if _, err := NormalizeNode(maximalNode(lim), lim); err != nil {
		t.Fatalf("a node record of exactly the limit is refused: %v", err)
	}
	lim.MaxNodeBytes = size - 1
	_, err = NormalizeNode(maximalNode(lim), lim)
	wantFieldError(t, err, "node", fmt.Sprintf("encodes to %d bytes, more than the limit of %d for one stored node record", size, size-1))
}

// Limits an operator raised (metadata) do not raise the byte bound: the
// bound comes from what one backend transaction carries, not from them.
func TestByteBoundHoldsWhenOtherLimitsAreRaised(t *testing.T) {
	lim := DefaultLimits
	lim.MaxMetadataEntries, lim.MaxMetadataBytes = 1000, 1<<20
	_, err := NormalizeEndpoint(maximalEndpoint(lim), lim)
	wantFieldError(t, err, "endpoint", fmt.Sprintf("more than the limit of %d for one stored endpoint", DefaultMaxEndpointBytes))
	_, err = NormalizeNode(maximalNode(lim), lim)
	wantFieldError(t, err, "node", fmt.Sprintf("more than the limit of %d for one stored node record", DefaultMaxNodeBytes))

	// Zero is the default bound, not no bound.
	lim.MaxEndpointBytes, lim.MaxNodeBytes = 0, 0
	_, err = NormalizeEndpoint(maximalEndpoint(lim), lim)
	wantFieldError(t, err, "endpoint", fmt.Sprintf("the limit of %d", DefaultMaxEndpointBytes))
	_, err = NormalizeNode(maximalNode(lim), lim)
	wantFieldError(t, err, "node", fmt.Sprintf("the limit of %d", DefaultMaxNodeBytes))
}

func wantFieldError(t *testing.T, err error, field, reason string) {
	t.Helper()
	fe, ok := err.(*FieldError)
	if !ok {
		t.Fatalf("err = %v, want a *FieldError for %s", err, field)
	}
	if fe.Field != field || !strings.Contains(fe.Reason, reason) {
		t.Fatalf("err = %q (field %q), want field %q containing %q", fe.Error(), fe.Field, field, reason)
	}
}
