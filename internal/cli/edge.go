package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	etcdversion "go.etcd.io/etcd/api/v3/version"
	"go.etcd.io/etcd/client/pkg/v3/tlsutil"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/client/pkg/v3/types"
	"go.etcd.io/etcd/pkg/v3/netutil"
	"go.uber.org/zap"

	"github.com/aethermesh/aether/edge"
)

// The edge command is a drop-in for etcd's command line, so etcd's own
// tooling (its e2e test harness, scripts, systemd units) can start it. That
// decides three things here, each unlike the rest of this CLI:
//
//   - Flags are parsed by Go's flag package, as etcd parses them, not by
//     pflag: etcd accepts -name x as well as --name=x and --name x, and
//     pflag would read -name as the shorthands -n -a -m -e.
//   - The environment is ETCD_<FLAG> (ETCD_DATA_DIR, ...), as etcd reads it,
//     not AETHER_<FLAG>; a flag on the command line wins.
//   - Every etcd flag is known by name. Those it implements work as in
//     etcd; those that only tune Raft or etcd internals (which the edge
//     store does not have) are accepted and named in one log line; those
//     that ask for a feature it lacks are refused by name, unless given
//     etcd's default value, which asks for nothing.

// edgeDefaults are etcd's defaults for the flags the edge command
// implements (go.etcd.io/etcd/server/v3/embed.NewConfig).
const (
	edgeDefaultName           = "default"
	edgeDefaultClientURL      = "http://localhost:2379"
	edgeDefaultPeerURL        = "http://localhost:2380"
	edgeDefaultInitialCluster = "default=http://localhost:2380"
	edgeDefaultClusterToken   = "etcd-cluster"
	edgeDefaultMaxRequest     = 1572864 // 1.5 MiB
	edgeDefaultMaxTxnOps      = 128
	edgeEnvPrefix             = "ETCD"
	// Not etcd's: edge.DefaultCheckpointChanges and
	// edge.DefaultCheckpointBytes (this package does not import edge).
	edgeDefaultCheckpointChanges = 10000
	edgeDefaultCheckpointBytes   = 64 << 20
	// Checkpoints closer together than this cost more than the replay
	// they save: each writes the whole state.
	edgeMinCheckpointChanges = 100
	edgeMinCheckpointBytes   = 1 << 20
)

// edgeFlagClass is how the edge command treats an etcd flag it does not
// implement.
type edgeFlagClass int

const (
	// edgeIgnored flags only tune Raft, the WAL, the bbolt backend or
	// other etcd internals; accepted and logged.
	edgeIgnored edgeFlagClass = iota + 1
	// edgeRefused flags ask for a feature aether edge lacks; refused by
	// name unless given etcd's default value.
	edgeRefused
)

// edgeOtherFlag is an etcd flag aether edge does not implement.
type edgeOtherFlag struct {
	name, def string // def: etcd's default, as etcd prints it
	isBool    bool
	class     edgeFlagClass
	why       string // for refused flags: what is missing
}

