package registry

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// EncodeEndpoint serializes an endpoint for storage. Deterministic, so equal
// endpoints always produce equal values and a value comparison is meaningful.
func EncodeEndpoint(ep *registryv1.ServiceEndpoint) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(ep)
}

// DecodeEndpoint parses a stored value and checks that it is the endpoint its
// key names. A value that disagrees with its key is corrupt, or was written
// by something that bypassed the registrar; either way it is not trusted.
func DecodeEndpoint(key string, value []byte) (*registryv1.ServiceEndpoint, error) {
	id, err := ParseEndpointKey(key)
	if err != nil {
		return nil, err
	}
	ep := &registryv1.ServiceEndpoint{}
	if err := proto.Unmarshal(value, ep); err != nil {
		return nil, fmt.Errorf("value at %q: %w", key, err)
	}
	if got := IDOf(ep); got != id {
		return nil, fmt.Errorf("value at %q names a different endpoint (%s)", key, got)
	}
	return ep, nil
}
