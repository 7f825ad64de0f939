// Command aether is the Aether service-mesh discovery plane: the registrar
// server and its command-line clients. See "aether --help".
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/aethermesh/aether/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, restore the default handling so a second
	// Ctrl-C kills a shutdown that hangs.
	go func() {
		<-ctx.Done()
		stop()
	}()
	err := cli.NewRoot(os.Stdout, os.Stderr).ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "aether: %v\n", err)
		os.Exit(1)
	}
}
