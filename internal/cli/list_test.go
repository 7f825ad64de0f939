package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// localityFixture is fixture() (region eu: one draining endpoint in eu-1a,
// one serving in eu-1b, two serving without a zone) plus a serving endpoint
// in eu-1a and one in region us whose zone is also named eu-1a.
func localityFixture() []*registryv1.ServiceEndpoint {
	return append(fixture(),
		&registryv1.ServiceEndpoint{
			Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.1.0.1",
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}}, Node: "n9",
			Cluster: "c7", Region: "us", Zone: "eu-1a", State: registryv1.State_STATE_SERVING, Weight: 1,
		},
		&registryv1.ServiceEndpoint{
			Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.11",
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}}, Node: "n3",
			Cluster: "c1", Region: "eu", Zone: "eu-1a", State: registryv1.State_STATE_SERVING, Weight: 2,
		},
	)
}

func TestWriteLocalityTable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, region, zone, want string
	}{
		{"zone", "eu", "eu-1a", `PRIORITY  SERVICE  PROTOCOL  IP           PORTS                 NODE  CLUSTER  REGION  ZONE   STATE    WEIGHT
0         web      http      10.0.0.11    http:8080             n3    c1       eu      eu-1a  SERVING  2
1         api      grpc      2001:db8::1  admin:9091,grpc:9090  -     c1       eu      -      SERVING  3
1         web      grpc      10.0.0.9     grpc:9090             -     c1       eu      -      SERVING  1
1         web      http      10.0.0.9     http:8080             n1    c1       eu      eu-1b  SERVING  1
2         web      http      10.1.0.1     http:8080             n9    c7       us      eu-1a  SERVING  1
`},
		{"region only", "eu", "", `PRIORITY  SERVICE  PROTOCOL  IP           PORTS                 NODE  CLUSTER  REGION  ZONE   STATE    WEIGHT
0         api      grpc      2001:db8::1  admin:9091,grpc:9090  -     c1       eu      -      SERVING  3
0         web      grpc      10.0.0.9     grpc:9090             -     c1       eu      -      SERVING  1
0         web      http      10.0.0.9     http:8080             n1    c1       eu      eu-1b  SERVING  1
0         web      http      10.0.0.11    http:8080             n3    c1       eu      eu-1a  SERVING  2
2         web      http      10.1.0.1     http:8080             n9    c7       us      eu-1a  SERVING  1
`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := localityFixture()
			var buf bytes.Buffer
			if err := writeLocalityTable(&buf, registry.ByLocality(in, tc.region, tc.zone)); err != nil {
				t.Fatal(err)
			}
			if got := buf.String(); got != tc.want {
				t.Errorf("table:\n%s\nwant:\n%s", got, tc.want)
			}
			if strings.Contains(buf.String(), "DRAINING") {
				t.Error("a draining endpoint is listed")
			}
		})
	}

	var buf bytes.Buffer
	if err := writeLocalityTable(&buf, nil); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); !strings.HasPrefix(got, "PRIORITY") || strings.Count(got, "\n") != 1 {
		t.Errorf("empty table = %q, want the header only", got)
	}
}

func TestWriteLocalityJSON(t *testing.T) {
	t.Parallel()
	eps := localityFixture()
	// web 10.0.0.10 (draining, eu-1a), web grpc 10.0.0.9 (eu, no zone), web 10.1.0.1 (us).
	in := []*registryv1.ServiceEndpoint{eps[0], eps[4], eps[3]}
	var buf bytes.Buffer
	if err := writeLocalityJSON(&buf, "e:9", "eu", "eu-1a", registry.ByLocality(in, "eu", "eu-1a")); err != nil {
		t.Fatal(err)
	}
	want := `{
  "version": "e:9",
  "from_region": "eu",
  "from_zone": "eu-1a",
  "endpoints": [
    {
      "priority": 1,
      "endpoint": {
        "service": "web",
        "protocol": "PROTOCOL_GRPC",
        "ip": "10.0.0.9",
        "ports": [
          {
            "name": "grpc",
            "port": 9090
          }
        ],
        "cluster": "c1",
        "region": "eu",
        "state": "STATE_SERVING",
        "weight": 1
      }
    },
    {
      "priority": 2,
      "endpoint": {
        "service": "web",
        "protocol": "PROTOCOL_HTTP1",
        "ip": "10.1.0.1",
        "ports": [
          {
            "name": "http",
            "port": 8080
          }
        ],
        "node": "n9",
        "cluster": "c7",
        "region": "us",
        "zone": "eu-1a",
        "state": "STATE_SERVING",
        "weight": 1
      }
    }
  ]
}
`
	if got := buf.String(); got != want {
		t.Errorf("json:\n%s\nwant:\n%s", got, want)
	}

	buf.Reset()
	if err := writeLocalityJSON(&buf, "e:0", "eu", "", nil); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); got != "{\n  \"version\": \"e:0\",\n  \"from_region\": \"eu\",\n  \"endpoints\": []\n}\n" {
		t.Errorf("empty listing = %q", got)
	}
}

