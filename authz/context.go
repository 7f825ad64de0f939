package authz

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// FromContext returns the identity of the peer of a gRPC call: the leaf of
// the client certificate chain the TLS handshake verified, read with
// ParseIdentity.
//
// Only a verified chain counts. A certificate the server merely received
// (tls.RequestClientCert, tls.RequireAnyClientCert) authenticates no one,
// so the server's TLS config must verify client certificates
// (tls.VerifyClientCertIfGiven or tls.RequireAndVerifyClientCert against
// the trust domain's CA, as pki.ServerTLSConfig does).
//
// Every failure is an *Error with code UNAUTHENTICATED and rule
// RuleAuthenticated, except a bad trustDomain or operatorPrefix, which is
// a configuration error (INTERNAL) the registrar should have caught at
// startup with NormalizeOperatorPrefix.
func FromContext(ctx context.Context, trustDomain, operatorPrefix string) (Identity, error) {
	if _, err := NormalizeOperatorPrefix(trustDomain, operatorPrefix); err != nil {
		return Identity{}, &Error{Code: codes.Internal, Rule: RuleAuthenticated, Msg: "authz: bad configuration: " + err.Error()}
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, unauth("no peer information in the call context")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Identity{}, unauth(fmt.Sprintf("connection from %s is not TLS: connect with TLS and a client certificate issued by the CA of trust domain %q", p.Addr, trustDomain))
	}
	chains := info.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		if len(info.State.PeerCertificates) > 0 {
			return Identity{}, unauth(fmt.Sprintf("client certificate from %s was not verified against the CA of trust domain %q", p.Addr, trustDomain))
		}
		return Identity{}, unauth(fmt.Sprintf("no client certificate from %s: present a certificate issued by the CA of trust domain %q", p.Addr, trustDomain))
	}
	id, err := ParseIdentity(chains[0][0], trustDomain, operatorPrefix)
	if err != nil {
		return Identity{}, unauth("client certificate rejected: " + err.Error())
	}
	return id, nil
}

func unauth(msg string) *Error {
	return &Error{Code: codes.Unauthenticated, Rule: RuleAuthenticated, Msg: msg}
}
