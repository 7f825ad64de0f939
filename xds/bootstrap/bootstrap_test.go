package bootstrap_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/xds"

	"github.com/aethermesh/aether/xds/bootstrap"
)

// buildErr is what grpc-go's xds resolver says of bootstrap b when a
// channel first uses it: it parses the file (and builds its channel
// credentials) only then, so the test dials a channel through it and
// makes one call. A file it cannot take fails the call with "failed to
// create xds-client" and the parser's error; a file it takes gets as far
// as its xDS client going for the server the file names, which no server
// answers here, so the call fails otherwise (the stream's error, the
// server's name unresolved) or waits for its deadline.
func buildErr(t *testing.T, b []byte) error {
	t.Helper()
	rb, err := xds.NewXDSResolverWithConfigForTesting(b)
	if err != nil {
		return err
	}
	cc, err := grpc.NewClient("xds:///web", grpc.WithResolvers(rb), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = cc.Invoke(ctx, "/grpc.health.v1.Health/Check", &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{})
	if err == nil || !strings.Contains(err.Error(), "failed to create xds-client") {
		return nil // the resolver took the file and went for its server
	}
	return err
}

// grpc-go itself parses what JSON writes, so a field it does not accept
// fails here.
func TestGRPCAcceptsTheBootstrap(t *testing.T) {
	for _, c := range []bootstrap.Config{
		{Server: "127.0.0.1:15010", Node: "node-a"},
		{Server: "127.0.0.1:15010", Node: "node-a", Region: "eu", Zone: "eu-1a"},
		{Server: "registrar.example:9445", Node: "gw-1", Region: "eu", CAFile: "/etc/aether/ca.pem", CertFile: "/etc/aether/gw.pem", KeyFile: "/etc/aether/gw-key.pem"},
	} {
		b, err := bootstrap.JSON(c)
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if err := buildErr(t, b); err != nil {
			t.Errorf("%+v: grpc-go refuses the bootstrap: %v\n%s", c, err, b)
		}
	}
}

// The check above can fail: grpc-go refuses a file whose channel
// credentials it cannot build.
func TestGRPCRefusesABrokenBootstrap(t *testing.T) {
	b, err := bootstrap.JSON(bootstrap.Config{Server: "127.0.0.1:15010", Node: "n"})
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(b), `"insecure"`, `"no-such-credentials"`, 1)
	if err := buildErr(t, []byte(broken)); err == nil || !strings.Contains(err.Error(), "channel_creds") {
		t.Fatalf("grpc-go on a bootstrap with unknown channel credentials: got %v, want its channel_creds error", err)
	}
}

func TestBootstrapSaysWhatWasAsked(t *testing.T) {
	b, err := bootstrap.JSON(bootstrap.Config{Server: "127.0.0.1:15010", Node: "node-a", Zone: "z1", CAFile: "ca.pem"})
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		XDSServers []struct {
			ServerURI    string `json:"server_uri"`
			ChannelCreds []struct {
				Type   string            `json:"type"`
				Config map[string]string `json:"config"`
			} `json:"channel_creds"`
		} `json:"xds_servers"`
		Node struct {
			ID       string            `json:"id"`
			Locality map[string]string `json:"locality"`
		} `json:"node"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.XDSServers) != 1 || f.XDSServers[0].ServerURI != "127.0.0.1:15010" {
		t.Fatalf("servers %+v", f.XDSServers)
	}
	if cc := f.XDSServers[0].ChannelCreds; len(cc) != 1 || cc[0].Type != "tls" || cc[0].Config["ca_certificate_file"] != "ca.pem" {
		t.Errorf("channel creds %+v, want tls with the CA", cc)
	}
	if f.Node.ID != "node-a" || f.Node.Locality["zone"] != "z1" || f.Node.Locality["region"] != "" {
		t.Errorf("node %+v", f.Node)
	}
}

func TestBootstrapRefusesWhatCannotWork(t *testing.T) {
	for _, tc := range []struct {
		c    bootstrap.Config
		want string
	}{
		{bootstrap.Config{Server: "127.0.0.1:15010"}, "node: a node id is required"},
		{bootstrap.Config{Server: "15010", Node: "n"}, `server: "15010": want host:port`},
		{bootstrap.Config{Server: ":15010", Node: "n"}, `server: ":15010": want host:port`},
		{bootstrap.Config{Server: "h:0", Node: "n"}, "server: \"h:0\": the port must be 1-65535"},
		{bootstrap.Config{Server: "h:1", Node: "n", CertFile: "c"}, "cert: the client certificate and its key go together"},
		{bootstrap.Config{Server: "h:1", Node: "n", CertFile: "c", KeyFile: "k"}, "ca: a client certificate needs the CA"},
	} {
		_, err := bootstrap.JSON(tc.c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want %q", tc.c, err, tc.want)
		}
	}
}
