package cli

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/aethermesh/aether/xds/bootstrap"
)

func newXDSCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "xds",
		Short: "Tools for the xDS clients of Aether (proxyless gRPC, proxies)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newXDSBootstrapCmd())
	return cmd
}

func newXDSBootstrapCmd() *cobra.Command {
	var c bootstrap.Config
	var out string
	cmd := &cobra.Command{
		Use:   "bootstrap",
		Short: "Print the xDS bootstrap file a proxyless gRPC client needs to reach Aether",
		Long: `Print the xDS bootstrap file (JSON) with which a proxyless gRPC client
finds Aether's xDS server: grpc-go, grpc-java and the other gRPC libraries
read it from the file named by GRPC_XDS_BOOTSTRAP, then resolve
"xds:///<service>" targets through it.

--server is the xDS server: the node's agent (its --xds-addr, loopback) or,
for a client that runs beside no agent, a registrar's --xds-addr. --node
names the client to the server (the agent's node name is a good choice);
--region and --zone are its locality, by which endpoints are ranked: its
own zone first, then its region, then the rest. --ca makes the channel TLS
(verifying the server); --cert and --key add the client's certificate for
mutual TLS.`,
		Example: `  aether xds bootstrap --node node-a --zone eu-west-1a --region eu-west-1 > /etc/aether/xds.json
  GRPC_XDS_BOOTSTRAP=/etc/aether/xds.json ./my-grpc-client   # dials xds:///web`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := bootstrap.JSON(c)
			if err != nil {
				return fmt.Errorf("xds bootstrap: %w", flagOf(err))
			}
			b = append(b, '\n')
			if out == "" || out == "-" {
				_, err = cmd.OutOrStdout().Write(b)
				return err
			}
			if err := os.WriteFile(out, b, 0o644); err != nil {
				return fmt.Errorf("xds bootstrap: --out: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Server, "server", "127.0.0.1:15010", "host:port of the xDS server (an agent's or a registrar's --xds-addr)")
	f.StringVar(&c.Node, "node", "", "node id the client presents (required)")
	f.StringVar(&c.Region, "region", "", "the client's region (optional; ranks endpoints)")
	f.StringVar(&c.Zone, "zone", "", "the client's zone (optional; ranks endpoints)")
	f.StringVar(&c.CAFile, "ca", "", "CA certificate that verifies the server (makes the channel TLS)")
	f.StringVar(&c.CertFile, "cert", "", "client certificate for mutual TLS (with --key and --ca)")
	f.StringVar(&c.KeyFile, "key", "", "client private key (with --cert)")
	f.StringVarP(&out, "out", "o", "", "write the file here instead of standard output")
	return cmd
}

// flagOf names the flag behind a bootstrap error: the package names its
// fields as the command names its flags.
func flagOf(err error) error {
	var fe *bootstrap.FieldError
	if errors.As(err, &fe) {
		return fmt.Errorf("--%s %s", fe.Field, fe.Reason)
	}
	return err
}
