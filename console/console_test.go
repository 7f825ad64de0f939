package console_test

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testutil/regtest"
)

// TestSubscriptionOnlyWhilePagesAreOpen: the console's subscription to
// the replica is a watch stream like an agent's, so it is held only while
// a page (an event stream) is open: none before, one while two pages
// are open, none after they close.
func TestSubscriptionOnlyWhilePagesAreOpen(t *testing.T) {
	srv := plane(t)
	base := "http://" + srv.HTTPAddr()
	streams := func() float64 { return regtest.MetricValue(t, srv.HTTPAddr(), "registrar_connected_agents") }
	if n := streams(); n != 0 {
		t.Fatalf("no page open: %v watch streams, want 0", n)
	}
	open := func() (context.CancelFunc, *bufio.Reader) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/ui/api/events", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("events: Content-Type %q", ct)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return cancel, bufio.NewReader(resp.Body)
	}
	close1, r1 := open()
	close2, _ := open()
	waitFor(t, "one subscription for two pages", 5*time.Second, func() bool { return streams() == 1 })

	// The stream says "change" when the replica's stream delivers.
	aether(t, "register", "--registrar="+srv.GRPCAddr(), "--service", "web", "--ip", "10.0.9.9", "--port", "8080")
	deadline := time.Now().Add(5 * time.Second)
	changes := 0
	for changes < 2 && time.Now().Before(deadline) { // one at the start, one for the write
		line, err := r1.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(line) == "event: change" {
			changes++
		}
	}
	if changes < 2 {
		t.Fatalf("saw %d change events, want the initial one and one for the write", changes)
	}

	close1()
	close2()
	waitFor(t, "no subscription once the pages closed", 5*time.Second, func() bool { return streams() == 0 })
}
