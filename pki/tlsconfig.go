package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc/credentials"
)

// ServerTLSConfig returns the TLS config of a server (a registrar) whose
// certificate and client CA pool are reloaded from their files, every
// reloadEvery (<= 0: only on Reloader.Reload), with no restart. Close the
// Reloader when the server stops.
//
// Client certificates:
//
//   - clientCAFile "" and !requireClientCert: none are asked for (plain
//     TLS).
//   - clientCAFile set, !requireClientCert: a client may present one; if
//     it does, it must verify against the pool (tls.VerifyClientCertIfGiven).
//     Calls without one arrive unauthenticated, and the server answers
//     UNAUTHENTICATED per call (authz.FromContext).
//   - requireClientCert: the handshake fails without a verified client
//     certificate (tls.RequireAndVerifyClientCert); clientCAFile is
//     required.
//
// How the client CA pool really reloads: tls.Config.ClientCAs is read once
// per config, so the returned config sets GetConfigForClient, which hands
// every handshake a clone of the returned config with ClientCAs set to the
// Reloader's current pool. (gRPC's credentials.NewTLS supports
// GetConfigForClient and still adds the h2 ALPN protocol to what it
// returns.) Set any other fields on the returned config before its first
// use; the clones are taken from it. Session resumption stays on:
// crypto/tls re-checks a resumed session's verified chain against the
// ClientCAs of the handshake's config, i.e. the current pool, so a removed
// CA does not keep admitting its clients through old tickets
// (TestReloadClientCA covers this with a client session cache).
func ServerTLSConfig(certFile, keyFile, clientCAFile string, requireClientCert bool, reloadEvery time.Duration, opts ...Option) (*tls.Config, *Reloader, error) {
	if certFile == "" || keyFile == "" {
		return nil, nil, errors.New("pki: a TLS server needs a certificate file and its key file")
	}
	if requireClientCert && clientCAFile == "" {
		return nil, nil, errors.New("pki: requiring client certificates needs a client CA file to verify them against")
	}
	r, err := NewReloader(certFile, keyFile, clientCAFile, reloadEvery, opts...)
	if err != nil {
		return nil, nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: r.GetCertificate,
	}
	if clientCAFile != "" {
		cfg.ClientAuth = tls.VerifyClientCertIfGiven
		if requireClientCert {
			cfg.ClientAuth = tls.RequireAndVerifyClientCert
		}
		cfg.ClientCAs = r.CAPool()
		cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
			c := cfg.Clone()
			c.GetConfigForClient = nil
			c.ClientCAs = r.CAPool()
			return c, nil
		}
	}
	return cfg, r, nil
}

// ClientTLSConfig returns a static TLS config for a short-lived client (a
// CLI command, an etcd client): caFile is the PEM bundle of CAs the server
// must chain to ("" for the system roots), and certFile and keyFile (both
// or neither) the client certificate. Nothing is reloaded; long-running
// gRPC clients use ClientCredentials.
func ClientTLSConfig(caFile, certFile, keyFile string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("pki: a client certificate needs its key: give both files or neither")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		certs, err := readCerts(caFile)
		if err != nil {
			return nil, fmt.Errorf("pki: CA file: %w", err)
		}
		pool := x509.NewCertPool()
		for _, c := range certs {
			pool.AddCert(c)
		}
		cfg.RootCAs = pool
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("pki: certificate %s with key %s: %v", certFile, keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// ClientCredentials returns gRPC transport credentials for a long-running
// client (an agent) whose client certificate and root CA pool are reloaded
// from their files, every reloadEvery (<= 0: only on Reloader.Reload),
// with no restart. Each new connection (including reconnects) uses what
// is current; established connections keep what they negotiated. caFile
// "" means the system roots; certFile and keyFile are both given or
// neither. Close the Reloader when the client stops.
//
// Why credentials and not a *tls.Config: a client config has no hook that
// picks the root pool per handshake, and verifying by hand in
// VerifyConnection cannot check an IP address SAN (crypto/tls does not
// pass the dialled IP on). These credentials build a fresh config, with
// the current pool, for every handshake and hand it to gRPC's own TLS
// credentials, so hostname and IP checks, ALPN and TLSInfo are gRPC's.
func ClientCredentials(caFile, certFile, keyFile string, reloadEvery time.Duration, opts ...Option) (credentials.TransportCredentials, *Reloader, error) {
	r, err := NewReloader(certFile, keyFile, caFile, reloadEvery, opts...)
	if err != nil {
		return nil, nil, err
	}
	return &reloadingCreds{r: r}, r, nil
}

// reloadingCreds are client TLS credentials over a Reloader.
type reloadingCreds struct {
	r          *Reloader
	serverName string // OverrideServerName; gRPC sets the name per handshake otherwise
}

func (c *reloadingCreds) config() *tls.Config {
	cfg := &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    c.r.CAPool(),
		ServerName: c.serverName,
	}
	if c.r.certFile != "" {
		cfg.GetClientCertificate = c.r.GetClientCertificate
	}
	return cfg
}

func (c *reloadingCreds) ClientHandshake(ctx context.Context, authority string, rawConn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.config()).ClientHandshake(ctx, authority, rawConn)
}

func (c *reloadingCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("pki: ClientCredentials are for clients; a server uses ServerTLSConfig")
}

func (c *reloadingCreds) Info() credentials.ProtocolInfo {
	return credentials.NewTLS(c.config()).Info()
}

func (c *reloadingCreds) Clone() credentials.TransportCredentials {
	return &reloadingCreds{r: c.r, serverName: c.serverName}
}

// OverrideServerName is deprecated in gRPC but part of the interface.
func (c *reloadingCreds) OverrideServerName(name string) error {
	c.serverName = name
	return nil
}
