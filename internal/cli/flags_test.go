package cli

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// TestFlagErrors checks that bad flags and environment values fail with a
// message naming the flag (or variable), before any connection is made.
func TestFlagErrors(t *testing.T) {
	t.Parallel()
	reg := []string{"register", "--service", "web", "--ip", "10.0.0.1"}
	with := func(base []string, extra ...string) []string {
		return append(append([]string{}, base...), extra...)
	}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"port zero", nil, with(reg, "--port", "0"), "--port 0: not a port number (1-65535)"},
		{"port too big", nil, with(reg, "--port", "70000"), "--port 70000: not a port number (1-65535)"},
		{"port not a number", nil, with(reg, "--port", "abc"), "--port abc: not a port number (1-65535)"},
		{"named port not a number", nil, with(reg, "--port", "http=x"), "--port http=x: not a port number (1-65535)"},
		{"bad port name", nil, with(reg, "--port", "a/b=80"), `--port a/b=80: port name "a/b" must not contain '/'`},
		{"missing port", nil, reg, "--port is required"},
		{"unnamed port among several", nil, with(reg, "--port", "http=8080", "--port", "9090"), "--port 9090: name each port when giving more than one (e.g. --port http=9090)"},
		{"duplicate port name", nil, with(reg, "--port", "a=1,a=2"), `--port a=2: duplicate port name "a"`},
		{"port-name with no unnamed port", nil, with(reg, "--port", "http=80", "--port-name", "web"), "--port-name web: every --port is already named"},
		{"port-name with two unnamed ports", nil, with(reg, "--port", "80,81", "--port-name", "web"), "--port-name web: 2 ports are unnamed"},
		{"unknown protocol", nil, with(reg, "--port", "80", "--protocol", "ftp"), `--protocol: unknown protocol "ftp" (use one of http, h2c, grpc, tcp)`},
		{"ip not an ip", nil, []string{"register", "--service", "web", "--ip", "not-an-ip", "--port", "80"}, `--ip: ip "not-an-ip" is not an IPv4 or IPv6 address`},
		{"unspecified ip", nil, []string{"register", "--service", "web", "--ip", "0.0.0.0", "--port", "80"}, `--ip: ip "0.0.0.0" is the unspecified address`},
		{"missing ip", nil, []string{"register", "--service", "web", "--port", "80"}, "--ip is required"},
		{"missing service", nil, []string{"register", "--ip", "10.0.0.1", "--port", "80"}, "--service is required"},
		{"bad service", nil, []string{"register", "--service", "-web", "--ip", "10.0.0.1", "--port", "80"}, `--service: service "-web" must start and end with a letter or digit`},
		{"meta without =", nil, with(reg, "--port", "80", "--meta", "version"), `--meta "version": expected key=value`},
		{"meta empty key", nil, with(reg, "--port", "80", "--meta", "=x"), `--meta "=x": expected key=value`},
		{"meta duplicate key", nil, with(reg, "--port", "80", "--meta", "a=1", "--meta", "a=2"), `--meta "a=2": key "a" is given more than once`},
		{"bad node", nil, with(reg, "--port", "80", "--node", "a b"), `--node: node "a b" contains " "`},
		{"bad zone", nil, with(reg, "--port", "80", "--zone", ".."), `--zone: zone ".." must start and end`},
		{"negative weight", nil, with(reg, "--port", "80", "--weight", "-1"), `invalid argument "-1" for "--weight" flag`},
		{"zero timeout", nil, with(reg, "--port", "80", "--timeout", "0s"), "--timeout 0s: must be positive"},
		{"empty registrar", nil, with(reg, "--port", "80", "--registrar", ""), "--registrar must not be empty"},
		{"unknown flag", nil, with(reg, "--bogus"), "unknown flag: --bogus (see 'aether register --help')"},
		{"positional argument", nil, with(reg, "extra"), `unknown command "extra" for "aether register"`},

		{"env timeout", map[string]string{"AETHER_TIMEOUT": "abc"}, with(reg, "--port", "80"), `invalid environment variable AETHER_TIMEOUT="abc" for --timeout: time: invalid duration "abc"`},
		{"env weight", map[string]string{"AETHER_WEIGHT": "heavy"}, with(reg, "--port", "80"), `invalid environment variable AETHER_WEIGHT="heavy" for --weight`},
		{"env port", map[string]string{"AETHER_PORT": "0"}, reg, "--port 0: not a port number (1-65535)"},
		{"env protocol", map[string]string{"AETHER_PROTOCOL": "ftp"}, with(reg, "--port", "80"), `--protocol: unknown protocol "ftp"`},

		{"deregister missing ip", nil, []string{"deregister", "--service", "web"}, "--ip is required"},
		{"deregister unknown protocol", nil, []string{"deregister", "--service", "web", "--ip", "10.0.0.1", "--protocol", "udp"}, `--protocol: unknown protocol "udp"`},
		{"deregister bad ip", nil, []string{"deregister", "--service", "web", "--ip", "fe80::1%eth0"}, `--ip: ip "fe80::1%eth0" has a zone`},

		{"list yaml", nil, []string{"list", "-o", "yaml"}, `-o/--output "yaml": use table or json`},
		{"list bad service", nil, []string{"list", "--service", "a/b"}, `--service: service "a/b" must not contain '/'`},
		{"list env output", map[string]string{"AETHER_OUTPUT": "yaml"}, []string{"list"}, `-o/--output "yaml": use table or json`},
		{"list env timeout", map[string]string{"AETHER_TIMEOUT": "-1s"}, []string{"list"}, "--timeout -1s: must be positive"},
		{"watch table", nil, []string{"watch", "-o", "table"}, `-o/--output "table": use text or json`},
		{"watch bad service", nil, []string{"watch", "--service", "web,"}, `--service: service must not be empty`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newSentinel(t)
			// Defaults first, so the case's own flags win.
			args := []string{tc.args[0], "--registrar", s.addr()}
			if _, set := tc.env["AETHER_TIMEOUT"]; !set {
				args = append(args, "--timeout", "2s") // keep a wrongly attempted call short
			}
			args = append(args, tc.args[1:]...)
			env := tc.env
			res := runCLI(t, nil, env, args...)
			if res.err == nil {
				t.Fatalf("no error; stdout %q", res.stdout)
			}
			if !strings.Contains(res.err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to contain %q", res.err, tc.want)
			}
			if strings.Contains(res.err.Error(), "cannot reach registrar") || strings.Contains(res.err.Error(), "did not answer") {
				t.Errorf("error %q is a connection error, want a flag error", res.err)
			}
			if n := s.conns.Load(); n != 0 {
				t.Errorf("%d connection(s) to the registrar; flags must be checked first", n)
			}
			if res.stdout != "" || res.stderr != "" {
				t.Errorf("output on error: stdout %q, stderr %q (errors are printed once, by main)", res.stdout, res.stderr)
			}
		})
	}
}

func TestRegistrarFlagErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"log level", nil, []string{"--log-level", "verbose"}, `--log-level "verbose": use debug, info, warn or error`},
		{"log format", nil, []string{"--log-format", "xml"}, `--log-format "xml": use text or json`},
		{"cluster name", nil, []string{"--cluster-name", "a/b"}, `--cluster-name: cluster name "a/b" must not contain '/'`},
		{"empty region", nil, []string{"--region", ""}, "--region: region must not be empty"},
		{"zone", nil, []string{"--zone", "eu west"}, `--zone: zone "eu west" contains " "`},
		{"negative duration", nil, []string{"--sync-interval", "-1s"}, "--sync-interval must be positive"},
		{"sync mode", nil, []string{"--sync-mode", "push"}, `--sync-mode "push": use watch or poll`},
		{"env sync mode", map[string]string{"AETHER_SYNC_MODE": "Watch"}, nil, `--sync-mode "Watch": use watch or poll`},
		{"negative int", nil, []string{"--watch-buffer", "-5"}, "--watch-buffer must be positive"},
		{"grpc addr", nil, []string{"--grpc-addr", "9443"}, `--grpc-addr "9443": not a host:port address (missing port in address)`},
		{"peer addr", nil, []string{"--embedded-etcd-peer-addr", "localhost"}, `--embedded-etcd-peer-addr "localhost": not a host:port address`},
		{"empty etcd endpoint", nil, []string{"--etcd-endpoints", "http://a:2379,,http://b:2379"}, "--etcd-endpoints: entry 2 is empty"},
		{"not an int", nil, []string{"--write-batch-size", "many"}, `invalid argument "many" for "--write-batch-size" flag`},
		{"env int", map[string]string{"AETHER_WRITE_QUEUE_LIMIT": "lots"}, nil, `invalid environment variable AETHER_WRITE_QUEUE_LIMIT="lots" for --write-queue-limit`},
		{"env duration", map[string]string{"AETHER_WATCH_PROGRESS_INTERVAL": "10"}, nil, `AETHER_WATCH_PROGRESS_INTERVAL="10" for --watch-progress-interval: time: missing unit in duration "10"`},
		{"env validated", map[string]string{"AETHER_REGION": "a..b"}, nil, `--region: region "a..b" must not contain ".."`},
		{"tls cert without key", nil, []string{"--tls-cert", "s.pem"}, "--tls-cert needs --tls-key"},
		{"client ca without trust domain", map[string]string{"AETHER_TLS_CERT": "s.pem", "AETHER_TLS_KEY": "k.pem"}, []string{"--tls-client-ca", "ca.pem"},
			"--tls-client-ca needs --trust-domain"},
		{"etcd tls without endpoints", nil, []string{"--etcd-cacert", "ca.pem"}, "add --etcd-endpoints https://HOST:2379"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := runCLI(t, nil, tc.env, append([]string{"registrar"}, tc.args...)...)
			if res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
				t.Fatalf("error %v\nwant it to contain %q", res.err, tc.want)
			}
			if res.served != nil {
				t.Error("Serve was called despite the bad flag")
			}
		})
	}
}

