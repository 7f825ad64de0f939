package cli

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/registry"
)

func newListCmd() *cobra.Command {
	var services []string
	var output string
	var cf *clientFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List endpoints",
		Long: `List the endpoints the registrar knows, optionally only those of some
services. -o json prints {"version": ..., "endpoints": [...]} with the API's
field names; the version can be passed to "aether watch --from-version".`,
		Example: `  aether list
  aether list --service web --service api
  aether list -o json | jq -r '.endpoints[].ip'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "table", "json"); err != nil {
				return err
			}
			if err := validateServices(services); err != nil {
				return err
			}
			if err := cf.validate(); err != nil {
				return err
			}
			client, done, err := cf.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			ctx, cancel := context.WithTimeout(cmd.Context(), cf.timeout)
			defer cancel()
			resp, err := client.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: services})
			if err != nil {
				return cf.rpcError("list endpoints", err)
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
