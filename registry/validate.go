package registry

import (
	"fmt"
	"sort"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// Limits bound what one endpoint may carry. They keep a single registration
// from bloating every watcher's snapshot.
type Limits struct {
	MaxPorts            int
	MaxMetadataEntries  int
	MaxMetadataKeyLen   int
	MaxMetadataValueLen int
	MaxMetadataBytes    int // keys plus values
	MaxWeight           uint32
	// MaxEndpointBytes bounds an endpoint's encoding (EncodeEndpoint) as
	// NormalizeEndpoint returns it, and MaxNodeBytes a node record's
	// (EncodeNode) as NormalizeNode returns it. They are what makes an
	// acknowledged write storable: the registrar writes a batch of
	// endpoints in one backend transaction, and a value that cannot fit
	// one would fail every flush it is part of. The other limits bound the
	// parts; these bound the whole, whatever the other limits are set to.
	// Zero or less means the default.
	MaxEndpointBytes int
	MaxNodeBytes     int
}

// DefaultLimits are the limits a registrar enforces unless configured.
var DefaultLimits = Limits{
	MaxPorts:            16,
	MaxMetadataEntries:  32,
	MaxMetadataKeyLen:   63,
	MaxMetadataValueLen: 256,
	MaxMetadataBytes:    4096,
	MaxWeight:           1 << 16,
	MaxEndpointBytes:    DefaultMaxEndpointBytes,
	MaxNodeBytes:        DefaultMaxNodeBytes,
}

// DefaultMaxEndpointBytes is above the largest endpoint the other default
// limits admit (every name at MaxNameLen, every port, all metadata), so it
// refuses nothing they allow; and small enough that a transaction of a
// full batch of them, keys and the registrar's timestamps and stamp
// included, stays under etcd's default request size limit.
// DefaultMaxNodeBytes is likewise above the largest node record the other
// default limits admit (MaxNodeServices services of MaxNameLen); a node
// record is written alone, so it only has to fit one request.
const (
	DefaultMaxEndpointBytes = 16 << 10
	DefaultMaxNodeBytes     = 64 << 10
)

func (l Limits) endpointBytes() int {
	if l.MaxEndpointBytes <= 0 {
		return DefaultMaxEndpointBytes
	}
	return l.MaxEndpointBytes
}

func (l Limits) nodeBytes() int {
	if l.MaxNodeBytes <= 0 {
		return DefaultMaxNodeBytes
	}
	return l.MaxNodeBytes
}

// FieldError is a validation failure of one request field. The registrar
// turns it into INVALID_ARGUMENT with this message.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

func fieldErr(field string, err error) *FieldError {
	return &FieldError{Field: field, Reason: err.Error()}
}

// NormalizeEndpoint validates an endpoint from a request and returns the
// canonical copy to store: canonical IP, default state SERVING, weight 1,
// a single unnamed port named after its protocol, ports sorted by name,
// no unknown fields (see DiscardUnknown), and an encoding of at most
// lim.MaxEndpointBytes. The input is not modified. Timestamps and the
// stamp are cleared; the caller owns them.
func NormalizeEndpoint(in *registryv1.ServiceEndpoint, lim Limits) (*registryv1.ServiceEndpoint, error) {
	if in == nil {
		return nil, &FieldError{Field: "endpoint", Reason: "must be set"}
	}
	ep := proto.Clone(in).(*registryv1.ServiceEndpoint)
	ep.CreatedAt, ep.UpdatedAt, ep.Stamp = nil, nil, nil
	DiscardUnknown(ep)

	id, err := checkID(IDOf(ep), "endpoint.")
	if err != nil {
		return nil, err
	}
	ep.Ip = id.IP
	if ep.Node != "" {
		if err := ValidateName("node", ep.Node); err != nil {
			return nil, fieldErr("endpoint.node", err)
		}
	}
	if ep.Zone != "" {
		if err := ValidateName("zone", ep.Zone); err != nil {
			return nil, fieldErr("endpoint.zone", err)
		}
	}
	switch ep.State {
	case registryv1.State_STATE_UNSPECIFIED:
		ep.State = registryv1.State_STATE_SERVING
	case registryv1.State_STATE_SERVING, registryv1.State_STATE_DRAINING:
	default:
		return nil, &FieldError{Field: "endpoint.state", Reason: fmt.Sprintf("unknown state %d (use SERVING or DRAINING)", int32(ep.State))}
	}
	switch {
	case ep.Weight == 0:
		ep.Weight = 1
	case ep.Weight > lim.MaxWeight:
		return nil, &FieldError{Field: "endpoint.weight", Reason: fmt.Sprintf("%d exceeds the limit of %d", ep.Weight, lim.MaxWeight)}
	}
	if err := checkPorts(ep, lim); err != nil { // ports.go
		return nil, err
	}
	if err := validateMetadata(ep.Metadata, lim); err != nil {
		return nil, err
	}
	if n, max := proto.Size(ep), lim.endpointBytes(); n > max {
		return nil, &FieldError{Field: "endpoint", Reason: fmt.Sprintf(
			"encodes to %d bytes, more than the limit of %d for one stored endpoint (every write must fit a backend transaction); carry less metadata or fewer, shorter port names", n, max)}
	}
	return ep, nil
}

// DiscardUnknown clears the unknown fields of m and of every message in it
// (nested, in repeated fields and in map values). A field this build does
// not know is kept by the protobuf decoder as raw bytes that no limit
// covers: stored, it would make a value of any size out of an endpoint
// whose known fields are small, and echo it to every watcher. It is
// dropped rather than refused because a client built against a newer API
// may set fields this registrar does not know yet, and refusing would
// break it for no gain: this registrar could not act on them anyway.
func DiscardUnknown(m proto.Message) {
	if m != nil {
		discardUnknown(m.ProtoReflect())
	}
}

func discardUnknown(m protoreflect.Message) {
	if !m.IsValid() {
		return
	}
	if len(m.GetUnknown()) > 0 {
		m.SetUnknown(nil)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList():
			if fd.Message() != nil {
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					discardUnknown(l.Get(i).Message())
				}
			}
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					discardUnknown(mv.Message())
					return true
				})
			}
		case fd.Message() != nil:
			discardUnknown(v.Message())
		}
		return true
	})
}