// TestRegistrarOptions checks that flags and environment map 1:1 onto
// server.Config, that the defaults are server.DefaultConfig (but for the
// sync mode, left to the registrar unless given) and that a flag wins over
// the environment.
func TestRegistrarOptions(t *testing.T) {
	t.Parallel()

	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		res := runCLI(t, nil, nil, "registrar")
		if res.err != nil {
			t.Fatal(res.err)
		}
		got := *res.served
		if got.Logger == nil {
			t.Error("Logger not set")
		}
		got.Logger = nil
		want := server.DefaultConfig()
		want.SyncMode = "" // the registrar picks it by its backend's capabilities
		if !optionsEqual(got, want) {
			t.Errorf("options\n got %+v\nwant %+v", got, want)
		}
	})

	t.Run("flags and env", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{
			"AETHER_ETCD_ENDPOINTS":          "http://e1:2379,http://e2:2379",
			"AETHER_DATA_DIR":                "/var/lib/aether",
			"AETHER_EMBEDDED_ETCD_ADDR":      "127.0.0.1:12379",
			"AETHER_EMBEDDED_ETCD_PEER_ADDR": "127.0.0.1:12380",
			"AETHER_GRPC_ADDR":               "0.0.0.0:1", // overridden by the flag below
			"AETHER_HTTP_ADDR":               ":18081",
			"AETHER_CLUSTER_NAME":            "c1",
			"AETHER_REGION":                  "eu-west",
			"AETHER_ZONE":                    "eu-west-1a",
			"AETHER_SYNC_MODE":               "poll",
			"AETHER_SYNC_INTERVAL":           "30s",
			"AETHER_SYNC_DEBOUNCE":           "1s",
			"AETHER_WRITE_BATCH_INTERVAL":    "50ms",
			"AETHER_WRITE_BATCH_SIZE":        "10",
			"AETHER_WRITE_QUEUE_LIMIT":       "20",
			"AETHER_WATCH_HISTORY":           "30",
			"AETHER_WATCH_BUFFER":            "40",
			"AETHER_NODE_TTL":                "45s",
			"AETHER_REPLICATION_LEASE_TTL":   "10s",
			"AETHER_LOG_LEVEL":               "debug",
			"AETHER_LOG_FORMAT":              "json",
			"AETHER_MAX_RECV_MSG_SIZE":       "1048576",
			"AETHER_MAX_METADATA_ENTRIES":    "8",
			"AETHER_MAX_WATCH_SERVICES":      "50",
			"AETHER_MAX_ENDPOINTS_PER_NODE":  "7",
		}
		res := runCLI(t, nil, env, "registrar", "--grpc-addr", ":19443", "--watch-progress-interval", "2s",
			"--max-metadata-bytes", "512", "--max-streams-per-identity", "3",
			"--peer-etcd", "us-east=http://p1:2379,http://p2:2379", "--peer-etcd", "ap-south=http://p3:2379",
			"--peer-watch", "--peer-advertise-addr", "r1.example:19443", "--peer-member-ttl", "6s")
		if res.err != nil {
			t.Fatal(res.err)
		}
		got := *res.served
		if got.Logger == nil || !got.Logger.Enabled(t.Context(), -4) {
			t.Error("Logger missing or not at debug level")
		}
		got.Logger = nil
		want := server.Config{
			EtcdEndpoints:         []string{"http://e1:2379", "http://e2:2379"},
			DataDir:               "/var/lib/aether",
			EmbeddedEtcdAddr:      "127.0.0.1:12379",
			EmbeddedEtcdPeerAddr:  "127.0.0.1:12380",
			GRPCAddr:              ":19443",
			HTTPAddr:              ":18081",
			PeerEtcd:              []string{"us-east=http://p1:2379,http://p2:2379", "ap-south=http://p3:2379"},
			ReplicationLeaseTTL:   10 * time.Second,
			TLSReloadInterval:     10 * time.Second, // the flag's default
			MaxRecvMsgSize:        1 << 20,
			MaxStreamsPerIdentity: 3,
			PeerAdvertiseAddr:     "r1.example:19443",
			Options: registrar.Options{
				PeerWatch:             true,
				PeerMemberTTL:         6 * time.Second,
				PeerDiscoveryInterval: time.Second, // the flag's default
				Zone:                  "eu-west-1a",
				MaxWatchServices:      50,
				ClusterName:           "c1",
				Region:                "eu-west",
				SyncMode:              registrar.SyncPoll,
				SyncInterval:          30 * time.Second,
				SyncDebounce:          time.Second,
				WriteBatchInterval:    50 * time.Millisecond,
				WriteBatchSize:        10,
				WriteQueueLimit:       20,
				WatchHistory:          30,
				WatchBuffer:           40,
				ProgressInterval:      2 * time.Second,
				NodeTTL:               45 * time.Second,
				MaxMetadataEntries:    8,
				MaxMetadataBytes:      512,
				MaxEndpointsPerNode:   7,
			},
		}
		want.Backend, want.DynamoDBFullScanInterval = server.BackendEtcd, 5*time.Minute // the backend flags' defaults
		if !optionsEqual(got, want) {
			t.Errorf("options\n got %+v\nwant %+v", got, want)
		}
	})

	t.Run("limit flags", func(t *testing.T) {
		t.Parallel()
		res := runCLI(t, nil, map[string]string{"AETHER_MAX_STREAMS_PER_IDENTITY": "0"}, "registrar")
		if res.err != nil {
			t.Fatal(res.err)
		}
		if got := res.served.MaxStreamsPerIdentity; got >= 0 {
			t.Errorf("--max-streams-per-identity 0: MaxStreamsPerIdentity = %d, want negative (unlimited)", got)
		}
		bad := []struct {
			args []string
			want string
		}{
			{[]string{"--max-recv-msg-size", "-1"}, "--max-recv-msg-size must be positive"},
			{[]string{"--max-recv-msg-size", "1000"}, "--max-recv-msg-size must be at least 65536 bytes"},
			{[]string{"--max-metadata-entries", "-1"}, "--max-metadata-entries must be positive"},
			{[]string{"--max-metadata-bytes", "-5"}, "--max-metadata-bytes must be positive"},
			{[]string{"--max-watch-services", "-1"}, "--max-watch-services must be positive"},
			{[]string{"--max-streams-per-identity", "-1"}, "--max-streams-per-identity must not be negative (0 means unlimited)"},
			{[]string{"--max-endpoints-per-node", "-1"}, "--max-endpoints-per-node must be positive"},
		}
		for _, b := range bad {
			res := runCLI(t, nil, nil, append([]string{"registrar"}, b.args...)...)
			if res.err == nil || !strings.Contains(res.err.Error(), b.want) {
				t.Errorf("%v: error %v, want one containing %q", b.args, res.err, b.want)
			}
		}
	})

	t.Run("security flags and env", func(t *testing.T) {
		t.Parallel()
		env := map[string]string{
			"AETHER_TLS_CERT":      "/etc/aether/server.pem",
			"AETHER_TLS_KEY":       "/etc/aether/server-key.pem",
			"AETHER_TLS_CLIENT_CA": "/etc/aether/ca.pem",
			"AETHER_TRUST_DOMAIN":  "example.org",
			"AETHER_ETCD_CACERT":   "/etc/etcd/ca.pem",
			"AETHER_ETCD_CERT":     "/etc/etcd/client.pem",
			"AETHER_ETCD_KEY":      "/etc/etcd/client-key.pem",
		}
		res := runCLI(t, nil, env, "registrar", "--etcd-endpoints", "https://e1:2379",
			"--operator-prefix", "spiffe://example.org/ops/", "--tls-reload-interval", "1m")
		if res.err != nil {
			t.Fatal(res.err)
		}
		o := *res.served
		got := []string{o.TLSCertFile, o.TLSKeyFile, o.TLSClientCAFile, o.TrustDomain, o.OperatorPrefix, o.TLSReloadInterval.String(), o.EtcdCACert, o.EtcdCert, o.EtcdKey}
		want := []string{"/etc/aether/server.pem", "/etc/aether/server-key.pem", "/etc/aether/ca.pem", "example.org", "spiffe://example.org/ops/", "1m0s", "/etc/etcd/ca.pem", "/etc/etcd/client.pem", "/etc/etcd/client-key.pem"}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("security options\n got %q\nwant %q", got, want)
		}
	})

	t.Run("sync mode only when given", func(t *testing.T) {
		t.Parallel()
		// Left out, the registrar picks by its backend (watch on etcd,
		// poll on a store without a change feed); given, it is passed on.
		for _, c := range []struct {
			args []string
			want string
		}{{nil, ""}, {[]string{"--sync-mode", "watch"}, registrar.SyncWatch}, {[]string{"--sync-mode", "poll"}, registrar.SyncPoll}} {
			res := runCLI(t, nil, nil, append([]string{"registrar"}, c.args...)...)
			if res.err != nil {
				t.Fatal(res.err)
			}
			if res.served.SyncMode != c.want {
				t.Errorf("%v: SyncMode %q, want %q", c.args, res.served.SyncMode, c.want)
			}
		}
	})

	t.Run("etcd endpoints flag", func(t *testing.T) {
		t.Parallel()
		res := runCLI(t, nil, map[string]string{"AETHER_ETCD_ENDPOINTS": "http://env:2379"},
			"registrar", "--etcd-endpoints", "http://a:2379", "--etcd-endpoints", "http://b:2379")
		if res.err != nil {
			t.Fatal(res.err)
		}
		if got := strings.Join(res.served.EtcdEndpoints, " "); got != "http://a:2379 http://b:2379" {
			t.Errorf("EtcdEndpoints = %q", got)
		}
	})
}

