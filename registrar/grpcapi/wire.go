package grpcapi

import (
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

// One event goes to every stream watching its service: thousands of
// streams for a popular one. The event is immutable once published, so its
// wire encoding is computed once and the same bytes go to every stream,
// instead of each stream's Send marshaling it again.
//
// The streams send an encodedEvent with SendMsg; the server's codec (wireCodec)
// passes its bytes through and marshals everything else as the standard
// proto codec does. A client decodes it as the EndpointEvent it is.

// encodedEvent is an EndpointEvent already in its wire form.
type encodedEvent []byte

// wireCodec is the standard proto codec, except that an encodedEvent is
// sent as it is, and that requests are decoded as ingress.go describes:
// unknown fields dropped, and a decode error into a decodeTarget kept in
// it for decodeRequest to report.
type wireCodec struct{ encoding.CodecV2 }

func (c wireCodec) Unmarshal(data mem.BufferSlice, v any) error {
	var m proto.Message
	switch v := v.(type) {
	case *decodeTarget:
		m = v.Message
	case proto.Message:
		m = v
	default:
		return c.CodecV2.Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	// Fields this build does not know are dropped: kept, they would be
	// stored and echoed with no limit covering them (see
	// registry.DiscardUnknown).
	err := proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
	if t, ok := v.(*decodeTarget); ok {
		if err != nil {
			t.err = describeDecodeError(b, m.ProtoReflect().Descriptor(), err)
		}
		return nil
	}
	return err
}

func (c wireCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(encodedEvent); ok {
		// SliceBuffer's Free is a no-op: the bytes are shared by every
		// stream, and gRPC may not recycle them.
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.CodecV2.Marshal(v)
}

// ServerCodec installs the service's codec on a gRPC server: the standard
// proto codec, except that requests decode as ingress.go describes (a
// malformed one is INVALID_ARGUMENT, not INTERNAL) and that events shared
// among streams (Config.SharedEncoding) are sent as already encoded.
func ServerCodec() grpc.ServerOption {
	return grpc.ForceServerCodecV2(wireCodec{encoding.GetCodecV2(grpcproto.Name)})
}

// wireCacheSize bounds the events whose encoding is kept: a published
// event reaches all of its streams within moments, so recent ones are all
// that is asked for. An event that dropped out is simply encoded again.
const wireCacheSize = 4096

// wireCache holds the encodings of recent events, by event. Two
// generations: an event found in the older one moves to the newer one;
// when the newer one is full the older one is dropped.
type wireCache struct {
	mu        sync.Mutex
	cur, prev map[*registrarv1.EndpointEvent]encodedEvent
}

func newWireCache() *wireCache {
	return &wireCache{cur: map[*registrarv1.EndpointEvent]encodedEvent{}}
}

// encode returns ev's wire form.
func (c *wireCache) encode(ev *registrarv1.EndpointEvent) (encodedEvent, error) {
	c.mu.Lock()
	b, ok := c.cur[ev]
	if !ok {
		if b, ok = c.prev[ev]; ok {
			c.put(ev, b)
		}
	}
	c.mu.Unlock()
	if ok {
		return b, nil
	}
	// Outside the lock: two streams may both encode a new event, which
	// is harmless (same bytes), and no stream waits on another's marshal.
	raw, err := proto.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode event %d: %w", ev.GetSequence(), err)
	}
	c.mu.Lock()
	c.put(ev, raw)
	c.mu.Unlock()
	return raw, nil
}

func (c *wireCache) put(ev *registrarv1.EndpointEvent, b encodedEvent) {
	if len(c.cur) >= wireCacheSize {
		c.prev, c.cur = c.cur, make(map[*registrarv1.EndpointEvent]encodedEvent, wireCacheSize)
	}
	c.cur[ev] = b
}
