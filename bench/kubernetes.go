package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend/etcd/embedetcd"
	kubestore "github.com/aethermesh/aether/backend/kubernetes"
	"github.com/aethermesh/aether/internal/kubeapiserver"
	"github.com/aethermesh/aether/server"
)

// ScenarioKubernetes: the kubernetes backend against etcd under the same
// load in the same run (the "Kubernetes backend" section): a registration
// phase (N endpoints through replica A: acknowledged/s, and visible on
// replica B/s), then cross-replica propagation at 100 changes/s with
// peer-watch on (the default) and off (what measures the backend itself),
// with the API server's CPU and memory during each phase.
const ScenarioKubernetes = "kubernetes"

const (
	kubeBeginMark = "<!-- bench:kubernetes:begin -->"
	kubeEndMark   = "<!-- bench:kubernetes:end -->"
)

// kubeNamespace is where the scenario's registrars keep their objects.
const kubeNamespace = "aether-bench"

// kubeLoadService is the registration phase's service; propagation is
// timed on another ("bench"), so B's watcher of it starts from an empty
// snapshot while the registry holds the whole load.
const kubeLoadService = "load"

// kubeLoadCallers is how many RegisterEndpoint calls the registration
// phase keeps in flight: enough that A's write path, not one caller's
// round trips, sets the rate.
const kubeLoadCallers = 32

// KubernetesConfig sizes the scenario.
type KubernetesConfig struct {
	Sizes   []int // endpoints registered before propagation is timed
	Changes int   // registrations timed for propagation, at Rate
	Rate    int
	KubeBin string // empty: kubeapiserver.Dir()
}

// APIServerStats are the kube-apiserver process's figures over one phase.
type APIServerStats struct {
	CPUCores     float64 `json:"cpu_cores"`      // CPU seconds over the phase's wall seconds (1.0 = one core busy)
	PeakCPUCores float64 `json:"peak_cpu_cores"` // the busiest one-second sample
	RSSMiB       float64 `json:"rss_mib"`        // resident set at the phase's end
	PeakRSSMiB   float64 `json:"peak_rss_mib"`   // high-water mark since it started
}

// KubeRun is one pair of registrars at one size, one backend and one
// peer-watch setting.
type KubeRun struct {
	Backend   string `json:"backend"`
	PeerWatch bool   `json:"peer_watch"`
	Endpoints int    `json:"endpoints"`
	// AckPS is registrations acknowledged by A per second; VisiblePS is
	// registrations per second until B's watcher had every one (with
	// peer-watch off: persisted in the backend and watched back from it).
	AckPS       float64            `json:"acknowledged_per_sec"`
	VisiblePS   float64            `json:"visible_on_b_per_sec"`
	Propagation CrossReplicaResult `json:"propagation"`
	// LoadAPI and PropAPI are the API server during the registration and
	// the propagation phase (kubernetes only).
	LoadAPI *APIServerStats `json:"apiserver_registration,omitempty"`
	PropAPI *APIServerStats `json:"apiserver_propagation,omitempty"`
}

// KubernetesResult is the kubernetes scenario.
type KubernetesResult struct {
	Sizes   []int     `json:"sizes"`
	Changes int       `json:"changes"`
	Rate    int       `json:"rate"`
	Runs    []KubeRun `json:"runs"`
	// Load is the machine's 1-minute load average at the start and end.
	Load [2]float64 `json:"load"`
}

// kubernetesPreflight checks, before any scenario runs, that the
// kube-apiserver binaries are there, so a run of every scenario does not
// fail at its end.
func kubernetesPreflight() error {
	if _, err := kubeapiserver.Dir(); err != nil {
		return fmt.Errorf("scenario %s: %w; build it with %s", ScenarioKubernetes, err, kubeapiserver.BuildHint)
	}
	return nil
}