// edgeOtherFlags lists every etcd v3.7.3 flag (embed.Config.AddFlags and
// etcdmain) that aether edge does not implement, with etcd's default.
var edgeOtherFlags = []edgeOtherFlag{
	// Raft, WAL, snapshot and backend tuning: the edge store has no Raft,
	// no WAL beside its change log, no snapshots and its own bbolt file.
	{name: "snapshot-count", def: "10000", class: edgeIgnored},
	{name: "snapshot-catchup-entries", def: "5000", class: edgeIgnored},
	{name: "heartbeat-interval", def: "100", class: edgeIgnored},
	{name: "election-timeout", def: "1000", class: edgeIgnored},
	{name: "initial-election-tick-advance", def: "true", isBool: true, class: edgeIgnored},
	{name: "pre-vote", def: "true", isBool: true, class: edgeIgnored},
	{name: "strict-reconfig-check", def: "true", isBool: true, class: edgeIgnored},
	{name: "raft-read-timeout", def: "5s", class: edgeIgnored},
	{name: "raft-write-timeout", def: "5s", class: edgeIgnored},
	{name: "max-learners", def: "1", class: edgeIgnored},
	{name: "max-snapshots", def: "5", class: edgeIgnored},
	{name: "max-wals", def: "5", class: edgeIgnored},
	{name: "wal-dir", def: "", class: edgeIgnored},
	{name: "unsafe-no-fsync", def: "false", isBool: true, class: edgeIgnored},
	{name: "backend-batch-interval", def: "0s", class: edgeIgnored},
	{name: "backend-batch-limit", def: "0", class: edgeIgnored},
	{name: "backend-bbolt-freelist-type", def: "", class: edgeIgnored},
	{name: "bootstrap-defrag-threshold-megabytes", def: "0", class: edgeIgnored},
	{name: "compaction-batch-limit", def: "0", class: edgeIgnored},
	{name: "compaction-sleep-interval", def: "0s", class: edgeIgnored},
	{name: "compact-hash-check-time", def: "1m0s", class: edgeIgnored},
	{name: "corrupt-check-time", def: "0s", class: edgeIgnored},
	{name: "downgrade-check-time", def: "5s", class: edgeIgnored},
	{name: "memory-mlock", def: "false", isBool: true, class: edgeIgnored},
	{name: "warning-apply-duration", def: "100ms", class: edgeIgnored},
	{name: "warning-unary-request-duration", def: "300ms", class: edgeIgnored},
	{name: "grpc-keepalive-interval", def: "2h0m0s", class: edgeIgnored},
	{name: "grpc-keepalive-min-time", def: "5s", class: edgeIgnored},
	{name: "grpc-keepalive-timeout", def: "20s", class: edgeIgnored},
	{name: "max-concurrent-streams", def: "4294967295", class: edgeIgnored},
	{name: "socket-reuse-address", def: "false", isBool: true, class: edgeIgnored},
	{name: "socket-reuse-port", def: "false", isBool: true, class: edgeIgnored},
	{name: "metrics", def: "basic", class: edgeIgnored},
	{name: "feature-gates", def: "", class: edgeIgnored},
	{name: "v2-deprecation", def: "", class: edgeIgnored}, // etcd ignores it too
	{name: "enable-grpc-gateway", def: "true", class: edgeIgnored, isBool: true},
	{name: "log-rotation-config-json", def: `{"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false}`, class: edgeIgnored},
	{name: "bcrypt-cost", def: "10", class: edgeIgnored},     // auth tuning; auth is refused
	{name: "auth-token-ttl", def: "300", class: edgeIgnored}, // same
	{name: "client-cert-file", def: "", class: edgeIgnored},  // etcd's certs as a client of itself (gateway)
	{name: "client-key-file", def: "", class: edgeIgnored},
	{name: "peer-client-cert-file", def: "", class: edgeIgnored},
	{name: "peer-client-key-file", def: "", class: edgeIgnored},
	{name: "distributed-tracing-address", def: "localhost:4317", class: edgeIgnored}, // inert without enable-distributed-tracing
	{name: "distributed-tracing-instance-id", def: "", class: edgeIgnored},
	{name: "distributed-tracing-sampling-rate", def: "0", class: edgeIgnored},
	{name: "distributed-tracing-service-name", def: "etcd", class: edgeIgnored},
	{name: "discovery-dial-timeout", def: "2s", class: edgeIgnored}, // inert without discovery
	{name: "discovery-keepalive-time", def: "2s", class: edgeIgnored},
	{name: "discovery-keepalive-timeout", def: "6s", class: edgeIgnored},
	{name: "discovery-request-timeout", def: "5s", class: edgeIgnored},
	{name: "discovery-insecure-transport", def: "true", isBool: true, class: edgeIgnored},
	{name: "discovery-insecure-skip-tls-verify", def: "false", isBool: true, class: edgeIgnored},
	{name: "discovery-fallback", def: "exit", class: edgeIgnored},
	// etcdmain's own list of flags it accepts and ignores (old releases'),
	// boolean-style as etcd's flags.IgnoredFlag is, so a bare -v works.
	{name: "cluster-active-size", isBool: true, class: edgeIgnored},
	{name: "cluster-remove-delay", isBool: true, class: edgeIgnored},
	{name: "cluster-sync-interval", isBool: true, class: edgeIgnored},
	{name: "config", isBool: true, class: edgeIgnored},
	{name: "force", isBool: true, class: edgeIgnored},
	{name: "max-result-buffer", isBool: true, class: edgeIgnored},
	{name: "max-retry-attempts", isBool: true, class: edgeIgnored},
	{name: "peer-heartbeat-interval", isBool: true, class: edgeIgnored},
	{name: "peer-election-timeout", isBool: true, class: edgeIgnored},
	{name: "retry-interval", isBool: true, class: edgeIgnored},
	{name: "snapshot", isBool: true, class: edgeIgnored},
	{name: "v", isBool: true, class: edgeIgnored},
	{name: "vv", isBool: true, class: edgeIgnored},
	{name: "test.coverprofile", isBool: true, class: edgeIgnored},
	{name: "test.outputdir", isBool: true, class: edgeIgnored},

	// Features aether edge does not have.
	{name: "config-file", def: "", class: edgeRefused, why: "configuration files are not supported; use flags or ETCD_* variables"},
	{name: "auth-token", def: "simple", class: edgeRefused, why: "authentication is not implemented"},
	{name: "force-new-cluster", def: "false", isBool: true, class: edgeRefused, why: "there is no Raft membership to reset"},
	{name: "discovery-token", def: "", class: edgeRefused, why: "discovery is not implemented; use --initial-cluster"},
	{name: "discovery-endpoints", def: "", class: edgeRefused, why: "discovery is not implemented; use --initial-cluster"},
	{name: "discovery-srv", def: "", class: edgeRefused, why: "DNS discovery is not implemented; use --initial-cluster"},
	{name: "discovery-srv-name", def: "", class: edgeRefused, why: "DNS discovery is not implemented; use --initial-cluster"},
	{name: "discovery-cacert", def: "", class: edgeRefused, why: "discovery is not implemented"},
	{name: "discovery-cert", def: "", class: edgeRefused, why: "discovery is not implemented"},
	{name: "discovery-key", def: "", class: edgeRefused, why: "discovery is not implemented"},
	{name: "discovery-user", def: "", class: edgeRefused, why: "discovery is not implemented"},
	{name: "discovery-password", def: "", class: edgeRefused, why: "discovery is not implemented"},
	{name: "enable-distributed-tracing", def: "false", isBool: true, class: edgeRefused, why: "distributed tracing is not implemented"},
	{name: "enable-log-rotation", def: "false", isBool: true, class: edgeRefused, why: "log rotation is not implemented; log to stderr or a file"},
	{name: "listen-client-http-urls", def: "", class: edgeRefused, why: "a separate HTTP listener is not implemented; /metrics and /health are on the client URLs"},
	{name: "listen-metrics-urls", def: "", class: edgeRefused, why: "a separate metrics listener is not implemented; /metrics is on the client URLs"},
	{name: "client-crl-file", def: "", class: edgeRefused, why: "certificate revocation lists are not implemented"},
	{name: "peer-crl-file", def: "", class: edgeRefused, why: "certificate revocation lists are not implemented"},
	{name: "client-cert-allowed-hostname", def: "", class: edgeRefused, why: "client certificate hostname checks are not implemented"},
	{name: "peer-cert-allowed-cn", def: "", class: edgeRefused, why: "peer certificate CN checks are not implemented"},
	{name: "peer-cert-allowed-hostname", def: "", class: edgeRefused, why: "peer certificate hostname checks are not implemented"},
	{name: "peer-skip-client-san-verification", def: "false", isBool: true, class: edgeRefused, why: "peer SAN verification cannot be turned off"},
	{name: "cors", def: "*", class: edgeRefused, why: "CORS applies to etcd's HTTP gateway, which is not served"},
	{name: "host-whitelist", def: "*", class: edgeRefused, why: "the host whitelist applies to etcd's HTTP gateway, which is not served"},
}

