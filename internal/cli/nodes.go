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
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
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
runs out.

HEALTH counts what the registrar holds of the node's endpoints, not what the
node believes: "HEALTHY (200/200 endpoints serving)" only when the registrar
holds them all, serving; "DEGRADED (150/200 held by the registrar)" when it
holds fewer than the node registered (the node's agent registers the
missing ones again). JSON output has both: endpoints_total and
endpoints_serving are the node's claim, endpoints_held and
endpoints_held_serving the registrar's.`,
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
		health := nodeHealth(n.GetHealth())
		age := "unknown"
		if a := st.GetLastHeartbeatAgeSeconds(); a >= 0 {
			age = fmt.Sprintf("%.0fs ago", a)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.GetName(), orDash(n.GetZone()), n.GetRegion(), n.GetCluster(),
			orDash(n.GetAddress()), orDash(strings.Join(n.GetServices(), ",")), health, age)
	}
	return tw.Flush()
}

// nodeHealth renders a node's health from what the registrar holds of its
// endpoints (endpoints_held, endpoints_held_serving), not from the node's
// claim alone: an agent believes its endpoints are registered, but a
// registrar that crashed before persisting them does not hold them, and
// the table must show that. A node that claims no endpoints and has none
// held shows its own summary as it sent it. Otherwise the status is the
// worse of the node's own and the held counts' (DEGRADED when the
// registrar holds fewer than the node claims, or some held ones do not
// serve), and the detail is the held counts.
func nodeHealth(h *registryv1.HealthSummary) string {
	status := h.GetStatus()
	total, held, serving := h.GetEndpointsTotal(), h.GetEndpointsHeld(), h.GetEndpointsHeldServing()
	var detail string
	switch {
	case total == 0 && held == 0:
		detail = h.GetMessage()
	case held < total:
		status = max(status, registryv1.Health_HEALTH_DEGRADED)
		detail = fmt.Sprintf("%d/%d held by the registrar", held, total)
		if serving < held {
			detail += fmt.Sprintf(", %d serving", serving)
		}
	default:
		if serving < held {
			status = max(status, registryv1.Health_HEALTH_DEGRADED)
		}
		detail = fmt.Sprintf("%d/%d endpoints serving", serving, held)
	}
	out := strings.TrimPrefix(status.String(), "HEALTH_")
	if detail != "" {
		out += " (" + detail + ")"
	}
	return out
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
