package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// Node calls go to the registrar in use and, while it cannot be reached,
// to the next; a heartbeat of an unknown node says NotFound (announce
// again), a second leave is no error, and a node other than the client's
// is refused before anything is sent.
func TestNodeCallsFailOverAndReportALapsedLease(t *testing.T) {
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd, "", func(o *server.Config) { o.NodeTTL = 3 * time.Second })
	// The first address has nothing behind it: a call made while the
	// stream is still on it moves on to the next, one made after the
	// stream moved starts there; either way it is answered.
	c := newClient(t, Config{Addrs: []string{freeAddr(t), r.GRPCAddr()}, Node: "n1", Services: []string{"web"}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	direct := dial(t, r.GRPCAddr())
	nodes := func() []string {
		resp, err := direct.ListNodes(ctx, &registrarv1.ListNodesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, n := range resp.GetNodes() {
			out = append(out, n.GetNode().GetName()+"/"+n.GetNode().GetZone())
		}
		return out
	}

	if err := c.Heartbeat(ctx); status.Code(err) != codes.NotFound {
		t.Fatalf("heartbeat before announcing: %v, want NotFound", err)
	}
	iv, err := c.AnnounceNode(ctx, &registryv1.Node{Zone: "z1"})
	if err != nil {
		t.Fatal(err)
	}
	if iv != time.Second {
		t.Errorf("heartbeat interval %v, want a third of the 3s TTL", iv)
	}
	if got := nodes(); len(got) != 1 || got[0] != "n1/z1" {
		t.Fatalf("nodes %v, want [n1/z1]", got)
	}
	if err := c.Heartbeat(ctx); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	if err := c.LeaveNode(ctx); err != nil {
		t.Fatalf("leave: %v", err)
	}
	if got := nodes(); len(got) != 0 {
		t.Fatalf("nodes after leaving: %v", got)
	}
	if err := c.LeaveNode(ctx); err != nil {
		t.Errorf("second leave: %v, want nil (gone already)", err)
	}
	if err := c.Heartbeat(ctx); status.Code(err) != codes.NotFound || Permanent(err) {
		t.Errorf("heartbeat after leaving: %v, want NotFound, not permanent", err)
	}

	var fe *registry.FieldError
	for what, n := range map[string]*registryv1.Node{
		"another node":   {Name: "n2"},
		"another region": {Region: "r2"},
	} {
		if _, err := c.AnnounceNode(ctx, n); !errors.As(err, &fe) || !Permanent(err) {
			t.Errorf("%s: %v, want a permanent field error", what, err)
		}
	}
	if got := nodes(); len(got) != 0 {
		t.Errorf("refused announces reached the registrar: %v", got)
	}
	// A client that names no node has none to keep alive.
	bare, err := New(Config{Addrs: []string{r.GRPCAddr()}, Region: "r1", Cluster: "c1", Services: []string{"web"}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close()
	if err := bare.Heartbeat(ctx); !errors.As(err, &fe) || !Permanent(err) {
		t.Errorf("heartbeat without Config.Node: %v, want a permanent field error", err)
	}
}
