package kubernetes

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/internal/testutil/kubeapi"
	"github.com/aethermesh/aether/internal/testutil/wait"
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

// throttlingProxy forwards to the API server (authenticating as the
// admin, so its clients need no credentials), and answers the next
// refuse requests of the kind it is told to with 429 Too Many Requests
// and Retry-After, as API priority and fairness does when a priority
// level's queues are full.
type throttlingProxy struct {
	proxy      *httputil.ReverseProxy
	match      func(*http.Request) bool
	refuse     atomic.Int64
	retryAfter atomic.Value // string

	mu       sync.Mutex
	refused  []time.Time // when each 429 was sent
	arrivals []arrival
}

type arrival struct {
	at   time.Time
	what string
}

func (p *throttlingProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	what := r.Method + " " + r.URL.Path
	p.mu.Lock()
	p.arrivals = append(p.arrivals, arrival{time.Now(), what})
	p.mu.Unlock()
	if p.match(r) && p.refuse.Add(-1) >= 0 {
		w.Header().Set("Retry-After", p.retryAfter.Load().(string))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(w).Encode(metav1.Status{
			TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status:   metav1.StatusFailure, Code: http.StatusTooManyRequests, Reason: metav1.StatusReasonTooManyRequests,
			Message: "too many requests, please try again later (the test's proxy)",
		})
		p.mu.Lock()
		p.refused = append(p.refused, time.Now())
		p.mu.Unlock()
		return
	}
	p.proxy.ServeHTTP(w, r)
}

func (p *throttlingProxy) arrivalsOf(what string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Time
	for _, a := range p.arrivals {
		if strings.Contains(a.what, what) {
			out = append(out, a.at)
		}
	}
	return out
}

func (p *throttlingProxy) refusals() []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Time(nil), p.refused...)
}

// TestRetryAfter: a 429 with Retry-After from in front of the real API
// server is retried by client-go after the Retry-After; refused with one
// request in flight, the client holds back every other request for as
// long (the pacer), not only the one refused; a client still refused
// after client-go's 10 retries fails with backend.ErrUnavailable, a
// failure of the moment.
func TestRetryAfter(t *testing.T) {
	api := kubeapi.Start(t)
	admin := api.Config()
	rt, err := rest.TransportFor(admin)
	if err != nil {
		t.Fatal(err)
	}
	target, err := url.Parse(admin.Host)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = rt
	px := &throttlingProxy{
		proxy: rp,
		match: func(r *http.Request) bool {
			return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/leases")
		},
	}
	px.retryAfter.Store("1")
	front := httptest.NewServer(px)
	t.Cleanup(front.Close)
	ns := testNamespace(t, admin)
	newLiveStore(t, admin, ns) // the CRDs, past the proxy
	// One request in flight at a time: a 429 then holds the whole client.
	ctx := ctxT(t)
	s, err := New(ctx, Config{RESTConfig: &rest.Config{Host: front.URL}, Namespace: ns, Region: "r1", Cluster: "c1", MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	other, err := s.GrantLease(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	// Two refusals of the grant, 1 s each; a read of another lease sent
	// while the grant waits is held back with it.
	px.refuse.Store(2)
	start := time.Now()
	var (
		id       int64
		grantErr error
		done     = make(chan struct{})
	)
	go func() { defer close(done); id, grantErr = s.GrantLease(ctx, time.Minute) }()
	wait.For(t, "the first 429", 10*time.Second, func() bool { return len(px.refusals()) >= 1 })
	readSent := time.Now()
	if _, _, err := s.LeaseTTL(ctx, other); err != nil {
		t.Fatalf("LeaseTTL while throttled: %v", err)
	}
	<-done
	took := time.Since(start)
	if grantErr != nil || id == 0 {
		t.Fatalf("GrantLease through two 429s: %x, %v", id, grantErr)
	}
	refused := px.refusals()
	if len(refused) != 2 || took < 2*time.Second {
		t.Fatalf("GrantLease took %v with %d refusals; want two, honoured for 1 s each", took, len(refused))
	}
	// The read reached the API server only once the Retry-After of the
	// refusal before it had passed (a little less: the client dates the
	// Retry-After from the response's arrival, after the proxy sent it).
	var readAt time.Time
	for _, at := range px.arrivalsOf("GET /apis/coordination.k8s.io/v1/namespaces/" + ns + "/leases/" + leaseName(other)) {
		if at.After(readSent) {
			readAt = at
			break
		}
	}
	if readAt.IsZero() || readAt.Sub(refused[0]) < 950*time.Millisecond {
		t.Fatalf("the read sent %v after the first 429 reached the server %v after it; want it held for the 1 s Retry-After",
			readSent.Sub(refused[0]), readAt.Sub(refused[0]))
	}
	if n, waited := s.pacer.Throttled(); n != 2 || waited < time.Second {
		t.Fatalf("pacer counted %d 429s and %v held back; want 2 and at least 1 s", n, waited)
	}
	t.Logf("grant through two 429s (Retry-After: 1) took %v; a read sent %v after the first 429 reached the server %v after it",
		took.Round(time.Millisecond), readSent.Sub(refused[0]).Round(time.Millisecond), readAt.Sub(refused[0]).Round(time.Millisecond))

	// Refused for good: client-go gives up after its 10 retries (11
	// attempts), and the error is a failure of the moment.
	px.retryAfter.Store("0")
	px.refuse.Store(1000)
	before := len(px.arrivalsOf("POST"))
	_, err = s.GrantLease(ctx, time.Minute)
	attempts := len(px.arrivalsOf("POST")) - before
	if !errors.Is(err, backend.ErrUnavailable) || !apierrors.IsTooManyRequests(err) {
		t.Fatalf("GrantLease refused for good: %v, want a 429 marked ErrUnavailable", err)
	}
	if attempts != 11 {
		t.Fatalf("client-go made %d attempts, want 11 (1 + its 10 retries)", attempts)
	}
	px.refuse.Store(0)
}
