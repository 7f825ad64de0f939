package grpcapi

import (
	"testing"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func wireEvent(seq uint64) *registrarv1.EndpointEvent {
	return &registrarv1.EndpointEvent{
		Type: registrarv1.EndpointEvent_ENDPOINT_ADDED, Sequence: seq, Version: "e:1",
		Endpoint: &registryv1.ServiceEndpoint{Service: "web", Ip: "10.0.0.1", Metadata: map[string]string{"a": "1", "b": "2"}},
	}
}

func TestWireCacheEncodesOnceAndDecodesBack(t *testing.T) {
	c := newWireCache()
	ev := wireEvent(1)
	b1, err := c.encode(ev)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := c.encode(ev)
	if &b1[0] != &b2[0] {
		t.Fatal("the same event was encoded twice: the bytes are not shared")
	}
	var back registrarv1.EndpointEvent
	if err := proto.Unmarshal(b1, &back); err != nil || !proto.Equal(&back, ev) {
		t.Fatalf("decoded %v (%v), want %v", &back, err, ev)
	}
	// A different event with equal contents is encoded on its own.
	if b3, _ := c.encode(wireEvent(1)); &b3[0] == &b1[0] {
		t.Fatal("a different event got another's bytes")
	}
	// Past two generations an event is encoded again, still correctly.
	for i := range 2*wireCacheSize + 1 {
		if _, err := c.encode(wireEvent(uint64(i + 2))); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(c.cur) + len(c.prev); n > 2*wireCacheSize {
		t.Fatalf("the cache holds %d encodings, more than two generations of %d", n, wireCacheSize)
	}
	b4, _ := c.encode(ev)
	if &b4[0] == &b1[0] {
		t.Fatal("an event two generations old was still cached")
	}
	if err := proto.Unmarshal(b4, &back); err != nil || !proto.Equal(&back, ev) {
		t.Fatalf("re-encoded %v (%v), want %v", &back, err, ev)
	}
	// Found in the older generation, it moves to the newer one.
	c.prev, c.cur = c.cur, map[*registrarv1.EndpointEvent]encodedEvent{}
	if b5, _ := c.encode(ev); &b5[0] != &b4[0] || c.cur[ev] == nil {
		t.Fatal("an event of the older generation was not kept")
	}
}

func TestWireCodecPassesEncodedEventsThrough(t *testing.T) {
	std := encoding.GetCodecV2(grpcproto.Name)
	c := wireCodec{std}
	ev := wireEvent(7)
	raw, _ := proto.Marshal(ev)
	out, err := c.Marshal(encodedEvent(raw))
	if err != nil || string(out.Materialize()) != string(raw) {
		t.Fatalf("Marshal(encodedEvent) = %x, %v; want the bytes as they are", out.Materialize(), err)
	}
	out.Free() // a no-op for shared bytes: they must stay intact
	if string(raw) != string(out.Materialize()) {
		t.Fatal("Free changed shared bytes")
	}
	// Anything else is the standard codec's.
	out, err = c.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	var back registrarv1.EndpointEvent
	if err := c.Unmarshal(out, &back); err != nil || !proto.Equal(&back, ev) {
		t.Fatalf("round trip through the codec = %v, %v", &back, err)
	}
	if _, err := c.Marshal("not a message"); err == nil {
		t.Fatal("the codec marshaled a string")
	}
	if c.Name() != grpcproto.Name {
		t.Fatalf("codec name %q, want %q (the content-subtype clients expect)", c.Name(), grpcproto.Name)
	}
}
