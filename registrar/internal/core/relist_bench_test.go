package core

import (
	"fmt"
	"testing"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// BenchmarkApplyListing is the cost of one backstop reconciliation of a
// listing equal to the snapshot, held under the registrar's lock.
func BenchmarkApplyListing100k(b *testing.B) {
	eps := make([]*registryv1.ServiceEndpoint, 0, 100000)
	for i := range 100000 {
		eps = append(eps, mkEP(b, fmt.Sprintf("svc-%d", i%3000), fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255)))
	}
	s := newStateForTest("e", 100, 100)
	s.ApplyListing(listing(10, eps...))
	b.ResetTimer()
	for i := range b.N {
		s.TrackForListing()
		s.ApplyListing(listing(int64(11+i), eps...))
	}
}
