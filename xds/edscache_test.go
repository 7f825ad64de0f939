package xds

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/envoyproxy/go-control-plane/pkg/server/stream/v3"
	"google.golang.org/protobuf/proto"
)

// edsClient plays one stream against one cache as go-control-plane's
// servers do (stream.Subscription kept by the server, the watch
// cancelled before each new one, a response's known versions recorded
// when it is sent), so that the edsCache and a LinearCache can be given
// the same script and their answers compared.
type edsClient struct {
	c      resCache
	delta  bool
	sub    stream.Subscription
	out    chan cachev3.Response
	dout   chan cachev3.DeltaResponse
	cancel func()
	ver    string // sotw: the version of the last response taken
	nonce  string // delta: "" until the first response
	got    []string
}

func (e *edsClient) watch(t *testing.T, names []string, sub, unsub []string) {
	t.Helper()
	var err error
	if e.delta {
		req := &discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: sub, ResourceNamesUnsubscribe: unsub, ResponseNonce: e.nonce}
		e.cancel, err = e.c.CreateDeltaWatch(req, e.sub, e.dout)
	} else {
		req := &discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names, VersionInfo: e.ver}
		e.cancel, err = e.c.CreateWatch(req, e.sub, e.out)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func (e *edsClient) stop() {
	if e.cancel != nil {
		e.cancel()
	}
	e.cancel = nil
}

// take records the response waiting, if any, as a line, and the known
// versions the server would keep (record: the server sent it; else it
// dropped it, as the ordered ADS server does with a response of the type
// it is about to re-watch).
func (e *edsClient) take(t *testing.T, record bool) bool {
	t.Helper()
	if e.delta {
		select {
		case r := <-e.dout:
			d, err := r.GetDeltaDiscoveryResponse()
			if err != nil {
				t.Fatal(err)
			}
			var rs []string
			for _, x := range d.GetResources() {
				rs = append(rs, x.GetName()+"@"+x.GetVersion()+"="+claName(t, x.GetResource().GetValue()))
			}
			slices.Sort(rs)
			rm := slices.Clone(d.GetRemovedResources())
			slices.Sort(rm)
			e.got = append(e.got, fmt.Sprintf("delta %s res %v removed %v next %v", d.GetSystemVersionInfo(), rs, rm, sortedMap(r.GetNextVersionMap())))
			if record {
				e.sub.SetReturnedResources(r.GetNextVersionMap())
				e.nonce = "n" + d.GetSystemVersionInfo()
			}
			return true
		default:
			return false
		}
	}
	select {
	case r := <-e.out:
		d, err := r.GetDiscoveryResponse()
		if err != nil {
			t.Fatal(err)
		}
		var rs []string
		for _, a := range d.GetResources() {
			rs = append(rs, claName(t, a.GetValue()))
		}
		slices.Sort(rs)
		e.got = append(e.got, fmt.Sprintf("sotw %s res %v known %v", d.GetVersionInfo(), rs, sortedMap(r.GetReturnedResources())))
		if record {
			e.sub.SetReturnedResources(r.GetReturnedResources())
			e.ver = d.GetVersionInfo()
		}
		return true
	default:
		return false
	}
}

func claName(t *testing.T, b []byte) string {
	var cla endpointv3.ClusterLoadAssignment
	if err := proto.Unmarshal(b, &cla); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s/%d", cla.GetClusterName(), len(cla.GetEndpoints()))
}

