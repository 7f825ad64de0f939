package regtest

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// EP is an HTTP endpoint of service svc at ip:port on node n1, zone z1,
// without an origin (the registrar fills in its own).
func EP(svc, ip string, port uint32) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
		Ports: []*registryv1.Port{{Name: "http", Port: port}}, Node: "n1", Zone: "z1",
	}
}

// Register registers e through c, failing t on an error.
func Register(t testing.TB, c registrarv1.RegistrarClient, e *registryv1.ServiceEndpoint) *registrarv1.RegisterEndpointResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: e})
	if err != nil {
		t.Fatalf("register %s %s: %v", e.Service, e.Ip, err)
	}
	return resp
}

// EtcdKey is e's v1 key (origin r1/c1 where e names none) and the endpoint
// stored there, nil when there is none.
func EtcdKey(t testing.TB, cli *clientv3.Client, e *registryv1.ServiceEndpoint) (key string, value *registryv1.ServiceEndpoint) {
	t.Helper()
	id := registry.IDOf(e)
	if id.Region == "" {
		id.Region = "r1"
	}
	if id.Cluster == "" {
		id.Cluster = "c1"
	}
	k, err := id.Key()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, k)
	if err != nil || len(resp.Kvs) == 0 {
		return k, nil
	}
	v, err := registry.DecodeEndpoint(k, resp.Kvs[0].Value)
	if err != nil {
		t.Fatalf("value at %s: %v", k, err)
	}
	return k, v
}

// MetricValue scrapes one unlabelled sample from the registrar's /metrics
// (0 if it is not there yet).
func MetricValue(t testing.TB, httpAddr, name string) float64 {
	t.Helper()
	v, _ := ScrapeMetric(t, "http://"+httpAddr+"/metrics", name)
	return v
}

// ScrapeMetric reads one unlabelled sample from a Prometheus text page.
func ScrapeMetric(t testing.TB, url, name string) (float64, bool) {
	t.Helper()
	_, body := Get(t, url)
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return v, true
		}
	}
	return 0, false
}

// Get fetches url from a registrar's HTTP endpoints: its status and body.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
