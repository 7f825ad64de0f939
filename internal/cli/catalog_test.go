package cli

import (
	"context"
	"strings"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/server"
)

// catalogRow is one default or validation rule of the command line, run
// through the real command tree. Exactly one of err and check says what
// must happen: the command fails with a message containing err (which
// names the flag, field or character and the fix), or it succeeds and
// check holds.
type catalogRow struct {
	rule  string
	env   map[string]string
	args  []string // "{registrar}" is replaced by the address of the row's registrar
	err   string
	check func(t *testing.T, res result)
}

// TestDefaultsCatalog is the catalog of the defaults and validation rules
// of issue 12 ("Safe, honest defaults"): loopback listeners without TLS,
// an explicit zero refused by name where the option would silently take
// the default, ports that clash, the offending character of a name, the
// registrar's port for a bare --registrar host, and the warning for an
// endpoint bound to a node that has no live record. Rows that must fail
// before any connection run against a sentinel that counts connections.
func TestDefaultsCatalog(t *testing.T) {
	served := func(want func(o server.Config) string) func(*testing.T, result) {
		return func(t *testing.T, res result) {
			if res.served == nil {
				t.Fatal("Serve was not called")
			}
			if msg := want(*res.served); msg != "" {
				t.Error(msg)
			}
		}
	}
	listen := func(grpcAddr, httpAddr string) func(*testing.T, result) {
		return served(func(o server.Config) string {
			if o.GRPCAddr != grpcAddr || o.HTTPAddr != httpAddr {
				return "listening on " + o.GRPCAddr + " and " + o.HTTPAddr + ", want " + grpcAddr + " and " + httpAddr
			}
			return ""
		})
	}
	tls := []string{"--tls-cert", "s.pem", "--tls-key", "k.pem"}
	reg := []string{"register", "--registrar", "{registrar}", "--service", "web", "--ip", "10.0.0.1"}
	agent := []string{"agent", "--registrar", "{registrar}", "--node", "n1"}
	with := func(base []string, extra ...string) []string { return append(append([]string{}, base...), extra...) }

	rows := []catalogRow{
		// Listeners: loopback unless TLS is on or an address is given.
		{rule: "plaintext listens on loopback", args: []string{"registrar"}, check: listen("127.0.0.1:9443", "127.0.0.1:8081")},
		{rule: "with TLS every interface", args: with([]string{"registrar"}, tls...), check: listen(":9443", ":8081")},
		{rule: "an explicit address wins", args: []string{"registrar", "--grpc-addr", ":9443", "--http-addr", "0.0.0.0:8081"}, check: listen(":9443", "0.0.0.0:8081")},
		{rule: "an address from the environment is explicit", env: map[string]string{"AETHER_GRPC_ADDR": "0.0.0.0:9443"}, args: []string{"registrar"}, check: listen("0.0.0.0:9443", "127.0.0.1:8081")},
		{rule: "an explicit address wins over TLS", args: with([]string{"registrar", "--http-addr", "127.0.0.1:8081"}, tls...), check: listen(":9443", "127.0.0.1:8081")},
		{rule: "an empty address is refused", args: []string{"registrar", "--grpc-addr", ""}, err: `--grpc-addr "": not a host:port address`},
		{rule: "xDS is off by default", args: []string{"registrar"}, check: served(func(o server.Config) string {
			if o.XDSAddr != "" {
				return "XDSAddr " + o.XDSAddr + ", want empty (off)"
			}
			return ""
		})},
		{rule: "--xds-addr is passed on", args: []string{"registrar", "--xds-addr", "127.0.0.1:15010"}, check: served(func(o server.Config) string {
			if o.XDSAddr != "127.0.0.1:15010" {
				return "XDSAddr " + o.XDSAddr + ", want 127.0.0.1:15010"
			}
			return ""
		})},
		{rule: "a bad --xds-addr is refused by name", args: []string{"registrar", "--xds-addr", "15010"}, err: `--xds-addr "15010": not a host:port address`},

		// Registrar flags whose zero would silently be the default.
		{rule: "zero --sync-interval", args: []string{"registrar", "--sync-interval", "0s"}, err: "--sync-interval 0s: must be positive (0 is not a setting here: it would silently mean the default); to run with the default (5s), leave --sync-interval out"},
		{rule: "zero --sync-debounce", args: []string{"registrar", "--sync-debounce", "0"}, err: "--sync-debounce 0s: must be positive"},
		{rule: "empty --sync-mode", args: []string{"registrar", "--sync-mode", ""}, err: `--sync-mode "": must not be empty; to run with the default (watch), leave --sync-mode out`},
		{rule: "zero --write-batch-interval", args: []string{"registrar", "--write-batch-interval", "0"}, err: "--write-batch-interval 0s: must be positive"},
		{rule: "zero --write-batch-size", args: []string{"registrar", "--write-batch-size", "0"}, err: "--write-batch-size 0: must be positive (0 is not a setting here: it would silently mean the default); to run with the default (50), leave --write-batch-size out"},
		{rule: "zero --write-queue-limit", args: []string{"registrar", "--write-queue-limit", "0"}, err: "--write-queue-limit 0: must be positive"},
		{rule: "zero --watch-history", args: []string{"registrar", "--watch-history", "0"}, err: "--watch-history 0: must be positive"},
		{rule: "zero --watch-buffer", args: []string{"registrar", "--watch-buffer", "0"}, err: "--watch-buffer 0: must be positive"},
		{rule: "zero --watch-progress-interval", args: []string{"registrar", "--watch-progress-interval", "0s"}, err: "--watch-progress-interval 0s: must be positive"},
		{rule: "zero --node-ttl", args: []string{"registrar", "--node-ttl", "0s"}, err: "--node-ttl 0s: must be positive (0 is not a setting here: it would silently mean the default); to run with the default (30s), leave --node-ttl out"},
		{rule: "zero --node-ttl from the environment", env: map[string]string{"AETHER_NODE_TTL": "0s"}, args: []string{"registrar"}, err: "--node-ttl 0s: must be positive"},
		{rule: "zero --replication-lease-ttl", args: []string{"registrar", "--replication-lease-ttl", "0s"}, err: "--replication-lease-ttl 0s: must be positive"},
		{rule: "zero --tls-reload-interval", args: []string{"registrar", "--tls-reload-interval", "0s"}, err: "--tls-reload-interval 0s: must be positive"},
		{rule: "zero --max-recv-msg-size", args: []string{"registrar", "--max-recv-msg-size", "0"}, err: "--max-recv-msg-size 0: must be positive"},
		{rule: "zero --max-metadata-entries", args: []string{"registrar", "--max-metadata-entries", "0"}, err: "--max-metadata-entries 0: must be positive"},
		{rule: "zero --max-metadata-bytes", args: []string{"registrar", "--max-metadata-bytes", "0"}, err: "--max-metadata-bytes 0: must be positive"},
		{rule: "zero --max-watch-services", args: []string{"registrar", "--max-watch-services", "0"}, err: "--max-watch-services 0: must be positive"},
		{rule: "zero --max-endpoints-per-node", args: []string{"registrar", "--max-endpoints-per-node", "0"}, err: "--max-endpoints-per-node 0: must be positive"},
		{rule: "--max-streams-per-identity 0 is documented: unlimited", args: []string{"registrar", "--max-streams-per-identity", "0"},
			check: served(func(o server.Config) string {
				if o.MaxStreamsPerIdentity != -1 {
					return "MaxStreamsPerIdentity is not -1 (unlimited)"
				}
				return ""
			})},

		// Agent flags whose zero agent.New would replace.
		{rule: "zero --drain-period", args: with(agent, "--drain-period", "0s"), err: "--drain-period 0s: must be positive (0 is not a setting here: it would silently mean the default); to run with the default (5s), leave --drain-period out"},
		{rule: "negative --drain-period", args: with(agent, "--drain-period", "-1s"), err: "--drain-period -1s: must be positive"},
		{rule: "empty agent --region", args: with(agent, "--region", ""), err: `--region "": must not be empty; to run with the default (default), leave --region out`},
		{rule: "empty agent --cluster", args: with(agent, "--cluster", ""), err: `--cluster "": must not be empty`},
		{rule: "client --timeout 0 (existing)", args: []string{"list", "--registrar", "{registrar}", "--timeout", "0s"}, err: "--timeout 0s: must be positive"},

		// Ports.
		{rule: "duplicate port numbers", args: with(reg, "--port", "http=8080", "--port", "admin=8080"), err: "--port admin=8080: port number 8080 is already given by --port http=8080; each port of an endpoint needs its own number"},
		{rule: "empty port name among several", args: with(reg, "--port", "http=8080", "--port", "=9090"), err: "--port =9090: port name must not be empty"},
		{rule: "unnamed port among several", args: with(reg, "--port", "http=8080", "--port", "9090"), err: "--port 9090: name each port when giving more than one"},

		// Names: the offending character, by rune.
		{rule: "service name character", args: []string{"register", "--registrar", "{registrar}", "--service", "Wéb", "--ip", "10.0.0.1", "--port", "80"}, err: `--service: service "Wéb" contains "é"`},
		{rule: "node name character", args: with(reg, "--port", "80", "--node", "nœud"), err: `--node: node "nœud" contains "œ"`},
		{rule: "registrar region character", args: []string{"registrar", "--region", "eu-wést"}, err: `--region: region "eu-wést" contains "é"`},
		{rule: "agent zone character", args: with(agent, "--zone", "zöne"), err: `--zone "zöne" contains "ö"`},

		// --registrar HOST: the registrar's port, not 443.
		{rule: "malformed --registrar", args: []string{"list", "--registrar", "[::1", "--timeout", "1s"}, err: `--registrar "[::1": not a host:port address`},
		{rule: "--registrar with an empty port", args: []string{"list", "--registrar", "localhost:", "--timeout", "1s"}, err: `--registrar "localhost:": give both host and port`},
		{rule: "agent --registrar with an empty port", args: []string{"agent", "--node", "n1", "--registrar", "localhost:"}, err: `--registrar "localhost:": give both host and port`},
	}
	for _, row := range rows {
		t.Run(row.rule, func(t *testing.T) {
			t.Parallel()
			s := newSentinel(t)
			args := make([]string, len(row.args))
			for i, a := range row.args {
				args[i] = strings.ReplaceAll(a, "{registrar}", s.addr())
			}
			res := runCLI(t, nil, row.env, args...)
			if row.err != "" {
				if res.err == nil || !strings.Contains(res.err.Error(), row.err) {
					t.Fatalf("error %v\nwant it to contain %q", res.err, row.err)
				}
				if res.served != nil {
					t.Error("Serve was called despite the refused flag")
				}
				if n := s.conns.Load(); n != 0 {
					t.Errorf("%d connection(s) to the registrar; flags must be checked first", n)
				}
				return
			}
			if res.err != nil {
				t.Fatalf("error %v, want success", res.err)
			}
			row.check(t, res)
		})
	}
}

