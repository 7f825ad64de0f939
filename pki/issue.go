package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/registry"
)

// Kind is the kind of certificate Issue makes: the kind of identity
// authz will find in it.
//   - Node: URI SAN spiffe://<td>/node/<name>; client and server auth.
//   - Operator: URI SAN spiffe://<td>/operator/<name>; client auth.
//   - Server: DNS and IP SANs for its hosts plus URI SAN
//     spiffe://<td>/server/<first host>; server and client auth (so a
//     registrar can also be a client of etcd and of other registrars).
type Kind = authz.Kind

// The kinds Issue makes.
const (
	Node     = authz.Node
	Operator = authz.Operator
	Server   = authz.Server
)

// DefaultValidity is how long a certificate made by Issue is valid, unless
// WithValidity says otherwise. It never outlives the CA.
const DefaultValidity = 365 * 24 * time.Hour

// Issued describes a certificate Issue wrote.
type Issued struct {
	Kind Kind
	// Name is the node or operator name, or the first server host.
	Name     string
	CertFile string
	KeyFile  string
	// URI is the certificate's SPIFFE ID.
	URI      string
	DNSNames []string
	IPs      []net.IP
	NotAfter time.Time
	// TrustDomain and CAFile are those of the CA that signed it.
	TrustDomain string
	CAFile      string
}

// IssueOption configures Issue.
type IssueOption func(*issueConfig)

type issueConfig struct {
	outDir      string
	validity    time.Duration
	overwrite   bool
	noLocalhost bool
	now         func() time.Time
}

// WithOutDir writes the certificate and key into dir (created if missing,
// mode 0700) instead of the CA directory.
func WithOutDir(dir string) IssueOption { return func(c *issueConfig) { c.outDir = dir } }

// WithValidity sets how long the certificate is valid (default
// DefaultValidity); it is cut to the CA's own expiry.
func WithValidity(d time.Duration) IssueOption { return func(c *issueConfig) { c.validity = d } }

// WithOverwrite replaces existing certificate and key files (atomically, by
// rename, so a Reloader watching them picks the new pair up). Without it
// Issue refuses with an *ExistsError.
func WithOverwrite() IssueOption { return func(c *issueConfig) { c.overwrite = true } }

// WithoutLocalhost leaves localhost, 127.0.0.1 and ::1 out of a server
// certificate.
func WithoutLocalhost() IssueOption { return func(c *issueConfig) { c.noLocalhost = true } }

// localHosts are added to every server certificate unless WithoutLocalhost:
// a registrar is then reachable by the same certificate from its own host
// (health checks, a local agent, "aether list" on the box), which is what
// a development setup wants. Only certificates of this CA are trusted, so
// the names grant nothing to anyone else.
var localHosts = []string{"localhost", "127.0.0.1", "::1"}

