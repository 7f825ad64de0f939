package cli

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/aethermesh/aether/agent"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/registry"
)

func newAgentCmd() *cobra.Command {
	var (
		cfg                 agent.Config
		registrars          []string
		endpoints, labels   []string
		httpAddr            string
		logLevel, logFormat string
		tf                  tlsFlags
		xtf                 xdsTLSFlags
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the node agent: announce this node and keep its endpoints registered",
		Long: `Run the node agent, one per node or appliance. It announces the node
(name, site, region, cluster, address, offered services, a health summary
and labels), keeps that record alive with heartbeats through any of the
given registrars, and keeps its endpoints registered.

Endpoints come from repeatable --endpoint flags and/or --endpoints-file, one
"service=ip:port[/protocol]" per line (# comments allowed), re-read when it
changes. An endpoint dropped from the file is drained, then removed after
--drain-period.

If the agent stops (killed or partitioned away), the node and its endpoints
disappear once the registrar's --node-ttl passes. On SIGTERM the agent
drains its endpoints, waits --drain-period, deregisters them, removes the
node record and exits 0.

With --xds-addr (e.g. 127.0.0.1:15010) the agent also serves xDS to the
node's proxies and proxyless gRPC clients (xds:///service) from its local
cache, so they keep their configuration while every registrar is down.
The agent watches only its own services and those its xDS clients ask
for: they join its subscription and leave it --xds-linger after no xDS
client names them, and an agent with neither watches nothing (see
README, "xDS"). The xDS port is plaintext, for a loopback --xds-addr;
--xds-tls-cert and --xds-tls-key make it TLS, and --xds-tls-client-ca
makes it mutual TLS (client certificates of that CA required). A
plaintext --xds-addr off loopback is served with a warning. With
--http-addr the agent serves /xds/status there, for "aether xds status".`,
		Example: `  aether agent --node node-a --zone z1 --registrar 10.0.0.10:9443,10.0.0.11:9443 \
    --endpoint web=10.0.1.5:8080/http --endpoint api=10.0.1.5:9090/grpc
  aether agent --node node-a --zone z1 --xds-addr 127.0.0.1:15010 --endpoint web=10.0.1.5:8080/grpc
  aether agent --node node-a --zone z1 --xds-addr :15010 --xds-tls-cert server-node-a.pem \
    --xds-tls-key server-node-a-key.pem --xds-tls-client-ca ca.pem --http-addr 127.0.0.1:15000
  aether agent --node node-a --cacert ca.pem --cert node-node-a.pem --key node-node-a-key.pem \
    --endpoint web=10.0.1.5:8080/http`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(cmd.ErrOrStderr(), logLevel, logFormat)
			if err != nil {
				return err
			}
			cfg.Logger = log
			// agent.New fills an empty region or cluster and a non-positive
			// drain period with defaults; given explicitly they are mistakes.
			if err := refuseZeros(cmd.Flags(), "region", "cluster", "drain-period", "xds-linger"); err != nil {
				return err
			}
			if cfg.XDSLinger < 0 {
				return fmt.Errorf("--xds-linger %s: must be positive (a service no proxy asks for stays watched this long)", cfg.XDSLinger)
			}
			if cfg.DrainPeriod < 0 {
				return fmt.Errorf("--drain-period %s: must be positive (endpoints stay DRAINING this long so proxies finish in-flight requests)", cfg.DrainPeriod)
			}
			for _, r := range registrars {
				if r = strings.TrimSpace(r); r != "" {
					addr, err := registrarAddr("--registrar", r)
					if err != nil {
						return err
					}
					cfg.Registrars = append(cfg.Registrars, addr)
				}
			}
			if cfg.Node == "" {
				return errors.New("--node is required: the name this node is registered under")
			}
			for _, spec := range endpoints {
				ep, err := agent.ParseEndpoint(spec)
				if err != nil {
					return fmt.Errorf("--endpoint %w", err)
				}
				cfg.Endpoints = append(cfg.Endpoints, ep)
			}
			if cfg.Labels, err = parseLabels(labels); err != nil {
				return err
			}
			for flag, v := range map[string]string{"--zone": cfg.Zone, "--region": cfg.Region, "--cluster": cfg.Cluster} {
				if v != "" {
					if err := registry.ValidateName(flag, v); err != nil {
						return err
					}
				}
			}
			if cfg.XDSAddr != "" {
				if _, _, err := net.SplitHostPort(cfg.XDSAddr); err != nil {
					return fmt.Errorf("--xds-addr %q: not a host:port address (%v); use e.g. 127.0.0.1:15010", cfg.XDSAddr, unwrapAddrErr(err))
				}
			}
			if err := xtf.validate(cfg.XDSAddr); err != nil {
				return err
			}
			if cfg.Address != "" {
				if cfg.Address, err = registry.CanonicalIP(cfg.Address); err != nil {
					return fmt.Errorf("--address: %w", err)
				}
			}
			if tf.enabled() {
				if err := tf.validate(); err != nil {
					return err
				}
				// Reloaded: a long-running agent picks up a renewed
				// certificate on its next connection, without a restart.
				creds, rl, err := pki.ClientCredentials(tf.cacert, tf.cert, tf.key, 30*time.Second, pki.WithLogger(log))
				if err != nil {
					return fmt.Errorf("--cacert/--cert/--key: %w", err)
				}
				defer rl.Close()
				cfg.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(creds)}
			}
			if xtf.enabled() {
				// Reloaded as the registrar's: a renewed certificate (or CA
				// bundle) is served from the next handshake on.
				tlsCfg, rl, err := pki.ServerTLSConfig(xtf.cert, xtf.key, xtf.clientCA, xtf.clientCA != "", xdsTLSReload, pki.WithLogger(log))
				if err != nil {
					return fmt.Errorf("--xds-tls-cert/--xds-tls-key/--xds-tls-client-ca: %w", err)
				}
				defer rl.Close()
				cfg.XDSTLS = tlsCfg
			}
			reg := prometheus.NewRegistry()
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			cfg.Registerer = reg
			a, err := agent.New(cfg)
			if err != nil {
				return err
			}
			if !tf.enabled() {
				log.Warn("connecting to the registrars in plaintext (no --cacert/--cert/--key): development only; see docs/security.md")
			}
			if httpAddr != "" {
				lis, err := net.Listen("tcp", httpAddr)
				if err != nil {
					return fmt.Errorf("--http-addr %s: %w (choose a free address)", httpAddr, err)
				}
				mux := http.NewServeMux()
				mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
				mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
				if h := a.XDSStatusHandler(); h != nil {
					// The document a registrar serves on its HTTP port, so
					// "aether xds status --http-addr" reads either.
					mux.Handle("/xds/status", h)
				}
				srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
				served := make(chan struct{})
				go func() { defer close(served); _ = srv.Serve(lis) }()
				defer func() { _ = srv.Close(); <-served }()
			}
			return a.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Node, "node", "", "node name (required)")
	f.StringVar(&cfg.Zone, "zone", "", "the node's site (availability zone)")
	f.StringVar(&cfg.Region, "region", "default", "the node's region (must match its registrars')")
	f.StringVar(&cfg.Cluster, "cluster", "default", "the node's cluster (must match its registrars' --cluster-name)")
	f.StringVar(&cfg.Address, "address", "", "the node's own IP address")
	f.StringSliceVar(&registrars, "registrar", []string{"127.0.0.1:9443"}, "registrar addresses (host:port; a bare host means port "+DefaultRegistrarPort+"), comma separated; the agent fails over between them")
	f.StringArrayVar(&endpoints, "endpoint", nil, "endpoint to keep registered: service=ip:port[/protocol] (repeatable)")
	f.StringVar(&cfg.EndpointsFile, "endpoints-file", "", "file with one service=ip:port[/protocol] per line, re-read when it changes")
	f.StringArrayVar(&labels, "label", nil, "node label key=value (repeatable)")
	f.DurationVar(&cfg.DrainPeriod, "drain-period", 5*time.Second, "how long endpoints stay DRAINING before they are removed")
	f.StringVar(&httpAddr, "http-addr", "", "serve /metrics and /healthz (and with --xds-addr /xds/status) here, plaintext (off when empty)")
	f.StringVar(&cfg.XDSAddr, "xds-addr", "", "serve xDS to this node's proxies from the agent's cache on this address, e.g. 127.0.0.1:15010 (loopback keeps it to the node; plaintext unless --xds-tls-cert); empty (the default) serves none")
	f.StringVar(&xtf.cert, "xds-tls-cert", "", "serve --xds-addr over TLS with this certificate (PEM; reloaded when the file changes); needs --xds-tls-key")
	f.StringVar(&xtf.key, "xds-tls-key", "", "private key of --xds-tls-cert (PEM)")
	f.StringVar(&xtf.clientCA, "xds-tls-client-ca", "", "require xDS clients to present a certificate issued by this CA (PEM bundle): mutual TLS; needs --xds-tls-cert")
	f.DurationVar(&cfg.XDSLinger, "xds-linger", agent.DefaultXDSLinger, "with --xds-addr: how long a service no xDS client asks for any more stays in the agent's subscription")
	f.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	addTLSFlags(f, &tf)
	return cmd
}

