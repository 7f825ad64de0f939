package disruption_test

import (
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/disruption"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/registrar"
)

// The battery on the kubernetes backend: two registrars on one real
// kube-apiserver (each run in a fresh namespace of its own), watch sync,
// with peer-watch and without.
//
// With peer-watch, A's writes reach B over A's peer stream within
// milliseconds: nothing is dropped. Without it, B learns them from the API
// server's watch once A's write-behind batch is flushed (every 100ms):
// a drain reaches every client in 130-165ms (p50, four runs), and at the default
// drain period of 1s the battery drops nothing on an idle machine, but
// under load the API path's tail passes 1s (one run of four here: p99
// 3.1s, 3035 dead picks in the churn), so a zero there is not a stable
// fact to assert. The run without peer-watch therefore uses a drain
// period of 50ms, below the flush interval, where most drains reach B's
// clients after their pod is dead: the battery must see those drops, the
// proof that it can fail on this backend (as poll-only sync is on etcd
// and DynamoDB). About 25 s per run on an idle machine.
func TestDisruptionBatteryKubernetes(t *testing.T) {
	api := kubeapi.Start(t)
	run := func(peerWatch bool, drainPeriod time.Duration) disruption.Result {
		cfg := shortForm(t, registrar.SyncWatch)
		cfg.Backend, cfg.Kubeconfig, cfg.PeerWatch, cfg.DrainPeriod = disruption.BackendKubernetes, api.Kubeconfig, peerWatch, drainPeriod
		res, err := disruption.Run(t.Context(), cfg)
		if err != nil {
			t.Fatalf("peer-watch %v: %v", peerWatch, err)
		}
		if res.WrongPicks != 0 {
			t.Errorf("peer-watch %v: %d wrong picks (unknown endpoints or wrong ports): %s", peerWatch, res.WrongPicks, strings.Join(res.Samples, "; "))
		}
		if res.DrainPropagation.N != retirements {
			t.Errorf("peer-watch %v: %d drains reached every client, want %d: the rolls did not run", peerWatch, res.DrainPropagation.N, retirements)
		}
		if res.Resolutions < 10_000 {
			t.Errorf("peer-watch %v: only %d resolutions: the battery did not exercise the resolvers", peerWatch, res.Resolutions)
		}
		return res
	}

	pw := run(true, time.Second)
	if pw.Drops != 0 {
		t.Errorf("kubernetes with peer-watch: %d drops over %d resolutions, want 0: %s; e.g. %s",
			pw.Drops, pw.Resolutions, pw.Where(), strings.Join(pw.Samples, "; "))
	}

	watch := run(false, 50*time.Millisecond)
	if watch.DeadPicks == 0 {
		t.Errorf("kubernetes without peer-watch (drain period %v, drain propagation %v): no dead picks over %d resolutions; the battery cannot see stale clients",
			watch.Config.DrainPeriod, watch.DrainPropagation, watch.Resolutions)
	}
	if watch.DrainPropagation.Max < watch.Config.DrainPeriod {
		t.Errorf("without peer-watch: slowest drain reached every client in %v, within the drain period %v", watch.DrainPropagation.Max, watch.Config.DrainPeriod)
	}
	// The zero above is the peer stream's, not an accident of timing: the
	// same drains through the API server's watch are slower.
	if pw.DrainPropagation.P50 >= watch.DrainPropagation.P50 {
		t.Errorf("drain propagation p50 %v with peer-watch, %v without: the run without peer-watch did not go through the API server's watch",
			pw.DrainPropagation.P50, watch.DrainPropagation.P50)
	}
}

// The battery's Config names what the kubernetes backend needs.
func TestDisruptionKubernetesConfig(t *testing.T) {
	for _, c := range []struct {
		cfg  disruption.Config
		want string
	}{
		{disruption.Config{Backend: disruption.BackendKubernetes}, "needs Kubeconfig"},
		{disruption.Config{Backend: disruption.BackendKubernetes, Kubeconfig: "k", DynamoDBEndpoint: "http://x"}, "DynamoDBEndpoint is for"},
		{disruption.Config{Kubeconfig: "k"}, "Kubeconfig is for"},
		{disruption.Config{Backend: "kube"}, "use etcd, dynamodb or kubernetes"},
	} {
		_, err := disruption.Run(t.Context(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Run(%+v) = %v, want an error containing %q", c.cfg, err, c.want)
		}
	}
	if m := (disruption.Config{Backend: disruption.BackendKubernetes, SyncMode: registrar.SyncWatch, PeerWatch: true}).Mode(); m != "Kubernetes, watch sync + peer-watch" {
		t.Errorf("Mode() = %q", m)
	}
}
