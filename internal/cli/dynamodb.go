package cli

import (
	"fmt"
	"log/slog"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	dynamostore "github.com/aethermesh/aether/backend/dynamodb"
	"github.com/aethermesh/aether/server"
)

// addDynamoDBFlags adds the registrar's --backend and DynamoDB flags.
func addDynamoDBFlags(f *pflag.FlagSet, opts *server.Config) {
	f.StringVar(&opts.Backend, "backend", opts.Backend, "the store: etcd (embedded, or --etcd-endpoints), dynamodb (--dynamodb-table; syncs by polling, see docs/operations.md) or kubernetes (custom resources in a Kubernetes API server: --kubeconfig, else the pod's service account)")
	f.StringVar(&opts.DynamoDBTable, "dynamodb-table", "", "with --backend dynamodb: the table (create it with aether dynamodb create-table)")
	f.StringVar(&opts.DynamoDBRegion, "dynamodb-region", "", "with --backend dynamodb: the AWS region; empty takes the SDK's chain (AWS_REGION, the shared config)")
	f.StringVar(&opts.DynamoDBEndpoint, "dynamodb-endpoint", "", "with --backend dynamodb: the DynamoDB endpoint URL, for a local server (e.g. http://127.0.0.1:4567); empty is AWS's")
	f.DurationVar(&opts.DynamoDBFullScanInterval, "dynamodb-full-scan-interval", opts.DynamoDBFullScanInterval, "with --backend dynamodb: how often a poll is a full Scan of the table, the backstop for a change the incremental poll missed (at 100k endpoints the scans are most of the read cost, see docs/benchmarks.md)")
}

func newDynamoDBCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dynamodb",
		Short: "Manage the DynamoDB table of --backend dynamodb",
	}
	cmd.AddCommand(newDynamoDBCreateTableCmd())
	return cmd
}

func newDynamoDBCreateTableCmd() *cobra.Command {
	var cfg dynamostore.Config
	var shards int
	cmd := &cobra.Command{
		Use:   "create-table",
		Short: "Create the table (and its changes index) a registrar with --backend dynamodb needs",
		Long: `Create the DynamoDB table a registrar with --backend dynamodb reads and
writes: hash key pk (the registry key), the global secondary index
"changes" (hash s, range r) that the incremental poll reads, TTL on x for
tombstones, on-demand billing, and the meta item holding the revision
counter. Credentials and region come from the AWS SDK's standard chain
(environment, shared config and credentials files, web identity, instance
metadata) unless --dynamodb-region/--dynamodb-endpoint say otherwise.

An existing table is checked and left as it is (its revision counter is
kept), so running it again is safe; a table of another shape is reported.`,
		Example: `  aether dynamodb create-table --dynamodb-table aether --dynamodb-region eu-west-1
  aether dynamodb create-table --dynamodb-table aether --dynamodb-endpoint http://127.0.0.1:4567`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if cfg.Table == "" {
				return fmt.Errorf("--dynamodb-table is required")
			}
			if shards < 1 || shards > 256 {
				return fmt.Errorf("--shards %d: want 1 to 256", shards)
			}
			cli, err := dynamostore.NewClient(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if err := dynamostore.CreateTable(cmd.Context(), cli, cfg.Table, shards); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "table %s ready\n", cfg.Table)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Table, "dynamodb-table", "", "the table to create (required)")
	f.StringVar(&cfg.Region, "dynamodb-region", "", "the AWS region; empty takes the SDK's chain")
	f.StringVar(&cfg.Endpoint, "dynamodb-endpoint", "", "the DynamoDB endpoint URL, for a local server; empty is AWS's")
	f.IntVar(&shards, "shards", dynamostore.DefaultShards, "change shards of the index: each takes a share of the writes (DynamoDB throttles one index key at about 1,000 writes/s); an idle poll costs one Query per shard. Fixed at creation")
	return cmd
}

// backendDefaults resolves the defaults that follow from the backend and
// from peer-watch, for the flags left out (f tells which were given):
//
//   - --peer-watch is on by default, but off, with a warning, when TLS is
//     on and nothing names a CA to verify peer registrars by: the explicit
//     flag refuses that start, the default must not break a TLS setup
//     without client certificates.
//   - --write-batch-interval is server.DefaultWriteBatchInterval: 100 ms
//     on DynamoDB (every flush is billed writes) and on etcd with
//     peer-watch (freshness comes through peer-watch), 10 ms on etcd
//     without it, where cross-replica freshness waits on the flush.
func backendDefaults(f *pflag.FlagSet, opts *server.Config, log *slog.Logger) {
	if !f.Changed("peer-watch") && opts.PeerWatch && opts.TLSEnabled() && opts.PeerWatchCACert == "" && opts.TLSClientCAFile == "" {
		opts.PeerWatch = false
		log.Warn("peer-watch is off: with --tls-cert it needs a CA to verify peer registrars by; give --peer-watch-cacert (or --tls-client-ca), or --peer-watch=false to silence this")
	}
	if !f.Changed("write-batch-interval") {
		opts.WriteBatchInterval = server.DefaultWriteBatchInterval(opts.Backend, opts.PeerWatch)
	}
}