func parseLabels(specs []string) (map[string]string, error) {
	if len(specs) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	for _, s := range specs {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--label %q: expected key=value", s)
		}
		out[k] = v
	}
	if _, err := registry.NormalizeNode(&registryv1.Node{Name: "n", Region: "r", Cluster: "c", Labels: out}, registry.DefaultLimits); err != nil {
		return nil, fmt.Errorf("--label: %w", err)
	}
	return out, nil
}

// xdsTLSReload is how often the xDS port's certificate files are checked
// for changes: the registrar's default --tls-reload-interval.
const xdsTLSReload = 10 * time.Second

// xdsTLSFlags are the agent's xDS server TLS flags, the registrar's
// --tls-cert/--tls-key/--tls-client-ca for its --xds-addr.
type xdsTLSFlags struct{ cert, key, clientCA string }

func (x *xdsTLSFlags) enabled() bool { return x.cert != "" || x.key != "" || x.clientCA != "" }

// validate checks the flags go together, as the registrar's do, before
// anything is dialled or bound.
func (x *xdsTLSFlags) validate(xdsAddr string) error {
	switch {
	case !x.enabled():
		return nil
	case xdsAddr == "":
		return errors.New("--xds-tls-cert, --xds-tls-key and --xds-tls-client-ca secure the xDS port: add --xds-addr or drop them")
	case x.cert != "" && x.key == "":
		return errors.New("--xds-tls-cert needs --xds-tls-key: give the xDS port's certificate and its private key together (or neither, for plaintext on loopback)")
	case x.key != "" && x.cert == "":
		return errors.New("--xds-tls-key needs --xds-tls-cert: give the xDS port's certificate and its private key together (or neither, for plaintext on loopback)")
	case x.clientCA != "" && x.cert == "":
		return errors.New("--xds-tls-client-ca needs --xds-tls-cert and --xds-tls-key: client certificates can only be verified over TLS (aether certs issue --server HOST makes a pair)")
	}
	return nil
}
