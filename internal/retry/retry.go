// Package retry is the backoff of the agent and of the client library: one
// rule for how long to wait before the next attempt, and one sleep that
// ends with its context.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff bounds full-jitter delays: retry number attempt (0-based) waits
// uniformly in [0, min(Max, Base*2^attempt)). The zero value never waits.
type Backoff struct {
	Base, Max time.Duration
}

// Delay is the wait before retry number attempt, from a real random source.
func (b Backoff) Delay(attempt int) time.Duration {
	return FullJitter(b.Base, b.Max, attempt, rand.Int64N)
}

// FullJitter is the delay before retry number attempt (0-based): uniform in
// [0, min(max, base*2^attempt)). Full jitter rather than "cap plus a little
// noise" spreads a crowd of agents that failed together over the whole
// window, which is what keeps a restarted registrar from being hit by all of
// them at once. rnd(n) must return a value in [0, n); it is a parameter so
// tests can pin the bounds.
func FullJitter(base, max time.Duration, attempt int, rnd func(n int64) int64) time.Duration {
	if base <= 0 || max <= 0 {
		return 0
	}
	ceil := max
	// base<<attempt overflows long before attempt reaches 63; stop doubling
	// as soon as the cap is reached.
	if attempt < 62 {
		if d := base << attempt; d > 0 && d>>attempt == base && d < max {
			ceil = d
		}
	}
	return time.Duration(rnd(int64(ceil)))
}

// Sleep waits for d, or until ctx ends or wake fires (nil: never); it
// reports whether the full delay passed. A loop that sleeps here stops as
// soon as it is told to, instead of sitting out a long delay first.
func Sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-wake:
		return false
	}
}
