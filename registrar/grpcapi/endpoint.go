package grpcapi

import (
	"fmt"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// namedEndpoint is the endpoint an unregister or drain request names. A
// request names it by its reference (the endpoint field, an EndpointRef),
// by the flat identity fields that older clients send, or by both, as a
// client does that also talks to older registrars. Each part of the
// identity is taken from the reference when set there, else from the flat
// field; a part set in both that disagrees would name two endpoints, and is
// refused (*registry.FieldError, so INVALID_ARGUMENT) rather than resolved
// by a precedence the client may not expect. Normalization (the origin
// defaults, the canonical IP) is the replica's, as for the flat fields.
func namedEndpoint(ref *registryv1.EndpointRef, region, cluster, service string, protocol registryv1.Protocol, ip string) (registry.EndpointID, error) {
	flat := registry.EndpointID{Region: region, Cluster: cluster, Service: service, Protocol: protocol, IP: ip}
	if ref == nil {
		return flat, nil
	}
	id := registry.IDOfRef(ref)
	pick := func(field string, fromRef, fromFlat *string, same func(a, b string) bool) error {
		switch {
		case *fromFlat == "":
		case *fromRef == "":
			*fromRef = *fromFlat
		case !same(*fromRef, *fromFlat):
			return disagree(field, *fromRef, *fromFlat)
		}
		return nil
	}
	equal := func(a, b string) bool { return a == b }
	for _, f := range []struct {
		name      string
		ref, flat *string
		same      func(a, b string) bool
	}{
		{"service", &id.Service, &flat.Service, equal},
		{"ip", &id.IP, &flat.IP, sameIP},
		{"cluster", &id.Cluster, &flat.Cluster, equal},
		{"region", &id.Region, &flat.Region, equal},
	} {
		if err := pick(f.name, f.ref, f.flat, f.same); err != nil {
			return registry.EndpointID{}, err
		}
	}
	switch {
	case flat.Protocol == registryv1.Protocol_PROTOCOL_UNSPECIFIED:
	case id.Protocol == registryv1.Protocol_PROTOCOL_UNSPECIFIED:
		id.Protocol = flat.Protocol
	case id.Protocol != flat.Protocol:
		return registry.EndpointID{}, disagree("protocol", id.Protocol.String(), flat.Protocol.String())
	}
	return id, nil
}

// sameIP compares addresses as the replica keys them, in canonical form
// (registry.CanonicalIP): "fd00::1" and "fd00:0::1" are one endpoint. Text
// that is no valid address is compared as it is; the replica refuses it
// afterwards, with its reason.
func sameIP(a, b string) bool {
	ca, errA := registry.CanonicalIP(a)
	cb, errB := registry.CanonicalIP(b)
	if errA != nil || errB != nil {
		return a == b
	}
	return ca == cb
}

func disagree(field, fromRef, fromFlat string) error {
	return &registry.FieldError{Field: "endpoint." + field, Reason: fmt.Sprintf(
		"%q disagrees with the flat field %s %q, so the request names two endpoints; send the same endpoint in both, or only endpoint",
		fromRef, field, fromFlat)}
}

// positionOf reads the position out of a version token the replica has
// just returned for a write, for the response's epoch and sequence fields.
// The token is the replica's own and always parses; the parse is the one
// parser of tokens rather than a second way of taking a token apart.
func positionOf(v string) registry.Position {
	p, _ := registry.ParsePosition(v)
	return p
}
