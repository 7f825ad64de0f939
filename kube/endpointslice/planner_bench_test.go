package endpointslice

import (
	"testing"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// BenchmarkPlan10kChangeOne is the planner's cost for one service of 10k
// endpoints in 100 slices when one endpoint changed: what a busy
// service's every sync pays.
func BenchmarkPlan10kChangeOne(b *testing.B) {
	eps := many(10000)
	ss := testCfg.Plan("web", eps, nil).Create
	for _, s := range ss {
		s.ResourceVersion = "1"
	}
	eps[5000] = sep(eps[5000].Ip, registryv1.State_STATE_DRAINING)
	b.ResetTimer()
	for range b.N {
		if p := testCfg.Plan("web", eps, ss); len(p.Update) != 1 || len(p.Create)+len(p.Delete) != 0 {
			b.Fatalf("%d creates %d updates %d deletes, want one update", len(p.Create), len(p.Update), len(p.Delete))
		}
	}
}
