package cli

import (
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version and commit may be set at link time, for release builds and for
// builds that carry no VCS stamp (a source tarball, -buildvcs=false):
//
//	go build -ldflags "-X github.com/aethermesh/aether/internal/cli.version=v1.2.3 \
//	    -X github.com/aethermesh/aether/internal/cli.commit=$(git rev-parse HEAD)" ./cmd/aether
//
// Otherwise they come from the build's own information: the module version
// (set by "go install module@version"; in a git checkout, since Go 1.24, a
// pseudo-version of the commit, "+dirty" when modified), and the VCS stamp
// "go build" records in a git checkout (vcs.revision, vcs.modified).
//
// They are link-time constants, not state: nothing writes them at run time.
var version, commit string

// buildVersion is what "aether version" reports.
type buildVersion struct {
	Version  string `json:"version"`
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"` // built from a tree with uncommitted changes
	Go       string `json:"go"`
	Platform string `json:"platform"`
}

// currentVersion is this binary's version.
func currentVersion() buildVersion {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return versionOf(version, commit, bi)
}

// versionOf derives the version from the link-time values (ldVersion,
// ldCommit; empty when not set) and the build info (nil when the binary
// has none). A link-time value wins over the build info.
func versionOf(ldVersion, ldCommit string, bi *debug.BuildInfo) buildVersion {
	v := buildVersion{Version: ldVersion, Commit: ldCommit, Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi == nil {
		if v.Version == "" {
			v.Version = "devel"
		}
		return v
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	if v.Version == "" {
		v.Version = "devel"
		if mv := bi.Main.Version; mv != "" && mv != "(devel)" {
			v.Version = mv
		}
	}
	var rev string
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if v.Commit == "" {
		// The modified flag belongs to the stamped revision; a commit
		// given at link time says nothing about the tree it was built
		// from, so it carries none.
		v.Commit, v.Modified = rev, modified && rev != ""
	}
	return v
}

// String is the one-line form:
// aether v1.2.3 (commit 0123456789ab, modified; go1.26.8 linux/amd64).
func (v buildVersion) String() string {
	c := "commit unknown"
	if v.Commit != "" {
		c = "commit " + v.Commit
		if v.Modified {
			c += ", modified"
		}
	}
	return fmt.Sprintf("aether %s (%s; %s %s)", v.Version, c, v.Go, v.Platform)
}

func newVersionCmd() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version and commit of this binary",
		Long: `Print this binary's version and the commit it was built from.

The version is the one set at link time (-ldflags "-X
github.com/aethermesh/aether/internal/cli.version=v1.2.3"), else the module
version of "go install ...@version" (in a git checkout, the pseudo-version
go build derives from the commit), else "devel". The commit is the one set
at link time (-X github.com/aethermesh/aether/internal/cli.commit=SHA), else
the VCS revision "go build" stamps in a git checkout, with "modified" when the
tree had uncommitted changes.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "text", "json"); err != nil {
				return err
			}
			v := currentVersion()
			if output == "json" {
				b, err := json.Marshal(v)
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
				return err
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), v)
			return err
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

// versionString is the short form for user agents and logs: the version,
// and for a devel build its commit, "devel-0123456789ab[-dirty]" (the
// edge command's --version derives etcd's "Git SHA" line from it).
func versionString() string {
	v := currentVersion()
	if v.Version != "devel" || v.Commit == "" {
		return v.Version
	}
	rev := v.Commit
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if v.Modified {
		rev += "-dirty"
	}
	return "devel-" + rev
}