// edgeRefusedExperimental are the features behind etcd's old
// --experimental-<name> flags that aether edge lacks; every other
// --experimental-* flag only tuned internals and is ignored.
var edgeRefusedExperimental = map[string]string{
	"enable-distributed-tracing":        "distributed tracing is not implemented",
	"peer-skip-client-san-verification": "peer SAN verification cannot be turned off",
}

// capturedFlag records the value of a flag aether edge does not implement,
// so it can be logged or refused by name after parsing.
type capturedFlag struct {
	value  string
	isBool bool
}

func (c *capturedFlag) String() string {
	if c == nil {
		return ""
	}
	return c.value
}
func (c *capturedFlag) Set(v string) error { c.value = v; return nil }
func (c *capturedFlag) IsBoolFlag() bool   { return c.isBool }

// edgeSettings is what the flags ask for, checked; edge.Config is built
// from it.
type edgeSettings struct {
	Name, DataDir                                                            string
	ListenClientURLs, AdvertiseClientURLs, ListenPeerURLs, AdvertisePeerURLs []url.URL
	InitialCluster                                                           map[string][]url.URL
	InitialClusterState, InitialClusterToken                                 string
	ClientTLS, PeerTLS                                                       *tls.Config
	MaxRequestBytes, MaxTxnOps                                               int
	WatchProgressNotifyInterval                                              time.Duration
	QuotaBackendBytes                                                        int64
	AutoCompactionMode                                                       string
	AutoCompactionRetention                                                  time.Duration
	SyncPeers                                                                []string      // --sync-peers (edge/sync.go)
	SyncInterval                                                             time.Duration // --sync-interval
	PeerCommitDelay                                                          time.Duration // --peer-commit-delay (<0: none)
	HistoryGC                                                                bool          // --history-gc (edge/gc.go)
	PeerRetention                                                            time.Duration // --peer-retention
	CheckpointChanges                                                        int           // --checkpoint-changes (edge/checkpoint.go; <0: off)
	CheckpointBytes                                                          int64         // --checkpoint-bytes (<0: off)
	ValueMerge                                                               string        // --value-merge
	ValueMergePrefixes                                                       []string      // --value-merge-prefix (JSON prefixes)
	EnablePprof                                                              bool          // --enable-pprof
	Logger                                                                   *slog.Logger

	// Ignored are the ignored flags that were set, sorted; already logged.
	Ignored []string
	// closers are the log files to close when the command ends.
	closers []io.Closer
}

func (s *edgeSettings) close() {
	for _, c := range s.closers {
		_ = c.Close()
	}
}

// edgeFlags holds the values of the flags aether edge implements.
type edgeFlags struct {
	fs *flag.FlagSet

	name, dataDir                              string
	listenClient, advertiseClient              string
	listenPeer, advertisePeer                  string
	initialCluster, initialState, initialToken string
	certFile, keyFile, trustedCA               string
	clientCertAuth, autoTLS                    bool
	peerCertFile, peerKeyFile, peerTrustedCA   string
	peerClientCertAuth, peerAutoTLS            bool
	selfSignedValidity                         uint
	cipherSuites, tlsMinVersion, tlsMaxVersion string
	logLevel, logger, logOutputs, logFormat    string
	maxRequestBytes, maxTxnOps                 uint
	progressInterval                           time.Duration
	quotaBackendBytes                          int64
	autoCompactionMode, autoCompactionRet      string
	syncPeers                                  string
	syncInterval                               time.Duration
	peerCommitDelay                            time.Duration
	historyGC                                  bool
	peerRetention                              time.Duration
	checkpointChanges, checkpointBytes         int64
	valueMerge, valueMergePrefix               string
	enablePprof                                bool
	version                                    bool
	other                                      map[string]*capturedFlag
	experimental                               map[string]*capturedFlag
}

