// Package pki creates a development CA and the certificates of an Aether
// mesh, and serves TLS configurations whose certificates and CA pools are
// reloaded from disk when the files change.
//
// A CA directory holds:
//
//	ca.pem       the CA certificate (ECDSA P-256, valid 10 years)
//	ca-key.pem   its private key (mode 0600)
//	ca.json      the trust domain and when the CA was created
//
// Issue writes <kind>-<name>.pem and <kind>-<name>-key.pem (mode 0600) next
// to it (or into WithOutDir): node, operator and server certificates whose
// URI SAN is the SPIFFE ID package authz reads back.
//
// This is a development CA in the style of "consul tls ca create": the CA
// key sits on disk unencrypted. Production meshes should issue the same
// SPIFFE IDs from their own PKI.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/aethermesh/aether/authz"
)

// Names of the files of a CA directory.
const (
	CACertFile = "ca.pem"
	CAKeyFile  = "ca-key.pem"
	CAInfoFile = "ca.json"
)

// CAValidity is how long a CA made by InitCA is valid.
const CAValidity = 10 * 365 * 24 * time.Hour

// backdate is how far NotBefore is set in the past, for clock skew between
// the machine that issues and the machines that verify.
const backdate = 5 * time.Minute

// ExistsError is returned when a file would be overwritten: InitCA never
// overwrites, Issue only with WithOverwrite. It wraps fs.ErrExist.
type ExistsError struct {
	// Path is the first file found in the way.
	Path string
	// What says what the file is and how to proceed.
	What string
}

func (e *ExistsError) Error() string { return e.Path + " already exists: " + e.What }

// Unwrap makes errors.Is(err, fs.ErrExist) true.
func (e *ExistsError) Unwrap() error { return fs.ErrExist }

// caInfo is the content of ca.json.
type caInfo struct {
	TrustDomain string    `json:"trust_domain"`
	CreatedAt   time.Time `json:"created_at"`
	NotAfter    time.Time `json:"not_after"`
}

// CA is a loaded CA: what Issue signs with.
type CA struct {
	Dir         string
	TrustDomain string
	Cert        *x509.Certificate
	Key         crypto.Signer
}

// InitCA creates a CA for trustDomain in dir (created if missing, mode
// 0700): an ECDSA P-256 key and a self-signed certificate valid for 10
// years whose URI SAN is spiffe://<trustDomain>, plus ca.json recording the
// trust domain. It refuses, with an *ExistsError, if dir already holds any
// of the CA's files: overwriting a CA would silently invalidate every
// certificate it issued.
func InitCA(dir, trustDomain string) error {
	return initCA(dir, trustDomain, time.Now())
}

func initCA(dir, trustDomain string, now time.Time) error {
	if err := authz.ValidateTrustDomain(trustDomain); err != nil {
		return err
	}
	if dir == "" {
		return errors.New("pki: CA directory must not be empty")
	}
	for _, name := range []string{CACertFile, CAKeyFile, CAInfoFile} {
		p := filepath.Join(dir, name)
		if _, err := os.Lstat(p); err == nil {
			return &ExistsError{Path: p, What: fmt.Sprintf("a CA already exists in %s; issue certificates from it, or to start over remove %s, %s and %s there (certificates the old CA issued will no longer be trusted)", dir, CACertFile, CAKeyFile, CAInfoFile)}
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("pki: %w", err)
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pki: create CA directory: %w", err)
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("pki: generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "Aether development CA " + trustDomain, Organization: []string{"Aether"}},
		URIs:                  []*url.URL{{Scheme: "spiffe", Host: trustDomain}},
		NotBefore:             now.Add(-backdate),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("pki: create CA certificate: %w", err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	info, err := json.MarshalIndent(caInfo{TrustDomain: trustDomain, CreatedAt: now.UTC().Truncate(time.Second), NotAfter: tmpl.NotAfter.UTC().Truncate(time.Second)}, "", "  ")
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	files := []struct {
		name string
		data []byte
		perm fs.FileMode
	}{
		{CAKeyFile, keyPEM, 0o600},
		{CACertFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644},
		{CAInfoFile, append(info, '\n'), 0o644},
	}
	var written []string
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := writeFile(p, f.data, f.perm, false); err != nil {
			for _, w := range written {
				os.Remove(w)
			}
			return err
		}
		written = append(written, p)
	}
	return nil
}

// LoadCA loads the CA in dir, checking that its files agree: the key
// matches the certificate, the certificate is a CA, and its SPIFFE ID (if
// any) names the trust domain in ca.json. A missing file is an error
// wrapping fs.ErrNotExist.
func LoadCA(dir string) (*CA, error) {
	infoPath := filepath.Join(dir, CAInfoFile)
	raw, err := os.ReadFile(infoPath)
	if err != nil {
		return nil, fmt.Errorf("pki: no CA in %s: %w", dir, err)
	}
	var info caInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		return nil, fmt.Errorf("pki: %s: %v", infoPath, err)
	}
	if err := authz.ValidateTrustDomain(info.TrustDomain); err != nil {
		return nil, fmt.Errorf("pki: %s: %v", infoPath, err)
	}
	certPath := filepath.Join(dir, CACertFile)
	certs, err := readCerts(certPath)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("pki: %s holds %d certificates; a CA file made by InitCA holds one", certPath, len(certs))
	}
	cert := certs[0]
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("pki: %s is not a CA certificate", certPath)
	}
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && u.Host != info.TrustDomain {
			return nil, fmt.Errorf("pki: %s is for trust domain %q but %s says %q", certPath, u.Host, infoPath, info.TrustDomain)
		}
	}
	keyPath := filepath.Join(dir, CAKeyFile)
	key, err := readKey(keyPath)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	if !publicKeysEqual(key.Public(), cert.PublicKey) {
		return nil, fmt.Errorf("pki: %s is not the key of %s", keyPath, certPath)
	}
	return &CA{Dir: dir, TrustDomain: info.TrustDomain, Cert: cert, Key: key}, nil
}

// newSerial returns a random 128-bit serial number.
func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("pki: serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil // never zero
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ak, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ak.Equal(b)
}
