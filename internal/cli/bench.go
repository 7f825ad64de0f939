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
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure the registrar on this machine (starts its own etcd and registrars)",
		Long: `Runs the benchmark scenarios against registrars it starts itself on an
embedded etcd, over real gRPC sockets on loopback:

  propagation  register-to-watcher latency on the same replica and across
               two replicas sharing one etcd (p50/p99/p99.9)
  writes       registrations per second through write-behind versus one
               etcd Put per registration, on the same etcd in the same run

It prints a summary, rewrites its section of --out (docs/benchmarks.md by
default; --out "" writes nothing), and prints the figures as one JSON object
on its last line.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			command := "aether bench"
			if quick {
				command += " --quick"
			}
			r, err := bench.Run(cmd.Context(), bench.Options{Quick: quick}, command, cmd.ErrOrStderr())
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
	cmd.Flags().StringVar(&out, "out", "docs/benchmarks.md", "markdown file whose benchmark section to rewrite (\"\" for none)")
	return cmd
}
