package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/registry"
)

func newListCmd() *cobra.Command {
	var services []string
	var output string
	var fromRegion, fromZone string
	var cf *clientFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List endpoints",
		Long: `List the endpoints the registrar knows, optionally only those of some
services. -o json prints {"version": ..., "endpoints": [...]} with the API's
field names; the version can be passed to "aether watch --from-version".

With --from-region (and optionally --from-zone), list shows what a consumer
in that region and zone would use: only SERVING endpoints (DRAINING ones take
no new requests), nearest first, with a PRIORITY column:

  0  same region and same zone (without --from-zone: anywhere in the region)
  1  same region, another zone or an endpoint of unknown zone
  2  another region, failover only

-o json then prints {"version": ..., "from_region": ..., "from_zone": ...,
"endpoints": [{"priority": 0, "endpoint": {...}}, ...]} in that order.`,
		Example: `  aether list
  aether list --service web --service api
  aether list -o json | jq -r '.endpoints[].ip'
  aether list --service web --from-region eu-west --from-zone eu-west-1a`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "table", "json"); err != nil {
				return err
			}
			if err := validateServices(services); err != nil {
				return err
			}
			byLocality, err := checkLocalityFlags(cmd, fromRegion, fromZone)
			if err != nil {
				return err
			}
			var resp *registrarv1.ListAllEndpointsResponse
			if err := cf.unary(cmd.Context(), "list endpoints", func(ctx context.Context, c registrarv1.RegistrarClient) (err error) {
				resp, err = c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: services})
				return err
			}); err != nil {
				return err
			}
			if byLocality {
				ps := registry.ByLocality(resp.GetEndpoints(), fromRegion, fromZone)
				if output == "json" {
					return writeLocalityJSON(cmd.OutOrStdout(), resp.GetVersion(), fromRegion, fromZone, ps)
				}
				return writeLocalityTable(cmd.OutOrStdout(), ps)
			}
			if output == "json" {
				return writeListJSON(cmd.OutOrStdout(), resp.GetVersion(), resp.GetEndpoints())
			}
			return writeTable(cmd.OutOrStdout(), resp.GetEndpoints())
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&services, "service", nil, "only these services; repeatable or comma-separated (default: all)")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	f.StringVar(&fromRegion, "from-region", "", "list the serving set as a consumer in this region would use it, nearest first, with its priority")
	f.StringVar(&fromZone, "from-zone", "", "the consumer's zone within --from-region (needs --from-region)")
	cf = addClientFlags(cmd)
	return cmd
}

// validateServices checks --service filters.
func validateServices(services []string) error {
	for _, s := range services {
		if err := registry.ValidateName("service", s); err != nil {
			return fmt.Errorf("--service: %v", err)
		}
	}
	return nil
}

// checkLocalityFlags validates --from-region and --from-zone and reports
// whether the listing is ordered by locality. A flag counts as given when it
// is on the command line or in the environment, even if empty, so that
// "--from-zone=" is an error rather than silently ignored.
func checkLocalityFlags(cmd *cobra.Command, region, zone string) (bool, error) {
	regionSet, zoneSet := cmd.Flags().Changed("from-region"), cmd.Flags().Changed("from-zone")
	if !regionSet && !zoneSet {
		return false, nil
	}
	if !regionSet {
		return false, errors.New("--from-zone needs --from-region: zone names are only meaningful within a region; add --from-region REGION (or set AETHER_FROM_REGION)")
	}
	if err := registry.ValidateName("region", region); err != nil {
		return false, fmt.Errorf("--from-region: %v", err)
	}
	if zoneSet {
		if err := registry.ValidateName("zone", zone); err != nil {
			return false, fmt.Errorf("--from-zone: %v", err)
		}
	}
	return true, nil
}

// writeLocalityTable prints the serving set in locality order, with the
// priority as the first column.
func writeLocalityTable(w io.Writer, ps []registry.Prioritized) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PRIORITY\t"+endpointColumns)
	for _, p := range ps {
		fmt.Fprintf(tw, "%d\t%s\n", p.Priority, endpointRow(p.Endpoint))
	}
	return tw.Flush()
}

// localityJSON is the document "aether list --from-region ... -o json"
// prints. Like listJSON, its shape is a stable interface for scripts.
type localityJSON struct {
	Version    string                `json:"version"`
	FromRegion string                `json:"from_region"`
	FromZone   string                `json:"from_zone,omitempty"`
	Endpoints  []prioritizedEndpoint `json:"endpoints"`
}

type prioritizedEndpoint struct {
	Priority int             `json:"priority"`
	Endpoint json.RawMessage `json:"endpoint"`
}

// writeLocalityJSON prints the serving set in locality order as one indented
// JSON document. "endpoints" is always present, [] when empty.
func writeLocalityJSON(w io.Writer, version, region, zone string, ps []registry.Prioritized) error {
	doc := localityJSON{Version: version, FromRegion: region, FromZone: zone, Endpoints: []prioritizedEndpoint{}}
	for _, p := range ps {
		b, err := marshalJSON(p.Endpoint)
		if err != nil {
			return fmt.Errorf("encode endpoint %s: %w", registry.IDOf(p.Endpoint), err)
		}
		doc.Endpoints = append(doc.Endpoints, prioritizedEndpoint{Priority: p.Priority, Endpoint: b})
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	out = append(out, '\n')
	_, err = w.Write(out)
	return err
}
