package xdstest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
)

// Node is the xDS Node a probe sends: the same id and locality a bootstrap
// gives grpc-go.
func Node(id string, l Locality) *core.Node {
	return &core.Node{Id: id, Locality: &core.Locality{Region: l.Region, Zone: l.Zone}}
}

// Delta is a client of the incremental xDS protocol over one real
// DeltaAggregatedResources stream (ADS): it subscribes and unsubscribes
// resource names per type, receives responses, ACKs each one (or NACKs it
// on demand) and keeps, per type, the resources the server has told it it
// holds. grpc-go speaks only state-of-the-world xDS, so this is what tests
// the delta side of a server with a client that speaks it.
//
// Its methods are called from the test's goroutine; one goroutine reads
// the stream into a channel so that Next can wait with a bound.
type Delta struct {
	t      testing.TB
	node   *core.Node
	stream discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient
	recv   chan *discovery.DeltaDiscoveryResponse
	done   chan struct{}

	mu        sync.Mutex
	recvErr   error
	sentNode  bool
	responses []*discovery.DeltaDiscoveryResponse
	// held[typeURL][name] is the resource as last sent; a name leaves it
	// when a response lists it in removed_resources.
	held map[string]map[string]*discovery.Resource
}

// DeltaProbe opens a DeltaAggregatedResources stream to the ADS server at
// addr as node, closed on t.Cleanup.
func DeltaProbe(t testing.TB, addr string, node *core.Node) *Delta {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		cancel()
		cc.Close()
		t.Fatalf("open delta ADS stream to %s: %v", addr, err)
	}
	d := &Delta{
		t: t, node: node, stream: stream,
		recv: make(chan *discovery.DeltaDiscoveryResponse, 64),
		done: make(chan struct{}),
		held: map[string]map[string]*discovery.Resource{},
	}
	go func() {
		defer close(d.done)
		for {
			resp, err := stream.Recv()
			if err != nil {
				d.mu.Lock()
				d.recvErr = err
				d.mu.Unlock()
				close(d.recv)
				return
			}
			select {
			case d.recv <- resp:
			case <-ctx.Done(): // cleanup while nobody reads
				close(d.recv)
				return
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-d.done
		cc.Close()
	})
	return d
}

// send sends one request; the node goes on the first request of the
// stream only, as the protocol allows and as Envoy does, so a server that
// forgets the node of a stream after its first request is caught.
func (d *Delta) send(req *discovery.DeltaDiscoveryRequest) {
	d.t.Helper()
	d.mu.Lock()
	if !d.sentNode {
		req.Node = d.node
		d.sentNode = true
	}
	d.mu.Unlock()
	if err := d.stream.Send(req); err != nil {
		d.t.Fatalf("delta send %s: %v", req.GetTypeUrl(), err)
	}
}

// Subscribe adds names to the probe's subscription of typeURL. A first
// request of a type with no names is a wildcard subscription (the legacy
// meaning the protocol keeps for LDS and CDS).
func (d *Delta) Subscribe(typeURL string, names ...string) {
	d.t.Helper()
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesSubscribe: names})
}

// Unsubscribe removes names from the probe's subscription of typeURL. The
// server sends nothing for them again; the protocol has the client forget
// them itself, so the probe drops them from Held at once.
func (d *Delta) Unsubscribe(typeURL string, names ...string) {
	d.t.Helper()
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: typeURL, ResourceNamesUnsubscribe: names})
	d.mu.Lock()
	for _, n := range names {
		delete(d.held[typeURL], n)
	}
	d.mu.Unlock()
}

// Next waits up to timeout for the next response (of any type), records
// it, applies it to Held and ACKs it: a request of its type echoing its
// nonce with no error_detail.
func (d *Delta) Next(timeout time.Duration) *discovery.DeltaDiscoveryResponse {
	d.t.Helper()
	resp := d.next(timeout)
	d.apply(resp)
	d.send(&discovery.DeltaDiscoveryRequest{TypeUrl: resp.GetTypeUrl(), ResponseNonce: resp.GetNonce()})
	return resp
}

// NextNACK is Next that rejects the response instead: the request echoes
// its nonce with error_detail (INVALID_ARGUMENT, detail), and the response
// is not applied to Held, as a client keeps its previous config.
func (d *Delta) NextNACK(timeout time.Duration, detail string) *discovery.DeltaDiscoveryResponse {
	d.t.Helper()
	resp := d.next(timeout)
	d.send(&discovery.DeltaDiscoveryRequest{
		TypeUrl:       resp.GetTypeUrl(),
		ResponseNonce: resp.GetNonce(),
		ErrorDetail:   &status.Status{Code: int32(codes.InvalidArgument), Message: detail},
	})
	return resp
}

// NextOf is Next for a response of typeURL: responses of other types that
// come first are ACKed and applied on the way.
func (d *Delta) NextOf(typeURL string, timeout time.Duration) *discovery.DeltaDiscoveryResponse {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		resp := d.Next(time.Until(deadline))
		if resp.GetTypeUrl() == typeURL {
			return resp
		}
	}
}

func (d *Delta) next(timeout time.Duration) *discovery.DeltaDiscoveryResponse {
	d.t.Helper()
	select {
	case resp, ok := <-d.recv:
		if !ok {
			d.mu.Lock()
			err := d.recvErr
			d.mu.Unlock()
			d.t.Fatalf("delta stream ended: %v", err)
		}
		d.mu.Lock()
		d.responses = append(d.responses, resp)
		d.mu.Unlock()
		return resp
	case <-time.After(timeout):
		d.t.Fatalf("no delta response within %v (held %s)", timeout, d.describe())
		return nil
	}
}

func (d *Delta) apply(resp *discovery.DeltaDiscoveryResponse) {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.held[resp.GetTypeUrl()]
	if h == nil {
		h = map[string]*discovery.Resource{}
		d.held[resp.GetTypeUrl()] = h
	}
	for _, r := range resp.GetResources() {
		h[r.GetName()] = r
	}
	for _, n := range resp.GetRemovedResources() {
		delete(h, n)
	}
}

// Held is the resources of typeURL the probe holds, by name.
func (d *Delta) Held(typeURL string) map[string]*discovery.Resource {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.held[typeURL])
}

// Responses is every response received so far, in order.
func (d *Delta) Responses() []*discovery.DeltaDiscoveryResponse {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.responses)
}

// Names is the names a delta response carries, sorted.
func Names(resp *discovery.DeltaDiscoveryResponse) []string {
	var ns []string
	for _, r := range resp.GetResources() {
		ns = append(ns, r.GetName())
	}
	slices.Sort(ns)
	return ns
}

func (d *Delta) describe() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	s := "{"
	for _, typ := range slices.Sorted(maps.Keys(d.held)) {
		s += fmt.Sprintf(" %s:%v", typ, slices.Sorted(maps.Keys(d.held[typ])))
	}
	return s + " }"
}
