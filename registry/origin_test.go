package registry

import (
	"errors"
	"fmt"
	"testing"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// registrarOrigin words refusals the way a registrar of r1/c1 does.
var registrarOrigin = Origin{Region: "r1", Cluster: "c1", Refusal: func(part, got, own string) string {
	return fmt.Sprintf("%q is not this registrar's %s %q; write through a registrar of %s %q", got, part, own, part, got)
}}

func TestNormalizeIDAcceptsAndCanonicalizes(t *testing.T) {
	http := registryv1.Protocol_PROTOCOL_HTTP1
	for _, tc := range []struct {
		name   string
		in     EndpointID
		wantID EndpointID
	}{
		{"origin left out", EndpointID{Service: "web", Protocol: http, IP: "10.0.0.1"},
			EndpointID{Region: "r1", Cluster: "c1", Service: "web", Protocol: http, IP: "10.0.0.1"}},
		{"own origin named", EndpointID{Region: "r1", Cluster: "c1", Service: "web", Protocol: http, IP: "10.0.0.1"},
			EndpointID{Region: "r1", Cluster: "c1", Service: "web", Protocol: http, IP: "10.0.0.1"}},
		{"only the cluster left out", EndpointID{Region: "r1", Service: "web", Protocol: http, IP: "10.0.0.1"},
			EndpointID{Region: "r1", Cluster: "c1", Service: "web", Protocol: http, IP: "10.0.0.1"}},
		{"mapped IPv4 unmapped", EndpointID{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, IP: "::ffff:10.0.0.1"},
			EndpointID{Region: "r1", Cluster: "c1", Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, IP: "10.0.0.1"}},
		{"IPv6 in canonical form", EndpointID{Service: "a.b-c_d", Protocol: registryv1.Protocol_PROTOCOL_TCP, IP: "2001:DB8:0::1"},
			EndpointID{Region: "r1", Cluster: "c1", Service: "a.b-c_d", Protocol: registryv1.Protocol_PROTOCOL_TCP, IP: "2001:db8::1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := registrarOrigin.NormalizeID(tc.in)
			if err != nil {
				t.Fatalf("NormalizeID(%+v) = %v", tc.in, err)
			}
			if got != tc.wantID {
				t.Fatalf("NormalizeID(%+v) = %+v, want %+v", tc.in, got, tc.wantID)
			}
			if err := got.Validate(); err != nil {
				t.Fatalf("normalized ID does not build a key: %v", err)
			}
		})
	}
}

func TestNormalizeIDRefuses(t *testing.T) {
	good := EndpointID{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.0.0.1"}
	with := func(f func(*EndpointID)) EndpointID { id := good; f(&id); return id }
	for _, tc := range []struct {
		name   string
		origin Origin
		in     EndpointID
		field  string
		msg    string
	}{
		{"empty service", registrarOrigin, with(func(id *EndpointID) { id.Service = "" }),
			"service", "service: service must not be empty"},
		{"service with a slash", registrarOrigin, with(func(id *EndpointID) { id.Service = "a/b" }),
			"service", `service: service "a/b" must not contain '/'`},
		{"service of dots", registrarOrigin, with(func(id *EndpointID) { id.Service = "a..b" }),
			"service", `service: service "a..b" must not contain ".."`},
		{"unset protocol", registrarOrigin, with(func(id *EndpointID) { id.Protocol = 0 }),
			"protocol", "protocol: protocol must be set (one of http, h2c, grpc, tcp)"},
		{"unknown protocol", registrarOrigin, with(func(id *EndpointID) { id.Protocol = 99 }),
			"protocol", "protocol: unknown protocol 99 (known: http, h2c, grpc, tcp)"},
		{"empty ip", registrarOrigin, with(func(id *EndpointID) { id.IP = "" }),
			"ip", "ip: ip must not be empty"},
		{"hostname as ip", registrarOrigin, with(func(id *EndpointID) { id.IP = "web.local" }),
			"ip", `ip: ip "web.local" is not an IPv4 or IPv6 address`},
		{"unspecified ip", registrarOrigin, with(func(id *EndpointID) { id.IP = "::" }),
			"ip", `ip: ip "::" is the unspecified address; register the address peers dial`},
		{"foreign region", registrarOrigin, with(func(id *EndpointID) { id.Region = "r2" }),
			"region", `region: "r2" is not this registrar's region "r1"; write through a registrar of region "r2"`},
		{"foreign cluster", registrarOrigin, with(func(id *EndpointID) { id.Cluster = "c9" }),
			"cluster", `cluster: "c9" is not this registrar's cluster "c1"; write through a registrar of cluster "c9"`},
		// The origin is claimed before anything else is looked at: the
		// caller learns where to write, not what else is wrong.
		{"foreign region and no service", registrarOrigin, with(func(id *EndpointID) { id.Region, id.Service = "r2", "" }),
			"region", `region: "r2" is not this registrar's region "r1"; write through a registrar of region "r2"`},
		{"foreign region that is no name", registrarOrigin, with(func(id *EndpointID) { id.Region = "r/2" }),
			"region", `region: "r/2" is not this registrar's region "r1"; write through a registrar of region "r/2"`},
		// Parts are checked in key order: service, protocol, ip.
		{"no service and no ip", registrarOrigin, with(func(id *EndpointID) { id.Service, id.IP = "", "" }),
			"service", "service: service must not be empty"},
		{"no protocol and no ip", registrarOrigin, with(func(id *EndpointID) { id.Protocol, id.IP = 0, "" }),
			"protocol", "protocol: protocol must be set (one of http, h2c, grpc, tcp)"},
		{"writer without a wording", Origin{Region: "r1", Cluster: "c1"}, with(func(id *EndpointID) { id.Region = "r2" }),
			"region", `region: "r2" is not this writer's region "r1"`},
		// A writer whose own origin is no name cannot build a key for it;
		// the claim passes, the name check does not.
		{"own region no name", Origin{Region: "r 1", Cluster: "c1"}, good,
			"region", `region: region "r 1" contains " "; allowed are ASCII letters and digits, '.', '_' and '-'`},
		{"own cluster empty", Origin{Region: "r1"}, good,
			"cluster", "cluster: cluster must not be empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.origin.NormalizeID(tc.in)
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("NormalizeID(%+v) = %v, want a FieldError", tc.in, err)
			}
			if fe.Field != tc.field || err.Error() != tc.msg {
				t.Fatalf("NormalizeID(%+v) = field %q, %q\nwant field %q, %q", tc.in, fe.Field, err, tc.field, tc.msg)
			}
		})
	}
}

func TestClaimDefaultsThenRefusesUnderItsField(t *testing.T) {
	region, cluster := "", ""
	if err := registrarOrigin.Claim(&region, &cluster, "endpoint."); err != nil {
		t.Fatal(err)
	}
	if region != "r1" || cluster != "c1" {
		t.Fatalf("claimed an empty origin as %s/%s, want r1/c1", region, cluster)
	}
	region, cluster = "", "other"
	err := registrarOrigin.Claim(&region, &cluster, "node.")
	want := `node.cluster: "other" is not this registrar's cluster "c1"; write through a registrar of cluster "other"`
	if err == nil || err.Error() != want {
		t.Fatalf("Claim(\"\", other) = %v, want %s", err, want)
	}
	if region != "r1" {
		t.Errorf("the empty region was not defaulted before the cluster was refused: %q", region)
	}
}
