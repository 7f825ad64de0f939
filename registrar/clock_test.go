package registrar

import (
	"context"
	"sync"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend/memory"
	"github.com/aethermesh/aether/internal/testutil/wait"
)

// fakeClock is a Clock that moves only when the test says so.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c      chan time.Time
	at     time.Time
	period time.Duration // 0: a one-shot timer
	live   bool
	clk    *fakeClock
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) add(d, period time.Duration) *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: make(chan time.Time, 1), at: c.now.Add(d), period: period, live: true, clk: c}
	c.timers = append(c.timers, t)
	c.fireLocked()
	return t
}

func (c *fakeClock) NewTimer(d time.Duration) Timer   { return c.add(d, 0) }
func (c *fakeClock) NewTicker(d time.Duration) Ticker { return fakeTicker{c.add(d, d)} }

type fakeTicker struct{ t *fakeTimer }

func (t fakeTicker) C() <-chan time.Time { return t.t.c }
func (t fakeTicker) Stop()               { t.t.Stop() }

// Advance moves the clock on by d and fires what is due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fireLocked()
}

func (c *fakeClock) fireLocked() {
	for _, t := range c.timers {
		for t.live && !t.at.After(c.now) {
			select {
			case t.c <- t.at:
			default: // as a real ticker, drop a tick nobody took
			}
			if t.period == 0 {
				t.live = false
				break
			}
			t.at = t.at.Add(t.period)
		}
	}
}

// oneShots counts the live one-shot timers: what a loop waits on.
func (c *fakeClock) oneShots() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if t.live && t.period == 0 {
			n++
		}
	}
	return n
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.clk.mu.Lock()
	defer t.clk.mu.Unlock()
	was := t.live
	t.live = false
	return was
}

// The flusher runs on the injected clock and does what core.PlanFlush
// says: a write into a quiet queue is flushed at once; one that arrives
// within --write-batch-interval of that flush waits, on a timer of the
// clock, for the interval to end, and not a moment longer. No real time
// passes in between: the clock moves only when the test moves it.
func TestFlusherRunsOnTheInjectedClock(t *testing.T) {
	clk := &fakeClock{now: t0}
	store := memory.New(memory.Options{})
	r, err := New(Options{ClusterName: "c", Region: "r", WriteBatchInterval: 50 * time.Millisecond, Logger: quietLog()}, store)
	if err != nil {
		t.Fatal(err)
	}
	r.clock, r.now = clk, clk.Now
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	persisted := func() bool { return r.PendingWrites() == 0 }

	if _, _, err := r.Register(mkEP(t, "web", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the first write flushed on the leading edge", 10*time.Second, persisted)

	if _, _, err := r.Register(mkEP(t, "web", "10.0.0.2")); err != nil {
		t.Fatal(err)
	}
	wait.For(t, "the flusher waiting on a timer of the clock", 10*time.Second, func() bool { return clk.oneShots() == 1 })
	clk.Advance(49 * time.Millisecond)
	// Only the timer or a kick wakes the flusher, and neither came.
	if n := r.PendingWrites(); n != 1 {
		t.Fatalf("%d writes pending 49ms into the interval, want 1 (the second waits for its end)", n)
	}
	clk.Advance(time.Millisecond)
	wait.For(t, "the second write flushed at the interval's end", 10*time.Second, persisted)
	l, err := store.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Endpoints) != 2 {
		t.Fatalf("the store holds %d endpoints, want 2", len(l.Endpoints))
	}
	for _, ep := range l.Endpoints {
		if ep.GetState() != registryv1.State_STATE_SERVING {
			t.Fatalf("stored %v", ep)
		}
	}
}