func newEdgeFlags(args []string) *edgeFlags {
	f := &edgeFlags{
		fs:           flag.NewFlagSet("aether edge", flag.ContinueOnError),
		other:        map[string]*capturedFlag{},
		experimental: map[string]*capturedFlag{},
	}
	fs := f.fs
	fs.SetOutput(io.Discard) // errors are returned; help is printed by the command
	fs.StringVar(&f.name, "name", edgeDefaultName, "Human-readable name for this member.")
	fs.StringVar(&f.dataDir, "data-dir", "", "Path to the data directory (default \"<name>.etcd\").")
	fs.StringVar(&f.listenClient, "listen-client-urls", edgeDefaultClientURL, "List of URLs to listen on for client gRPC, /metrics and /health traffic.")
	fs.StringVar(&f.advertiseClient, "advertise-client-urls", edgeDefaultClientURL, "List of this member's client URLs to advertise to the public.")
	fs.StringVar(&f.listenPeer, "listen-peer-urls", edgeDefaultPeerURL, "List of URLs to listen on for peer traffic.")
	fs.StringVar(&f.advertisePeer, "initial-advertise-peer-urls", edgeDefaultPeerURL, "List of this member's peer URLs to advertise to the rest of the cluster.")
	fs.StringVar(&f.initialCluster, "initial-cluster", edgeDefaultInitialCluster, "Initial cluster configuration for bootstrapping.")
	fs.StringVar(&f.initialState, "initial-cluster-state", "new", "Initial cluster state ('new' or 'existing').")
	fs.StringVar(&f.initialToken, "initial-cluster-token", edgeDefaultClusterToken, "Initial cluster token for the cluster during bootstrap.")
	fs.StringVar(&f.certFile, "cert-file", "", "Path to the client server TLS cert file.")
	fs.StringVar(&f.keyFile, "key-file", "", "Path to the client server TLS key file.")
	fs.StringVar(&f.trustedCA, "trusted-ca-file", "", "Path to the client server TLS trusted CA cert file.")
	fs.BoolVar(&f.clientCertAuth, "client-cert-auth", false, "Enable client cert authentication.")
	fs.BoolVar(&f.autoTLS, "auto-tls", false, "Client TLS using generated certificates.")
	fs.StringVar(&f.peerCertFile, "peer-cert-file", "", "Path to the peer server TLS cert file.")
	fs.StringVar(&f.peerKeyFile, "peer-key-file", "", "Path to the peer server TLS key file.")
	fs.StringVar(&f.peerTrustedCA, "peer-trusted-ca-file", "", "Path to the peer server TLS trusted CA file.")
	fs.BoolVar(&f.peerClientCertAuth, "peer-client-cert-auth", false, "Enable peer client cert authentication.")
	fs.BoolVar(&f.peerAutoTLS, "peer-auto-tls", false, "Peer TLS using generated certificates.")
	fs.UintVar(&f.selfSignedValidity, "self-signed-cert-validity", 1, "The validity period of the client and peer certificates generated by --auto-tls and --peer-auto-tls, in years.")
	fs.StringVar(&f.cipherSuites, "cipher-suites", "", "Comma-separated list of supported TLS cipher suites between client/server and peers (empty will be auto-populated by Go).")
	fs.StringVar(&f.tlsMinVersion, "tls-min-version", string(tlsutil.TLSVersion12), "Minimum TLS version supported by etcd. Possible values: TLS1.2, TLS1.3.")
	fs.StringVar(&f.tlsMaxVersion, "tls-max-version", string(tlsutil.TLSVersionDefault), "Maximum TLS version supported by etcd. Possible values: TLS1.2, TLS1.3 (empty defers to Go).")
	fs.StringVar(&f.logLevel, "log-level", "info", "Configures log level. Only supports debug, info, warn, error, panic, or fatal.")
	fs.StringVar(&f.logger, "logger", "zap", "Currently only supports 'zap' for structured logging.")
	fs.StringVar(&f.logOutputs, "log-outputs", "default", "Specify 'stdout' or 'stderr' to skip journald logging even when running under systemd, or list of comma separated output targets.")
	fs.StringVar(&f.logFormat, "log-format", "json", "Configures log format. Only supports json, console.")
	fs.UintVar(&f.maxRequestBytes, "max-request-bytes", edgeDefaultMaxRequest, "Maximum client request size in bytes the server will accept.")
	fs.UintVar(&f.maxTxnOps, "max-txn-ops", edgeDefaultMaxTxnOps, "Maximum number of operations permitted in a transaction.")
	fs.DurationVar(&f.progressInterval, "watch-progress-notify-interval", 0, "Duration of periodic watch progress notifications (0 is etcd's 10 minutes).")
	fs.StringVar(&f.autoCompactionMode, "auto-compaction-mode", "periodic", "Interpret 'auto-compaction-retention' one of: periodic|revision. 'periodic' for duration based retention, defaulting to hours if no time unit is provided (e.g. '5m'). 'revision' for revision number based retention.")
	fs.StringVar(&f.autoCompactionRet, "auto-compaction-retention", "0", "Auto compaction retention for mvcc key value store. 0 means disable auto compaction.")
	fs.Int64Var(&f.quotaBackendBytes, "quota-backend-bytes", 0, "Raise a NOSPACE alarm when the history kept since the last compaction exceeds this many bytes (0 is etcd's 2 GiB).")
	// Not etcd's: replication between edge replicas (edge/sync.go).
	fs.StringVar(&f.syncPeers, "sync-peers", "", "Comma-separated names of the initial-cluster members this replica syncs with (empty: every other member).")
	fs.DurationVar(&f.syncInterval, "sync-interval", 0, "Anti-entropy round interval per peer (0: 5s).")
	fs.DurationVar(&f.peerCommitDelay, "peer-commit-delay", edge.DefaultPeerCommitDelay, "How long changes merged from peers may wait for more before they are fsynced together (a local write ends the wait at once; reads meanwhile serve the newest durable revision): peers' acks, this replica's watchers and its reads see them up to this much later, for far fewer fsyncs. 0: none.")
	fs.BoolVar(&f.historyGC, "history-gc", true, "Drop changes from the in-memory sync log once every peer holds them (bounded memory); --history-gc=false keeps the whole history.")
	fs.DurationVar(&f.peerRetention, "peer-retention", 0, "With --history-gc, how long a member may go unheard before it stops holding GC back (0: forever). A member that returns lacking dropped changes is re-bootstrapped by a state snapshot transfer; a key it still holds whose deletion was collected meanwhile stays deleted, but a write it made while away, concurrent with such a deletion, wins (keep this longer than any partition that must not bring deleted keys back).")
	fs.Int64Var(&f.checkpointChanges, "checkpoint-changes", edgeDefaultCheckpointChanges, "Write a checkpoint (the whole state, with the change log before the sync log's first held change deleted) once this many changes became durable since the last one; 0: no change-count trigger. Like etcd's --snapshot-count.")
	fs.Int64Var(&f.checkpointBytes, "checkpoint-bytes", edgeDefaultCheckpointBytes, "Write a checkpoint once this many bytes of encoded changes became durable since the last one; 0: no byte trigger (both 0: the log is kept and replayed whole).")
	fs.StringVar(&f.valueMerge, "value-merge", "bytes", "How concurrent writes of one key merge: 'bytes' (last writer wins) or 'json' (a JSON object merges field by field, recursively; other values last writer wins). Every member must use the same setting.")
	fs.StringVar(&f.valueMergePrefix, "value-merge-prefix", "", "Comma-separated PREFIX=json entries: keys under PREFIX merge as JSON, the others as --value-merge bytes (e.g. '/config/=json'). Every member must use the same setting.")
	fs.BoolVar(&f.enablePprof, "enable-pprof", false, "Enable runtime profiling data via HTTP server. Address is at client URL + \"/debug/pprof/\"")
	fs.BoolVar(&f.version, "version", false, "Print the version and exit.")
	for _, o := range edgeOtherFlags {
		c := &capturedFlag{value: o.def, isBool: o.isBool}
		f.other[o.name] = c
		usage := "Ignored: only tunes etcd internals aether edge does not have."
		if o.class == edgeRefused {
			usage = "Refused unless " + fmt.Sprintf("%q", o.def) + ": " + o.why + "."
		}
		fs.Var(c, o.name, usage)
	}
	// etcd before 3.6 spelled many flags --experimental-<name>, and tools
	// written for those releases still pass them. They are defined as
	// they appear, as boolean-style flags so that a bare
	// --experimental-x does not swallow the next argument.
	for _, a := range args {
		if a == "--" {
			break
		}
		name, ok := strings.CutPrefix(strings.TrimLeft(a, "-"), "experimental-")
		if !ok || !strings.HasPrefix(a, "-") {
			continue
		}
		full := "experimental-" + strings.SplitN(name, "=", 2)[0]
		if fs.Lookup(full) == nil {
			c := &capturedFlag{isBool: true}
			f.experimental[full] = c
			fs.Var(c, full, "Ignored: an etcd 3.5 experimental flag.")
		}
	}
	return f
}

