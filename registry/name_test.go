package registry

import (
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"strings"
	"testing"
)

// TestValidateNameReportsRunes: the offending character is reported as the
// character the user typed, not as a byte of its UTF-8 encoding.
func TestValidateNameReportsRunes(t *testing.T) {
	tests := []struct{ name, want, notWant string }{
		{"Wéb", `service "Wéb" contains "é"`, "Ã"},
		{"café-", `service "café-" contains "é"`, ""},
		{"日本", `service "日本" contains "日"`, ""},
		{"a\u00a0b", `service "a\u00a0b" contains "\u00a0"`, ""},
		{"web\xff", `is not valid UTF-8 (byte 0xff at offset 3)`, ""},
		{"web\ufffd", "contains \"\ufffd\"", "not valid UTF-8"},
		{"a b", `service "a b" contains " "`, ""},
		{"-web", `service "-web" must start and end with a letter or digit`, ""},
		{"web.", `service "web." must start and end with a letter or digit`, ""},
	}
	for _, tc := range tests {
		err := ValidateName("service", tc.name)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateName(%q) = %v\nwant an error containing %q", tc.name, err, tc.want)
			continue
		}
		if tc.notWant != "" && strings.Contains(err.Error(), tc.notWant) {
			t.Errorf("ValidateName(%q) = %v; must not mention %q", tc.name, err, tc.notWant)
		}
	}
	for _, ok := range []string{"web", "w3b.v1_a-b", "A"} {
		if err := ValidateName("service", ok); err != nil {
			t.Errorf("ValidateName(%q) = %v", ok, err)
		}
	}
}

// Metadata keys (and node labels) are checked by rune too.
func TestMetadataKeyReportsRunes(t *testing.T) {
	ep := &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.1",
		Ports: []*registryv1.Port{{Port: 80}}, Region: "r", Cluster: "c", Metadata: map[string]string{"rég": "1"}}
	_, err := NormalizeEndpoint(ep, DefaultLimits)
	if err == nil || !strings.Contains(err.Error(), `key "rég" contains "é"`) || strings.Contains(err.Error(), "Ã") {
		t.Fatalf("NormalizeEndpoint with metadata key rég: %v, want it to name é", err)
	}
}
