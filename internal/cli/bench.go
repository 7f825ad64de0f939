package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aethermesh/aether/bench"
)

func newBenchCmd() *cobra.Command {
	var quick, compare bool
	var out string
	var scenarios []string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the registrar and the replicator on this machine (starts its own etcds)",
		Long: `Runs the benchmark scenarios against registrars and replicators it starts
itself on embedded etcds, over real sockets on loopback. --scenario picks
groups (comma-separated or repeated; default all):

  registrar    propagation: register-to-watcher latency on the same replica
               and across two replicas sharing one etcd (p50/p99/p99.9);
               writes: registrations per second through write-behind versus
               one etcd Put per registration; write-behind drain; agent
               cache read
  replication  two regions' etcds, region A mirrored into B: lag p50/p99/max
               of a burst of 10k changes, and convergence after a 1-minute
               partition, for the replicator (lease 30s and 2m) and for the
               real "etcdctl make-mirror" on the same workload (the harness
               builds etcdctl from tools/etcdctl; $AETHER_ETCDCTL names a
               prebuilt one). With --quick: 1k changes, a 5s partition, and
               no make-mirror (etcdctl is not built).
  fanout       agents' view of churn at design scale: WatchEndpoints streams
               (up to 10k, each subscribed to up to 200 of 3k services, 100k
               endpoints) on two registrar processes sharing an etcd process,
               endpoints changing at 100 to 1000/s; latency p50/p99/p99.9
               same and cross replica, registrar and etcd CPU and peak RSS,
               etcd watches; a ladder of steps, each marked where it
               saturates. With --compare, instead: the same workload with
               agents watching etcd directly (one watch per dependency),
               through etcd's grpc-proxy, and through registrars. A run of
               every scenario runs both. The harness builds etcd from
               tools/etcd ($AETHER_ETCD names a prebuilt one) and runs
               registrars from this binary ($AETHER_BIN names another).
  disruption   the disruption battery: two registrars on one etcd,
               writes through A, clients resolving through B while pods roll
               (surge, two-phase drain), registrars restart, clients
               reconnect and services churn; resolutions and drops (dead
               endpoint picked, or none found while one is live), once with
               watch sync and once with --sync-mode poll, both at the
               default --sync-interval 5s (about 3 minutes). With --quick:
               a few seconds each, --sync-interval 1s.
  xds          register-to-first-RPC latency through grpc-go's own xDS
               client: a registrar with --xds-addr, an xds:/// channel
               sending RPCs in a tight loop, 200 new backends (real gRPC
               servers) each timed from RegisterEndpoint's return to the
               first RPC it answers (p50/p99/max), under 100 changes/s on
               other services. Then fan-out, at 1k, 5k and 10k streams
               each on 20 of 3k services, 100 registrations/s for 10s,
               against one registrar process: raw ADS streams (EDS, state
               of the world, then delta) beside WatchEndpoints streams,
               each in a fresh world; delivery p50/p99, registrar CPU and
               peak RSS. With --quick: 20 backends, no churn; 50 streams
               for 2s.
  edge         YCSB workload A (50/50 read/update, uniform, 18-byte keys)
               with go-ycsb v1.0.3's etcd driver (built from tools/ycsb;
               $AETHER_YCSB names a prebuilt one) against a real etcd
               (tools/etcd) and against "aether edge" (this binary) in
               the same run, steps alternating, single members with data
               on the same disk: throughput and read/update p50/p99 at
               1k/s, 10k/s and unbounded (64 threads), 50k records
               (about 3 minutes).
               With --quick: 1k records, 1k to 2k operations per step.
  peer-watch   two registrars of one cluster on etcd and on DynamoDB (a
               local dynalite: $AETHER_DYNALITE, or npm dynalite@4.0.0 in
               $HOME/.cache/aether-dynalite): cross-replica propagation
               p50/p99 at 100 changes/s with and without peer-watch, at
               the default --write-batch-interval; then the disruption
               battery on DynamoDB poll-only and with peer-watch, and on
               etcd with peer-watch (about 7 minutes). With --quick: 300
               changes per run, the battery's quick form.
  kubernetes   two registrars on the kubernetes backend (a real
               kube-apiserver from $AETHER_KUBE_BIN or
               tools/kubeapiserver/build.sh's cache, on an embedded etcd)
               against the same load on etcd: 1k and 10k endpoints
               registered through one (acknowledged/s, visible on the
               other/s), then cross-replica propagation p50/p99 at
               100 changes/s with and without peer-watch, and the API
               server's CPU and RSS (about 9 minutes). With --quick: 500
               endpoints, 200 changes (about a minute).

It prints a summary, rewrites the sections of --out (docs/benchmarks.md by
default; --out "" writes nothing) for the groups it ran, and prints the
figures as one JSON object on its last line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			command := "aether bench"
			if quick {
				command += " --quick"
			}
			if len(scenarios) > 0 {
				command += " --scenario " + strings.Join(scenarios, ",")
			}
			if compare {
				command += " --compare"
			}
			exe, _ := os.Executable() // registrars run as processes of this binary...
			if strings.HasSuffix(exe, ".test") {
				exe = "" // ...unless it is a test binary, not the CLI
			}
			r, err := bench.Run(cmd.Context(), bench.Options{Quick: quick, Scenarios: scenarios, Compare: compare, AetherBin: exe}, command, cmd.ErrOrStderr())
			if err != nil {
				return fmt.Errorf("bench: %w", err)
			}
			if strings.TrimSpace(out) != "" {
				if err := r.UpdateFile(out); err != nil {
					return fmt.Errorf("--out %s: %w", out, err)
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s\n", out)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), r.JSON())
			return err
		},
	}
	cmd.Flags().BoolVar(&quick, "quick", false, "small sizes that finish in well under a minute")
	cmd.Flags().StringSliceVar(&scenarios, "scenario", nil, "scenario groups to run: "+strings.Join(bench.Scenarios, ", ")+" (default all)")
	cmd.Flags().BoolVar(&compare, "compare", false, "with --scenario fanout: compare agents on etcd, through etcd's grpc-proxy and through registrars, instead of the fanout steps")
	cmd.Flags().StringVar(&out, "out", "docs/benchmarks.md", "markdown file whose benchmark section to rewrite (\"\" for none)")
	return cmd
}
