package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// XDSFanoutConfig sizes the xDS fan-out comparison.
type XDSFanoutConfig struct {
	Clients   int           `json:"streams"`      // each subscribed to PerClient services
	Services  int           `json:"services"`     // in the registry
	PerClient int           `json:"per_stream"`   // services each stream subscribes to
	Rate      int           `json:"rate_per_sec"` // registrations per second asked for
	Duration  time.Duration `json:"duration_ns"`  // of the churn
	Conns     int           `json:"conns"`        // gRPC connections the streams share
}

// XDSFanoutPath is one delivery path's figures.
type XDSFanoutPath struct {
	Path    string `json:"path"` // "xds (ADS, EDS)" or "native (WatchEndpoints)"
	Changes int    `json:"changes"`
	// RatePerSec is the registrations per second achieved: the writer
	// waits for each RegisterEndpoint, so a saturated registrar slows it.
	RatePerSec float64   `json:"rate_per_sec"`
	Expected   int64     `json:"expected_deliveries"`
	Delivered  int64     `json:"deliveries"`
	Latency    Latencies `json:"latency"`
	CPUCores   float64   `json:"registrar_cpu_cores"` // registrar CPU seconds per second of churn
	PeakRSSMiB float64   `json:"registrar_peak_rss_mib"`
	// HarnessCores is this process's CPU (the streams' decoding, the
	// writer) per second: it shares the machine with the registrar.
	HarnessCores float64 `json:"harness_cpu_cores"`
	// Messages is what the streams received during the churn (xDS:
	// DiscoveryResponses; native: events), beside Expected, the
	// deliveries that had news for the stream.
	Messages int64 `json:"messages"`
}

// XDSFanoutResult compares xDS with the native stream at one size.
type XDSFanoutResult struct {
	Config XDSFanoutConfig `json:"config"`
	XDS    XDSFanoutPath   `json:"xds"`
	Native XDSFanoutPath   `json:"native"`
}

// xdsFanIP is the k-th churned endpoint's IP, apart from the preload's.
func xdsFanIP(k int) string { return benchIP(500000 + k) }

// XDSFanout runs the same churn twice, each time in a fresh world (an etcd
// process and one registrar process serving xDS, so the registrar's CPU
// and memory are its own, read from /proc): once with cfg.Clients raw ADS
// streams each subscribing to the EDS of cfg.PerClient services, once with
// as many WatchEndpoints streams on the same services. A delivery is a
// stream's first sight of a registered endpoint; its latency runs from
// just before the RegisterEndpoint call.
func XDSFanout(ctx context.Context, cfg XDSFanoutConfig, exe string, w io.Writer) (XDSFanoutResult, error) {
	res := XDSFanoutResult{Config: cfg}
	b, err := fanoutBins(ctx, exe, w)
	if err != nil {
		return res, err
	}
	for _, native := range []bool{false, true} {
		p, err := xdsFanoutPath(ctx, cfg, b, native)
		if err != nil {
			return res, fmt.Errorf("%s: %w", p.Path, err)
		}
		if native {
			res.Native = p
		} else {
			res.XDS = p
		}
	}
	return res, nil
}

// subsOf is which services stream i subscribes to: PerClient of them,
// spread so that every service has about Clients*PerClient/Services
// subscribers.
func (c XDSFanoutConfig) subsOf(i int) []int {
	out := make([]int, 0, c.PerClient)
	for j := range c.PerClient {
		out = append(out, (i+j*(c.Services/c.PerClient))%c.Services)
	}
	return out
}

// fanStream is one stream's bookkeeping: what it has seen.
type fanStream struct {
	seen map[string]bool   // endpoint IPs delivered
	msgs *atomic.Int64     // messages received, all streams
	last map[string][]byte // xDS: the last CLA bytes per resource, to skip unchanged ones
}

