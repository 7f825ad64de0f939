package registrar

import (
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/retry"
)

// The registrar's own retries wait the plain exponential step, without
// jitter: the initial listing from 100ms, a failed flush from 50ms, both
// doubling to 5s.
func TestRetryStepsDoubleToTheirCap(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    retry.Backoff
		want []time.Duration
	}{
		{"initial listing", startBackoff, []time.Duration{100, 200, 400, 800, 1600, 3200, 5000, 5000}},
		{"flush", flushBackoff, []time.Duration{50, 100, 200, 400, 800, 1600, 3200, 5000, 5000}},
	} {
		for attempt, w := range tc.want {
			if got := tc.b.Ceiling(attempt); got != w*time.Millisecond {
				t.Errorf("%s: retry %d waits %v, want %v", tc.name, attempt, got, w*time.Millisecond)
			}
		}
	}
}
