package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/aethermesh/aether/backend/etcd/migrate"
)

func newMigrateCmd() *cobra.Command {
	var (
		fromLegacy, dryRun bool
		endpoints          []string
		timeout            time.Duration
		etcdTLS            etcdTLSFlags
	)
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Move endpoints from the legacy flat etcd schema into schema v1",
		Long: `Copy every endpoint under the legacy flat prefix
/aether/services/<service>/protocols/<proto>/endpoints/<ip> into schema v1
(/aether/v1/regions/<region>/clusters/<cluster>/...), placing each by the
origin its value carries, and delete the legacy prefix only after every entry
is copied. An entry that cannot be placed stops the migration before anything
is written. --dry-run prints the plan and writes nothing.`,
		Example: `  aether migrate --from-legacy --etcd-endpoints http://10.0.0.1:2379 --dry-run
  aether migrate --from-legacy --etcd-endpoints http://10.0.0.1:2379
  aether migrate --from-legacy --etcd-endpoints https://10.0.0.1:2379 \
      --etcd-cacert ca.pem --etcd-cert operator-alice.pem --etcd-key operator-alice-key.pem`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !fromLegacy {
				return errors.New("--from-legacy is required (it is the only migration there is): aether migrate --from-legacy --etcd-endpoints URL [--dry-run]")
			}
			if len(endpoints) == 0 {
				return errors.New("--etcd-endpoints is required: the etcd cluster holding the legacy keys")
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: must be positive", timeout)
			}
			tlsCfg, err := etcdTLS.config(endpoints)
			if err != nil {
				return err
			}
			cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, TLS: tlsCfg, DialTimeout: timeout, Logger: zap.NewNop()})
			if err != nil {
				return fmt.Errorf("--etcd-endpoints %v: %w", endpoints, err)
			}
			defer cli.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			rep, err := migrate.FromLegacy(ctx, cli, dryRun, cmd.OutOrStdout())
			if err != nil {
				if errors.Is(err, context.DeadlineExceeded) {
					return fmt.Errorf("etcd at %v did not answer within %s (check --etcd-endpoints, or raise --timeout): %w", endpoints, timeout, err)
				}
				return err
			}
			verb := "migrated"
			if dryRun {
				verb = "dry run: would migrate"
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %d of %d legacy endpoints (%d already in schema v1), %d legacy keys deleted\n",
				verb, rep.Copied, rep.Legacy, rep.Present, rep.Deleted)
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVar(&fromLegacy, "from-legacy", false, "migrate from the legacy flat schema (/aether/services/...)")
	f.BoolVar(&dryRun, "dry-run", false, "print what would be done and write nothing")
	f.StringSliceVar(&endpoints, "etcd-endpoints", nil, "etcd cluster, comma separated (required)")
	f.DurationVar(&timeout, "timeout", 60*time.Second, "bound on the whole migration")
	etcdTLS.add(f)
	return cmd
}