// optionsEqual compares options, ignoring the logger.
func optionsEqual(a, b server.Config) bool {
	a.Logger, b.Logger = nil, nil
	return reflect.DeepEqual(a, b)
}

func TestNewLogger(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l, err := newLogger(&buf, "WARN", "json")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "k", "v")
	if got := buf.String(); strings.Contains(got, "hidden") || !strings.Contains(got, `"msg":"shown"`) || !strings.Contains(got, `"k":"v"`) {
		t.Errorf("log output %q", got)
	}
}

// TestNewRootEnv checks the real wiring: NewRoot reads the process
// environment.
func TestNewRootEnv(t *testing.T) {
	t.Setenv("AETHER_TIMEOUT", "abc")
	var stdout, stderr bytes.Buffer
	root := NewRoot(&stdout, &stderr)
	root.SetArgs([]string{"list", "--registrar", unusedAddr(t)})
	err := root.ExecuteContext(t.Context())
	if err == nil || !strings.Contains(err.Error(), "AETHER_TIMEOUT") {
		t.Fatalf("error %v, want one naming AETHER_TIMEOUT", err)
	}
	if stdout.Len() != 0 || stderr.Len() != 0 {
		t.Errorf("output on error: %q %q", stdout.String(), stderr.String())
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	res := runCLI(t, nil, nil, "version")
	if res.err != nil || !strings.HasPrefix(res.stdout, "aether ") {
		t.Fatalf("version: %v, %q", res.err, res.stdout)
	}
}
