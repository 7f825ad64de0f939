package registry

import (
	"strings"
	"testing"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// TestNormalizeRefusesPortClashes: among several ports, each needs a name
// and a number of its own; the error names the field and the clash.
func TestNormalizeRefusesPortClashes(t *testing.T) {
	tests := []struct {
		name  string
		ports []*registryv1.Port
		want  string
	}{
		{"duplicate number", []*registryv1.Port{{Name: "http", Port: 8080}, {Name: "admin", Port: 8080}},
			`endpoint.ports[1].port: 8080 is already the number of endpoint.ports[0] ("http"); each port of an endpoint needs its own number`},
		{"duplicate number, later pair", []*registryv1.Port{{Name: "a", Port: 1}, {Name: "b", Port: 2}, {Name: "c", Port: 2}},
			`endpoint.ports[2].port: 2 is already the number of endpoint.ports[1] ("b")`},
		{"empty name among several", []*registryv1.Port{{Name: "http", Port: 8080}, {Port: 9090}},
			"endpoint.ports[1].name: must be set when an endpoint has more than one port"},
		{"duplicate name", []*registryv1.Port{{Name: "x", Port: 1}, {Name: "x", Port: 2}},
			`endpoint.ports[1].name: duplicate port name "x"`},
		{"zero number is a range error, not a clash", []*registryv1.Port{{Name: "a", Port: 0}, {Name: "b", Port: 0}},
			"endpoint.ports[0].port: 0 is not a port number (1-65535)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := validEndpoint()
			in.Ports = tc.ports
			_, err := NormalizeEndpoint(in, DefaultLimits)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NormalizeEndpoint = %v\nwant an error containing %q", err, tc.want)
			}
		})
	}

	// Distinct names and numbers pass, in any order.
	in := validEndpoint()
	in.Ports = []*registryv1.Port{{Name: "http", Port: 8080}, {Name: "admin", Port: 9090}}
	if _, err := NormalizeEndpoint(in, DefaultLimits); err != nil {
		t.Fatal(err)
	}
}
