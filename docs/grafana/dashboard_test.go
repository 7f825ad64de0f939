package grafana

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/internal/testutil/xdstest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

const (
	dashboardFile = "aether.json"
	rulesFile     = "../alerts.yml"
)

func TestMetricNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`registrar_persistence_lag_seconds > 10`, []string{"registrar_persistence_lag_seconds"}},
		{`max by (instance) (registrar_persistence_lag_seconds{job=~"$job"})`, []string{"registrar_persistence_lag_seconds"}},
		{`sum without(cluster, region) (registrar_endpoints)`, []string{"registrar_endpoints"}},
		{`histogram_quantile(0.99, sum by (le, instance) (rate(xds_push_latency_seconds_bucket{type!="other"}[$__rate_interval])))`, []string{"xds_push_latency_seconds_bucket"}},
		{`rate(a_total[5m] offset 1h) / on(instance) group_left(version) b_info`, []string{"a_total", "b_info"}},
		{`increase(x_total[10m:1m]) > bool 3 and y unless z or w`, []string{"x_total", "y", "z", "w"}},
		{`max_over_time(m{l="sum(not_a_metric)", k='by (x)'}[1h]) * 1e3 + 0x1f - 5 + Inf`, []string{"m"}},
		{`topk(3, sum by (peer) (replicator_lag_seconds)) @ end()`, []string{"replicator_lag_seconds"}},
		{`{__name__="by_name_only"}`, nil},
		{`ns:recorded:rate5m`, []string{"ns:recorded:rate5m"}},
	} {
		got, err := metricNames(tc.expr)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, %v; want %q", tc.expr, got, err, tc.want)
		}
	}
	for _, bad := range []string{`m{a="b"`, `rate(m[5m)`, `m{a="b}`} {
		if _, err := metricNames(bad); err == nil {
			t.Errorf("metricNames(%q) accepted an unterminated expression", bad)
		}
	}
}

// TestDashboardAndRulesNameExportedMetrics scrapes a live registrar with
// every part on — an etcd backend, the xDS feed with a delta client that
// ACKs and then NACKs, the region replicator leading with a peer — so every
// metric family it exports is on its /metrics, and checks that each metric
// the dashboard's queries and the alert rules' expressions name is one of
// them. Then it shows the check catches a dashboard and a rule naming a
// metric that does not exist.
func TestDashboardAndRulesNameExportedMetrics(t *testing.T) {
	t.Parallel()
	if out, err := exec.Command("promtool", "check", "rules", rulesFile).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules %s: %v\n%s", rulesFile, err, out)
	}
	qs, err := dashboardQueries(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := ruleQueries(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) < 20 || len(rules) < 12 {
		t.Fatalf("read %d dashboard queries and %d rules; the readers miss some", len(qs), len(rules))
	}

	home, peer := etcdtest.Start(t), etcdtest.Start(t)
	srv := regtest.Start(t, server.Config{
		EtcdEndpoints:       home.Endpoints(),
		XDSAddr:             "127.0.0.1:0",
		PeerEtcd:            []string{"us=" + peer.Endpoints()[0]},
		ReplicationLeaseTTL: 6 * time.Second,
		Options:             registrar.Options{ClusterName: "c1", Region: "eu", Zone: "z1"},
	})
	reg := srv.Registrar()
	web := regtest.EP("web", "10.0.0.1", 8080)
	if _, _, err := reg.Register(web); err != nil {
		t.Fatal(err)
	}
	d := xdstest.DeltaProbe(t, srv.XDSAddr(), xdstest.Node("dash-probe", xdstest.Locality{Region: "eu", Zone: "z1"}))
	d.Subscribe(resourcev3.EndpointType, "web")
	d.Next(10 * time.Second)
	if _, _, err := reg.Register(regtest.EP("web", "10.0.0.2", 8080)); err != nil {
		t.Fatal(err)
	}
	d.NextNACK(10*time.Second, "dashboard test: rejected on purpose")

	var fams map[string]string
	wait.ForState(t, "every family on /metrics", 20*time.Second, func() (bool, string) {
		_, page := regtest.Get(t, "http://"+srv.HTTPAddr()+"/metrics")
		fams = families(page)
		var absent []string
		for _, f := range []string{"xds_nacks_total", "xds_connected_clients", "xds_push_latency_seconds", "replicator_lag_seconds", "replicator_lease_ttl_remaining_seconds", "registrar_persistence_lag_seconds", "registrar_watch_evictions_total"} {
			if _, ok := fams[f]; !ok {
				absent = append(absent, f)
			}
		}
		return len(absent) == 0, "absent: " + strings.Join(absent, ", ")
	})

	missing, err := missingMetrics(append(qs, rules...), fams)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, q := range append(qs, rules...) {
		names, _ := metricNames(q.expr)
		for _, n := range names {
			used[n] = true
		}
	}
	t.Logf("%d dashboard queries and %d rules name %d metrics, checked against %d exported families", len(qs), len(rules), len(used), len(fams))
	for _, m := range missing {
		t.Error(m)
	}

	t.Run("catches a metric that does not exist", func(t *testing.T) {
		raw, err := os.ReadFile(dashboardFile)
		if err != nil {
			t.Fatal(err)
		}
		// A plausible typo: the singular of xds_nacks_total.
		broken := strings.Replace(string(raw), "rate(xds_nacks_total", "rate(xds_nack_total", 1)
		if broken == string(raw) {
			t.Fatal("the dashboard has no xds_nacks_total query to break")
		}
		dir := t.TempDir()
		bad := filepath.Join(dir, "aether.json")
		if err := os.WriteFile(bad, []byte(broken), 0o644); err != nil {
			t.Fatal(err)
		}
		rawRules, err := os.ReadFile(rulesFile)
		if err != nil {
			t.Fatal(err)
		}
		brokenRules := strings.Replace(string(rawRules), "expr: replicator_lag_seconds > 30", "expr: replicator_lag_secs > 30", 1)
		if brokenRules == string(rawRules) {
			t.Fatal("the rules have no replicator_lag_seconds rule to break")
		}
		badRules := filepath.Join(dir, "alerts.yml")
		if err := os.WriteFile(badRules, []byte(brokenRules), 0o644); err != nil {
			t.Fatal(err)
		}
		bq, err := dashboardQueries(bad)
		if err != nil {
			t.Fatal(err)
		}
		br, err := ruleQueries(badRules)
		if err != nil {
			t.Fatal(err)
		}
		got, err := missingMetrics(append(bq, br...), fams)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || !strings.Contains(got[0]+got[1], "xds_nack_total is not exported") || !strings.Contains(got[0]+got[1], "replicator_lag_secs is not exported") {
			t.Errorf("the check reported %q, want exactly the two misspelt metrics", got)
		}
	})
}

// TestDashboardShape: the things Grafana needs to import the file and
// that a hand edit tends to break.
func TestDashboardShape(t *testing.T) {
	t.Parallel()
	qs, err := dashboardQueries(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if strings.TrimSpace(q.expr) == "" {
			t.Errorf("%s: empty expression", q.where)
		}
	}
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"uid": "aether-overview"`, `"uid": "${datasource}"`, "xds_nacks_total", "xds_push_latency_seconds_bucket",
		"registrar_write_flush_errors_total", "registrar_watch_evictions_total", "replicator_lag_seconds", "replicator_lease_ttl_remaining_seconds", "registrar_persistence_lag_seconds"} {
		if !strings.Contains(string(raw), want) {
			t.Errorf("%s lacks %s", dashboardFile, want)
		}
	}
}
