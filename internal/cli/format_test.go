package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// fixture endpoints, deliberately out of order.
func fixture() []*registryv1.ServiceEndpoint {
	ts := timestamppb.New(time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC))
	return []*registryv1.ServiceEndpoint{
		{
			Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.10",
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}}, Node: "n2",
			Cluster: "c1", Region: "eu", Zone: "eu-1a", State: registryv1.State_STATE_DRAINING, Weight: 1,
		},
		{
			Service: "api", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "2001:db8::1",
			Ports:   []*registryv1.Port{{Name: "admin", Port: 9091}, {Name: "grpc", Port: 9090}},
			Cluster: "c1", Region: "eu", State: registryv1.State_STATE_SERVING, Weight: 3,
			Metadata:  map[string]string{"version": "1.4.2", "team": "core"},
			CreatedAt: ts, UpdatedAt: ts,
		},
		{
			Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.9",
			Ports: []*registryv1.Port{{Name: "http", Port: 8080}}, Node: "n1",
			Cluster: "c1", Region: "eu", Zone: "eu-1b", State: registryv1.State_STATE_SERVING, Weight: 1,
		},
		{
			Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "10.0.0.9",
			Ports:   []*registryv1.Port{{Name: "grpc", Port: 9090}},
			Cluster: "c1", Region: "eu", State: registryv1.State_STATE_SERVING, Weight: 1,
		},
	}
}

func TestWriteTable(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	in := fixture()
	if err := writeTable(&buf, in); err != nil {
		t.Fatal(err)
	}
	want := `SERVICE  PROTOCOL  IP           PORTS                 NODE  CLUSTER  REGION  ZONE   STATE     WEIGHT
api      grpc      2001:db8::1  admin:9091,grpc:9090  -     c1       eu      -      SERVING   3
web      grpc      10.0.0.9     grpc:9090             -     c1       eu      -      SERVING   1
web      http      10.0.0.9     http:8080             n1    c1       eu      eu-1b  SERVING   1
web      http      10.0.0.10    http:8080             n2    c1       eu      eu-1a  DRAINING  1
`
	if got := buf.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	if in[0].GetIp() != "10.0.0.10" {
		t.Error("writeTable reordered its input")
	}

	buf.Reset()
	if err := writeTable(&buf, nil); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); !strings.HasPrefix(got, "SERVICE") || strings.Count(got, "\n") != 1 {
		t.Errorf("empty table = %q, want the header only", got)
	}
}

func TestWriteListJSON(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := writeListJSON(&buf, "abc:42", fixture()[:2]); err != nil {
		t.Fatal(err)
	}
	want := `{
  "version": "abc:42",
  "endpoints": [
    {
      "service": "api",
      "protocol": "PROTOCOL_GRPC",
      "ip": "2001:db8::1",
      "ports": [
        {
          "name": "admin",
          "port": 9091
        },
        {
          "name": "grpc",
          "port": 9090
        }
      ],
      "cluster": "c1",
      "region": "eu",
      "state": "STATE_SERVING",
      "weight": 3,
      "metadata": {
        "team": "core",
        "version": "1.4.2"
      },
      "created_at": "2024-01-02T03:04:05Z",
      "updated_at": "2024-01-02T03:04:05Z"
    },
    {
      "service": "web",
      "protocol": "PROTOCOL_HTTP1",
      "ip": "10.0.0.10",
      "ports": [
        {
          "name": "http",
          "port": 8080
        }
      ],
      "node": "n2",
      "cluster": "c1",
      "region": "eu",
      "zone": "eu-1a",
      "state": "STATE_DRAINING",
      "weight": 1
    }
  ]
}
`
	if got := buf.String(); got != want {
		t.Errorf("json:\n%s\nwant:\n%s", got, want)
	}

	buf.Reset()
	if err := writeListJSON(&buf, "abc:0", nil); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); got != "{\n  \"version\": \"abc:0\",\n  \"endpoints\": []\n}\n" {
		t.Errorf("empty listing = %q", got)
	}
}

