package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/aethermesh/aether/bench"
)

func newBenchCmd() *cobra.Command {
	var quick bool
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
			r, err := bench.Run(cmd.Context(), bench.Options{Quick: quick, Scenarios: scenarios}, command, cmd.ErrOrStderr())
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
	cmd.Flags().StringVar(&out, "out", "docs/benchmarks.md", "markdown file whose benchmark section to rewrite (\"\" for none)")
	return cmd
}
