package cli

import (
	"strings"
	"testing"
)

// --value-merge and --value-merge-prefix (and their ETCD_* spellings) reach
// the server's config; bad values are refused naming the flag.
func TestEdgeValueMergeFlags(t *testing.T) {
	res := mustEdge(t, nil, "--data-dir", t.TempDir(), "--value-merge", "json")
	if cfg := res.settings.edgeConfig(); cfg.ValueMerge != "json" || len(cfg.ValueMergePrefixes) != 0 {
		t.Fatalf("--value-merge json: config %q %q", cfg.ValueMerge, cfg.ValueMergePrefixes)
	}
	res = mustEdge(t, map[string]string{"ETCD_VALUE_MERGE_PREFIX": "/config/=json,/deploy/=json"}, "--data-dir", t.TempDir())
	if cfg := res.settings.edgeConfig(); cfg.ValueMerge != "bytes" || strings.Join(cfg.ValueMergePrefixes, " ") != "/config/ /deploy/" {
		t.Fatalf("ETCD_VALUE_MERGE_PREFIX: config %q %q", cfg.ValueMerge, cfg.ValueMergePrefixes)
	}
	if cfg := mustEdge(t, nil, "--data-dir", t.TempDir()).settings.edgeConfig(); cfg.ValueMerge != "bytes" || cfg.ValueMergePrefixes != nil {
		t.Fatalf("default: %q %q", cfg.ValueMerge, cfg.ValueMergePrefixes)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--value-merge", "yaml"}, `invalid value "yaml" for --value-merge`},
		{[]string{"--value-merge", "json", "--value-merge-prefix", "/a/=json"}, "--value-merge-prefix needs --value-merge bytes"},
		{[]string{"--value-merge-prefix", "/a/"}, `invalid entry "/a/" for --value-merge-prefix: want PREFIX=json`},
		{[]string{"--value-merge-prefix", "=json"}, `invalid entry "=json"`},
		{[]string{"--value-merge-prefix", "/a/=bytes"}, `invalid mode "bytes" for prefix "/a/" in --value-merge-prefix`},
	} {
		res := runEdgeCLI(t, nil, append([]string{"--data-dir", t.TempDir()}, tc.args...)...)
		if res.err == nil || !strings.Contains(res.err.Error(), tc.want) {
			t.Errorf("%q: error %v, want it to say %q", tc.args, res.err, tc.want)
		}
	}
}
