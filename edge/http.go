package edge

// The HTTP endpoints etcd serves on its client URLs, for the tools that
// probe and scrape etcd: /metrics (Prometheus), /health (etcd's JSON, what
// etcdctl endpoint health over HTTP, load balancers and older Kubernetes
// probes read), /livez and /readyz (etcd 3.6+ probes) and /version.
// Semantics follow go.etcd.io/etcd/server/v3/etcdserver/api/etcdhttp.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/coreos/go-semver/semver"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	etcdversion "go.etcd.io/etcd/api/v3/version"

	"github.com/aethermesh/aether/internal/pprofhttp"
)

// httpChecks is what the HTTP endpoints ask of the server.
type httpChecks struct {
	// Ready reports whether the server has recovered its log and serves.
	Ready func() bool
	// Read does what etcd's health check does: a local keys-only Range
	// of limit 1, proving the store answers.
	Read func(ctx context.Context) error
	// Alarms are the active alarms; nil means none (the edge store raises
	// none today: it has no backend quota).
	Alarms func() []*pb.AlarmMember
}

// Reason strings, as etcd writes them; a replica is its own leader, so
// etcd's "RAFT NO LEADER" never applies.
const (
	healthNotReady = "NOT READY"
)

// newHTTPHandler returns the handler for /metrics, /health, /livez,
// /readyz and /version; the server mounts it on the client URLs beside
// gRPC. reg is the server's registry: /metrics serves it, and the health
// counters etcd exports (etcd_server_health_success, _failures) are
// registered on it.
func newHTTPHandler(reg *prometheus.Registry, lg *slog.Logger, c httpChecks) (http.Handler, error) {
	if c.Ready == nil || c.Read == nil {
		return nil, errors.New("edge: http checks need Ready and Read")
	}
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	success, err := registerCounter(reg, prometheus.CounterOpts{
		Namespace: "etcd", Subsystem: "server", Name: "health_success",
		Help: "The total number of successful health checks",
	})
	if err != nil {
		return nil, err
	}
	failed, err := registerCounter(reg, prometheus.CounterOpts{
		Namespace: "etcd", Subsystem: "server", Name: "health_failures",
		Help: "The total number of failed health checks",
	})
	if err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		if !allowGet(w, r) {
			return
		}
		h := checkHealth(r.Context(), c, querySet(r, "exclude"))
		b, _ := json.Marshal(h)
		if h.Health != "true" {
			failed.Inc()
			lg.Warn("/health error", "output", string(b), "status-code", http.StatusServiceUnavailable)
			http.Error(w, string(b), http.StatusServiceUnavailable)
			return
		}
		success.Inc()
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b)
	})

	// /livez and /readyz: etcd's check registries. The checks a replica
	// cannot fail in etcd's sense (linearizable read needs no quorum here,
	// a replica is never a learner) are kept by name so that probes naming
	// them, or excluding them, work unchanged.
	read := func(ctx context.Context) error {
		if !c.Ready() {
			return errors.New(strings.ToLower(healthNotReady))
		}
		return c.Read(ctx)
	}
	corruption := func(context.Context) error {
		for _, a := range alarms(c) {
			if a.Alarm == pb.AlarmType_CORRUPT {
				return fmt.Errorf("alarm activated: %s", a.Alarm)
			}
		}
		return nil
	}
	installChecks(mux, lg, "livez", []namedCheck{{"serializable_read", read}})
	installChecks(mux, lg, "readyz", []namedCheck{
		{"data_corruption", corruption},
		{"serializable_read", read},
		{"linearizable_read", read},
		{"non_learner", func(context.Context) error { return nil }},
	})

	mux.HandleFunc("/version", func(w http.ResponseWriter, r *http.Request) {
		if !allowGet(w, r) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		b, _ := json.Marshal(etcdversion.Versions{
			Server:  etcdversion.Version,
			Cluster: clusterVersion(),
			Storage: clusterVersion(),
		})
		_, _ = w.Write(b)
	})
	return mux, nil
}

// mountHTTP mounts the HTTP endpoints on the client URLs' mux (serve.go).
func (s *Server) mountHTTP(mux *http.ServeMux) {
	h, err := newHTTPHandler(s.reg, s.log, httpChecks{
		Ready: s.Ready,
		// etcd's check reads through the server like a client would, so
		// a stuck store shows; here that is the state lock and the commit
		// wait of s.read. Key and range end "\x00" is "every key".
		Read: func(ctx context.Context) error {
			_, err := s.read(ctx, func() error {
				_, err := s.st.Range(&pb.RangeRequest{Key: []byte{0}, RangeEnd: []byte{0}, KeysOnly: true, Limit: 1})
				return err
			})
			return err
		},
		// NOSPACE, the one alarm the edge store raises (quota.go).
		Alarms: func() []*pb.AlarmMember { return s.activeAlarms(pb.AlarmType_NONE) },
	})
	if err != nil {
		// Only a registry conflict on the server's own, fresh registry:
		// a programming error, but serving gRPC without HTTP beats none.
		s.log.Error("edge: HTTP endpoints not served", "err", err)
		return
	}
	mux.Handle("/", h)
	if s.cfg.EnablePprof {
		pprofhttp.Mount(mux) // etcd's paths (etcdserver/api/etcdhttp)
	}
}

