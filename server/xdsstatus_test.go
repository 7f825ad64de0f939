package server_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/xdstest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
	"github.com/aethermesh/aether/xds"
)

// TestXDSStatusEndpoint: with --xds-addr, the HTTP port serves
// /xds/status, where a real grpc-go client doing RPCs through the
// registrar's xDS shows with its node and locality, SYNCED on all four
// types; without --xds-addr there is none (404).
func TestXDSStatusEndpoint(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	s := regtest.Start(t, server.Config{EtcdEndpoints: etcd.Endpoints(), XDSAddr: "127.0.0.1:0",
		Options: registrar.Options{ClusterName: "c1", Region: "r1", Zone: "z1"}})
	b := xdstest.StartBackends(t, 1)[0]
	if _, _, err := s.Registrar().Register(&registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC,
		Ip: b.Host(), Ports: []*registryv1.Port{{Name: "grpc", Port: b.Port()}}, Zone: "z1"}); err != nil {
		t.Fatal(err)
	}
	cc := xdstest.Client(t, "web", xdstest.Bootstrap(s.XDSAddr(), "status-node", xdstest.Locality{Region: "r1", Zone: "z1"}))
	xdstest.WaitSpread(t, cc, xdstest.Only(b), 10*time.Second)

	var doc xds.StatusDocument
	wait.ForState(t, "the client SYNCED on every type in /xds/status", 10*time.Second, func() (bool, string) {
		code, body := regtest.Get(t, "http://"+s.HTTPAddr()+"/xds/status")
		if code != http.StatusOK {
			return false, body
		}
		if err := json.Unmarshal([]byte(body), &doc); err != nil {
			t.Fatalf("/xds/status is not a status document: %v\n%s", err, body)
		}
		if len(doc.Clients) != 1 {
			return false, body
		}
		for _, typ := range []string{resourcev3.ListenerType, resourcev3.RouteType, resourcev3.ClusterType, resourcev3.EndpointType} {
			if ts := doc.Clients[0].Types[typ]; ts.State != xds.Synced || ts.AckedVersion == "" {
				return false, body
			}
		}
		return true, body
	})
	c := doc.Clients[0]
	if c.Node != "status-node" || c.Variant != "sotw" || c.Service != "ads" || c.Locality == nil || c.Locality.Region != "r1" || c.Locality.Zone != "z1" {
		t.Errorf("client %+v: want status-node, sotw over ads, in r1/z1", c)
	}

	// A change pushed to the waiting client is a push latency sample (a
	// change of the service it watches: resources are versioned one by
	// one, so another service's change pushes nothing to it); the scrape
	// with it passes promtool.
	b2 := xdstest.StartBackends(t, 1)[0]
	if _, _, err := s.Registrar().Register(&registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_GRPC,
		Ip: "127.0.0.2", Ports: []*registryv1.Port{{Name: "grpc", Port: b2.Port()}}, Zone: "z1"}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "a push latency sample", 10*time.Second, func() bool {
		_, page := regtest.Get(t, "http://"+s.HTTPAddr()+"/metrics")
		return strings.Contains(page, `xds_push_latency_seconds_count{type="endpoint"}`)
	})
	tool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (%v): install it, e.g. apt-get install -y prometheus", err)
	}
	_, page := regtest.Get(t, "http://"+s.HTTPAddr()+"/metrics")
	cmd := exec.Command(tool, "check", "metrics")
	cmd.Stdin = strings.NewReader(page)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil || out.Len() > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out.String())
	}

	plain := regtest.Start(t, server.Config{EtcdEndpoints: etcd.Endpoints(), Options: registrar.Options{ClusterName: "c1", Region: "r2"}})
	if code, _ := regtest.Get(t, "http://"+plain.HTTPAddr()+"/xds/status"); code != http.StatusNotFound {
		t.Errorf("/xds/status without --xds-addr: %d, want 404", code)
	}
}
