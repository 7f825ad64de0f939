package replicator

import (
	"context"
	"math/rand/v2"
	"time"
)

// backoff is a capped exponential backoff with jitter. The zero value is not
// usable; build it with newBackoff.
type backoff struct {
	min, max, cur time.Duration
}

func newBackoff(lo, hi time.Duration) *backoff { return &backoff{min: lo, max: hi} }

// next returns the delay before the next attempt: the current step, doubled
// each call up to max, with ±20% jitter so that the loops of many replicas
// or peers do not retry in lockstep.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(2*b.cur, b.max)
	}
	return jitter(b.cur)
}

// reset makes the next delay the minimum again: call it after a success.
func (b *backoff) reset() { b.cur = 0 }

func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d*8/10 + rand.N(d*4/10+1)
}

// sleep waits d or until ctx ends; it reports whether the full d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