// edgeParseResult is what parsing the command line decided.
type edgeParseResult struct {
	settings *edgeSettings
	exit     bool // --version or --help printed; nothing to run
}

// parseEdgeArgs parses etcd's command line and environment into settings.
// stdout gets --version and --help, stderr the logs.
func parseEdgeArgs(args []string, lookup lookupFunc, stdout, stderr io.Writer) (edgeParseResult, error) {
	f := newEdgeFlags(args)
	fs := f.fs
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			printEdgeHelp(stdout, fs)
			return edgeParseResult{exit: true}, nil
		}
		return edgeParseResult{}, fmt.Errorf("edge: %w", err)
	}
	if fs.NArg() != 0 {
		return edgeParseResult{}, fmt.Errorf("%q is not a valid flag", fs.Arg(0))
	}
	if f.version {
		printEdgeVersion(stdout)
		return edgeParseResult{exit: true}, nil
	}

	explicit := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { explicit[fl.Name] = true })
	var shadowed []string
	var envErr error
	fs.VisitAll(func(fl *flag.Flag) {
		// etcd refuses to take --version from the environment.
		if envErr != nil || fl.Name == "version" {
			return
		}
		key := edgeEnvName(fl.Name)
		v, ok := lookup(key)
		if !ok || v == "" {
			return
		}
		if explicit[fl.Name] {
			shadowed = append(shadowed, key)
			return
		}
		if err := fs.Set(fl.Name, v); err != nil {
			envErr = fmt.Errorf("invalid value %q for %s: %v", v, key, err)
			return
		}
		explicit[fl.Name] = true
	})
	if envErr != nil {
		return edgeParseResult{}, envErr
	}

	// Refuse before anything else happens (no log file is created, no
	// data dir touched), naming every refused flag at once.
	var refused []string
	var ignored []string
	for _, o := range edgeOtherFlags {
		if !explicit[o.name] {
			continue
		}
		if o.class == edgeIgnored {
			ignored = append(ignored, "--"+o.name)
			continue
		}
		if v := f.other[o.name].value; !sameFlagValue(v, o.def, o.isBool) {
			refused = append(refused, fmt.Sprintf("--%s=%s (%s)", o.name, v, o.why))
		}
	}
	for name, c := range f.experimental {
		if !explicit[name] {
			continue
		}
		base := strings.TrimPrefix(name, "experimental-")
		if why, ok := edgeRefusedExperimental[base]; ok && !sameFlagValue(c.value, "false", true) {
			refused = append(refused, fmt.Sprintf("--%s=%s (%s)", name, c.value, why))
			continue
		}
		ignored = append(ignored, "--"+name)
	}
	if len(refused) > 0 {
		sort.Strings(refused)
		return edgeParseResult{}, fmt.Errorf("unsupported etcd flags: %s", strings.Join(refused, ", "))
	}
	sort.Strings(ignored)

	logger, closers, err := newEdgeLogger(f, stdout, stderr)
	if err != nil {
		return edgeParseResult{}, err
	}
	s := &edgeSettings{Logger: logger, Ignored: ignored, closers: closers}
	if err := f.settings(s, explicit); err != nil {
		s.close()
		return edgeParseResult{}, err
	}
	for _, key := range shadowed {
		logger.Warn("ignoring environment variable, shadowed by a command-line flag", "variable-name", key)
	}
	if len(ignored) > 0 {
		logger.Info("ignoring flags that only tune Raft or etcd internals, which aether edge does not have", "flags", ignored)
	}
	return edgeParseResult{settings: s}, nil
}

// sameFlagValue reports whether v is the default def: a boolean given bare
// is "true", and booleans compare by meaning (--x=1 is --x=true).
func sameFlagValue(v, def string, isBool bool) bool {
	if !isBool {
		return v == def
	}
	norm := func(s string) string {
		switch strings.ToLower(s) {
		case "1", "t", "true":
			return "true"
		case "", "0", "f", "false":
			return "false"
		}
		return s
	}
	return norm(v) == norm(def)
}

