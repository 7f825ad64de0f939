package disruption_test

import (
	"strings"
	"testing"

	"github.com/aethermesh/aether/disruption"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/registrar"
)

// The battery on the kubernetes backend: two registrars on one real
// kube-apiserver (each run in a fresh namespace of its own), watch sync,
// with peer-watch and without. Without it, B learns A's writes from the
// API server's watch once A's write-behind batch (100ms) is flushed: a
// drain reaches every client in a few hundred milliseconds, inside the 1s
// drain period, so neither run drops anything. That this battery can fail
// is shown on etcd and DynamoDB with poll-only sync
// (TestDisruptionBatteryPollOnlyDrops, TestDisruptionBatteryDynamoDB);
// here the no-peer-watch run is checked to have taken the API server's
// path (slower than the peer stream) so that its zero means what it says.
// Both runs take about 25 s each on an idle machine.
func TestDisruptionBatteryKubernetes(t *testing.T) {
	api := kubeapi.Start(t)
	run := func(peerWatch bool) disruption.Result {
		cfg := shortForm(t, registrar.SyncWatch)
		cfg.Backend, cfg.Kubeconfig, cfg.PeerWatch = disruption.BackendKubernetes, api.Kubeconfig, peerWatch
		res, err := disruption.Run(t.Context(), cfg)
		if err != nil {
			t.Fatalf("peer-watch %v: %v", peerWatch, err)
		}
		if res.Drops != 0 {
			t.Errorf("kubernetes, peer-watch %v: %d drops over %d resolutions, want 0: %s; e.g. %s",
				peerWatch, res.Drops, res.Resolutions, res.Where(), strings.Join(res.Samples, "; "))
		}
		if res.DrainPropagation.N != retirements {
			t.Errorf("peer-watch %v: %d drains reached every client, want %d: the rolls did not run", peerWatch, res.DrainPropagation.N, retirements)
		}
		if res.Resolutions < 10_000 {
			t.Errorf("peer-watch %v: only %d resolutions: the battery did not exercise the resolvers", peerWatch, res.Resolutions)
		}
		return res
	}
	pw, watch := run(true), run(false)
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
