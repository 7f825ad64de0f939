package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// setupCompletion adds cobra's "completion" command now rather than at
// Execute, so that it can be given a refusal of an unknown shell: cobra's
// own prints its help and exits 0 for "aether completion tcsh", which a
// provisioning script would take for success.
func setupCompletion(root *cobra.Command) {
	root.CompletionOptions.HiddenDefaultCmd = false
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() != "completion" {
			continue
		}
		var shells []string
		for _, s := range c.Commands() {
			shells = append(shells, s.Name())
		}
		c.Long += `

  source <(aether completion bash)          # bash, this shell
  aether completion zsh > "${fpath[1]}/_aether"   # zsh
  aether completion fish > ~/.config/fish/completions/aether.fish`
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("name a shell: aether completion %s", strings.Join(shells, "|"))
			}
			return fmt.Errorf("unknown shell %q: use one of %s", args[0], strings.Join(shells, ", "))
		}
	}
}
