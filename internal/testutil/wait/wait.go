// Package wait is how tests wait: for a condition, with a deadline, never
// for a fixed sleep.
package wait

import (
	"testing"
	"time"
)

// For polls cond every 5ms until it holds, failing t with what it waited
// for once d has passed.
func For(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
