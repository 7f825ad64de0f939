package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

func newReplicationCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "replication",
		Short: "Multi-region replication",
	}
	cmd.AddCommand(newReplicationStatusCmd())
	return cmd
}

func newReplicationStatusCmd() *cobra.Command {
	var output string
	var cf *clientFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show, for each peer region, how this region's mirror into it is doing",
		Long: `Show the multi-region replicator's view of each peer region: reachable or
not, the heartbeat lease this region's keys live under there and its time
left, the last mirrored revision, the lag, and the keys mirrored. The
figures come from the region's replication leader; ask any registrar of the
region (a non-leader names the leader).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "table", "json"); err != nil {
				return err
			}
			var resp *registrarv1.ReplicationStatusResponse
			if err := cf.unary(cmd.Context(), "replication status", func(ctx context.Context, c registrarv1.RegistrarClient) (err error) {
				resp, err = c.ReplicationStatus(ctx, &registrarv1.ReplicationStatusRequest{})
				return err
			}); err != nil {
				return err
			}
			if output == "json" {
				b, err := marshalJSON(resp)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
				return err
			}
			return writeReplicationTable(cmd.OutOrStdout(), resp)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cf = addClientFlags(cmd)
	return cmd
}

func writeReplicationTable(w io.Writer, resp *registrarv1.ReplicationStatusResponse) error {
	if !resp.GetEnabled() {
		_, err := fmt.Fprintf(w, "replication is off in region %s (start the registrar with --peer-etcd region=endpoints)\n", resp.GetRegion())
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tREACHABLE\tSYNCED\tLEASE\tLEASE LEFT\tLAST REVISION\tLAG\tKEYS\tLEADER\tLAST ERROR")
	for _, p := range resp.GetPeers() {
		leader := p.GetLeader()
		if p.GetIsLeader() {
			leader += " (this registrar)"
		}
		lease := "-"
		if p.GetLeaseId() != 0 {
			lease = fmt.Sprintf("%x", p.GetLeaseId())
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%s\t%.0fs\t%d\t%.1fs\t%d\t%s\t%s\n", p.GetRegion(), p.GetReachable(), p.GetSynced(), lease,
			p.GetLeaseTtlRemainingSeconds(), p.GetLastMirroredRevision(), p.GetLagSeconds(), p.GetKeysMirrored(), orDash(leader),
			orDash(strings.ReplaceAll(p.GetLastError(), "\n", " ")))
	}
	return tw.Flush()
}
