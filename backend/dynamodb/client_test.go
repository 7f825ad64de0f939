package dynamodb

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testutil/dynalite"
)

// A loopback endpoint with no credentials anywhere in the SDK's chain
// gets placeholder ones (a local server only checks that requests are
// signed): NewClient's client creates a table on dynalite. A remote
// endpoint gets no such fallback.
func TestLocalEndpointNeedsNoCredentials(t *testing.T) {
	none := filepath.Join(t.TempDir(), "none")
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "", "AWS_PROFILE": "",
		"AWS_SHARED_CREDENTIALS_FILE": none, "AWS_CONFIG_FILE": none,
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_WEB_IDENTITY_TOKEN_FILE": "", "AWS_CONTAINER_CREDENTIALS_FULL_URI": "", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "",
	} {
		t.Setenv(k, v)
	}
	d := dynalite.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli, err := NewClient(ctx, Config{Table: "aether", Region: "us-east-1", Endpoint: d.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	if err := CreateTable(ctx, cli, "aether", 2); err != nil {
		t.Fatalf("create table through a client without credentials in the chain: %v", err)
	}

	remote, err := NewClient(ctx, Config{Table: "aether", Region: "us-east-1", Endpoint: "http://192.0.2.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Options().Credentials.Retrieve(ctx); err == nil || !strings.Contains(err.Error(), "credentials") {
		t.Fatalf("a remote endpoint's client found credentials (%v): the fallback is for loopback only", err)
	}
}
