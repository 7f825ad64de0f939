package console

import (
	"testing"
	"time"
)

// TestRateWindow: events land in their second, the window ends at now,
// and a bucket reused after RateWindow seconds starts from zero.
func TestRateWindow(t *testing.T) {
	r := newRate()
	t0 := time.Unix(1_000_000, 0)
	r.add(t0, 3, "e:3")
	r.add(t0.Add(500*time.Millisecond), 2, "e:5")
	r.add(t0.Add(2*time.Second), 1, "e:6")
	s := r.summary(t0.Add(2 * time.Second))
	if s.Total != 6 || s.Version != "e:6" || len(s.PerSecond) != RateWindow {
		t.Fatalf("summary %+v", s)
	}
	if got := s.PerSecond[RateWindow-3:]; got[0] != 5 || got[1] != 0 || got[2] != 1 {
		t.Fatalf("last three seconds %v, want [5 0 1]", got)
	}
	// RateWindow seconds on, t0's bucket holds the new second only.
	later := t0.Add(RateWindow * time.Second)
	r.add(later, 4, "e:10")
	s = r.summary(later)
	if s.PerSecond[RateWindow-1] != 4 {
		t.Fatalf("reused bucket: %d, want 4", s.PerSecond[RateWindow-1])
	}
	// The window is now t0+1s .. t0+300s: t0+2s is its second entry,
	// t0 itself has left it.
	for i, v := range s.PerSecond[:RateWindow-1] {
		want := 0
		if i == 1 {
			want = 1
		}
		if v != want {
			t.Fatalf("entry %d of the window: %d, want %d", i, v, want)
		}
	}
}
