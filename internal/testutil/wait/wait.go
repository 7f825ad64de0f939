// Package wait is how tests wait: for a condition, with a deadline, never
// for a fixed sleep.
package wait

import (
	"time"
)

// TB is what a wait needs of its test. testing.TB has it; so does the
// narrower T of a suite that runs its checks against a recording double
// to show that they can fail (backend/backendtest), which no value but a
// real test can satisfy testing.TB for.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// step is how often a condition is polled: a wait ends within a few
// milliseconds of its condition holding, so a test that waits for many
// conditions in turn does not add up coarse steps.
const step = 5 * time.Millisecond

// For polls cond every 5ms until it holds, failing t with what it waited
// for once d has passed.
func For(t TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	ForState(t, what, d, func() (bool, string) { return cond(), "" })
}

// ForState is For for a condition that also describes what it saw: when
// the wait times out, the failure ends with the last description, which is
// the evidence of what did not happen.
func ForState(t TB, what string, d time.Duration, cond func() (ok bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			if state != "" {
				t.Fatalf("timed out after %v waiting for %s: %s", d, what, state)
			} else {
				t.Fatalf("timed out after %v waiting for %s", d, what)
			}
			// A double's Fatalf may return; the wait is over either way.
			return
		}
		time.Sleep(step)
	}
}
