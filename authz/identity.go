// Package authz decides who may do what on a registrar. It is pure: it reads
// no files and opens no connections.
//
// Identity comes from the client certificate's URI SAN, a SPIFFE ID:
//
//	spiffe://<trust-domain>/node/<node-name>      a node (its agent)
//	<operator-prefix><name>                       an operator; the default
//	                                              prefix is spiffe://<trust-domain>/operator/
//	spiffe://<trust-domain>/server/<host>         a registrar (server certificate)
//
// ParseIdentity turns a verified leaf certificate into an Identity,
// FromContext does the same for the peer of a gRPC call, and Policy decides
// whether an Identity may perform a write. Every refusal is an *Error that
// carries its gRPC code (UNAUTHENTICATED or PERMISSION_DENIED), a stable rule
// name for metrics, and a message naming the identity and the rule.
package authz

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"strings"

	"github.com/aethermesh/aether/registry"
)

// Kind is what an identity is.
type Kind int

const (
	// Unknown is the zero Kind: no identity. ParseIdentity never returns it
	// with a nil error.
	Unknown Kind = iota
	// Node is an agent's identity, spiffe://<trust-domain>/node/<name>. It
	// may write only its own node record and its own node's endpoints.
	Node
	// Operator is a person's or tool's identity under the operator prefix.
	// It may do everything.
	Operator
	// Server is a registrar's own identity, spiffe://<trust-domain>/server/<host>
	// (server certificates also allow client auth so registrars can talk to
	// etcd and to each other). It may read but not write.
	Server
)

// String returns "node", "operator", "server" or "unknown".
func (k Kind) String() string {
	switch k {
	case Node:
		return "node"
	case Operator:
		return "operator"
	case Server:
		return "server"
	default:
		return "unknown"
	}
}

// Identity is an authenticated caller.
type Identity struct {
	Kind Kind
	// Name is the node name, the operator name (what follows the operator
	// prefix) or the server host.
	Name string
	// URI is the SPIFFE ID the identity was read from.
	URI string
}

// String names the identity for messages and logs: node "node-a"
// (spiffe://example.org/node/node-a).
func (id Identity) String() string {
	if id.Kind == Unknown {
		return "unauthenticated caller"
	}
	return fmt.Sprintf("%s %q (%s)", id.Kind, id.Name, id.URI)
}

// Path segments of the SPIFFE IDs this package issues and recognises.
const (
	nodePath     = "/node/"
	operatorPath = "/operator/"
	serverPath   = "/server/"
)

// ValidateTrustDomain checks a trust domain: 1..255 characters of lowercase
// letters, digits, '.', '-' and '_', as the SPIFFE specification allows
// (example.org, mesh.internal, prod_eu).
func ValidateTrustDomain(td string) error {
	if td == "" {
		return fmt.Errorf("trust domain must not be empty (e.g. example.org)")
	}
	if len(td) > 255 {
		return fmt.Errorf("trust domain is %d bytes long; the limit is 255", len(td))
	}
	for i := 0; i < len(td); i++ {
		c := td[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_' {
			continue
		}
		if c >= 'A' && c <= 'Z' {
			return fmt.Errorf("trust domain %q must be lowercase", td)
		}
		return fmt.Errorf("trust domain %q contains %q; allowed are lowercase letters, digits, '.', '-' and '_'", td, string(rune(c)))
	}
	return nil
}

// NodeID is the SPIFFE ID of a node: spiffe://<td>/node/<node>.
func NodeID(td, node string) string { return "spiffe://" + td + nodePath + node }

// ServerID is the SPIFFE ID of a registrar: spiffe://<td>/server/<host>.
func ServerID(td, host string) string { return "spiffe://" + td + serverPath + host }

// DefaultOperatorPrefix is the operator prefix when none is configured:
// spiffe://<td>/operator/.
func DefaultOperatorPrefix(td string) string { return "spiffe://" + td + operatorPath }

// OperatorID is the SPIFFE ID of operator name under the default prefix.
func OperatorID(td, name string) string { return DefaultOperatorPrefix(td) + name }

// NormalizeOperatorPrefix checks a configured operator prefix and returns
// the one in effect: "" means DefaultOperatorPrefix(td), and a missing
// trailing '/' is added (so "spiffe://td/ops" does not also match
// "spiffe://td/opsx/..."). The prefix must be a path inside the trust
// domain, and must not contain the node or server IDs, so that no node or
// registrar is ever taken for an operator.
func NormalizeOperatorPrefix(td, prefix string) (string, error) {
	if err := ValidateTrustDomain(td); err != nil {
		return "", err
	}
	if prefix == "" {
		return DefaultOperatorPrefix(td), nil
	}
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	root := "spiffe://" + td + "/"
	if !strings.HasPrefix(prefix, root) {
		return "", fmt.Errorf("operator prefix %q is not inside trust domain %q: it must start with %s (the default is %s)", prefix, td, root, DefaultOperatorPrefix(td))
	}
	path := strings.TrimPrefix(prefix, "spiffe://"+td)
	if path == "/" || strings.HasPrefix(path, nodePath) || strings.HasPrefix(path, serverPath) {
		return "", fmt.Errorf("operator prefix %q would make nodes or registrars operators; use a path of its own, such as %s", prefix, DefaultOperatorPrefix(td))
	}
	for _, seg := range strings.Split(strings.Trim(path, "/"), "/") {
		if err := validateSegment(seg); err != nil {
			return "", fmt.Errorf("operator prefix %q: %v", prefix, err)
		}
	}
	return prefix, nil
}