func sortedMap(m map[string]string) string {
	var kv []string
	for k, v := range m {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

// TestEDSCacheAnswersAsALinearCache drives an edsCache and a LinearCache
// with the same random script (updates and deletions of resources;
// streams that ACK, re-request with other names, have a response dropped,
// NACK-like re-requests, subscribe to everything), in state of the world
// and in delta, and requires the same answers from both, step by step:
// the edsCache keeps its watches across ACKs and computes only what
// moved, and must not answer differently for it.
func TestEDSCacheAnswersAsALinearCache(t *testing.T) {
	for _, delta := range []bool{false, true} {
		t.Run(map[bool]string{false: "sotw", true: "delta"}[delta], func(t *testing.T) {
			for seed := range uint64(30) {
				compareScript(t, delta, seed)
			}
		})
	}
}

func compareScript(t *testing.T, delta bool, seed uint64) {
	rnd := rand.New(rand.NewPCG(seed, 7))
	const prefix = "E-e0-"
	lin := cachev3.NewLinearCache(resourcev3.EndpointType, cachev3.WithVersionPrefix(prefix), cachev3.WithLogger(cacheLogger{slog.New(slog.DiscardHandler)}))
	eds := newEDSCache(resourcev3.EndpointType, prefix)
	names := []string{"a", "b", "c", "d", "e", "f"}
	pick := func() []string {
		var out []string
		for _, n := range names {
			if rnd.IntN(2) == 0 {
				out = append(out, n)
			}
		}
		if len(out) == 0 && rnd.IntN(4) != 0 {
			out = []string{names[rnd.IntN(len(names))]}
		}
		return out
	}
	type pair struct {
		l, e  *edsClient
		names []string
	}
	newPair := func() *pair {
		n := pick()
		p := &pair{names: n}
		for _, c := range []*edsClient{{c: lin}, {c: eds}} {
			c.delta = delta
			if delta {
				c.sub = stream.NewDeltaSubscription(n, nil, nil, true)
				c.dout = make(chan cachev3.DeltaResponse, 8)
			} else {
				c.sub = stream.NewSotwSubscription(n, true)
				c.out = make(chan cachev3.Response, 8)
			}
			c.watch(t, n, n, nil)
			if p.l == nil {
				p.l = c
			} else {
				p.e = c
			}
		}
		return p
	}
	var streams []*pair
	for range 3 {
		streams = append(streams, newPair())
	}
	check := func(step int, what string) {
		t.Helper()
		for i, p := range streams {
			if !slices.Equal(p.l.got, p.e.got) {
				t.Fatalf("seed %d step %d (%s) stream %d: LinearCache answered\n  %s\nedsCache answered\n  %s", seed, step, what, i,
					strings.Join(p.l.got, "\n  "), strings.Join(p.e.got, "\n  "))
			}
		}
	}
	gen := 0
	for step := range 60 {
		var what string
		switch op := rnd.IntN(10); {
		case op < 4: // the feed writes
			put := map[string]types.Resource{}
			var del []string
			for _, n := range names {
				switch rnd.IntN(5) {
				case 0:
					gen++
					cla := &endpointv3.ClusterLoadAssignment{ClusterName: n}
					for range rnd.IntN(3) {
						cla.Endpoints = append(cla.Endpoints, &endpointv3.LocalityLbEndpoints{Priority: uint32(gen)})
					}
					put[n] = cla
				case 1:
					del = append(del, n)
				}
			}
			if len(put) == 0 && len(del) == 0 {
				continue
			}
			what = fmt.Sprintf("update %v delete %v", slices.Sorted(maps.Keys(put)), del)
			for _, c := range []resCache{lin, eds} {
				if err := c.UpdateResources(put, del); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range streams {
				if rnd.IntN(4) != 0 {
					p.l.take(t, true)
					p.e.take(t, true)
					continue
				}
				// The response is dropped, not sent: a request of the
				// stream came first (the ordered ADS server drops a
				// pending response of the type it re-watches), which
				// knows the versions before it.
				p.l.take(t, false)
				p.e.take(t, false)
				rewatch(t, p.l, p.names)
				rewatch(t, p.e, p.names)
			}
		case op < 7: // a stream ACKs (or re-requests the same names)
			p := streams[rnd.IntN(len(streams))]
			what = "ack"
			rewatch(t, p.l, p.names)
			rewatch(t, p.e, p.names)
		case op < 8: // a stream changes its names
			p := streams[rnd.IntN(len(streams))]
			n := pick()
			var sub, unsub []string
			for _, x := range n {
				if !slices.Contains(p.names, x) {
					sub = append(sub, x)
				}
			}
			for _, x := range p.names {
				if !slices.Contains(n, x) {
					unsub = append(unsub, x)
				}
			}
			what = fmt.Sprintf("names %v -> %v", p.names, n)
			p.names = n
			for _, c := range []*edsClient{p.l, p.e} {
				c.stop()
				if delta {
					c.sub.UpdateResourceSubscriptions(sub, unsub)
				} else {
					c.sub.SetResourceSubscription(n)
				}
				c.watch(t, n, sub, unsub)
				c.take(t, true)
			}
		case op < 9: // a stream ends, a new one comes
			i := rnd.IntN(len(streams))
			what = "reconnect"
			streams[i].l.stop()
			streams[i].e.stop()
			streams[i] = newPair()
			streams[i].l.take(t, true)
			streams[i].e.take(t, true)
		default: // nothing: a step for the answers of a new stream
			what = "none"
			for _, p := range streams {
				p.l.take(t, true)
				p.e.take(t, true)
			}
		}
		check(step, what)
	}
	// The edsCache's registrations: one per live stream (the ended ones
	// parked until the sweep), never one per request.
	if reg, _ := eds.watches(); reg > 3+60 {
		t.Fatalf("seed %d: %d registrations for 3 streams", seed, reg)
	}
}

// rewatch is a request of the same names: cancel, the server's
// subscription update, a new watch, its answer taken.
func rewatch(t *testing.T, c *edsClient, names []string) {
	t.Helper()
	c.stop()
	if c.delta {
		c.sub.UpdateResourceSubscriptions(nil, nil)
	} else {
		c.sub.SetResourceSubscription(names)
	}
	c.watch(t, names, nil, nil)
	c.take(t, true)
}