// startKube starts, for startPair, an embedded etcd and a kube-apiserver on
// it, and points base at it through an admin kubeconfig, in a namespace it
// creates; the registrars install the CRDs.
func (p *pair) startKube(ctx context.Context, base *server.Config, bin string) (err error) {
	if bin == "" {
		if bin, err = kubeapiserver.Dir(); err != nil {
			return fmt.Errorf("%w; build it with %s", err, kubeapiserver.BuildHint)
		}
	}
	if p.dir, err = os.MkdirTemp("", "aether-bench-kube-"); err != nil {
		return err
	}
	quiet := base.Options.Logger
	p.etcd, err = embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(p.dir, "etcd"), ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		return fmt.Errorf("the API server's etcd: %w", err)
	}
	kdir := filepath.Join(p.dir, "kube")
	if err := os.Mkdir(kdir, 0o700); err != nil {
		return err
	}
	if p.kapi, err = kubeapiserver.Start(ctx, kubeapiserver.Config{BinDir: bin, EtcdServers: p.etcd.Endpoints(), Dir: kdir}); err != nil {
		return err
	}
	kc := filepath.Join(kdir, "admin.kubeconfig")
	if err := p.kapi.WriteKubeconfig(kc, "admin", p.kapi.AdminToken); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(p.kapi.Config(p.kapi.AdminToken))
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: kubeNamespace}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("namespace %s: %w", kubeNamespace, err)
	}
	base.Backend, base.Kubeconfig, base.KubernetesNamespace, base.KubernetesInstallCRDs = server.BackendKubernetes, kc, kubeNamespace, true
	return nil
}

// cpuSampler follows a process's CPU time and memory over one phase.
type cpuSampler struct {
	pid   int
	start procStats
	t0    time.Time
	peak  atomic.Uint64 // the busiest second, in thousandths of a core
	stop  chan struct{}
	wg    sync.WaitGroup
}

func sampleCPU(pid int) *cpuSampler {
	s := &cpuSampler{pid: pid, t0: time.Now(), stop: make(chan struct{})}
	s.start, _ = pidStats(pid)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		last, lastT := s.start, s.t0
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case now := <-tick.C:
				st, err := pidStats(pid)
				if err != nil {
					continue
				}
				c := uint64((st.CPUSec - last.CPUSec) / now.Sub(lastT).Seconds() * 1000)
				if c > s.peak.Load() {
					s.peak.Store(c)
				}
				last, lastT = st, now
			}
		}
	}()
	return s
}

func (s *cpuSampler) done() *APIServerStats {
	close(s.stop)
	s.wg.Wait()
	end, _ := pidStats(s.pid)
	wall := time.Since(s.t0).Seconds()
	out := &APIServerStats{
		CPUCores: (end.CPUSec - s.start.CPUSec) / wall, PeakCPUCores: float64(s.peak.Load()) / 1000,
		RSSMiB: float64(end.RSSBytes) / (1 << 20), PeakRSSMiB: float64(end.PeakRSS) / (1 << 20),
	}
	// A phase shorter than one sample: its average is its busiest second.
	out.PeakCPUCores = max(out.PeakCPUCores, out.CPUCores)
	return out
}

