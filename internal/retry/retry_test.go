package retry

import (
	"context"
	"testing"
	"time"
)

func TestSleepEndsWithItsContextOrWake(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond, nil) {
		t.Error("a delay that passed reported as cut short")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if Sleep(ctx, time.Hour, nil) {
		t.Error("an ended context reported as a full delay")
	}
	wake := make(chan struct{}, 1)
	wake <- struct{}{}
	if Sleep(context.Background(), time.Hour, wake) {
		t.Error("a wake reported as a full delay")
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("cut-short sleeps took %v", d)
	}
}

func TestBackoffDelayWithinBounds(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	for attempt, ceil := range map[int]time.Duration{0: 100 * time.Millisecond, 3: 800 * time.Millisecond, 10: 5 * time.Second} {
		for range 500 {
			if d := b.Delay(attempt); d < 0 || d >= ceil {
				t.Fatalf("attempt %d: %v outside [0, %v)", attempt, d, ceil)
			}
		}
	}
	if d := (Backoff{}).Delay(3); d != 0 {
		t.Errorf("zero Backoff waits %v", d)
	}
}

func TestCeilingDoublesUpToMax(t *testing.T) {
	b := Backoff{Base: 50 * time.Millisecond, Max: 2 * time.Second}
	want := []time.Duration{50, 100, 200, 400, 800, 1600, 2000, 2000}
	for attempt, w := range want {
		if d := b.Ceiling(attempt); d != w*time.Millisecond {
			t.Errorf("Ceiling(%d) = %v, want %v", attempt, d, w*time.Millisecond)
		}
	}
	if d := b.Ceiling(1000); d != 2*time.Second {
		t.Errorf("Ceiling(1000) = %v, want the cap", d)
	}
	if d := (Backoff{}).Ceiling(3); d != 0 {
		t.Errorf("zero Backoff waits %v", d)
	}
}

func TestSpreadStaysWithinItsFraction(t *testing.T) {
	d := time.Second
	lowest := Spread(d, 20, func(int64) int64 { return 0 })
	highest := Spread(d, 20, func(n int64) int64 { return n - 1 })
	if lowest != 800*time.Millisecond || highest != 1200*time.Millisecond {
		t.Errorf("Spread(1s, 20%%) spans [%v, %v], want [800ms, 1.2s]", lowest, highest)
	}
	if got := Spread(d, 0, func(n int64) int64 { return n - 1 }); got != d {
		t.Errorf("Spread(1s, 0%%) = %v, want 1s", got)
	}
	if got := Spread(0, 20, func(n int64) int64 { return n - 1 }); got != 0 {
		t.Errorf("Spread(0) = %v, want 0", got)
	}
	b := Backoff{Base: 100 * time.Millisecond, Max: 2 * time.Second}
	for attempt, ceil := range map[int]time.Duration{0: 100 * time.Millisecond, 2: 400 * time.Millisecond, 9: 2 * time.Second} {
		for range 500 {
			if got := b.Spread(attempt, 20); got < ceil*8/10 || got > ceil*12/10 {
				t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, got, ceil*8/10, ceil*12/10)
			}
		}
	}
}