func xdsFanoutPath(ctx context.Context, cfg XDSFanoutConfig, b bins, native bool) (p XDSFanoutPath, err error) {
	p.Path = "xds (ADS, EDS)"
	if native {
		p.Path = "native (WatchEndpoints)"
	}
	etcd, err := startEtcdProc(ctx, b.etcd)
	if err != nil {
		return p, err
	}
	defer etcd.stop(10 * time.Second)
	ports, err := freePorts(1)
	if err != nil {
		return p, err
	}
	xdsAddr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	reg, err := startRegistrarProc(ctx, b.aether, "registrar", etcd.url, append(registrarFlags(0), "--xds-addr", xdsAddr)...)
	if err != nil {
		return p, err
	}
	defer reg.stop(10 * time.Second)
	wconn, err := grpc.NewClient(reg.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return p, err
	}
	defer wconn.Close()
	writer := registrarv1.NewRegistrarClient(wconn)
	svc := func(s int) string { return fmt.Sprintf("fx-%d", s) }
	// Endpoint i's node is benchNode(i): nodes of 100, inside the
	// registrar's --max-endpoints-per-node.
	ep := func(s, i int, ip string) *registryv1.ServiceEndpoint {
		return &registryv1.ServiceEndpoint{Service: svc(s), Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: ip,
			Ports: []*registryv1.Port{{Name: "grpc", Port: 8080}}, Node: benchNode(i)}
	}
	// Every service has endpoints before the streams subscribe, so each
	// stream's first answer is a real snapshot.
	for s := range cfg.Services {
		if _, err := writer.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: ep(s, s, benchIP(s))}); err != nil {
			return p, fmt.Errorf("preload: %w", err)
		}
	}
	target := reg.grpcAddr
	if !native {
		target = xdsAddr
	}
	conns := make([]*grpc.ClientConn, max(cfg.Conns, 1))
	for i := range conns {
		if conns[i], err = grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return p, err
		}
		defer conns[i].Close()
	}

	var mu sync.Mutex
	sent := map[string]time.Time{}
	var lat []time.Duration
	var delivered, msgs atomic.Int64
	deliver := func(st *fanStream, ip string, now time.Time) {
		if st.seen[ip] {
			return
		}
		st.seen[ip] = true
		mu.Lock()
		t0, ok := sent[ip]
		if ok {
			lat = append(lat, now.Sub(t0))
		}
		mu.Unlock()
		if ok {
			delivered.Add(1)
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var synced sync.WaitGroup
	errs := make(chan error, cfg.Clients)
	for i := range cfg.Clients {
		subs := cfg.subsOf(i)
		names := make([]string, len(subs))
		for j, s := range subs {
			names[j] = svc(s)
		}
		cc := conns[i%len(conns)]
		st := &fanStream{seen: map[string]bool{}, last: map[string][]byte{}, msgs: &msgs}
		wg.Add(1)
		synced.Add(1)
		go func() {
			defer wg.Done()
			once := sync.OnceFunc(synced.Done)
			defer once()
			var err error
			if native {
				err = nativeFanStream(sctx, cc, names, st, deliver, once)
			} else {
				err = xdsFanStream(sctx, cc, fmt.Sprintf("fx-client-%d", i), names, st, deliver, once)
			}
			if err != nil && sctx.Err() == nil {
				errs <- err
			}
		}()
	}
	synced.Wait()
	select {
	case err := <-errs:
		return p, err
	default:
	}

	subscribers := make([]int64, cfg.Services)
	for i := range cfg.Clients {
		for _, s := range cfg.subsOf(i) {
			subscribers[s]++
		}
	}
	before, err := reg.stats()
	if err != nil {
		return p, err
	}
	self0, msgs0 := selfStats(), msgs.Load()
	start := time.Now()
	t := time.NewTicker(time.Second / time.Duration(cfg.Rate))
	for k := 0; time.Since(start) < cfg.Duration; k++ {
		<-t.C
		s, ip := k%cfg.Services, xdsFanIP(k)
		mu.Lock()
		sent[ip] = time.Now()
		mu.Unlock()
		if _, err := writer.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: ep(s, cfg.Services+k, ip)}); err != nil {
			t.Stop()
			return p, fmt.Errorf("register: %w", err)
		}
		p.Changes++
		p.Expected += subscribers[s]
	}
	t.Stop()
	elapsed := time.Since(start)
	waitDeliveries(ctx, 10*time.Second, func() bool { return delivered.Load() >= p.Expected })
	after, err := reg.stats()
	if err != nil {
		return p, err
	}
	p.HarnessCores = (selfStats().CPUSec - self0.CPUSec) / time.Since(start).Seconds()
	p.Delivered = delivered.Load()
	p.Messages = msgs.Load() - msgs0
	mu.Lock()
	p.Latency = summarize(lat)
	mu.Unlock()
	p.CPUCores = (after.CPUSec - before.CPUSec) / elapsed.Seconds()
	p.RatePerSec = float64(p.Changes) / elapsed.Seconds()
	p.PeakRSSMiB = float64(after.PeakRSS) / (1 << 20)
	select {
	case err := <-errs:
		return p, err
	default:
	}
	return p, nil
}

// xdsFanStream is one raw ADS stream subscribed to the EDS of names, as a
// proxyless client's xDS client would hold it, without the channel and
// balancer above: each response is ACKed (state of the world: the server
// sends the next version only after the previous one's ACK), and each
// ClusterLoadAssignment that changed is decoded for its endpoints.
func xdsFanStream(ctx context.Context, cc *grpc.ClientConn, node string, names []string, st *fanStream, deliver func(*fanStream, string, time.Time), synced func()) error {
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	req := &discoverygrpc.DiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: resourcev3.EndpointType, ResourceNames: names}
	if err := stream.Send(req); err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		now := time.Now()
		st.msgs.Add(1)
		for _, a := range resp.GetResources() {
			var cla endpointv3.ClusterLoadAssignment
			if err := proto.Unmarshal(a.GetValue(), &cla); err != nil {
				return err
			}
			if old, ok := st.last[cla.GetClusterName()]; ok && bytes.Equal(old, a.GetValue()) {
				continue
			}
			st.last[cla.GetClusterName()] = a.GetValue()
			for _, le := range cla.GetEndpoints() {
				for _, lb := range le.GetLbEndpoints() {
					deliver(st, lb.GetEndpoint().GetAddress().GetSocketAddress().GetAddress(), now)
				}
			}
		}
		synced()
		// The ACK: the same names, the version and nonce just received.
		if err := stream.Send(&discoverygrpc.DiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResourceNames: names,
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			return err
		}
	}
}

// nativeFanStream is one WatchEndpoints stream on the same services.
func nativeFanStream(ctx context.Context, cc *grpc.ClientConn, names []string, st *fanStream, deliver func(*fanStream, string, time.Time), synced func()) error {
	stream, err := registrarv1.NewRegistrarClient(cc).WatchEndpoints(ctx, &registrarv1.WatchEndpointsRequest{Services: names})
	if err != nil {
		return err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
		}
		synced()
		st.msgs.Add(1)
		if ev.GetType() == registrarv1.EndpointEvent_ENDPOINT_ADDED {
			deliver(st, ev.GetEndpoint().GetIp(), time.Now())
		}
	}
}
