package authz

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

const td = "example.org"

// cert is a certificate with the given URI SANs. ParseIdentity reads names
// only, so it need not be signed.
func cert(t *testing.T, uris ...string) *x509.Certificate {
	t.Helper()
	c := &x509.Certificate{Subject: pkix.Name{CommonName: "test-cert"}}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		c.URIs = append(c.URIs, u)
	}
	return c
}

func TestParseIdentity(t *testing.T) {
	t.Parallel()
	node := func(name string) Identity { return Identity{Kind: Node, Name: name, URI: NodeID(td, name)} }
	tests := []struct {
		name    string
		leaf    *x509.Certificate
		td      string
		prefix  string
		want    Identity
		wantErr []string // substrings of the error; nil means success
	}{
		{name: "node", leaf: cert(t, "spiffe://example.org/node/node-a"), want: node("node-a")},
		{name: "node with dots", leaf: cert(t, "spiffe://example.org/node/n1.eu-west.example"), want: node("n1.eu-west.example")},
		{name: "operator default prefix", leaf: cert(t, "spiffe://example.org/operator/alice"),
			want: Identity{Kind: Operator, Name: "alice", URI: "spiffe://example.org/operator/alice"}},
		{name: "server", leaf: cert(t, "spiffe://example.org/server/reg.example.com"),
			want: Identity{Kind: Server, Name: "reg.example.com", URI: "spiffe://example.org/server/reg.example.com"}},
		{name: "custom operator prefix", leaf: cert(t, "spiffe://example.org/humans/sre/alice"), prefix: "spiffe://example.org/humans/sre/",
			want: Identity{Kind: Operator, Name: "alice", URI: "spiffe://example.org/humans/sre/alice"}},
		{name: "custom prefix without slash", leaf: cert(t, "spiffe://example.org/humans/alice"), prefix: "spiffe://example.org/humans",
			want: Identity{Kind: Operator, Name: "alice", URI: "spiffe://example.org/humans/alice"}},
		{name: "custom prefix does not match a longer segment", leaf: cert(t, "spiffe://example.org/humansx/alice"), prefix: "spiffe://example.org/humans",
			wantErr: []string{"neither a node", "spiffe://example.org/humans/<name>"}},
		{name: "default operator path under a custom prefix", leaf: cert(t, "spiffe://example.org/operator/alice"), prefix: "spiffe://example.org/humans/",
			wantErr: []string{"neither a node"}},
		{name: "custom prefix leaves nodes nodes", leaf: cert(t, "spiffe://example.org/node/node-a"), prefix: "spiffe://example.org/humans/", want: node("node-a")},

		{name: "other trust domain", leaf: cert(t, "spiffe://other.org/node/node-a"),
			wantErr: []string{`trust domain "other.org"`, `trusts only "example.org"`, "spiffe://other.org/node/node-a"}},
		{name: "other trust domain operator", leaf: cert(t, "spiffe://other.org/operator/alice"), wantErr: []string{`"other.org"`, `"example.org"`}},
		{name: "sub trust domain", leaf: cert(t, "spiffe://eu.example.org/node/a"), wantErr: []string{`"eu.example.org"`}},
		{name: "uppercase trust domain", leaf: cert(t, "spiffe://EXAMPLE.org/node/a"), wantErr: []string{"lowercase"}},
		{name: "no URI SAN", leaf: cert(t), wantErr: []string{`"test-cert" has no URI SAN`, "spiffe://example.org/node/<node>"}},
		{name: "two URI SANs", leaf: cert(t, "spiffe://example.org/node/a", "spiffe://example.org/operator/b"),
			wantErr: []string{"2 URI SANs", "spiffe://example.org/node/a, spiffe://example.org/operator/b", "exactly one"}},
		{name: "spiffe and https SANs", leaf: cert(t, "spiffe://example.org/node/a", "https://example.org/"), wantErr: []string{"2 URI SANs"}},
		{name: "not spiffe", leaf: cert(t, "https://example.org/node/a"), wantErr: []string{"not a SPIFFE ID"}},
		{name: "port", leaf: cert(t, "spiffe://example.org:443/node/a"), wantErr: []string{"malformed"}},
		{name: "query", leaf: cert(t, "spiffe://example.org/node/a?x=1"), wantErr: []string{"malformed"}},
		{name: "fragment", leaf: cert(t, "spiffe://example.org/node/a#x"), wantErr: []string{"malformed"}},
		{name: "user", leaf: cert(t, "spiffe://u@example.org/node/a"), wantErr: []string{"malformed"}},
		{name: "escaped slash", leaf: cert(t, "spiffe://example.org/node/a%2Fb"), wantErr: []string{"malformed"}},
		{name: "no trust domain", leaf: cert(t, "spiffe:///node/a"), wantErr: []string{"no trust domain"}},
		{name: "node name with slash", leaf: cert(t, "spiffe://example.org/node/a/b"), wantErr: []string{`node name "a/b" must not contain '/'`}},
		{name: "empty node name", leaf: cert(t, "spiffe://example.org/node/"), wantErr: []string{"node name must not be empty"}},
		{name: "bad node name", leaf: cert(t, "spiffe://example.org/node/-a"), wantErr: []string{"must start and end with a letter or digit"}},
		{name: "dot-dot node", leaf: cert(t, "spiffe://example.org/node/.."), wantErr: []string{"node name"}},
		{name: "nested operator", leaf: cert(t, "spiffe://example.org/operator/team/alice"), wantErr: []string{`operator name "team/alice"`}},
		{name: "bad server host", leaf: cert(t, "spiffe://example.org/server/a/b"), wantErr: []string{"server host"}},
		{name: "trust domain only", leaf: cert(t, "spiffe://example.org"), wantErr: []string{"neither a node"}},
		{name: "unknown path", leaf: cert(t, "spiffe://example.org/workload/x"), wantErr: []string{"spiffe://example.org/workload/x is neither a node (spiffe://example.org/node/<name>) nor an operator (spiffe://example.org/operator/<name>)"}},
		{name: "nodes is not node", leaf: cert(t, "spiffe://example.org/nodes/a"), wantErr: []string{"neither a node"}},
		{name: "nil leaf", leaf: nil, wantErr: []string{"no client certificate"}},

		{name: "bad configured trust domain", leaf: cert(t, "spiffe://example.org/node/a"), td: "Example.org", wantErr: []string{"lowercase"}},
		{name: "empty configured trust domain", leaf: cert(t, "spiffe://example.org/node/a"), td: "-", wantErr: []string{"trust domain must not be empty"}},
		{name: "prefix outside trust domain", leaf: cert(t, "spiffe://example.org/node/a"), prefix: "spiffe://other.org/operator/", wantErr: []string{"not inside trust domain"}},
		{name: "prefix is the root", leaf: cert(t, "spiffe://example.org/node/a"), prefix: "spiffe://example.org/", wantErr: []string{"would make nodes or registrars operators"}},
		{name: "prefix under node", leaf: cert(t, "spiffe://example.org/node/a"), prefix: "spiffe://example.org/node/", wantErr: []string{"would make nodes or registrars operators"}},
		{name: "prefix under server", leaf: cert(t, "spiffe://example.org/node/a"), prefix: "spiffe://example.org/server/x", wantErr: []string{"would make nodes"}},
		{name: "prefix with bad segment", leaf: cert(t, "spiffe://example.org/node/a"), prefix: "spiffe://example.org/a b/", wantErr: []string{"contains"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			trust := tc.td
			switch trust {
			case "":
				trust = td
			case "-":
				trust = ""
			}
			got, err := ParseIdentity(tc.leaf, trust, tc.prefix)
			if tc.wantErr == nil {
				if err != nil || got != tc.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("got %+v, want an error", got)
			}
			if got != (Identity{}) {
				t.Errorf("error with a non-zero identity %+v", got)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestNormalizeOperatorPrefix(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                          "spiffe://example.org/operator/",
		"spiffe://example.org/ops":  "spiffe://example.org/ops/",
		"spiffe://example.org/ops/": "spiffe://example.org/ops/",
	} {
		if got, err := NormalizeOperatorPrefix(td, in); err != nil || got != want {
			t.Errorf("NormalizeOperatorPrefix(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}

var (
	nodeA    = Identity{Kind: Node, Name: "node-a", URI: "spiffe://example.org/node/node-a"}
	operator = Identity{Kind: Operator, Name: "alice", URI: "spiffe://example.org/operator/alice"}
	server   = Identity{Kind: Server, Name: "reg-1", URI: "spiffe://example.org/server/reg-1"}
	nobody   = Identity{}
)

// check compares a decision with the expected code ("OK" for nil), rule
// and message.
func check(t *testing.T, err error, code codes.Code, rule, msg string) {
	t.Helper()
	if code == codes.OK {
		if err != nil {
			t.Errorf("denied: %v", err)
		}
		return
	}
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("got %v (%T), want *Error", err, err)
	}
	if got := status.Code(err); got != code {
		t.Errorf("status.Code %v, want %v", got, code)
	}
	if e.Rule != rule {
		t.Errorf("rule %q, want %q", e.Rule, rule)
	}
	if msg != "" && err.Error() != msg {
		t.Errorf("message\n  %s\nwant\n  %s", err, msg)
	}
	if s := status.Convert(err); s.Message() != err.Error() {
		t.Errorf("status message %q differs from the error %q", s.Message(), err)
	}
}

func TestAuthorizeEndpointWrite(t *testing.T) {
	t.Parallel()
	var p Policy
	tests := []struct {
		id       Identity
		op, node string
		code     codes.Code
		rule     string
		msg      string
	}{
		{nodeA, OpRegister, "node-a", codes.OK, "", ""},
		{nodeA, OpUnregister, "node-a", codes.OK, "", ""},
		{nodeA, OpDrain, "node-a", codes.OK, "", ""},
		{nodeA, OpRegister, "node-b", codes.PermissionDenied, RuleOwnNodeEndpoints,
			`node "node-a" (spiffe://example.org/node/node-a) may only register endpoints of its own node; this endpoint's node is "node-b"`},
		{nodeA, OpUnregister, "node-b", codes.PermissionDenied, RuleOwnNodeEndpoints,
			`node "node-a" (spiffe://example.org/node/node-a) may only unregister endpoints of its own node; this endpoint's node is "node-b"`},
		{nodeA, OpDrain, "node-b", codes.PermissionDenied, RuleOwnNodeEndpoints,
			`node "node-a" (spiffe://example.org/node/node-a) may only drain endpoints of its own node; this endpoint's node is "node-b"`},
		{nodeA, OpDrain, "Node-A", codes.PermissionDenied, RuleOwnNodeEndpoints, ""},
		{nodeA, OpRegister, "", codes.PermissionDenied, RuleOwnNodeEndpoints,
			`node "node-a" (spiffe://example.org/node/node-a) may only register endpoints of its own node; this endpoint has no node (set its node to "node-a")`},
		{nodeA, OpUnregister, "", codes.PermissionDenied, RuleOwnNodeEndpoints,
			`node "node-a" (spiffe://example.org/node/node-a) may only unregister endpoints of its own node; this endpoint has no node`},
		{operator, OpRegister, "node-b", codes.OK, "", ""},
		{operator, OpUnregister, "node-b", codes.OK, "", ""},
		{operator, OpDrain, "node-b", codes.OK, "", ""},
		{operator, OpRegister, "", codes.OK, "", ""},
		{operator, OpUnregister, "", codes.OK, "", ""},
		{server, OpRegister, "node-a", codes.PermissionDenied, RuleReadOnly,
			`server "reg-1" (spiffe://example.org/server/reg-1) may not register endpoints: registrar identities are read-only (only operators, and nodes for their own node, may write)`},
		{server, OpDrain, "", codes.PermissionDenied, RuleReadOnly, ""},
		{nobody, OpRegister, "node-a", codes.Unauthenticated, RuleAuthenticated,
			"unauthenticated caller may not register endpoints: present a client certificate issued by the mesh's CA"},
		{nobody, OpUnregister, "", codes.Unauthenticated, RuleAuthenticated, ""},
		{operator, "delete", "node-a", codes.Internal, RuleKnownOperation, `authz: unknown endpoint operation "delete" (refused)`},
		{nodeA, OpAnnounce, "node-a", codes.Internal, RuleKnownOperation, ""},
		{Identity{Kind: Node}, OpRegister, "", codes.PermissionDenied, RuleOwnNodeEndpoints, ""},
	}
	for _, tc := range tests {
		t.Run(tc.id.Kind.String()+"/"+tc.op+"/"+tc.node, func(t *testing.T) {
			err := p.AuthorizeEndpointWrite(tc.id, tc.op, tc.node)
			check(t, err, tc.code, tc.rule, tc.msg)
			var e *Error
			if errors.As(err, &e) && (e.Identity != tc.id || e.Op != tc.op) {
				t.Errorf("Error carries identity %+v op %q", e.Identity, e.Op)
			}
		})
	}
}

func TestAuthorizeNodeWrite(t *testing.T) {
	t.Parallel()
	var p Policy
	tests := []struct {
		id       Identity
		op, node string
		code     codes.Code
		rule     string
		msg      string
	}{
		{nodeA, OpAnnounce, "node-a", codes.OK, "", ""},
		{nodeA, OpHeartbeat, "node-a", codes.OK, "", ""},
		{nodeA, OpLeave, "node-a", codes.OK, "", ""},
		{nodeA, OpAnnounce, "node-b", codes.PermissionDenied, RuleOwnNodeRecord,
			`node "node-a" (spiffe://example.org/node/node-a) may only announce, heartbeat and leave as itself (node "node-a"); this announce is for node "node-b"`},
		{nodeA, OpHeartbeat, "node-b", codes.PermissionDenied, RuleOwnNodeRecord,
			`node "node-a" (spiffe://example.org/node/node-a) may only announce, heartbeat and leave as itself (node "node-a"); this heartbeat is for node "node-b"`},
		{nodeA, OpLeave, "node-b", codes.PermissionDenied, RuleOwnNodeRecord,
			`node "node-a" (spiffe://example.org/node/node-a) may only announce, heartbeat and leave as itself (node "node-a"); this leave is for node "node-b"`},
		{nodeA, OpLeave, "", codes.PermissionDenied, RuleOwnNodeRecord,
			`node "node-a" (spiffe://example.org/node/node-a) may only announce, heartbeat and leave as itself (node "node-a"); this leave names no node`},
		{operator, OpAnnounce, "node-b", codes.OK, "", ""},
		{operator, OpHeartbeat, "node-b", codes.OK, "", ""},
		{operator, OpLeave, "node-b", codes.OK, "", ""},
		{server, OpHeartbeat, "reg-1", codes.PermissionDenied, RuleReadOnly,
			`server "reg-1" (spiffe://example.org/server/reg-1) may not heartbeat: registrar identities are read-only (only operators, and nodes for their own node, may write)`},
		{nobody, OpAnnounce, "node-a", codes.Unauthenticated, RuleAuthenticated, ""},
		{operator, OpRegister, "node-a", codes.Internal, RuleKnownOperation, `authz: unknown node operation "register" (refused)`},
		{Identity{Kind: Node}, OpLeave, "", codes.PermissionDenied, RuleOwnNodeRecord, ""},
	}
	for _, tc := range tests {
		t.Run(tc.id.Kind.String()+"/"+tc.op+"/"+tc.node, func(t *testing.T) {
			check(t, p.AuthorizeNodeWrite(tc.id, tc.op, tc.node), tc.code, tc.rule, tc.msg)
		})
	}
}

func TestAuthorizeRead(t *testing.T) {
	t.Parallel()
	var p Policy
	for _, id := range []Identity{nodeA, operator, server} {
		check(t, p.AuthorizeRead(id), codes.OK, "", "")
	}
	check(t, p.AuthorizeRead(nobody), codes.Unauthenticated, RuleAuthenticated,
		"unauthenticated caller may not list or watch: present a client certificate issued by the mesh's CA")
	// An identity with a name but no kind is not authenticated.
	check(t, p.AuthorizeRead(Identity{Name: "node-a"}), codes.Unauthenticated, RuleAuthenticated, "")
}

// TestFromContextWithoutTLS covers the cases a real server cannot easily
// produce; authz_grpc_test.go covers real connections.
func TestFromContextWithoutTLS(t *testing.T) {
	t.Parallel()
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1234}
	leaf := cert(t, "spiffe://example.org/node/node-a")
	tests := []struct {
		name string
		ctx  context.Context
		td   string
		code codes.Code
		want string
	}{
		{"no peer", context.Background(), td, codes.Unauthenticated, "no peer information"},
		{"not TLS", peer.NewContext(context.Background(), &peer.Peer{Addr: addr}), td, codes.Unauthenticated, "connection from 10.0.0.1:1234 is not TLS"},
		{"unverified certificate", peer.NewContext(context.Background(), &peer.Peer{Addr: addr, AuthInfo: credentials.TLSInfo{
			State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}},
		}}), td, codes.Unauthenticated, "was not verified"},
		{"no certificate", peer.NewContext(context.Background(), &peer.Peer{Addr: addr, AuthInfo: credentials.TLSInfo{}}), td, codes.Unauthenticated, "no client certificate from 10.0.0.1:1234"},
		{"bad configuration", context.Background(), "", codes.Internal, "bad configuration"},
	}
	for _, tc := range tests {
		id, err := FromContext(tc.ctx, tc.td, "")
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.want) || id != (Identity{}) {
			t.Errorf("%s: %+v, %v; want %v containing %q", tc.name, id, err, tc.code, tc.want)
		}
	}
	verified := peer.NewContext(context.Background(), &peer.Peer{Addr: addr, AuthInfo: credentials.TLSInfo{
		State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{leaf}, VerifiedChains: [][]*x509.Certificate{{leaf}}},
	}})
	if id, err := FromContext(verified, td, ""); err != nil || id != nodeA {
		t.Errorf("verified chain: %+v, %v", id, err)
	}
}

func TestIdentityString(t *testing.T) {
	t.Parallel()
	if got := nodeA.String(); got != `node "node-a" (spiffe://example.org/node/node-a)` {
		t.Errorf("got %s", got)
	}
	if got := nobody.String(); got != "unauthenticated caller" {
		t.Errorf("got %s", got)
	}
}