// edgeEnvName is etcd's environment variable for a flag (flags.FlagToEnv).
func edgeEnvName(flag string) string {
	return edgeEnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// settings checks the implemented flags as etcd does and fills s.
func (f *edgeFlags) settings(s *edgeSettings, explicit map[string]bool) error {
	s.Name = f.name
	s.DataDir = f.dataDir
	if s.DataDir == "" {
		s.DataDir = s.Name + ".etcd" // etcdmain's default
	}
	var err error
	if s.ListenClientURLs, err = edgeURLs("listen-client-urls", f.listenClient); err != nil {
		return err
	}
	// etcd drops the default advertise URL when only the listen URL is
	// given, then refuses: a member must say where clients reach it.
	if explicit["listen-client-urls"] && !explicit["advertise-client-urls"] {
		return errors.New("--advertise-client-urls is required when --listen-client-urls is set explicitly")
	}
	if s.AdvertiseClientURLs, err = edgeURLs("advertise-client-urls", f.advertiseClient); err != nil {
		return err
	}
	if s.ListenPeerURLs, err = edgeURLs("listen-peer-urls", f.listenPeer); err != nil {
		return err
	}
	if s.AdvertisePeerURLs, err = edgeURLs("initial-advertise-peer-urls", f.advertisePeer); err != nil {
		return err
	}

	// etcd: --name alone (initial-cluster left at its default) names this
	// member in a one-member cluster at its advertised peer URLs.
	initial := f.initialCluster
	if s.Name != edgeDefaultName && initial == edgeDefaultInitialCluster {
		parts := make([]string, len(s.AdvertisePeerURLs))
		for i, u := range s.AdvertisePeerURLs {
			parts[i] = s.Name + "=" + u.String()
		}
		initial = strings.Join(parts, ",")
	}
	cluster, err := types.NewURLsMap(initial)
	if err != nil {
		return fmt.Errorf("--initial-cluster %q: %w", initial, err)
	}
	mine, ok := cluster[s.Name]
	if !ok {
		return fmt.Errorf("couldn't find local name %q in the initial cluster configuration", s.Name)
	}
	// etcd checks this when bootstrapping a new cluster, resolving host
	// names (localhost matches 127.0.0.1).
	if f.initialState == "new" && !sameURLs(mine, s.AdvertisePeerURLs) {
		return fmt.Errorf("--initial-cluster has %s=%s but missing from --initial-advertise-peer-urls=%s",
			s.Name, types.URLs(mine).String(), types.URLs(s.AdvertisePeerURLs).String())
	}
	s.InitialCluster = make(map[string][]url.URL, len(cluster))
	for name, us := range cluster {
		s.InitialCluster[name] = []url.URL(us)
	}

	switch f.initialState {
	case "new", "existing":
		s.InitialClusterState = f.initialState
	default:
		return fmt.Errorf("invalid value %q for --initial-cluster-state: valid values are \"new\", \"existing\"", f.initialState)
	}
	s.InitialClusterToken = f.initialToken
	if f.maxRequestBytes == 0 || f.maxTxnOps == 0 {
		return errors.New("--max-request-bytes and --max-txn-ops must be positive")
	}
	s.MaxRequestBytes, s.MaxTxnOps = int(f.maxRequestBytes), int(f.maxTxnOps)
	if f.progressInterval < 0 {
		return errors.New("--watch-progress-notify-interval must not be negative")
	}
	s.WatchProgressNotifyInterval = f.progressInterval
	if f.quotaBackendBytes < 0 {
		return errors.New("--quota-backend-bytes must not be negative")
	}
	s.QuotaBackendBytes = f.quotaBackendBytes
	if s.AutoCompactionMode, s.AutoCompactionRetention, err = compactionRetention(f.autoCompactionMode, f.autoCompactionRet); err != nil {
		return err
	}
	if f.syncPeers != "" {
		s.SyncPeers = strings.Split(f.syncPeers, ",")
	}
	if f.syncInterval < 0 {
		return errors.New("--sync-interval must not be negative")
	}
	s.SyncInterval = f.syncInterval
	if f.peerCommitDelay < 0 || f.peerCommitDelay > time.Second {
		return errors.New("--peer-commit-delay must be between 0 and 1s")
	}
	s.PeerCommitDelay = f.peerCommitDelay
	if s.PeerCommitDelay == 0 {
		s.PeerCommitDelay = -1 // edge.Config: negative is none
	}
	if f.peerRetention < 0 {
		return errors.New("--peer-retention must not be negative")
	}
	if f.peerRetention > 0 {
		// A live peer acks at least every sync interval; a retention near
		// it would drop changes a healthy peer is about to ack for.
		iv := f.syncInterval
		if iv == 0 {
			iv = 5 * time.Second
		}
		if f.peerRetention < 10*iv {
			return fmt.Errorf("--peer-retention %v is under 10 sync intervals (%v): a healthy peer would be dropped from GC; raise it or lower --sync-interval", f.peerRetention, 10*iv)
		}
		if !f.historyGC {
			return errors.New("--peer-retention needs --history-gc (without GC nothing is held back)")
		}
	}
	s.HistoryGC = f.historyGC
	s.PeerRetention = f.peerRetention
	if s.CheckpointChanges, s.CheckpointBytes, err = checkpointSettings(f.checkpointChanges, f.checkpointBytes); err != nil {
		return err
	}
	if s.ValueMerge, s.ValueMergePrefixes, err = valueMergeSettings(f.valueMerge, f.valueMergePrefix); err != nil {
		return err
	}

	s.EnablePprof = f.enablePprof

	client := transport.TLSInfo{CertFile: f.certFile, KeyFile: f.keyFile, TrustedCAFile: f.trustedCA, ClientCertAuth: f.clientCertAuth}
	if s.ClientTLS, err = f.tlsConfig("client", client, f.autoTLS, s.ListenClientURLs, filepath.Join(s.DataDir, "fixtures", "client"), s.Logger); err != nil {
		return err
	}
	peer := transport.TLSInfo{CertFile: f.peerCertFile, KeyFile: f.peerKeyFile, TrustedCAFile: f.peerTrustedCA, ClientCertAuth: f.peerClientCertAuth}
	if s.PeerTLS, err = f.tlsConfig("peer", peer, f.peerAutoTLS, s.ListenPeerURLs, filepath.Join(s.DataDir, "fixtures", "peer"), s.Logger); err != nil {
		return err
	}
	return nil
}

// tlsConfig builds the server TLS config of one listener kind ("client" or
// "peer") the way etcd does: with etcd's own transport.TLSInfo, so files,
// client-certificate rules and auto TLS behave exactly as in etcd. It is
// nil when no URL of that kind is https or unixs. With both http and
// https URLs the server uses it on the https ones only.
func (f *edgeFlags) tlsConfig(kind string, info transport.TLSInfo, auto bool, urls []url.URL, fixtures string, lg *slog.Logger) (*tls.Config, error) {
	secure := false
	for _, u := range urls {
		if u.Scheme == "https" || u.Scheme == "unixs" {
			secure = true
		}
	}
	if !secure {
		if !info.Empty() {
			lg.Warn("scheme is http or unix while key and cert files are present; ignoring key and cert files", "kind", kind)
		}
		return nil, nil
	}
	if auto && info.Empty() {
		hosts := make([]string, len(urls))
		for i, u := range urls {
			hosts[i] = u.Host
		}
		self, err := transport.SelfCert(zap.NewNop(), fixtures, hosts, f.selfSignedValidity)
		if err != nil {
			return nil, fmt.Errorf("%s auto TLS: %w", kind, err)
		}
		self.ClientCertAuth = info.ClientCertAuth
		info = self
	} else if auto {
		lg.Warn("ignoring auto TLS since certs given", "kind", kind)
	}
	if info.Empty() {
		flagName := "--cert-file, --key-file"
		if kind == "peer" {
			flagName = "--peer-cert-file, --peer-key-file"
		}
		return nil, fmt.Errorf("TLS key/cert (%s) must be provided for %s url %s with HTTPS scheme", flagName, kind, urls[0].String())
	}
	var err error
	if f.cipherSuites != "" {
		if info.CipherSuites, err = tlsutil.GetCipherSuites(strings.Split(f.cipherSuites, ",")); err != nil {
			return nil, fmt.Errorf("--cipher-suites: %w", err)
		}
	}
	if info.MinVersion, err = tlsutil.GetTLSVersion(f.tlsMinVersion); err != nil {
		return nil, fmt.Errorf("--tls-min-version: %w", err)
	}
	if info.MaxVersion, err = tlsutil.GetTLSVersion(f.tlsMaxVersion); err != nil {
		return nil, fmt.Errorf("--tls-max-version: %w", err)
	}
	cfg, err := info.ServerConfig()
	if err != nil {
		return nil, fmt.Errorf("%s TLS: %w", kind, err)
	}
	// etcd's config offers only h2; /metrics and /health are served on the
	// same port to HTTP/1 clients (curl, Prometheus) too.
	if !slices.Contains(cfg.NextProtos, "http/1.1") {
		cfg.NextProtos = append(cfg.NextProtos, "http/1.1")
	}
	return cfg, nil
}

// edgeURLs parses a comma-separated URL flag as etcd does
// (flags.UniqueURLsFromFlag): validated, duplicates dropped.
func edgeURLs(flagName, v string) ([]url.URL, error) {
	var parts []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" && !slices.Contains(parts, p) {
			parts = append(parts, p)
		}
	}
	us, err := types.NewURLs(parts)
	if err != nil {
		return nil, fmt.Errorf("--%s %q: %w", flagName, v, err)
	}
	return []url.URL(us), nil
}