// register loads n endpoints of kubeLoadService through A with
// kubeLoadCallers in flight, and times it until A acknowledged them all
// and until B's watcher had them all.
func (p *pair) register(ctx context.Context, n int) (ackPS, visiblePS float64, err error) {
	a, b := p.regs[0], p.regs[1]
	ca, err := dialRegistrar(a.GRPCAddr())
	if err != nil {
		return 0, 0, err
	}
	defer ca.Close()
	cb, err := dialRegistrar(b.GRPCAddr())
	if err != nil {
		return 0, 0, err
	}
	defer cb.Close()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := registrarv1.NewRegistrarClient(cb).WatchEndpoints(wctx, &registrarv1.WatchEndpointsRequest{Services: []string{kubeLoadService}})
	if err != nil {
		return 0, 0, err
	}
	if _, err := st.Recv(); err != nil { // the (empty) snapshot
		return 0, 0, fmt.Errorf("B's watch: %w", err)
	}
	allSeen := make(chan time.Time, 1)
	var seenN atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		seen := make(map[string]bool, n)
		for {
			ev, err := st.Recv()
			if err != nil {
				return
			}
			if ev.Type != registrarv1.EndpointEvent_ENDPOINT_ADDED || seen[ev.Endpoint.Ip] {
				continue
			}
			seen[ev.Endpoint.Ip] = true
			seenN.Store(int64(len(seen)))
			if len(seen) == n {
				allSeen <- time.Now()
				return
			}
		}
	}()
	defer func() { cancel(); wg.Wait() }()

	reg := registrarv1.NewRegistrarClient(ca)
	var next atomic.Int64
	errs := make(chan error, kubeLoadCallers)
	start := time.Now()
	var callers sync.WaitGroup
	for range kubeLoadCallers {
		callers.Add(1)
		go func() {
			defer callers.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				ip := benchIP(i)
				if _, err := reg.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: &registryv1.ServiceEndpoint{
					Service: kubeLoadService, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
					// No node: an endpoint on a node that never announces
					// is swept after --node-ttl, which a slow backend's
					// registration phase outlasts.
					Ports: []*registryv1.Port{{Name: "http", Port: 8080}},
				}}); err != nil {
					errs <- fmt.Errorf("register %s: %w", ip, err)
					next.Store(int64(n)) // stop the other callers
					return
				}
			}
		}()
	}
	callers.Wait()
	acked := time.Since(start)
	select {
	case err := <-errs:
		return 0, 0, err
	default:
	}
	select {
	case t := <-allSeen:
		return float64(n) / acked.Seconds(), float64(n) / t.Sub(start).Seconds(), nil
	case <-time.After(5 * time.Minute):
		// What each replica's registry holds says whether the writes or
		// B's watch fell behind.
		held := func(c registrarv1.RegistrarClient) string {
			lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
			defer lcancel()
			resp, err := c.ListAllEndpoints(lctx, &registrarv1.ListAllEndpointsRequest{Services: []string{kubeLoadService}})
			if err != nil {
				return err.Error()
			}
			return fmt.Sprint(len(resp.Endpoints))
		}
		return 0, 0, fmt.Errorf("B's watcher saw %d of %d registrations within 5 minutes of the first (A's registry holds %s, B's %s)",
			seenN.Load(), n, held(reg), held(registrarv1.NewRegistrarClient(cb)))
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

// kubeRun is one KubeRun: a fresh pair (and, on kubernetes, a fresh API
// server and etcd), loaded, then timed.
func kubeRun(ctx context.Context, cfg KubernetesConfig, backend string, pw bool, n int) (KubeRun, error) {
	cc := CrossReplicaConfig{Backend: backend, PeerWatch: pw, Changes: cfg.Changes, Rate: cfg.Rate, KubeBin: cfg.KubeBin}
	p, err := startPair(ctx, cc)
	if err != nil {
		return KubeRun{}, err
	}
	defer p.close()
	run := KubeRun{Backend: backend, PeerWatch: pw, Endpoints: n}
	var s *cpuSampler
	if p.kapi != nil {
		s = sampleCPU(p.kapi.Pid())
	}
	if run.AckPS, run.VisiblePS, err = p.register(ctx, n); err != nil {
		return run, fmt.Errorf("registering %d endpoints: %w", n, err)
	}
	if s != nil {
		run.LoadAPI = s.done()
		s = sampleCPU(p.kapi.Pid())
	}
	if run.Propagation, err = p.crossReplica(ctx, cc); err != nil {
		return run, fmt.Errorf("propagation: %w", err)
	}
	if s != nil {
		run.PropAPI = s.done()
	}
	return run, nil
}

// Kubernetes runs the scenario: at each size, etcd then kubernetes, each
// with peer-watch off and on.
func Kubernetes(ctx context.Context, cfg KubernetesConfig, w io.Writer) (out KubernetesResult, err error) {
	out.Load[0] = loadAvg()
	defer func() { out.Load[1] = loadAvg() }()
	if cfg.KubeBin == "" {
		if err := kubernetesPreflight(); err != nil {
			return out, err
		}
	}
	out.Sizes, out.Changes, out.Rate = cfg.Sizes, cfg.Changes, cfg.Rate
	for _, n := range cfg.Sizes {
		for _, backend := range []string{server.BackendEtcd, server.BackendKubernetes} {
			for _, pw := range []bool{false, true} {
				fmt.Fprintf(w, "kubernetes: %s, peer-watch %v: %d endpoints through A, then %d registrations at %d/s...\n", backend, pw, n, cfg.Changes, cfg.Rate)
				run, err := kubeRun(ctx, cfg, backend, pw, n)
				if err != nil {
					return out, fmt.Errorf("%s, peer-watch %v, %d endpoints: %w", backend, pw, n, err)
				}
				fmt.Fprintf(w, "  %.0f/s acknowledged, %.0f/s visible on B; propagation %s\n", run.AckPS, run.VisiblePS, run.Propagation.Cross)
				if run.LoadAPI != nil {
					fmt.Fprintf(w, "  API server: %.2f cores (peak %.2f) registering, %.2f (peak %.2f) at %d/s; RSS %.0f MiB (peak %.0f)\n",
						run.LoadAPI.CPUCores, run.LoadAPI.PeakCPUCores, run.PropAPI.CPUCores, run.PropAPI.PeakCPUCores, cfg.Rate, run.PropAPI.RSSMiB, run.PropAPI.PeakRSSMiB)
				}
				out.Runs = append(out.Runs, run)
			}
		}
	}
	return out, nil
}

func kubernetesConfig(quick bool) KubernetesConfig {
	if quick {
		return KubernetesConfig{Sizes: []int{500}, Changes: 200, Rate: 100}
	}
	// 5k is left out: at the ~40 registrations/s the kubernetes backend
	// persists here, each size costs two loads of it.
	return KubernetesConfig{Sizes: []int{1000, 10000}, Changes: 1000, Rate: 100}
}

func runKubernetes(ctx context.Context, o Options, r *Report, w io.Writer) error {
	res, err := Kubernetes(ctx, kubernetesConfig(o.Quick), w)
	if err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	r.Kubernetes = &res
	return nil
}

// kubeFine is where the section draws the line: the kubernetes backend is
// "fine" at a size while, with peer-watch off, it persists (and watches
// back) at least the propagation load's rate, its cross-replica p99 stays
// within kubeP99Limit and the API server's busiest second during
// propagation stays under kubeCPULimit cores (of this machine's two, shared
// with the registrars and the load).
const (
	kubeP99Limit = time.Second
	kubeCPULimit = 1.0
)

// kubeVerdict says why run is not fine, or "" when it is.
func kubeVerdict(run KubeRun, rate int) string {
	var why []string
	if !run.PeerWatch && run.VisiblePS < float64(rate) {
		why = append(why, fmt.Sprintf("it persisted and watched back %.0f registrations/s, under the %d/s of the propagation load", run.VisiblePS, rate))
	}
	if run.Propagation.Cross.P99 > ms(kubeP99Limit) {
		why = append(why, fmt.Sprintf("cross-replica p99 %.0f ms > %v", run.Propagation.Cross.P99, kubeP99Limit))
	}
	if run.PropAPI != nil && run.PropAPI.PeakCPUCores >= kubeCPULimit {
		why = append(why, fmt.Sprintf("the API server's busiest second at %.2f cores", run.PropAPI.PeakCPUCores))
	}
	return strings.Join(why, ", ")
}

func (r Report) kubernetesMarkdown(b *strings.Builder) {
	k := r.Kubernetes
	fmt.Fprintf(b, "### Kubernetes backend (last run %s)\n\n", r.Date)
	fmt.Fprintf(b, "- Machine: %s\n- Command: `%s`\n", r.Machine, r.Command)
	if k.Load[0] > 0 {
		fmt.Fprintf(b, "- Load average (1 min) at start / end: %.1f / %.1f (a shared machine: the tails move with it)\n", k.Load[0], k.Load[1])
	}
	fmt.Fprintf(b, "\nTwo registrar replicas, A and B, of one cluster on one store: an embedded etcd (`--backend etcd`), or Kubernetes' own kube-apiserver %s (`--backend kubernetes`, the registry as AetherEndpoint custom resources, node liveness on Leases) on an embedded etcd of its own, started fresh for every row with its watch cache on, as in a cluster. The API server, the registrars and the load generator share this machine's cores. Each row starts a new pair and, first, **registers** N endpoints through A (%d calls in flight; static endpoints, without a node, so that no liveness sweep removes them however long the phase takes): *acknowledged* is what A's callers saw, *visible on B* is N over the time until B's watcher had all N; with peer-watch off B learns only from the backend, so that figure is the backend's persisted-and-watched rate. Then **propagation**: %d more registrations through A at %d/s (open loop), each timed from just before its call to the event on B's watcher, with the N endpoints still registered. Peer-watch on is the default; off measures the backend itself. *API server* is the kube-apiserver process during each phase: CPU seconds over wall seconds (1.00 = one core busy; its busiest one-second sample in brackets), and its resident set at the phase's end (peak since it started in brackets).\n\n",
		kubeapiserver.Version, kubeLoadCallers, k.Changes, k.Rate)
	b.WriteString("| endpoints | backend | peer-watch | --write-batch-interval | acknowledged | visible on B | propagation p50 | p99 | max | API server CPU: registering / propagating | API server RSS |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, run := range k.Runs {
		on := "off"
		if run.PeerWatch {
			on = "on"
		}
		api, rss := "—", "—"
		if run.LoadAPI != nil && run.PropAPI != nil {
			api = fmt.Sprintf("%.2f (%.2f) / %.2f (%.2f)", run.LoadAPI.CPUCores, run.LoadAPI.PeakCPUCores, run.PropAPI.CPUCores, run.PropAPI.PeakCPUCores)
			rss = fmt.Sprintf("%.0f MiB (%.0f)", run.PropAPI.RSSMiB, run.PropAPI.PeakRSSMiB)
		}
		p := run.Propagation
		fmt.Fprintf(b, "| %d | %s | %s | %s | %.0f/s | %.0f/s | %.2f ms | %.2f ms | %.2f ms | %s | %s |\n",
			run.Endpoints, run.Backend, on, p.BatchInterval, run.AckPS, run.VisiblePS, p.Cross.P50, p.Cross.P99, p.Cross.Max, api, rss)
	}
	b.WriteString("\n**Reading.** ")
	find := func(backend string, pw bool, n int) *KubeRun {
		for i := range k.Runs {
			if run := &k.Runs[i]; run.Backend == backend && run.PeerWatch == pw && run.Endpoints == n {
				return run
			}
		}
		return nil
	}
	stop := 0
	var stopWhy string
	for _, n := range k.Sizes {
		kube, etcd := find(server.BackendKubernetes, false, n), find(server.BackendEtcd, false, n)
		if kube == nil || etcd == nil {
			continue
		}
		fmt.Fprintf(b, "At %d endpoints the kubernetes backend persisted and watched back %.0f registrations/s against etcd's %.0f (%.1f×), and without peer-watch propagated at p99 %.1f ms against etcd's %.1f ms",
			n, kube.VisiblePS, etcd.VisiblePS, etcd.VisiblePS/max(kube.VisiblePS, 1e-9), kube.Propagation.Cross.P99, etcd.Propagation.Cross.P99)
		if on := find(server.BackendKubernetes, true, n); on != nil {
			fmt.Fprintf(b, " (%.1f ms with peer-watch)", on.Propagation.Cross.P99)
		}
		if kube.PropAPI != nil {
			fmt.Fprintf(b, ", the API server at %.2f cores while registering and %.2f at %d/s, %.0f MiB resident", kube.LoadAPI.CPUCores, kube.PropAPI.CPUCores, k.Rate, kube.PropAPI.RSSMiB)
		}
		b.WriteString(". ")
		if kube.LoadAPI != nil && kube.LoadAPI.PeakCPUCores < kubeCPULimit && kube.VisiblePS < etcd.VisiblePS {
			fmt.Fprintf(b, "The API server was not CPU-bound while registering (busiest second %.2f cores), which fits the backend writing each endpoint as its own object, one API call and one etcd transaction each (at most %d in flight), where the etcd backend's write-behind coalesces a flush into one transaction. ", kube.LoadAPI.PeakCPUCores, kubestore.DefaultMaxInFlight)
		}
		if why := kubeVerdict(*kube, k.Rate); why != "" && stop == 0 {
			stop, stopWhy = n, why
		}
	}
	if stop > 0 {
		at := fmt.Sprintf("%d endpoints", stop)
		if stop == k.Sizes[0] {
			at = fmt.Sprintf("already at %d endpoints, the smallest size measured", stop)
		}
		fmt.Fprintf(b, "**Where it stops being fine: %s** (%s; the line is, with peer-watch off, a registration rate of at least the propagation load's %d/s, a p99 within %v and the API server's busiest second under %.1f cores of this machine's shared two). ", at, stopWhy, k.Rate, kubeP99Limit, kubeCPULimit)
	} else if len(k.Sizes) > 0 {
		fmt.Fprintf(b, "**Fine up to the largest size measured, %d endpoints**: with peer-watch off it persists at least the propagation load's %d/s, its p99 stays within %v and the API server's busiest second under %.1f cores (the line this section draws); past it, the registration rate, bounded by the API server's writes, is what grows a cold start and a mass re-registration. ", k.Sizes[len(k.Sizes)-1], k.Rate, kubeP99Limit, kubeCPULimit)
	}
	for _, n := range k.Sizes {
		kube, etcd := find(server.BackendKubernetes, true, n), find(server.BackendEtcd, true, n)
		if kube == nil || etcd == nil {
			continue
		}
		fmt.Fprintf(b, "With peer-watch on (the default) at %d endpoints, B heard of A's writes over the peer stream: cross-replica p99 %.1f ms on kubernetes against %.1f ms on etcd, while B's view of the registration burst came at %.0f/s against %.0f/s. ", n, kube.Propagation.Cross.P99, etcd.Propagation.Cross.P99, kube.VisiblePS, etcd.VisiblePS)
	}
	b.WriteString("What the backend alone sets is the peer-watch-off rows: how fast a replica without a peer stream (a restart, a partition) catches up.\n")
}