// TestRegistrarAddrDefaultPort: a --registrar value without a port gets
// the registrar's default port; gRPC would dial 443.
func TestRegistrarAddrDefaultPort(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.1":            "10.0.0.1:9443",
		"registrar.internal":  "registrar.internal:9443",
		"localhost":           "localhost:9443",
		"::1":                 "[::1]:9443",
		"[fd00::1]":           "[fd00::1]:9443",
		"10.0.0.1:9000":       "10.0.0.1:9000",
		"[::1]:9000":          "[::1]:9000",
		" 10.0.0.1 ":          "10.0.0.1:9443",
		"dns:///r.internal:1": "dns:///r.internal:1",
		"unix:///run/a.sock":  "unix:///run/a.sock",
	} {
		got, err := registrarAddr("--registrar", in)
		if err != nil || got != want {
			t.Errorf("registrarAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	// Through the command: a bare host is dialled, and reported, with the
	// registrar's port.
	// (If a registrar answers on 127.0.0.1:9443 here, the call succeeds,
	// which shows the same.)
	res := runCLI(t, nil, nil, "list", "--registrar", "127.0.0.1", "--timeout", "2s")
	if res.err != nil && !strings.Contains(res.err.Error(), "registrar at 127.0.0.1:9443") {
		t.Errorf("error %q does not name 127.0.0.1:9443", res.err)
	}
}

// TestRegisterWithNodeWithoutLiveRecordWarns: an endpoint bound to a node
// with no live node record is registered, and the user is told it will be
// swept; with the node announced, or without --node, nothing is said.
func TestRegisterWithNodeWithoutLiveRecordWarns(t *testing.T) {
	r := startRegistrar(t, etcdtest.Start(t))
	reg := func(extra ...string) result {
		t.Helper()
		res := runCLI(t, nil, nil, append([]string{"register", "--registrar", r.addr(), "--service", "web", "--port", "80"}, extra...)...)
		if res.err != nil {
			t.Fatalf("register %v: %v", extra, res.err)
		}
		return res
	}

	res := reg("--ip", "10.0.0.1", "--node", "ghost")
	for _, want := range []string{"warning: node ghost has no live record", "aether agent --node ghost", "removed by the registrar's ghost sweep after its --node-ttl", "register without --node for a static endpoint"} {
		if !strings.Contains(res.stderr, want) {
			t.Errorf("stderr %q lacks %q", res.stderr, want)
		}
	}
	if !strings.Contains(res.stdout, "registered web 10.0.0.1 (http)") {
		t.Errorf("stdout %q: the endpoint must still be registered", res.stdout)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := r.c.AnnounceNode(ctx, &registrarv1.AnnounceNodeRequest{Node: &registryv1.Node{Name: "node-a"}}); err != nil {
		t.Fatal(err)
	}
	if res := reg("--ip", "10.0.0.2", "--node", "node-a"); res.stderr != "" {
		t.Errorf("live node: stderr %q, want nothing", res.stderr)
	}
	if res := reg("--ip", "10.0.0.3"); res.stderr != "" {
		t.Errorf("no --node: stderr %q, want nothing", res.stderr)
	}
}