// sameURLs is etcd's advertiseMatchesCluster comparison
// (netutil.URLStringsEqual): equal as strings, or after resolving hosts.
func sameURLs(a, b []url.URL) bool {
	as, bs := types.URLs(a).StringSlice(), types.URLs(b).StringSlice()
	sort.Strings(as)
	sort.Strings(bs)
	if slices.Equal(as, bs) {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // etcd's bound
	defer cancel()
	ok, _ := netutil.URLStringsEqual(ctx, zap.NewNop(), as, bs)
	return ok
}

// newEdgeLogger builds the logger etcd's flags describe: JSON lines shaped
// like etcd's zap output ({"level":"info","ts":...,"msg":...}), so tools
// that grep etcd's log (its e2e harness waits for "ready to serve client
// requests") read ours.
func newEdgeLogger(f *edgeFlags, stdout, stderr io.Writer) (*slog.Logger, []io.Closer, error) {
	if f.logger != "zap" {
		return nil, nil, fmt.Errorf("unknown logger option %q", f.logger)
	}
	var lvl slog.Level
	switch f.logLevel {
	case "debug":
		lvl = slog.LevelDebug
	case "info":
		lvl = slog.LevelInfo
	case "warn":
		lvl = slog.LevelWarn
	case "error", "dpanic", "panic", "fatal":
		// slog has nothing above error; etcd logs next to nothing there.
		lvl = slog.LevelError
	default:
		return nil, nil, fmt.Errorf("unknown log level %q (only supports debug, info, warn, error, panic, or fatal)", f.logLevel)
	}
	var (
		writers []io.Writer
		closers []io.Closer
	)
	for _, out := range strings.Split(f.logOutputs, ",") {
		switch out = strings.TrimSpace(out); out {
		case "default", "stderr":
			writers = append(writers, stderr)
		case "stdout":
			writers = append(writers, stdout)
		case "":
		default:
			file, err := os.OpenFile(out, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
			if err != nil {
				for _, c := range closers {
					_ = c.Close()
				}
				return nil, nil, fmt.Errorf("--log-outputs: %w", err)
			}
			writers = append(writers, file)
			closers = append(closers, file)
		}
	}
	if len(writers) == 0 {
		writers = append(writers, stderr)
	}
	w := io.MultiWriter(writers...)
	opts := &slog.HandlerOptions{
		Level: lvl,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) > 0 {
				return a
			}
			switch a.Key {
			case slog.TimeKey:
				a.Key = "ts"
			case slog.LevelKey:
				a.Value = slog.StringValue(strings.ToLower(a.Value.String()))
			}
			return a
		},
	}
	switch f.logFormat {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), closers, nil
	case "console":
		return slog.New(slog.NewTextHandler(w, opts)), closers, nil
	}
	for _, c := range closers {
		_ = c.Close()
	}
	return nil, nil, fmt.Errorf("unknown log format %q (only supports json, console)", f.logFormat)
}

// edgeEtcdVersion is the etcd version aether edge answers as: that of the
// etcd API it implements (the protos it is built against). etcd's tooling
// reads it to choose flags and expectations: its e2e harness passes
// --experimental-* spellings to anything below 3.6 and checks features by
// version, and clients read Status.version.
var edgeEtcdVersion = etcdversion.Version

