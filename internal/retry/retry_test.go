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
