package registry

import (
	"fmt"
	"strings"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// protocolSegments are the key segments of each protocol. They are part of
// the v1 schema: changing one re-keys every endpoint.
var protocolSegments = map[registryv1.Protocol]string{
	registryv1.Protocol_PROTOCOL_HTTP1: "http1",
	registryv1.Protocol_PROTOCOL_HTTP2: "http2",
	registryv1.Protocol_PROTOCOL_GRPC:  "grpc",
	registryv1.Protocol_PROTOCOL_TCP:   "tcp",
}

// ProtocolSegment is the protocol's key segment, or an error for
// PROTOCOL_UNSPECIFIED and values this build does not know.
func ProtocolSegment(p registryv1.Protocol) (string, error) {
	if s, ok := protocolSegments[p]; ok {
		return s, nil
	}
	if p == registryv1.Protocol_PROTOCOL_UNSPECIFIED {
		return "", fmt.Errorf("protocol must be set (one of %s)", ProtocolNames)
	}
	return "", fmt.Errorf("unknown protocol %d (known: %s)", int32(p), ProtocolNames)
}

// ProtocolNames lists the names ParseProtocol accepts, for error messages.
const ProtocolNames = "http, h2c, grpc, tcp"

// ParseProtocol maps a user-facing protocol name to the enum. It accepts the
// CLI names (http, h2c, grpc, tcp), the key segments and the enum names.
func ParseProtocol(s string) (registryv1.Protocol, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "http", "http1", "http/1.1", "protocol_http1":
		return registryv1.Protocol_PROTOCOL_HTTP1, nil
	case "h2c", "http2", "h2", "protocol_http2":
		return registryv1.Protocol_PROTOCOL_HTTP2, nil
	case "grpc", "protocol_grpc":
		return registryv1.Protocol_PROTOCOL_GRPC, nil
	case "tcp", "protocol_tcp":
		return registryv1.Protocol_PROTOCOL_TCP, nil
	}
	return 0, fmt.Errorf("unknown protocol %q (use one of %s)", s, ProtocolNames)
}

// ProtocolName is the short user-facing name of a protocol.
func ProtocolName(p registryv1.Protocol) string {
	switch p {
	case registryv1.Protocol_PROTOCOL_HTTP1:
		return "http"
	case registryv1.Protocol_PROTOCOL_HTTP2:
		return "h2c"
	case registryv1.Protocol_PROTOCOL_GRPC:
		return "grpc"
	case registryv1.Protocol_PROTOCOL_TCP:
		return "tcp"
	}
	return fmt.Sprintf("protocol(%d)", int32(p))
}

func protocolFromSegment(seg string) (registryv1.Protocol, bool) {
	for p, s := range protocolSegments {
		if s == seg {
			return p, true
		}
	}
	return 0, false
}
