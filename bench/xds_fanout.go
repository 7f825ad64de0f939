package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
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

// fanPath is one delivery path of the fan-out comparison.
type fanPath int

const (
	pathSotW   fanPath = iota // ADS, state of the world, EDS
	pathDelta                 // ADS, delta (incremental), EDS
	pathNative                // WatchEndpoints
)

func (p fanPath) String() string {
	switch p {
	case pathSotW:
		return "xds (ADS, EDS, state of the world)"
	case pathDelta:
		return "xds (ADS, EDS, delta)"
	}
	return "native (WatchEndpoints)"
}

// tag names the path in profile file names.
func (p fanPath) tag() string { return [...]string{"sotw", "delta", "native"}[p] }

// XDSFanoutPath is one delivery path's figures.
type XDSFanoutPath struct {
	Path    string `json:"path"`
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
	// SetupSec is from the first stream opening to every stream holding
	// its first answer.
	SetupSec float64 `json:"setup_sec"`
	// LoadAvg is the machine's 1-minute load average as the churn began:
	// the machine's 2 cores may be shared with other work, which the
	// figures then include.
	LoadAvg float64 `json:"loadavg_1m"`
	// Error is why the path did not complete at this size (then its
	// figures are not to be read), or why it was not run.
	Error string `json:"error,omitempty"`
}

// cpuPerChange is the registrar's CPU milliseconds per registration.
func (p XDSFanoutPath) cpuPerChange() float64 { return 1000 * p.CPUCores / max(p.RatePerSec, 1e-9) }

// XDSFanoutResult compares xDS (both protocol variants) with the native
// stream at one size.
type XDSFanoutResult struct {
	Config XDSFanoutConfig `json:"config"`
	XDS    XDSFanoutPath   `json:"xds"`
	Delta  XDSFanoutPath   `json:"xds_delta"`
	Native XDSFanoutPath   `json:"native"`
}

func (r *XDSFanoutResult) path(p fanPath) *XDSFanoutPath {
	switch p {
	case pathSotW:
		return &r.XDS
	case pathDelta:
		return &r.Delta
	}
	return &r.Native
}

// xdsFanIP is the k-th churned endpoint's IP, apart from the preload's.
func xdsFanIP(k int) string { return benchIP(500000 + k) }

