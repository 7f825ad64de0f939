package dynalite

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// The shield's point: a client that goes away in the middle of its
// request does not bring dynalite down (unshielded, dynalite 4.0.0 on
// Node 20 rethrows the abort and exits; pointed at dynalite's own port,
// this test fails). Requests cut mid-body, then one answered.
func TestAbortedRequestsLeaveDynaliteUp(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	target := strings.TrimPrefix(s.Endpoint, "http://")
	for range 5 {
		c, err := net.Dial("tcp", target)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/x-amz-json-1.0\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Length: 100\r\n\r\n{\"Lim", target)
		// The server must have begun the request before the cut, and
		// nothing it sends shows that (it answers only a whole request):
		// a pause, not a condition. A cut at once is dropped before
		// dynalite sees a request, and proves nothing.
		time.Sleep(20 * time.Millisecond)
		c.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, s.Endpoint, bytes.NewReader([]byte(`{}`)))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", "application/x-amz-json-1.0")
	r.Header.Set("X-Amz-Target", "DynamoDB_20120810.ListTables")
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatalf("a request after 5 cut ones: %v (dynalite output: %s)", err, s.Output())
	}
	resp.Body.Close()
	select {
	case <-s.Done():
		t.Fatalf("dynalite exited: %s", s.Output())
	default:
	}
}