// TestListLocalityFlagErrors checks --from-region and --from-zone before any
// connection is made.
func TestListLocalityFlagErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"zone without region", nil, []string{"--from-zone", "eu-1a"},
			"--from-zone needs --from-region: zone names are only meaningful within a region; add --from-region REGION (or set AETHER_FROM_REGION)"},
		{"zone from env without region", map[string]string{"AETHER_FROM_ZONE": "eu-1a"}, nil, "--from-zone needs --from-region"},
		{"bad region", nil, []string{"--from-region", "eu/west"}, `--from-region: region "eu/west" must not contain '/'`},
		{"empty region", nil, []string{"--from-region", ""}, "--from-region: region must not be empty"},
		{"bad zone", nil, []string{"--from-region", "eu", "--from-zone", "-1a"}, `--from-zone: zone "-1a" must start and end with a letter or digit`},
		{"empty zone", nil, []string{"--from-region", "eu", "--from-zone="}, "--from-zone: zone must not be empty"},
		{"bad region from env", map[string]string{"AETHER_FROM_REGION": "a b"}, nil, `--from-region: region "a b" contains " "`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSentinel(t)
			args := append([]string{"list", "--registrar", s.addr(), "--timeout", "2s"}, tc.args...)
			res := runCLI(t, nil, tc.env, args...)
			if res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
				t.Fatalf("error %v\nwant it to contain %q", res.err, tc.want)
			}
			if n := s.conns.Load(); n != 0 {
				t.Errorf("%d connection(s) to the registrar; flags must be checked first", n)
			}
			if res.stdout != "" || res.stderr != "" {
				t.Errorf("output on error: stdout %q, stderr %q", res.stdout, res.stderr)
			}
		})
	}
}

func TestListLocalityAgainstRegistrar(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	// The registrar of eu/c1 holds fixture() and web 10.0.0.11; web 10.1.0.1
	// belongs to cluster c7 of region us, so its own registrar writes it and
	// eu's learns of it through etcd, as in production.
	eps := localityFixture()
	eu := startRegistrar(t, etcd)
	us := startRegistrar(t, etcd, func(o *server.Config) { o.Region, o.ClusterName = "us", "c7" })
	us.register(t, eps[4])
	eu.register(t, append(eps[:4:4], eps[5])...)
	waitFor(t, "eu's registrar lists us's endpoint", 10*time.Second, func() bool {
		all, _ := eu.list(t)
		return len(all) == 6
	})

	res := runCLI(t, nil, nil, "list", "--registrar", eu.addr(), "--from-region", "eu", "--from-zone", "eu-1a")
	if res.err != nil {
		t.Fatal(res.err)
	}
	want := `PRIORITY  SERVICE  PROTOCOL  IP           PORTS                 NODE  CLUSTER  REGION  ZONE   STATE    WEIGHT
0         web      http      10.0.0.11    http:8080             n3    c1       eu      eu-1a  SERVING  2
1         api      grpc      2001:db8::1  admin:9091,grpc:9090  -     c1       eu      -      SERVING  3
1         web      grpc      10.0.0.9     grpc:9090             -     c1       eu      -      SERVING  1
1         web      http      10.0.0.9     http:8080             n1    c1       eu      eu-1b  SERVING  1
2         web      http      10.1.0.1     http:8080             n9    c7       us      eu-1a  SERVING  1
`
	if res.stdout != want {
		t.Errorf("table:\n%s\nwant:\n%s", res.stdout, want)
	}

	// From the environment, as JSON.
	res = runCLI(t, nil, map[string]string{"AETHER_FROM_REGION": "eu", "AETHER_OUTPUT": "json"}, "list", "--registrar", eu.addr())
	if res.err != nil {
		t.Fatal(res.err)
	}
	var doc struct {
		Version    string  `json:"version"`
		FromRegion string  `json:"from_region"`
		FromZone   *string `json:"from_zone"`
		Endpoints  []struct {
			Priority *int `json:"priority"`
			Endpoint struct {
				IP      string `json:"ip"`
				Cluster string `json:"cluster"`
			} `json:"endpoint"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &doc); err != nil {
		t.Fatalf("%v\n%s", err, res.stdout)
	}
	var got []string
	for _, e := range doc.Endpoints {
		if e.Priority == nil {
			t.Fatalf("endpoint without priority:\n%s", res.stdout)
		}
		got = append(got, fmt.Sprintf("%d@%s/%s", *e.Priority, e.Endpoint.Cluster, e.Endpoint.IP))
	}
	_, version := eu.list(t)
	wantEPs := "0@c1/2001:db8::1 0@c1/10.0.0.9 0@c1/10.0.0.9 0@c1/10.0.0.11 2@c7/10.1.0.1"
	if doc.Version != version || doc.FromRegion != "eu" || doc.FromZone != nil || strings.Join(got, " ") != wantEPs {
		t.Errorf("json: version %q region %q, endpoints %s\nwant version %q, endpoints %s\n%s", doc.Version, doc.FromRegion, strings.Join(got, " "), version, wantEPs, res.stdout)
	}

	// Without the flags, list is unchanged: every endpoint, no priority.
	res = runCLI(t, nil, nil, "list", "--registrar", eu.addr(), "-o", "json")
	if res.err != nil || strings.Contains(res.stdout, "priority") || strings.Count(res.stdout, `"service"`) != 6 {
		t.Errorf("plain list: %v\n%s", res.err, res.stdout)
	}
}
