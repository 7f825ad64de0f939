package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func TestEnvName(t *testing.T) {
	t.Parallel()
	for flag, want := range map[string]string{
		"registrar":               "AETHER_REGISTRAR",
		"grpc-addr":               "AETHER_GRPC_ADDR",
		"watch-progress-interval": "AETHER_WATCH_PROGRESS_INTERVAL",
		"output":                  "AETHER_OUTPUT",
	} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q, want %q", flag, got, want)
		}
	}
}

func TestApplyEnv(t *testing.T) {
	t.Parallel()
	type vals struct {
		s     string
		n     int
		d     time.Duration
		b     bool
		list  []string
		arr   []string
		other string
	}
	newFS := func(v *vals) *pflag.FlagSet {
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		fs.StringVar(&v.s, "grpc-addr", ":9443", "")
		fs.IntVar(&v.n, "write-batch-size", 50, "")
		fs.DurationVar(&v.d, "timeout", 5*time.Second, "")
		fs.BoolVar(&v.b, "draining", false, "")
		fs.StringSliceVar(&v.list, "etcd-endpoints", []string{"default:2379"}, "")
		fs.StringArrayVar(&v.arr, "meta", nil, "")
		fs.StringVar(&v.other, "other", "keep", "")
		fs.Bool("help", false, "")
		return fs
	}
	env := map[string]string{
		"AETHER_GRPC_ADDR":        ":1",
		"AETHER_WRITE_BATCH_SIZE": "7",
		"AETHER_TIMEOUT":          "1m",
		"AETHER_DRAINING":         "true",
		"AETHER_ETCD_ENDPOINTS":   "a:1,b:2",
		"AETHER_META":             "k=v,w",
		"AETHER_OTHER":            "", // empty counts as unset
		"AETHER_HELP":             "true",
		"GRPC_ADDR":               ":2", // no prefix: ignored
	}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }

	t.Run("env fills unset flags", func(t *testing.T) {
		var v vals
		fs := newFS(&v)
		if err := applyEnv(fs, lookup); err != nil {
			t.Fatal(err)
		}
		if v.s != ":1" || v.n != 7 || v.d != time.Minute || !v.b || v.other != "keep" {
			t.Errorf("got %+v", v)
		}
		if strings.Join(v.list, "|") != "a:1|b:2" {
			t.Errorf("slice flag = %q, want the env list replacing the default", v.list)
		}
		if len(v.arr) != 1 || v.arr[0] != "k=v,w" {
			t.Errorf("array flag = %q, want one element", v.arr)
		}
		if !fs.Changed("grpc-addr") || fs.Changed("other") {
			t.Error("flags set from env must count as changed, others not")
		}
		if h, _ := fs.GetBool("help"); h {
			t.Error("AETHER_HELP must not set --help")
		}
	})

	t.Run("explicit flag wins", func(t *testing.T) {
		var v vals
		fs := newFS(&v)
		if err := fs.Parse([]string{"--grpc-addr", ":3", "--etcd-endpoints", "c:3", "--draining=false"}); err != nil {
			t.Fatal(err)
		}
		if err := applyEnv(fs, lookup); err != nil {
			t.Fatal(err)
		}
		if v.s != ":3" || v.b || strings.Join(v.list, "|") != "c:3" {
			t.Errorf("env overrode an explicit flag: %+v", v)
		}
		if v.n != 7 {
			t.Errorf("unset flag not taken from env: %d", v.n)
		}
	})

	t.Run("bad value names the variable", func(t *testing.T) {
		var v vals
		fs := newFS(&v)
		err := applyEnv(fs, func(name string) (string, bool) {
			if name == "AETHER_WRITE_BATCH_SIZE" {
				return "ten", true
			}
			return "", false
		})
		if err == nil || !strings.Contains(err.Error(), `AETHER_WRITE_BATCH_SIZE="ten"`) || !strings.Contains(err.Error(), "--write-batch-size") {
			t.Fatalf("error %v", err)
		}
	})
}

// TestInheritedFlagsFromEnv checks that the hook sees persistent flags of
// parent commands too.
func TestInheritedFlagsFromEnv(t *testing.T) {
	t.Parallel()
	var addr string
	var ran bool
	root := &cobra.Command{Use: "x", PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
		return applyEnv(cmd.Flags(), func(n string) (string, bool) { return "env:1", n == "AETHER_REGISTRAR" })
	}}
	root.PersistentFlags().StringVar(&addr, "registrar", "default:1", "")
	root.AddCommand(&cobra.Command{Use: "sub", RunE: func(*cobra.Command, []string) error { ran = true; return nil }})
	root.SetArgs([]string{"sub"})
	if err := root.Execute(); err != nil || !ran {
		t.Fatal(err, ran)
	}
	if addr != "env:1" {
		t.Errorf("inherited flag = %q, want env:1", addr)
	}
}

func TestHelpShowsEnv(t *testing.T) {
	t.Parallel()
	res := runCLI(t, nil, nil, "list", "--help")
	if res.err != nil {
		t.Fatal(res.err)
	}
	for _, want := range []string{"[$AETHER_REGISTRAR]", "[$AETHER_TIMEOUT]", "[$AETHER_OUTPUT]", "[$AETHER_SERVICE]"} {
		if !strings.Contains(res.stdout, want) {
			t.Errorf("help lacks %s:\n%s", want, res.stdout)
		}
	}
	if strings.Count(res.stdout, "[$AETHER_REGISTRAR]") != 1 {
		t.Errorf("env documented more than once:\n%s", res.stdout)
	}
}
