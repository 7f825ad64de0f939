package kubernetes

import (
	"net/http"
	"testing"
	"time"
)

// TestServerClock: the estimate of the API server's clock narrows as Date
// headers fall at different phases of the server's second, is independent
// of the replica's own wall clock (only the server's Date and the local
// monotonic clock enter it), and starts over when the server's clock
// steps.
func TestServerClock(t *testing.T) {
	c := newServerClock()
	// The server runs 1h23m45.3s ahead of this replica's wall clock.
	skew := time.Hour + 23*time.Minute + 45*time.Second + 300*time.Millisecond
	serverAt := func(local time.Time) time.Time { return local.Add(skew) }
	date := func(local time.Time) string { return serverAt(local).UTC().Format(http.TimeFormat) }
	sample := func(at time.Duration) {
		sent := c.base.Add(at)
		recv := sent.Add(4 * time.Millisecond)
		// The server stamps the response halfway through the round trip.
		c.observe(sent, recv, date(sent.Add(2*time.Millisecond)))
	}
	width := func() time.Duration { c.mu.Lock(); defer c.mu.Unlock(); return c.hi - c.lo }

	sample(0)
	if w := width(); w < 900*time.Millisecond || w > time.Second+5*time.Millisecond {
		t.Fatalf("one sample: bounds %v wide, want about a second (Date has whole seconds)", w)
	}
	// Samples 10 ms apart over two seconds cross the server's second
	// boundaries, each crossing pinning the offset to a round trip.
	for at := 10 * time.Millisecond; at < 2*time.Second; at += 10 * time.Millisecond {
		sample(at)
	}
	if w := width(); w > 20*time.Millisecond {
		t.Fatalf("after 200 samples: bounds %v wide, want a round trip or two", w)
	}
	earliest, latest := c.now()
	truth := serverAt(time.Now())
	if earliest.After(truth.Add(time.Millisecond)) || latest.Before(truth.Add(-time.Millisecond)) {
		t.Fatalf("server now in [%v, %v], true %v", earliest, latest, truth)
	}
	if d := truth.Sub(time.Now()); d < skew-time.Second {
		t.Fatalf("the estimate follows the local clock: %v", d)
	}

	// The server's clock steps back 10 s: its next Date contradicts the
	// bounds, and the clock starts over from it.
	skew -= 10 * time.Second
	sample(3 * time.Second)
	if w := width(); w < 900*time.Millisecond {
		t.Fatalf("after a step of the server's clock: bounds %v wide, want one sample's second", w)
	}
	earliest, latest = c.now()
	truth = serverAt(time.Now())
	if earliest.After(truth.Add(time.Millisecond)) || latest.Before(truth.Add(-time.Millisecond)) {
		t.Fatalf("after the step: server now in [%v, %v], true %v", earliest, latest, truth)
	}

	// A response without a (valid) Date changes nothing.
	before := width()
	c.observe(time.Now(), time.Now(), "")
	c.observe(time.Now(), time.Now(), "yesterday")
	if width() != before {
		t.Fatalf("a response without a Date moved the bounds")
	}
}

// TestLeaseSeconds: Lease durations are whole seconds, rounded up, at
// least one.
func TestLeaseSeconds(t *testing.T) {
	for _, c := range []struct {
		ttl  time.Duration
		want int32
	}{{0, 1}, {time.Millisecond, 1}, {time.Second, 1}, {1500 * time.Millisecond, 2}, {30 * time.Second, 30}, {1 << 62, 1<<31 - 1}} {
		if got := leaseSeconds(c.ttl); got != c.want {
			t.Errorf("leaseSeconds(%v) = %d, want %d", c.ttl, got, c.want)
		}
	}
	for _, id := range []int64{1, 0xabc, 1<<62 + 1} {
		if got := leaseIDOf(leaseName(id)); got != id {
			t.Errorf("leaseIDOf(leaseName(%x)) = %x", id, got)
		}
		if got := leaseIDOf(leaseHex(id)); got != id {
			t.Errorf("leaseIDOf(leaseHex(%x)) = %x", id, got)
		}
	}
	for _, bad := range []string{"", "aether-lease-", "aether-lease-zz", "other"} {
		if got := leaseIDOf(bad); got != 0 {
			t.Errorf("leaseIDOf(%q) = %x, want 0", bad, got)
		}
	}
}
