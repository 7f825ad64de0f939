package grpcapi

import (
	"context"
	"errors"
	"fmt"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

// Bounded ingress, at the API edge: what a request may carry into the
// registrar.
//
//   - Unknown fields are dropped. The server's codec (wireCodec) decodes
//     with DiscardUnknown, and registry.NormalizeEndpoint and NormalizeNode
//     clear them again, for callers that do not come through this server.
//     Dropped rather than refused: a client of a newer API version may set
//     fields this registrar does not know, and could not act on.
//   - A request that does not decode (garbage, a truncated varint, invalid
//     UTF-8 in a string field) is INVALID_ARGUMENT naming the method, the
//     message and what is wrong with it, and is counted as rejected
//     ("malformed"). It never reaches a handler.
//   - Sizes are bounded by gRPC's receive limit (--max-recv-msg-size) and
//     then, per stored value, by registry.Limits.
//
// gRPC reports a codec's Unmarshal error as INTERNAL, whatever the error
// is: it wraps it before any interceptor or handler sees it, for a unary
// method's request and for a stream's RecvMsg alike. So the Registrar
// service is registered with a copy of its ServiceDesc whose handlers
// decode through decodeRequest: the codec keeps the decode error in the
// decodeTarget instead of returning it, and decodeRequest turns it into
// the status it deserves.
//
// On a server without ServerCodec (RegisterGRPC) the codec is gRPC's own: the
// handlers still decode through decodeRequest, but a malformed request is
// INTERNAL as gRPC makes it, and unknown fields are dropped only by
// validation, before anything is stored.

// decodeTarget is what decodeRequest asks gRPC to decode a request into.
// It is the request message (embedded, so any proto codec decodes into it
// as into the message itself); wireCodec recognizes it and records a
// decode error in err rather than returning it.
type decodeTarget struct {
	proto.Message
	err error
}

// registerIngress registers srv as the Registrar service on s, every
// request decoded through decodeRequest; onMalformed counts a request
// refused because it did not decode.
func registerIngress(s grpc.ServiceRegistrar, srv registrarv1.RegistrarServer, onMalformed func()) {
	s.RegisterService(ingressDesc(&registrarv1.Registrar_ServiceDesc, onMalformed), srv)
}

// ingressDesc is desc with every method's and stream's decoding routed
// through decodeRequest.
func ingressDesc(desc *grpc.ServiceDesc, onMalformed func()) *grpc.ServiceDesc {
	d := *desc
	d.Methods = make([]grpc.MethodDesc, len(desc.Methods))
	for i, md := range desc.Methods {
		method, h := md.MethodName, md.Handler
		d.Methods[i] = grpc.MethodDesc{
			MethodName: method,
			Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
				return h(srv, ctx, func(v any) error { return decodeRequest(method, v, dec, onMalformed) }, ic)
			},
		}
	}
	d.Streams = make([]grpc.StreamDesc, len(desc.Streams))
	for i, sd := range desc.Streams {
		method, h := sd.StreamName, sd.Handler
		sd.Handler = func(srv any, stream grpc.ServerStream) error {
			return h(srv, &ingressStream{ServerStream: stream, method: method, onMalformed: onMalformed})
		}
		d.Streams[i] = sd
	}
	return &d
}

// ingressStream is a server stream whose received messages are decoded
// through decodeRequest.
type ingressStream struct {
	grpc.ServerStream
	method      string
	onMalformed func()
}

func (s *ingressStream) RecvMsg(m any) error {
	return decodeRequest(s.method, m, s.ServerStream.RecvMsg, s.onMalformed)
}

// decodeRequest decodes one request message into v with recv (gRPC's own
// decoding: receive limit, decompression, the server's codec). A message
// that does not decode is INVALID_ARGUMENT; every other failure of recv
// (the stream's end, the receive limit, a cancelled call) is returned as
// gRPC reported it.
func decodeRequest(method string, v any, recv func(any) error, onMalformed func()) error {
	m, ok := v.(proto.Message)
	if !ok {
		return recv(v)
	}
	t := &decodeTarget{Message: m}
	if err := recv(t); err != nil {
		return err
	}
	if t.err != nil {
		onMalformed()
		return status.Errorf(codes.InvalidArgument,
			"%s: the request is not a valid %s message: %v; send it encoded by a protobuf library from the registrar's API definition (api/registrar/v1/registrar.proto)",
			method, m.ProtoReflect().Descriptor().FullName(), t.err)
	}
	return nil
}

// describeDecodeError says where b stops being a valid message of md: the
// field's path and what is wrong with it, which is what the sender needs
// to find the bug in its encoder; the protobuf library's error names
// neither. err, the library's, is kept when no single field is to blame.
func describeDecodeError(b []byte, md protoreflect.MessageDescriptor, err error) error {
	if where := diagnose(b, md, "", 0, 0); where != "" {
		return errors.New(where)
	}
	return err
}

// maxDiagnoseDepth bounds the nesting diagnose follows: the registrar's
// messages nest a few levels deep, and a sender's bytes must not be able
// to make it recurse without end.
const maxDiagnoseDepth = 32

// diagnose walks b, a message of md at byte off of the request, and
// describes the first thing in it that does not decode ("" if nothing
// does). It follows the known length-delimited fields: strings must be
// UTF-8, messages (map entries included) are walked in turn.
func diagnose(b []byte, md protoreflect.MessageDescriptor, path string, off, depth int) string {
	if depth > maxDiagnoseDepth {
		return ""
	}
	for pos := 0; pos < len(b); {
		num, typ, n := protowire.ConsumeTag(b[pos:])
		if n < 0 {
			where := fmt.Sprintf("byte %d is not a valid field tag (%v)", off+pos, protowire.ParseError(n))
			if path != "" {
				where = path + ": " + where
			}
			return where
		}
		fd := md.Fields().ByNumber(num)
		name := fmt.Sprintf("field %d", num)
		if fd != nil {
			name = string(fd.Name())
		}
		if path != "" {
			name = path + "." + name
		}
		m := protowire.ConsumeFieldValue(num, typ, b[pos+n:])
		if m < 0 {
			return fmt.Sprintf("%s: the value at byte %d is cut short or malformed (%v)", name, off+pos, protowire.ParseError(m))
		}
		if fd != nil && typ == protowire.BytesType {
			v, vn := protowire.ConsumeBytes(b[pos+n:])
			at := off + pos + n + vn - len(v)
			switch {
			case fd.Kind() == protoreflect.StringKind && !utf8.Valid(v):
				return fmt.Sprintf("%s is not valid UTF-8 (the string at byte %d)", name, at)
			case fd.Message() != nil:
				if where := diagnose(v, fd.Message(), name, at, depth+1); where != "" {
					return where
				}
			}
		}
		pos += n + m
	}
	return ""
}
