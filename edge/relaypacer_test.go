package edge

import (
	"testing"
	"time"
)

// The wait before a probe that would release relayed changes doubles while
// answers release nothing, up to relayProbeMax, and drops to nothing once
// a relayed change had to be sent.
func TestRelayPacer(t *testing.T) {
	var p relayPacer
	t0 := time.Unix(1000, 0)
	if d := p.due(t0); d > 0 {
		t.Fatalf("first probe waits %v, want none", d)
	}
	now := t0
	want := relayProbeMin
	for range 10 {
		p.probed(now)
		if d := p.due(now); d != want {
			t.Fatalf("after a probe that released nothing: wait %v, want %v", d, want)
		}
		if d := p.due(now.Add(want - time.Millisecond)); d != time.Millisecond {
			t.Fatalf("1 ms before the wait ends: due in %v", d)
		}
		now = now.Add(want)
		if d := p.due(now); d > 0 {
			t.Fatalf("at the end of the wait: due in %v", d)
		}
		want = min(2*want, relayProbeMax)
	}
	if p.wait != relayProbeMax {
		t.Fatalf("wait %v after 10 idle probes, want the cap %v", p.wait, relayProbeMax)
	}
	p.probed(now)
	// The peer lacked a relayed change: the next probe goes at once, and
	// the one after it too while relaying is needed.
	p.took(0)
	if d := p.due(now); d <= 0 {
		t.Fatal("a take without relayed changes ended the wait")
	}
	p.took(3)
	if d := p.due(now); d > 0 {
		t.Fatalf("after relaying, the next probe waits %v, want none", d)
	}
	p.probed(now)
	p.took(1)
	if d := p.due(now); d > 0 {
		t.Fatalf("still relaying: the probe waits %v, want none", d)
	}
	p.probed(now)
	// Relaying stopped: the next answer released nothing, and it backs off
	// from the start again.
	p.probed(now)
	if d := p.due(now); d != relayProbeMin {
		t.Fatalf("relaying over: wait %v, want %v", d, relayProbeMin)
	}
}
