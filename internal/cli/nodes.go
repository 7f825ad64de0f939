package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

func newNodesCmd() *cobra.Command {
	var output string
	var cf *clientFlags
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List the nodes that announced themselves, with their liveness",
		Long: `List node records: node, site (zone), region, cluster, offered services,
health, and how long ago the node's last heartbeat renewed its lease. A node
whose heartbeats stop disappears once its lease (the registrar's --node-ttl)
runs out.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "table", "json"); err != nil {
				return err
			}
			var resp *registrarv1.ListNodesResponse
			if err := cf.unary(cmd.Context(), "list nodes", func(ctx context.Context, c registrarv1.RegistrarClient) (err error) {
				resp, err = c.ListNodes(ctx, &registrarv1.ListNodesRequest{})
				return err
			}); err != nil {
				return err
			}
			nodes := resp.GetNodes()
			sort.Slice(nodes, func(i, j int) bool {
				a, b := nodes[i].GetNode(), nodes[j].GetNode()
				if a.GetRegion() != b.GetRegion() {
					return a.GetRegion() < b.GetRegion()
				}
				if a.GetCluster() != b.GetCluster() {
					return a.GetCluster() < b.GetCluster()
				}
				return a.GetName() < b.GetName()
			})
			if output == "json" {
				return writeNodesJSON(cmd.OutOrStdout(), nodes)
			}
			return writeNodesTable(cmd.OutOrStdout(), nodes)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cf = addClientFlags(cmd)
	return cmd
}

func writeNodesTable(w io.Writer, nodes []*registrarv1.NodeStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSITE\tREGION\tCLUSTER\tADDRESS\tSERVICES\tHEALTH\tLAST HEARTBEAT")
	for _, st := range nodes {
		n := st.GetNode()
		health := strings.TrimPrefix(n.GetHealth().GetStatus().String(), "HEALTH_")
		if m := n.GetHealth().GetMessage(); m != "" {
			health += " (" + m + ")"
		}
		age := "unknown"
		if a := st.GetLastHeartbeatAgeSeconds(); a >= 0 {
			age = fmt.Sprintf("%.0fs ago", a)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.GetName(), orDash(n.GetZone()), n.GetRegion(), n.GetCluster(),
			orDash(n.GetAddress()), orDash(strings.Join(n.GetServices(), ",")), health, age)
	}
	return tw.Flush()
}

func writeNodesJSON(w io.Writer, nodes []*registrarv1.NodeStatus) error {
	// The liveness figures are always present (0 is a real age), unlike
	// other unset fields; and protojson's whitespace is not stable, so the
	// document is re-indented.
	raw, err := protojson.MarshalOptions{UseProtoNames: true, EmitDefaultValues: true}.Marshal(&registrarv1.ListNodesResponse{Nodes: nodes})
	if err != nil {
		return fmt.Errorf("encode nodes: %w", err)
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return fmt.Errorf("encode nodes: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", buf.Bytes())
	return err
}