func TestEventJSON(t *testing.T) {
	t.Parallel()
	ep := fixture()[3]
	tests := []struct {
		name string
		ev   *registrarv1.EndpointEvent
		want string
	}{
		{"empty snapshot", &registrarv1.EndpointEvent{}, `{"type":"FULL_SNAPSHOT"}`},
		{"snapshot part", &registrarv1.EndpointEvent{Version: "e:5", Sequence: 5, Endpoints: []*registryv1.ServiceEndpoint{ep}, SnapshotContinues: true},
			`{"type":"FULL_SNAPSHOT","version":"e:5","sequence":"5","endpoints":[{"service":"web","protocol":"PROTOCOL_GRPC","ip":"10.0.0.9","ports":[{"name":"grpc","port":9090}],"cluster":"c1","region":"eu","state":"STATE_SERVING","weight":1}],"snapshot_continues":true}`},
		{"added", &registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_ENDPOINT_ADDED, Endpoint: ep, Version: "e:6", Sequence: 6},
			`{"type":"ENDPOINT_ADDED","endpoint":{"service":"web","protocol":"PROTOCOL_GRPC","ip":"10.0.0.9","ports":[{"name":"grpc","port":9090}],"cluster":"c1","region":"eu","state":"STATE_SERVING","weight":1},"version":"e:6","sequence":"6"}`},
		{"progress", &registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_PROGRESS, Version: "e:6", Sequence: 6},
			`{"type":"PROGRESS","version":"e:6","sequence":"6"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := eventJSON(tc.ev)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("got  %s\nwant %s", b, tc.want)
			}
			if !json.Valid(b) || bytes.ContainsRune(b, '\n') {
				t.Errorf("not one line of valid JSON: %s", b)
			}
		})
	}
}

func TestWatchPrinter(t *testing.T) {
	t.Parallel()
	eps := fixture()
	events := []*registrarv1.EndpointEvent{
		{Version: "e:3", Endpoints: eps[:2], SnapshotContinues: true},
		{Version: "e:3", Endpoints: eps[2:]},
		{Type: registrarv1.EndpointEvent_PROGRESS, Version: "e:3"},
		{Type: registrarv1.EndpointEvent_ENDPOINT_ADDED, Endpoint: eps[1], Version: "e:4"},
		{Type: registrarv1.EndpointEvent_ENDPOINT_UPDATED, Endpoint: eps[0], Version: "e:5"},
		{Type: registrarv1.EndpointEvent_ENDPOINT_REMOVED, Endpoint: eps[2], Version: "e:6"},
		{Type: registrarv1.EndpointEvent_PROGRESS, Version: "e:7"},
		{Version: "e:8", Endpoints: eps[:1], SnapshotContinues: true},
	}

	t.Run("text", func(t *testing.T) {
		t.Parallel()
		var buf bytes.Buffer
		p := &watchPrinter{w: &buf}
		var versions []string
		for _, ev := range events {
			if err := p.handle(ev); err != nil {
				t.Fatal(err)
			}
			versions = append(versions, p.lastVersion)
		}
		want := `SNAPSHOT 4 endpoints v=e:3
  api 2001:db8::1 (grpc) admin:9091,grpc:9090 SERVING
  web 10.0.0.9 (grpc) grpc:9090 SERVING
  web 10.0.0.9 (http) http:8080 SERVING
  web 10.0.0.10 (http) http:8080 DRAINING
ADDED api 2001:db8::1 (grpc) admin:9091,grpc:9090 SERVING v=e:4
UPDATED web 10.0.0.10 (http) http:8080 DRAINING v=e:5
REMOVED web 10.0.0.9 (http) http:8080 SERVING v=e:6
`
		if got := buf.String(); got != want {
			t.Errorf("text:\n%s\nwant:\n%s", got, want)
		}
		// A snapshot counts as applied only once its last part arrived.
		wantVersions := "|e:3|e:3|e:4|e:5|e:6|e:7|e:7"
		if got := strings.Join(versions, "|"); got != wantVersions {
			t.Errorf("resume versions %q, want %q", got, wantVersions)
		}
	})

	t.Run("json", func(t *testing.T) {
		t.Parallel()
		var buf bytes.Buffer
		p := &watchPrinter{w: &buf, json: true}
		for _, ev := range events {
			if err := p.handle(ev); err != nil {
				t.Fatal(err)
			}
		}
		lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
		if len(lines) != len(events) {
			t.Fatalf("%d lines for %d events:\n%s", len(lines), len(events), buf.String())
		}
		var first struct {
			Type              string            `json:"type"`
			Endpoints         []json.RawMessage `json:"endpoints"`
			SnapshotContinues bool              `json:"snapshot_continues"`
		}
		if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
			t.Fatal(err)
		}
		if first.Type != "FULL_SNAPSHOT" || len(first.Endpoints) != 2 || !first.SnapshotContinues {
			t.Errorf("first line %s", lines[0])
		}
		if p.lastVersion != "e:7" {
			t.Errorf("lastVersion %q, want e:7", p.lastVersion)
		}
	})
}