// XDSFanout runs the same churn once per size and path, each time in a
// fresh world (an etcd process and one registrar process serving xDS, so
// the registrar's CPU and memory are its own, read from /proc): with
// cfg.Clients raw ADS streams each subscribing to the EDS of
// cfg.PerClient services, state of the world, then delta, then with as
// many WatchEndpoints streams on the same services. A delivery is a
// stream's first sight of a registered endpoint; its latency runs from
// just before the RegisterEndpoint call. A path that fails at one size
// (its streams could not all be set up, a stream failed, deliveries were
// missing) records why, and is not run at the larger sizes that follow:
// what fits on the machine is measured, and what did not is said.
func XDSFanout(ctx context.Context, sizes []XDSFanoutConfig, exe string, w io.Writer) ([]XDSFanoutResult, error) {
	b, err := fanoutBins(ctx, exe, w)
	if err != nil {
		return nil, err
	}
	failed := map[fanPath]string{}
	var out []XDSFanoutResult
	for _, cfg := range sizes {
		res := XDSFanoutResult{Config: cfg}
		for _, path := range []fanPath{pathSotW, pathDelta, pathNative} {
			if why, ok := failed[path]; ok {
				*res.path(path) = XDSFanoutPath{Path: path.String(), Error: "not run: " + why}
				continue
			}
			fmt.Fprintf(w, "  %d streams, %s...\n", cfg.Clients, path)
			p, err := xdsFanoutPath(ctx, cfg, b, path)
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			if err == nil && p.Delivered < p.Expected {
				err = fmt.Errorf("%d of %d deliveries missing 10s after the churn", p.Expected-p.Delivered, p.Expected)
			}
			if err != nil {
				p.Error = err.Error()
				failed[path] = fmt.Sprintf("failed at %d streams", cfg.Clients)
				fmt.Fprintf(w, "    failed: %v\n", err)
			} else {
				fmt.Fprintf(w, "    %.0f registrations/s, %d messages, %d/%d deliveries, p50 %.2f ms, p99 %.2f ms, registrar %.2f cores (%.2f ms per registration), peak RSS %.0f MiB, harness %.2f cores, setup %.1fs\n",
					p.RatePerSec, p.Messages, p.Delivered, p.Expected, p.Latency.P50, p.Latency.P99, p.CPUCores, p.cpuPerChange(), p.PeakRSSMiB, p.HarnessCores, p.SetupSec)
			}
			*res.path(path) = p
		}
		out = append(out, res)
	}
	return out, nil
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

// xdsSetupTimeout bounds the streams' setup: past it, the size does not
// fit on the machine.
const xdsSetupTimeout = 3 * time.Minute

func xdsFanoutPath(ctx context.Context, cfg XDSFanoutConfig, b bins, path fanPath) (p XDSFanoutPath, err error) {
	p.Path = path.String()
	native := path == pathNative
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
	// stream's first answer is a real snapshot. A few writers at once: the
	// registrar batches them into etcd.
	if err := preloadServices(ctx, writer, cfg.Services, func(s int) *registryv1.ServiceEndpoint { return ep(s, s, benchIP(s)) }); err != nil {
		return p, err
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
	setupStart := time.Now()
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
			switch path {
			case pathNative:
				err = nativeFanStream(sctx, cc, names, st, deliver, once)
			case pathDelta:
				err = deltaFanStream(sctx, cc, fmt.Sprintf("fx-client-%d", i), names, st, deliver, once)
			default:
				err = xdsFanStream(sctx, cc, fmt.Sprintf("fx-client-%d", i), names, st, deliver, once)
			}
			if err != nil && sctx.Err() == nil {
				errs <- err
			}
		}()
	}
	allSynced := make(chan struct{})
	go func() { synced.Wait(); close(allSynced) }()
	select {
	case <-allSynced:
	case err := <-errs:
		return p, fmt.Errorf("setting up the streams: %w", err)
	case <-time.After(xdsSetupTimeout):
		return p, fmt.Errorf("the %d streams were not all set up in %v", cfg.Clients, xdsSetupTimeout)
	case <-ctx.Done():
		return p, ctx.Err()
	}
	p.SetupSec = time.Since(setupStart).Seconds()
	select {
	case err := <-errs:
		return p, err
	default:
	}
	// The setup's garbage (every stream's first answer) is collected
	// before the churn, not during it.
	if err := settle(ctx, 2*time.Second); err != nil {
		return p, err
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
	p.LoadAvg = loadAvg()
	// With $AETHER_BENCH_PROFILE, CPU profiles of the registrar and of the
	// harness over the churn (the registrar runs with --enable-pprof then).
	prof := startProfiles(ctx, fmt.Sprintf("xds-%d-%s", cfg.Clients, path.tag()),
		0, cfg.Duration, map[string]string{"registrar": "http://" + reg.httpAddr})
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
	prof.stop(io.Discard)
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

// deltaFanStream is one raw delta ADS stream subscribed to the EDS of
// names: every response carries only the resources that changed (by
// their hash), each decoded for its endpoints, and is ACKed by its nonce.
func deltaFanStream(ctx context.Context, cc *grpc.ClientConn, node string, names []string, st *fanStream, deliver func(*fanStream, string, time.Time), synced func()) error {
	stream, err := discoverygrpc.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{Node: &corev3.Node{Id: node}, TypeUrl: resourcev3.EndpointType, ResourceNamesSubscribe: names}); err != nil {
		return err
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		now := time.Now()
		st.msgs.Add(1)
		for _, r := range resp.GetResources() {
			var cla endpointv3.ClusterLoadAssignment
			if err := proto.Unmarshal(r.GetResource().GetValue(), &cla); err != nil {
				return err
			}
			for _, le := range cla.GetEndpoints() {
				for _, lb := range le.GetLbEndpoints() {
					deliver(st, lb.GetEndpoint().GetAddress().GetSocketAddress().GetAddress(), now)
				}
			}
		}
		synced()
		if err := stream.Send(&discoverygrpc.DeltaDiscoveryRequest{TypeUrl: resourcev3.EndpointType, ResponseNonce: resp.GetNonce()}); err != nil {
			return err
		}
	}
}

// preloadServices registers one endpoint per service, from a few writers
// at once.
func preloadServices(ctx context.Context, writer registrarv1.RegistrarClient, services int, ep func(s int) *registryv1.ServiceEndpoint) error {
	const writers = 8
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for wi := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for s := wi; s < services; s += writers {
				if _, err := writer.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: ep(s)}); err != nil {
					errs <- fmt.Errorf("preload: %w", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when none failed
}

// loadAvg is the 1-minute load average from /proc/loadavg (0 where there
// is none).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	var l float64
	fmt.Sscan(string(b), &l)
	return l
}
