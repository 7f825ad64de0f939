// Package retry is the one backoff of the project: one rule for how long to
// wait before the next attempt, and one sleep that ends with its context.
// Callers differ only in how they draw a delay below the exponential
// ceiling: full jitter (Delay), a spread around it (Spread), or none
// (Ceiling).
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff bounds the delays of a capped exponential backoff: retry number
// attempt (0-based) has the ceiling min(Max, Base*2^attempt). The zero value
// never waits.
type Backoff struct {
	Base, Max time.Duration
}

// Delay is the full-jitter wait before retry number attempt, from a real
// random source: uniform in [0, Ceiling(attempt)).
func (b Backoff) Delay(attempt int) time.Duration {
	return FullJitter(b.Base, b.Max, attempt, rand.Int64N)
}

// Ceiling is the un-jittered wait before retry number attempt:
// min(Max, Base*2^attempt), or 0 if Base or Max is not positive. A loop
// that is alone in retrying one thing (one watch of one store client) has
// no crowd to spread, so it may wait exactly this.
func (b Backoff) Ceiling(attempt int) time.Duration {
	return ceiling(b.Base, b.Max, attempt)
}

// Spread is the wait before retry number attempt drawn uniformly within
// ±pct percent of Ceiling(attempt), from a real random source. Unlike full
// jitter it keeps the wait near the exponential step, so a loop still backs
// off by about the step it means to, while loops that failed together (the
// replicas of one region, the peers of one replicator) drift apart instead
// of retrying in lockstep.
func (b Backoff) Spread(attempt, pct int) time.Duration {
	return Spread(b.Ceiling(attempt), pct, rand.Int64N)
}

// FullJitter is the delay before retry number attempt (0-based): uniform in
// [0, min(max, base*2^attempt)). Full jitter rather than "cap plus a little
// noise" spreads a crowd of agents that failed together over the whole
// window, which is what keeps a restarted registrar from being hit by all of
// them at once. rnd(n) must return a value in [0, n); it is a parameter so
// tests can pin the bounds.
func FullJitter(base, max time.Duration, attempt int, rnd func(n int64) int64) time.Duration {
	ceil := ceiling(base, max, attempt)
	if ceil <= 0 {
		return 0
	}
	return time.Duration(rnd(int64(ceil)))
}

// Spread is d moved uniformly within [d-pct%, d+pct%] (both ends included),
// or 0 if d is not positive. rnd(n) must return a value in [0, n); it is a
// parameter so tests can pin the bounds. d*100 must not overflow, which
// holds for any delay below about three years.
func Spread(d time.Duration, pct int, rnd func(n int64) int64) time.Duration {
	if d <= 0 {
		return 0
	}
	p := time.Duration(min(max(pct, 0), 100))
	return d*(100-p)/100 + time.Duration(rnd(int64(d*2*p/100+1)))
}

func ceiling(base, max time.Duration, attempt int) time.Duration {
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
	return ceil
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
