package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionOf(t *testing.T) {
	t.Parallel()
	stamped := func(mainVersion string, settings ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Path: "github.com/aethermesh/aether", Version: mainVersion}}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi
	}
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name                string
		ldVersion, ldCommit string
		bi                  *debug.BuildInfo
		want                buildVersion
		line                string
	}{
		{"no build info", "", "", nil,
			buildVersion{Version: "devel", Go: runtime.Version()}, "aether devel (commit unknown; "},
		{"devel, no vcs", "", "", stamped("(devel)"),
			buildVersion{Version: "devel", Go: "go1.99"}, "aether devel (commit unknown; go1.99 "},
		{"devel, clean checkout", "", "", stamped("(devel)", "vcs", "git", "vcs.revision", rev, "vcs.modified", "false"),
			buildVersion{Version: "devel", Commit: rev, Go: "go1.99"}, "aether devel (commit " + rev + "; go1.99 "},
		{"devel, modified checkout", "", "", stamped("(devel)", "vcs.revision", rev, "vcs.modified", "true"),
			buildVersion{Version: "devel", Commit: rev, Modified: true, Go: "go1.99"}, "aether devel (commit " + rev + ", modified; go1.99 "},
		{"go install @version", "", "", stamped("v1.4.0"),
			buildVersion{Version: "v1.4.0", Go: "go1.99"}, "aether v1.4.0 (commit unknown; "},
		{"link-time version wins", "v2.0.0", "", stamped("v1.4.0", "vcs.revision", rev, "vcs.modified", "true"),
			buildVersion{Version: "v2.0.0", Commit: rev, Modified: true, Go: "go1.99"}, "aether v2.0.0 (commit " + rev + ", modified; "},
		{"link-time commit wins, without a modified flag", "v2.0.0", "feedbeef", stamped("(devel)", "vcs.revision", rev, "vcs.modified", "true"),
			buildVersion{Version: "v2.0.0", Commit: "feedbeef", Go: "go1.99"}, "aether v2.0.0 (commit feedbeef; "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := versionOf(tc.ldVersion, tc.ldCommit, tc.bi)
			tc.want.Platform = runtime.GOOS + "/" + runtime.GOARCH
			if got != tc.want {
				t.Errorf("versionOf = %+v, want %+v", got, tc.want)
			}
			if !strings.HasPrefix(got.String(), tc.line) {
				t.Errorf("String() = %q, want prefix %q", got.String(), tc.line)
			}
		})
	}
}

func TestVersionCommand(t *testing.T) {
	t.Parallel()
	res := runCLI(t, nil, nil, "version")
	if res.err != nil || !regexp.MustCompile(`^aether \S+ \(commit [^;]+; go\S+ \S+/\S+\)\n$`).MatchString(res.stdout) {
		t.Errorf("version: %v %q", res.err, res.stdout)
	}
	res = runCLI(t, nil, nil, "version", "-o", "json")
	var v buildVersion
	if err := json.Unmarshal([]byte(res.stdout), &v); err != nil || res.err != nil || v.Version == "" || v.Go == "" || v.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("version -o json: %v %v %q", res.err, err, res.stdout)
	}
	if res := runCLI(t, nil, nil, "version", "-o", "yaml"); res.err == nil || !strings.Contains(res.err.Error(), `-o/--output "yaml": use text or json`) {
		t.Errorf("version -o yaml: %v", res.err)
	}
}

// TestVersionOfBuiltBinary builds the real binary the way a user does, in a
// git checkout of this tree (a copy of the working tree committed into a
// fresh repository: a worktree's .git file is not stamped by go build, and
// the working tree is what is under test), and checks "aether version"
// reports that commit; then with -ldflags -X overrides, and from a
// modified tree.
func TestVersionOfBuiltBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary twice")
	}
	t.Parallel()
	git, err := exec.LookPath("git")
	if err != nil {
		t.Fatalf("git not found: %v", err)
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	run := func(dir string, env []string, name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir, cmd.Env = dir, append(os.Environ(), env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, stderr.String())
		}
		return string(out)
	}
	// The files git would commit: tracked ones and untracked ones not
	// ignored, as in the working tree now.
	files := strings.Split(strings.TrimRight(run(root, nil, git, "ls-files", "-co", "--exclude-standard", "-z"), "\x00"), "\x00")
	src := t.TempDir()
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if os.IsNotExist(err) {
			continue // deleted in the working tree, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(src, filepath.Dir(f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gitEnv := []string{"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.invalid", "GIT_CONFIG_GLOBAL=/dev/null"}
	run(src, gitEnv, git, "init", "-q")
	run(src, gitEnv, git, "add", "-A")
	run(src, gitEnv, git, "commit", "-q", "-m", "snapshot")
	head := strings.TrimSpace(run(src, gitEnv, git, "rev-parse", "HEAD"))

	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go not found: %v", err)
	}
	// GOFLAGS may say -buildvcs=false (this machine's does); a user's
	// build stamps, so the test does.
	build := func(bin string, ldflags string) buildVersion {
		t.Helper()
		args := []string{"build", "-buildvcs=true", "-o", bin}
		if ldflags != "" {
			args = append(args, "-ldflags", ldflags)
		}
		run(src, append(gitEnv, "GOFLAGS="), goTool, append(args, "./cmd/aether")...)
		var v buildVersion
		out := run(src, nil, bin, "version", "-o", "json")
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("%s version -o json: %v: %q", bin, err, out)
		}
		if line := run(src, nil, bin, "version"); line != v.String()+"\n" {
			t.Errorf("text %q disagrees with JSON %+v", line, v)
		}
		return v
	}
	bin := t.TempDir()
	v := build(filepath.Join(bin, "released"), "-X github.com/aethermesh/aether/internal/cli.version=v9.8.7")
	if v.Version != "v9.8.7" || v.Commit != head || v.Modified {
		t.Errorf("-X version build of a clean checkout at %s reports %+v", head, v)
	}
	// An untracked file makes the checkout modified as git status sees it.
	if err := os.WriteFile(filepath.Join(src, "scratch.txt"), []byte("local change\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	v = build(filepath.Join(bin, "devel"), "")
	// Since Go 1.24 go build derives the main module's version from the
	// stamp: a pseudo-version of the commit, +dirty when modified.
	if !strings.HasPrefix(v.Version, "v0.0.0-") || !strings.HasSuffix(v.Version, "-"+head[:12]+"+dirty") || v.Commit != head || !v.Modified {
		t.Errorf("build of a modified checkout at %s reports %+v", head, v)
	}
}