// healthStatus is etcd's /health body.
type healthStatus struct {
	Health string `json:"health"`
	Reason string `json:"reason"`
}

// checkHealth is etcd's /health check: alarms (unless excluded), then a read.
// etcd's serializable=true only skips its leader check, which a replica
// always passes, so it needs no handling.
func checkHealth(ctx context.Context, c httpChecks, excluded map[string]bool) healthStatus {
	if !c.Ready() {
		return healthStatus{Health: "false", Reason: healthNotReady}
	}
	for _, a := range alarms(c) {
		if excluded[a.Alarm.String()] {
			continue
		}
		switch a.Alarm {
		case pb.AlarmType_NOSPACE:
			return healthStatus{Health: "false", Reason: "ALARM NOSPACE"}
		case pb.AlarmType_CORRUPT:
			return healthStatus{Health: "false", Reason: "ALARM CORRUPT"}
		default:
			return healthStatus{Health: "false", Reason: "ALARM UNKNOWN"}
		}
	}
	if err := c.Read(ctx); err != nil {
		return healthStatus{Health: "false", Reason: fmt.Sprintf("RANGE ERROR:%s", err)}
	}
	return healthStatus{Health: "true"}
}

func alarms(c httpChecks) []*pb.AlarmMember {
	if c.Alarms == nil {
		return nil
	}
	return c.Alarms()
}

type namedCheck struct {
	name  string
	check func(context.Context) error
}

// installChecks serves /<kind> (every check, minus ?exclude=) and
// /<kind>/<check> with etcd's plain-text answers: "ok", the per-check
// lines with ?verbose, and 503 with the lines on a failure.
func installChecks(mux *http.ServeMux, lg *slog.Logger, kind string, checks []namedCheck) {
	run := func(w http.ResponseWriter, r *http.Request, run []namedCheck) {
		if !allowGet(w, r) {
			return
		}
		var out strings.Builder
		failedAny := false
		for _, c := range run {
			if err := c.check(r.Context()); err != nil {
				fmt.Fprintf(&out, "[-]%s failed: %v\n", c.name, err)
				failedAny = true
			} else {
				fmt.Fprintf(&out, "[+]%s ok\n", c.name)
			}
		}
		if failedAny {
			lg.Error("Health check error", "path", r.URL.Path, "reason", out.String(), "status-code", http.StatusServiceUnavailable)
			http.Error(w, out.String(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if _, verbose := r.URL.Query()["verbose"]; verbose {
			fmt.Fprint(w, out.String())
		}
		fmt.Fprint(w, "ok\n")
	}
	mux.HandleFunc("/"+kind, func(w http.ResponseWriter, r *http.Request) {
		excluded := querySet(r, "exclude")
		var keep []namedCheck
		for _, c := range checks {
			if !excluded[c.name] {
				keep = append(keep, c)
			}
		}
		run(w, r, keep)
	})
	for _, c := range checks {
		mux.HandleFunc("/"+kind+"/"+c.name, func(w http.ResponseWriter, r *http.Request) {
			run(w, r, []namedCheck{c})
		})
	}
}

// allowGet answers 405 to anything but GET, as etcd does.
func allowGet(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet {
		return true
	}
	w.Header().Set("Allow", http.MethodGet)
	http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
	return false
}

func querySet(r *http.Request, name string) map[string]bool {
	out := map[string]bool{}
	for _, v := range r.URL.Query()[name] {
		if v != "" {
			out[v] = true
		}
	}
	return out
}

// clusterVersion is etcd's cluster version for this server version: its
// major.minor with patch 0 (etcd 3.7.3 reports "3.7.0").
func clusterVersion() string {
	v := semver.New(etcdversion.Version)
	return fmt.Sprintf("%d.%d.0", v.Major, v.Minor)
}

// registerCounter registers a counter on reg, or returns the one already
// registered under its name (a server builds its handler once, but a
// registry shared between handlers must not panic).
func registerCounter(reg *prometheus.Registry, opts prometheus.CounterOpts) (prometheus.Counter, error) {
	c := prometheus.NewCounter(opts)
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(prometheus.Counter); ok {
				return existing, nil
			}
		}
		return nil, fmt.Errorf("edge: register %s: %w", opts.Name, err)
	}
	return c, nil
}
