package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestXDSBootstrapPrintsAFileForTheNode(t *testing.T) {
	res := runCLI(t, nil, nil, "xds", "bootstrap", "--node", "node-a", "--region", "eu", "--zone", "eu-1a", "--server", "127.0.0.1:15011")
	if res.err != nil {
		t.Fatalf("%v\n%s", res.err, res.stderr)
	}
	var f struct {
		XDSServers []struct {
			ServerURI string `json:"server_uri"`
		} `json:"xds_servers"`
		Node struct {
			ID       string            `json:"id"`
			Locality map[string]string `json:"locality"`
		} `json:"node"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &f); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, res.stdout)
	}
	if len(f.XDSServers) != 1 || f.XDSServers[0].ServerURI != "127.0.0.1:15011" || f.Node.ID != "node-a" ||
		f.Node.Locality["region"] != "eu" || f.Node.Locality["zone"] != "eu-1a" {
		t.Fatalf("bootstrap %+v", f)
	}

	out := filepath.Join(t.TempDir(), "xds.json")
	if res := runCLI(t, nil, nil, "xds", "bootstrap", "--node", "node-a", "-o", out); res.err != nil || res.stdout != "" {
		t.Fatalf("--out: err %v, stdout %q", res.err, res.stdout)
	}
	if b, err := os.ReadFile(out); err != nil || !strings.Contains(string(b), `"id": "node-a"`) {
		t.Fatalf("--out file: %v %s", err, b)
	}
}

func TestXDSBootstrapNamesTheFlagToFix(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--node a node id is required"},
		{[]string{"--node", "n", "--server", "15010"}, `--server "15010": want host:port`},
		{[]string{"--node", "n", "--cert", "c.pem"}, "--cert the client certificate and its key go together"},
		{[]string{"--node", "n", "--cert", "c.pem", "--key", "k.pem"}, "--ca a client certificate needs the CA"},
	} {
		res := runCLI(t, nil, nil, append([]string{"xds", "bootstrap"}, tc.args...)...)
		if res.err == nil || !strings.Contains(res.err.Error(), tc.want) || res.stdout != "" {
			t.Errorf("%v: err %v, stdout %q; want an error containing %q and no output", tc.args, res.err, res.stdout, tc.want)
		}
	}
}
