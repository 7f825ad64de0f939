package registrar_test

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
)

// promtool is Prometheus' own checker (Debian: apt-get install prometheus;
// .ci/run installs it). Not skipped when missing: the lint is the point.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (%v): install it, e.g. apt-get install -y prometheus", err)
	}
	return p
}

// TestMetricsPassPromtool scrapes a live registrar that holds endpoints
// and has flushed, so every family is present with samples, and runs
// `promtool check metrics` on the page: names follow Prometheus'
// conventions ("_count" only on histograms and summaries, "_total" on
// counters, units as suffixes). It also runs `promtool check rules` on the
// example alerts of docs/alerts.yml and checks that every registrar_*
// metric they use is one the registrar exports.
func TestMetricsPassPromtool(t *testing.T) {
	t.Parallel()
	tool := promtool(t)
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints())
	c := dial(t, s.GRPCAddr())
	register(t, c, ep("web", "10.0.0.1", 80))
	waitFor(t, "the write to persist", 10*time.Second, func() bool { return s.Registrar().PendingWrites() == 0 })

	_, page := get(t, "http://"+s.HTTPAddr()+"/metrics")
	for _, want := range []string{`registrar_endpoints{cluster="c1"} 1`, "registrar_persistence_lag_seconds 0", "registrar_persistence_isolated_writes 0"} {
		if !strings.Contains(page, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	cmd := exec.Command(tool, "check", "metrics")
	cmd.Stdin = strings.NewReader(page)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil || out.Len() > 0 {
		t.Errorf("promtool check metrics: %v\n%s", err, out.String())
	}

	const rules = "../docs/alerts.yml"
	if b, err := exec.Command(tool, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules %s: %v\n%s", rules, err, b)
	}
	raw, err := os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	used := regexp.MustCompile(`\bregistrar_[a-z_]+`).FindAllString(string(raw), -1)
	if len(used) == 0 {
		t.Fatalf("%s names no registrar_* metric", rules)
	}
	for _, name := range used {
		if !regexp.MustCompile(`(?m)^# TYPE ` + name + ` `).MatchString(page) {
			t.Errorf("%s uses %s, which the registrar does not export", rules, name)
		}
	}
}
