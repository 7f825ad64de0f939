package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// EnvPrefix prefixes the environment variable of every flag: --grpc-addr is
// also AETHER_GRPC_ADDR.
const EnvPrefix = "AETHER_"

// envName is the environment variable that sets a flag.
func envName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// lookupFunc reads an environment variable; os.LookupEnv in production.
type lookupFunc func(name string) (string, bool)

// noEnvFlags are flags the environment must not set.
var noEnvFlags = map[string]bool{"help": true}

// applyEnv sets every flag of fs that was not given on the command line from
// its environment variable, if that is set. A flag given explicitly wins.
// List flags take a comma-separated value. An empty variable is treated as
// unset. Errors name the variable and the flag.
func applyEnv(fs *pflag.FlagSet, lookup lookupFunc) error {
	var firstErr error
	fs.VisitAll(func(f *pflag.Flag) {
		if firstErr != nil || f.Changed || noEnvFlags[f.Name] {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if !ok || v == "" {
			return
		}
		if err := f.Value.Set(v); err != nil {
			firstErr = fmt.Errorf("invalid environment variable %s=%q for --%s: %v", name, v, f.Name, err)
			return
		}
		// Commands treat a value from the environment like one given on
		// the command line.
		f.Changed = true
	})
	return firstErr
}

// documentEnv appends the environment variable to the help text of every
// flag in the tree under root.
func documentEnv(root *cobra.Command) {
	seen := map[*pflag.Flag]bool{}
	note := func(f *pflag.Flag) {
		if seen[f] || noEnvFlags[f.Name] {
			return
		}
		seen[f] = true
		f.Usage += " [$" + envName(f.Name) + "]"
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.PersistentFlags().VisitAll(note)
		c.Flags().VisitAll(note)
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}
