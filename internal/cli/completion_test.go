package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompletion: cobra's completion command prints a script for each
// shell, naming aether's own commands; bash's parses with bash -n (zsh and
// fish are not installed here, so theirs are checked by their markers).
func TestCompletion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ shell, marker string }{
		{"bash", "__start_aether"},
		{"zsh", "#compdef aether"},
		{"fish", "complete -c aether"},
	} {
		t.Run(tc.shell, func(t *testing.T) {
			res := runCLI(t, nil, nil, "completion", tc.shell)
			if res.err != nil || !strings.Contains(res.stdout, tc.marker) {
				t.Fatalf("completion %s: %v, script lacks %q:\n%.400s", tc.shell, res.err, tc.marker, res.stdout)
			}
			if tc.shell != "bash" {
				return
			}
			script := filepath.Join(t.TempDir(), "aether.bash")
			if err := os.WriteFile(script, []byte(res.stdout), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("bash", "-n", script).CombinedOutput(); err != nil {
				t.Errorf("bash -n: %v\n%s", err, out)
			}
			// The script completes through the binary itself
			// (__complete); ask it what follows "aether ins".
			res = runCLI(t, nil, nil, "__complete", "ins")
			if res.err != nil || !strings.Contains(res.stdout, "inspect") {
				t.Errorf("__complete ins: %v %q", res.err, res.stdout)
			}
		})
	}
	if res := runCLI(t, nil, nil, "completion", "tcsh"); res.err == nil || !strings.Contains(res.err.Error(), `unknown shell "tcsh": use one of bash, fish`) {
		t.Errorf("completion tcsh: %v %q", res.err, res.stdout)
	}
}
