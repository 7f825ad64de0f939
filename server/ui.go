package server

import (
	"net/http"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/console"
	"github.com/aethermesh/aether/xds"
)

// serveConsole mounts the status page (package console) at /ui on mux,
// the HTTP port's: the same TLS as /metrics and, with mTLS on, for
// operators only (the HTTP port verifies a client certificate when one
// is given; the console refuses a request without an operator's).
// Called once s.xds exists, so the page shows the xDS clients.
func (s *Server) serveConsole(mux *http.ServeMux) {
	opts := s.opts
	cfg := console.Config{
		Registrar:  s.reg,
		StuckAfter: opts.stuckAfter(),
		GRPCAddr:   s.GRPCAddr(),
		HTTPAddr:   s.HTTPAddr(),
		XDSAddr:    s.XDSAddr(),
		Logger:     opts.Logger.With("component", "console"),
		Checks: func() []console.Check {
			out := make([]console.Check, 0, len(readyChecks))
			for _, name := range readyChecks {
				ok, detail := s.check(name)
				out = append(out, console.Check{Name: name, OK: ok, Detail: detail})
			}
			return out
		},
		Backend: func() (string, []string) {
			if len(opts.EtcdEndpoints) > 0 {
				return "etcd", opts.EtcdEndpoints
			}
			// s.etcd is set by load before the start-up gate opens, and
			// isReady's atomic store orders the two.
			if s.startup.isReady.Load() {
				return "etcd (embedded)", s.etcd.Endpoints()
			}
			return "etcd (embedded)", nil
		},
		Replication: func() ([]*registrarv1.PeerReplicationStatus, bool) {
			// s.repl likewise: read only once the gate is open.
			if !s.startup.isReady.Load() {
				return nil, len(opts.PeerEtcd) > 0
			}
			return replicationStatus(s.repl)
		},
	}
	if s.xds != nil {
		cfg.XDS = func() []xds.ClientStatus { return s.xds.Status() }
	}
	if opts.AuthzEnabled() {
		cfg.Authz = &console.Authz{TrustDomain: opts.TrustDomain, OperatorPrefix: opts.OperatorPrefix}
	}
	s.console = console.New(cfg)
	h := s.console.Handler()
	mux.Handle(console.Path, h)
	mux.Handle(console.Path+"/", h)
}
