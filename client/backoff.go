package client

import (
	"context"
	"math/rand/v2"
	"time"
)

// fullJitter is the delay before retry number attempt (0-based): uniform in
// [0, min(max, base*2^attempt)). Full jitter rather than "cap plus a little
// noise" spreads a crowd of agents that failed together over the whole
// window, which is what keeps a restarted registrar from being hit by all of
// them at once. rnd(n) must return a value in [0, n); it is a parameter so
// tests can pin the bounds.
func fullJitter(base, max time.Duration, attempt int, rnd func(n int64) int64) time.Duration {
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

// backoff is fullJitter with the client's bounds and a real random source.
func (c *Client) backoff(attempt int) time.Duration {
	return fullJitter(c.cfg.BackoffBase, c.cfg.BackoffMax, attempt, rand.Int64N)
}

// sleep waits for d, or until ctx ends or wake fires; it reports whether the
// full delay passed.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
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
