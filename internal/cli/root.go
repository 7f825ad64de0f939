// Package cli is the aether command line: the registrar server and the
// client commands that talk to it.
//
// The command tree is built by NewRoot and holds no global state, so tests
// run commands in-process. Every flag can also be set from the environment
// as AETHER_<FLAG_NAME> (--grpc-addr is AETHER_GRPC_ADDR); a flag given on
// the command line wins.
package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/aethermesh/aether/server"
)

// deps is what the command tree needs from the outside world; tests replace
// the environment and the server.
type deps struct {
	stdout, stderr io.Writer
	lookupEnv      lookupFunc
	serve          func(context.Context, server.Config) error
	runEdge        func(context.Context, *edgeSettings) error
}

// NewRoot builds the aether command tree writing to stdout and stderr. Run
// it with ExecuteContext; cancelling the context stops the registrar and
// ends a watch cleanly.
func NewRoot(stdout, stderr io.Writer) *cobra.Command {
	return newRoot(deps{
		stdout:    stdout,
		stderr:    stderr,
		lookupEnv: os.LookupEnv,
		serve:     serveRegistrar,
		runEdge:   runEdge,
	})
}

func newRoot(d deps) *cobra.Command {
	root := &cobra.Command{
		Use:   "aether",
		Short: "Aether service-mesh discovery plane",
		Long: `Aether is a service-mesh discovery plane.

"aether registrar" runs the registrar: the cluster's write choke point and
watch cache over etcd. The other commands are clients of a registrar
(--registrar, default 127.0.0.1:9443).

Every flag can also be set from the environment as AETHER_<FLAG_NAME>, for
example --grpc-addr as AETHER_GRPC_ADDR; a flag on the command line wins.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return applyEnv(cmd.Flags(), d.lookupEnv)
		},
	}
	root.SetOut(d.stdout)
	root.SetErr(d.stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())
	})

	root.AddCommand(
		newRegistrarCmd(d),
		newRegisterCmd(),
		newDeregisterCmd(),
		newListCmd(),
		newWatchCmd(),
		newVersionCmd(),
		newBenchCmd(),
		newDrainCmd(),
		newNodesCmd(),
		newAgentCmd(),
		newReplicationCmd(),
		newMigrateCmd(),
		newClusterCmd(),
		newCertsCmd(),
		newXDSCmd(),
		newEdgeCmd(d),
		newStatusCmd(),
	)
	documentEnv(root)
	return root
}