// validateSegment checks one path segment of a SPIFFE ID: letters, digits,
// '.', '-' and '_', and not "." or "..".
func validateSegment(seg string) error {
	if seg == "" {
		return fmt.Errorf("empty path segment")
	}
	if seg == "." || seg == ".." {
		return fmt.Errorf("path segment %q is not allowed", seg)
	}
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("path segment %q contains %q", seg, string(rune(c)))
		}
	}
	return nil
}

// ParseIdentity reads the identity of a certificate's holder. leaf must be
// the leaf of a chain the caller has already verified against the trust
// domain's CA; ParseIdentity checks names, not signatures.
//
// The certificate must carry exactly one URI SAN (as the SPIFFE X.509-SVID
// specification requires), and it must be a spiffe:// ID in trustDomain.
// Then:
//
//   - spiffe://<td>/node/<name> is a Node; name must pass
//     registry.ValidateName.
//   - <operatorPrefix><name> is an Operator (operatorPrefix "" means
//     spiffe://<td>/operator/); name is one segment and must pass
//     registry.ValidateName.
//   - spiffe://<td>/server/<host> is a Server (read-only).
//
// Anything else is an error, never a silent Unknown identity: a certificate
// this package cannot classify authenticates no one.
func ParseIdentity(leaf *x509.Certificate, trustDomain, operatorPrefix string) (Identity, error) {
	prefix, err := NormalizeOperatorPrefix(trustDomain, operatorPrefix)
	if err != nil {
		return Identity{}, err
	}
	if leaf == nil {
		return Identity{}, fmt.Errorf("no client certificate")
	}
	switch len(leaf.URIs) {
	case 0:
		return Identity{}, fmt.Errorf("certificate %s has no URI SAN; it needs a SPIFFE ID such as %s", describe(leaf), NodeID(trustDomain, "<node>"))
	case 1:
	default:
		uris := make([]string, len(leaf.URIs))
		for i, u := range leaf.URIs {
			uris[i] = u.String()
		}
		return Identity{}, fmt.Errorf("certificate %s has %d URI SANs (%s); a SPIFFE certificate carries exactly one", describe(leaf), len(uris), strings.Join(uris, ", "))
	}
	u := leaf.URIs[0]
	id, err := parseSPIFFEID(u)
	if err != nil {
		return Identity{}, fmt.Errorf("certificate %s: %v", describe(leaf), err)
	}
	if u.Host != trustDomain {
		return Identity{}, fmt.Errorf("certificate %s is from trust domain %q (%s); this registrar trusts only %q", describe(leaf), u.Host, id, trustDomain)
	}
	path := u.Path
	switch {
	case strings.HasPrefix(path, nodePath):
		name := strings.TrimPrefix(path, nodePath)
		if err := registry.ValidateName("node name", name); err != nil {
			return Identity{}, fmt.Errorf("certificate %s: SPIFFE ID %s: %v", describe(leaf), id, err)
		}
		return Identity{Kind: Node, Name: name, URI: id}, nil
	case strings.HasPrefix(id, prefix):
		name := strings.TrimPrefix(id, prefix)
		if err := registry.ValidateName("operator name", name); err != nil {
			return Identity{}, fmt.Errorf("certificate %s: SPIFFE ID %s: %v", describe(leaf), id, err)
		}
		return Identity{Kind: Operator, Name: name, URI: id}, nil
	case strings.HasPrefix(path, serverPath):
		host := strings.TrimPrefix(path, serverPath)
		if err := validateSegment(host); err != nil {
			return Identity{}, fmt.Errorf("certificate %s: SPIFFE ID %s: server host: %v", describe(leaf), id, err)
		}
		return Identity{Kind: Server, Name: host, URI: id}, nil
	}
	return Identity{}, fmt.Errorf("certificate %s: SPIFFE ID %s is neither a node (%s) nor an operator (%s<name>)", describe(leaf), id, NodeID(trustDomain, "<name>"), prefix)
}

// parseSPIFFEID checks the form of a SPIFFE ID and returns it as text:
// spiffe scheme, a host and a path, nothing else.
func parseSPIFFEID(u *url.URL) (string, error) {
	s := u.String()
	switch {
	case u.Scheme != "spiffe":
		return "", fmt.Errorf("URI SAN %s is not a SPIFFE ID (spiffe://<trust-domain>/<path>)", s)
	case u.Opaque != "" || u.User != nil || u.Port() != "" || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.RawPath != "":
		return "", fmt.Errorf("SPIFFE ID %s is malformed: it may have only a trust domain and a path", s)
	case u.Host == "":
		return "", fmt.Errorf("SPIFFE ID %s has no trust domain", s)
	}
	if err := ValidateTrustDomain(u.Host); err != nil {
		return "", fmt.Errorf("SPIFFE ID %s: %v", s, err)
	}
	return "spiffe://" + u.Host + u.Path, nil
}

// describe names a certificate in messages by its subject and serial.
func describe(c *x509.Certificate) string {
	if c.Subject.CommonName != "" {
		return fmt.Sprintf("%q", c.Subject.CommonName)
	}
	if c.SerialNumber != nil {
		return "serial " + c.SerialNumber.Text(16)
	}
	return "(no subject)"
}