// printEdgeVersion prints --version in etcd's format (etcdmain), with the
// aether build as an extra line; tools match the "etcd Version:" prefix.
func printEdgeVersion(w io.Writer) {
	fmt.Fprintf(w, "etcd Version: %s\n", edgeEtcdVersion)
	fmt.Fprintf(w, "Git SHA: %s\n", edgeGitSHA())
	fmt.Fprintf(w, "Go Version: %s\n", runtime.Version())
	fmt.Fprintf(w, "Go OS/Arch: %s/%s\n", runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(w, "Aether Version: %s\n", versionString())
}

// edgeGitSHA is the VCS revision of this build, as etcd prints its own
// ("Not provided (use ./build instead of go build)" when unknown).
func edgeGitSHA() string {
	if c := currentVersion().Commit; c != "" {
		return c[:min(len(c), 12)]
	}
	return "Not provided"
}

func printEdgeHelp(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprint(w, edgeLong+"\n\nFlags (etcd's; also settable as ETCD_<FLAG>, e.g. ETCD_DATA_DIR):\n")
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

const edgeLong = `Run an edge store replica: an etcd-compatible server (etcd's v3 gRPC API,
unchanged) on a hash-addressed change log, for sites that must keep reading
and writing when cut off.

It takes etcd's own command line: etcd's flag names and defaults, -flag and
--flag, ETCD_* environment variables. Flags that only tune Raft or etcd
internals are accepted and ignored (one log line names them); flags for
features it lacks (auth, discovery, ...) are refused by name. It serves
gRPC, /metrics and /health on the client URLs and logs "ready to serve
client requests" when serving. See README "Edge store".`

func newEdgeCmd(d deps) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "edge [etcd flags]",
		Short: "Run an etcd-compatible edge store replica",
		Long:  edgeLong,
		Example: `  aether edge --name edge-1 --data-dir /var/lib/aether-edge \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379
  ETCD_DATA_DIR=/tmp/e1 aether edge
  aether edge --version`,
		// etcd's command line is parsed by Go's flag package (see above).
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := parseEdgeArgs(args, d.lookupEnv, cmd.OutOrStdout(), cmd.ErrOrStderr())
			if err != nil || res.exit {
				return err
			}
			defer res.settings.close()
			return d.runEdge(cmd.Context(), res.settings)
		},
	}
	cmd.AddCommand(newEdgeStatusCmd(), newEdgePutCmd()) // edge_status.go, edge_put.go
	return cmd
}

// compactionRetention reads --auto-compaction-mode and
// --auto-compaction-retention as etcd's embed.parseCompactionRetention
// does: a bare number is hours in periodic mode and a count of revisions in
// revision mode (carried as a time.Duration of that many units, etcd's own
// convention); anything else must be a duration, which only periodic mode
// takes.
func compactionRetention(mode, retention string) (string, time.Duration, error) {
	switch mode {
	case "periodic", "revision":
	default:
		return "", 0, fmt.Errorf("invalid value %q for --auto-compaction-mode: valid values are \"periodic\", \"revision\"", mode)
	}
	if n, err := strconv.Atoi(retention); err == nil {
		if n < 0 {
			return "", 0, fmt.Errorf("--auto-compaction-retention must not be negative, got %d", n)
		}
		if mode == "revision" {
			return mode, time.Duration(int64(n)), nil
		}
		return mode, time.Duration(int64(n)) * time.Hour, nil
	}
	if mode == "revision" {
		return "", 0, fmt.Errorf("--auto-compaction-retention %q: in revision mode it is a number of revisions", retention)
	}
	d, err := time.ParseDuration(retention)
	if err != nil || d < 0 {
		return "", 0, fmt.Errorf("--auto-compaction-retention %q: want a duration such as 5m, or a number of hours", retention)
	}
	return mode, d, nil
}

// checkpointSettings checks --checkpoint-changes and --checkpoint-bytes and
// turns them into edge.Config's (where 0 is the default and negative off).
func checkpointSettings(changes, bytes int64) (int, int64, error) {
	if changes < 0 {
		return 0, 0, fmt.Errorf("--checkpoint-changes must not be negative, got %d (0 turns the change-count trigger off)", changes)
	}
	if bytes < 0 {
		return 0, 0, fmt.Errorf("--checkpoint-bytes must not be negative, got %d (0 turns the byte trigger off)", bytes)
	}
	if changes > 0 && changes < edgeMinCheckpointChanges {
		return 0, 0, fmt.Errorf("--checkpoint-changes %d is under %d: every checkpoint writes the whole state, so checkpointing that often costs more than the replay it saves (0 turns the trigger off)", changes, edgeMinCheckpointChanges)
	}
	if bytes > 0 && bytes < edgeMinCheckpointBytes {
		return 0, 0, fmt.Errorf("--checkpoint-bytes %d is under %d (1 MiB): every checkpoint writes the whole state, so checkpointing that often costs more than the replay it saves (0 turns the trigger off)", bytes, edgeMinCheckpointBytes)
	}
	if changes > math.MaxInt32 {
		return 0, 0, fmt.Errorf("--checkpoint-changes %d is over %d", changes, math.MaxInt32)
	}
	off := func(v int64) int64 {
		if v == 0 {
			return -1
		}
		return v
	}
	return int(off(changes)), off(bytes), nil
}

// valueMergeSettings reads --value-merge and --value-merge-prefix.
func valueMergeSettings(mode, prefixes string) (string, []string, error) {
	switch mode {
	case "bytes", "json":
	default:
		return "", nil, fmt.Errorf("invalid value %q for --value-merge: valid values are \"bytes\", \"json\"", mode)
	}
	if prefixes == "" {
		return mode, nil, nil
	}
	if mode == "json" {
		return "", nil, errors.New("--value-merge-prefix needs --value-merge bytes: with --value-merge json every key already merges as JSON")
	}
	var out []string
	for _, e := range strings.Split(prefixes, ",") {
		p, m, ok := strings.Cut(e, "=")
		switch {
		case !ok || p == "":
			return "", nil, fmt.Errorf("invalid entry %q for --value-merge-prefix: want PREFIX=json, e.g. /config/=json", e)
		case m != "json":
			return "", nil, fmt.Errorf("invalid mode %q for prefix %q in --value-merge-prefix: the only mode is \"json\" (other keys merge as --value-merge says)", m, p)
		}
		out = append(out, p)
	}
	return mode, out, nil
}