func normalizePorts(ep *registryv1.ServiceEndpoint, lim Limits) error {
	switch {
	case len(ep.Ports) == 0:
		return &FieldError{Field: "endpoint.ports", Reason: "at least one port is required"}
	case len(ep.Ports) > lim.MaxPorts:
		return &FieldError{Field: "endpoint.ports", Reason: fmt.Sprintf("%d ports exceed the limit of %d", len(ep.Ports), lim.MaxPorts)}
	}
	if len(ep.Ports) == 1 && ep.Ports[0].GetName() == "" {
		ep.Ports[0].Name = ProtocolName(ep.Protocol)
	}
	seen := make(map[string]bool, len(ep.Ports))
	for i, p := range ep.Ports {
		field := fmt.Sprintf("endpoint.ports[%d]", i)
		if p == nil {
			return &FieldError{Field: field, Reason: "must be set"}
		}
		if p.Port == 0 || p.Port > 65535 {
			return &FieldError{Field: field + ".port", Reason: fmt.Sprintf("%d is not a port number (1-65535)", p.Port)}
		}
		if p.Name == "" {
			return &FieldError{Field: field + ".name", Reason: "must be set when an endpoint has more than one port"}
		}
		if err := ValidateName("port name", p.Name); err != nil {
			return fieldErr(field+".name", err)
		}
		if seen[p.Name] {
			return &FieldError{Field: field + ".name", Reason: fmt.Sprintf("duplicate port name %q", p.Name)}
		}
		seen[p.Name] = true
	}
	sort.Slice(ep.Ports, func(i, j int) bool { return ep.Ports[i].Name < ep.Ports[j].Name })
	return nil
}

func validateMetadata(md map[string]string, lim Limits) error {
	if len(md) > lim.MaxMetadataEntries {
		return &FieldError{Field: "endpoint.metadata", Reason: fmt.Sprintf("%d entries exceed the limit of %d (--max-metadata-entries)", len(md), lim.MaxMetadataEntries)}
	}
	total := 0
	for k, v := range md {
		if k == "" {
			return &FieldError{Field: "endpoint.metadata", Reason: "keys must not be empty"}
		}
		if len(k) > lim.MaxMetadataKeyLen {
			return &FieldError{Field: "endpoint.metadata", Reason: fmt.Sprintf("key %.20q... is %d bytes; the limit is %d", k, len(k), lim.MaxMetadataKeyLen)}
		}
		for _, c := range k { // by rune: a multi-byte character is named as itself
			if c >= utf8.RuneSelf || !isAlnum(byte(c)) && c != '.' && c != '_' && c != '-' && c != '/' {
				return &FieldError{Field: "endpoint.metadata", Reason: fmt.Sprintf("key %q contains %q; allowed are ASCII letters and digits, '.', '_', '-' and '/'", k, string(c))}
			}
		}
		if len(v) > lim.MaxMetadataValueLen {
			return &FieldError{Field: "endpoint.metadata", Reason: fmt.Sprintf("value of %q is %d bytes; the limit is %d", k, len(v), lim.MaxMetadataValueLen)}
		}
		if !utf8.ValidString(v) {
			return &FieldError{Field: "endpoint.metadata", Reason: fmt.Sprintf("value of %q is not valid UTF-8", k)}
		}
		total += len(k) + len(v)
	}
	if total > lim.MaxMetadataBytes {
		return &FieldError{Field: "endpoint.metadata", Reason: fmt.Sprintf("%d bytes of keys and values exceed the limit of %d (--max-metadata-bytes)", total, lim.MaxMetadataBytes)}
	}
	return nil
}

// SameAttributes reports whether two stored endpoints differ in anything but
// their timestamps; a re-registration that changes nothing is not an update.
// Both must be normalized (ports sorted).
func SameAttributes(a, b *registryv1.ServiceEndpoint) bool {
	if IDOf(a) != IDOf(b) || a.Node != b.Node || a.Zone != b.Zone || a.State != b.State ||
		a.Weight != b.Weight || len(a.Ports) != len(b.Ports) || len(a.Metadata) != len(b.Metadata) {
		return false
	}
	for i := range a.Ports {
		if a.Ports[i].GetName() != b.Ports[i].GetName() || a.Ports[i].GetPort() != b.Ports[i].GetPort() {
			return false
		}
	}
	for k, v := range a.Metadata {
		if w, ok := b.Metadata[k]; !ok || w != v {
			return false
		}
	}
	return true
}