// Issue loads the CA in dir and issues a certificate of kind:
//
//   - Node: name is the node name (registry.ValidateName).
//   - Operator: name is the operator name (registry.ValidateName), under
//     the default operator prefix spiffe://<td>/operator/.
//   - Server: name is one or more hosts, comma-separated. IP addresses
//     become IP SANs and other hosts DNS SANs (each passing
//     registry.ValidateName; no wildcards); localhost, 127.0.0.1 and ::1
//     are always added unless WithoutLocalhost. The SPIFFE ID and the file
//     names use the first host (':' of an IPv6 address becomes '-').
//
// The key is ECDSA P-256. The files are <kind>-<name>.pem and
// <kind>-<name>-key.pem (mode 0600) in dir, or in WithOutDir.
func Issue(dir string, kind Kind, name string, opts ...IssueOption) (*Issued, error) {
	cfg := issueConfig{outDir: dir, validity: DefaultValidity, now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.validity <= 0 {
		return nil, fmt.Errorf("pki: validity %s must be positive", cfg.validity)
	}

	var (
		base     string // file name and SPIFFE ID segment
		dnsNames []string
		ips      []net.IP
		usages   []x509.ExtKeyUsage
		cn       string
	)
	switch kind {
	case Node, Operator:
		if err := registry.ValidateName(kind.String()+" name", name); err != nil {
			return nil, err
		}
		base, cn = name, name
		usages = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		if kind == Node {
			usages = append(usages, x509.ExtKeyUsageServerAuth)
		}
	case Server:
		hosts, err := splitHosts(name)
		if err != nil {
			return nil, err
		}
		cn = hosts[0]
		base = strings.ReplaceAll(hosts[0], ":", "-")
		if !cfg.noLocalhost {
			for _, h := range localHosts {
				if !slices.Contains(hosts, h) {
					hosts = append(hosts, h)
				}
			}
		}
		for _, h := range hosts {
			if ip := net.ParseIP(h); ip != nil {
				if v4 := ip.To4(); v4 != nil {
					ip = v4
				}
				ips = append(ips, ip)
			} else {
				dnsNames = append(dnsNames, h)
			}
		}
		usages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	default:
		return nil, fmt.Errorf("pki: unknown certificate kind %d", int(kind))
	}

	ca, err := LoadCA(dir)
	if err != nil {
		return nil, err
	}
	var uri string
	switch kind {
	case Node:
		uri = authz.NodeID(ca.TrustDomain, base)
	case Operator:
		uri = authz.OperatorID(ca.TrustDomain, base)
	case Server:
		uri = authz.ServerID(ca.TrustDomain, base)
	}
	u, err := url.Parse(uri)
	if err != nil {
		return nil, fmt.Errorf("pki: SPIFFE ID %s: %v", uri, err)
	}

	now := cfg.now()
	notAfter := now.Add(cfg.validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	if !notAfter.After(now) {
		return nil, fmt.Errorf("pki: the CA in %s expired at %s; create a new one", dir, ca.Cert.NotAfter.Format(time.RFC3339))
	}

	certPath := filepath.Join(cfg.outDir, kind.String()+"-"+base+".pem")
	keyPath := filepath.Join(cfg.outDir, kind.String()+"-"+base+"-key.pem")
	if !cfg.overwrite {
		for _, p := range []string{certPath, keyPath} {
			if _, err := os.Lstat(p); err == nil {
				return nil, &ExistsError{Path: p, What: "refusing to overwrite an issued certificate; remove it first or overwrite it on purpose"}
			}
		}
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn, Organization: []string{"Aether"}, OrganizationalUnit: []string{kind.String()}},
		URIs:                  []*url.URL{u},
		DNSNames:              dnsNames,
		IPAddresses:           ips,
		NotBefore:             now.Add(-backdate),
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           usages,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: sign certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.outDir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: create output directory: %w", err)
	}
	// The key first: a Reloader that sees the new certificate before the
	// new key reports a mismatch and keeps the old pair until both are in.
	if err := writeFile(keyPath, keyPEM, 0o600, cfg.overwrite); err != nil {
		return nil, err
	}
	if err := writeFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644, cfg.overwrite); err != nil {
		if !cfg.overwrite {
			os.Remove(keyPath) // ours: created exclusively above
		}
		return nil, err
	}
	return &Issued{
		Kind: kind, Name: cn, CertFile: certPath, KeyFile: keyPath,
		URI: uri, DNSNames: dnsNames, IPs: ips, NotAfter: notAfter,
		TrustDomain: ca.TrustDomain, CAFile: filepath.Join(dir, CACertFile),
	}, nil
}

// CheckName checks the name Issue would be given for kind, without a CA:
// a node or operator name, or a server's comma-separated host list.
func CheckName(kind Kind, name string) error {
	switch kind {
	case Node, Operator:
		return registry.ValidateName(kind.String()+" name", name)
	case Server:
		_, err := splitHosts(name)
		return err
	default:
		return fmt.Errorf("pki: unknown certificate kind %d", int(kind))
	}
}

// splitHosts splits a comma-separated host list, checking each host and
// dropping duplicates. IP addresses are returned in canonical form.
func splitHosts(list string) ([]string, error) {
	var hosts []string
	for _, h := range strings.Split(list, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return nil, fmt.Errorf("server host list %q has an empty host", list)
		}
		if strings.Contains(h, "%") {
			return nil, fmt.Errorf("server host %q has a zone; certificates cannot name one", h)
		}
		if ip := net.ParseIP(h); ip != nil {
			if ip.IsUnspecified() {
				return nil, fmt.Errorf("server host %q is the unspecified address; name the address clients connect to", h)
			}
			h = ip.String()
		} else {
			if err := registry.ValidateName("server host", h); err != nil {
				return nil, err
			}
			h = strings.ToLower(h)
		}
		if !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return hosts, nil
}
