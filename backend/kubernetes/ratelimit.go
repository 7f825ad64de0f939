package kubernetes

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/rest"
)

// How the backend paces its API calls. The API server protects itself with
// API priority and fairness (APF): requests are classified by FlowSchema
// into priority levels of limited concurrency, and a level that is full
// queues and then rejects with 429 Too Many Requests and a Retry-After.
// A client that answers a 429 by sending more requests only lengthens the
// queue its own priority level shares with every other client of it, so
// the backend:
//
//   - limits its own request rate with client-go's token bucket (QPS and
//     Burst, set here deliberately: client-go's defaults, 5 and 10, would
//     stretch a write-behind flush of 1,000 endpoints over 200 s, and an
//     unbounded client is what APF exists to contain);
//   - bounds its requests in flight (MaxInFlight): each occupies a seat of
//     its priority level until its response body is read, and a flush's
//     burst of parallel writes should not take every seat the level has;
//     watches are long-running (APF seats one only while it starts) and
//     are not counted;
//   - answers a 429 by lowering its bound on requests in flight (pacer,
//     below), and by holding back the whole client for the Retry-After
//     when one request at a time was already too many. client-go itself
//     (rest.Request, with_retry.go)
//     retries a request that got 429 or a 5xx with a Retry-After header,
//     up to 10 times (Request.maxRetries), sleeping the Retry-After before
//     each retry and passing its rate limiter again (and then the pacer);
//     it does not retry a 429 without Retry-After, nor tell other requests.
//     What still fails after client-go's retries reaches the backend as a
//     429 StatusError, which the backend reports as backend.ErrUnavailable
//     (a failure of the moment the caller retries later).
const (
	// DefaultQPS and DefaultBurst are the client's token bucket when the
	// rest.Config sets none: the throughput cap. A write takes the API
	// server a few milliseconds, so 200 writes/s keep about one seat of
	// a priority level busy on average, and MaxInFlight (DefaultMaxInFlight,
	// 16) bounds the seats a burst takes. A default API server has 600
	// seats: a registrar's service account falls (FlowSchema
	// service-accounts) in workload-low, about 245 of them, a kubeconfig
	// user in global-default, about 49. client-go's own defaults (5/10)
	// would stretch a flush of 1,000 endpoints over 200 s.
	DefaultQPS   = 200
	DefaultBurst = 400
	// noRetryAfterWait is how long the client holds back after a 429
	// that names no Retry-After (APF always sends one; a proxy may not).
	noRetryAfterWait = time.Second
)

// pacer is the client-wide pacing of the backend's API calls (above) and
// its estimate of the API server's clock (serverClock), both fed by the
// one transport every client of the Store shares.
//
// Its bound on requests in flight adapts, as TCP's window does: a 429
// says one request more was in flight than the priority level would take,
// so the first 429 of a second halves the bound and each further one
// takes one off; answers raise it again by about one per round of answers
// in flight, but only once a second has passed without a 429, so that it
// settles just under what the level takes instead of overshooting every
// few milliseconds. The request refused waits its Retry-After (client-go
// sleeps it before its retry); the whole client waits it only when even
// one request at a time was refused (the bound at 1: the level is full of
// others' requests), and then no request starts before it. Holding every
// request on any 429 was measured here and rejected: with the bound
// above the level's seats, one request in the next few milliseconds is
// refused again, and the client spends every second but a few
// milliseconds waiting (TestPriorityAndFairness429: a priority level of
// two or three seats served about 3 calls a second that way).
type pacer struct {
	max   int
	clock *serverClock

	mu        sync.Mutex
	limit     float64   // requests allowed in flight now, 1..max
	inflight  int       // requests in flight
	lastCut   time.Time // when a 429 last cut the limit by half
	notBefore time.Time // no request starts before it (a Retry-After at limit 1)
	wake      chan struct{}

	throttled atomic.Int64 // 429 responses seen
	waited    atomic.Int64 // nanoseconds the whole client held back on Retry-After
}

// cutCooldown is how long after a 429 the limit stays where the 429 put it.
const cutCooldown = time.Second

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func newPacer(maxInFlight int) *pacer {
	if maxInFlight <= 0 {
		maxInFlight = DefaultMaxInFlight
	}
	return &pacer{max: maxInFlight, limit: float64(maxInFlight), clock: newServerClock(), wake: make(chan struct{})}
}

// configure returns a copy of cfg whose clients are paced by p: QPS and
// Burst set where cfg leaves them zero, a user agent naming Aether (it
// shows in the API server's audit log and APF's debug endpoints), and p's
// transport under client-go's.
func (p *pacer) configure(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	if cfg.QPS == 0 && cfg.RateLimiter == nil {
		cfg.QPS, cfg.Burst = DefaultQPS, DefaultBurst
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "aether-registrar (" + rest.DefaultKubernetesUserAgent() + ")"
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &pacedTransport{p: p, next: rt} })
	return cfg
}

// Throttled is how many 429 responses the API server has sent this
// client, and for how long in all it held back on their Retry-After.
func (p *pacer) Throttled() (n int64, waited time.Duration) {
	return p.throttled.Load(), time.Duration(p.waited.Load())
}

// hold waits until a request may start: any Retry-After has passed and
// fewer than the limit are in flight.
func (p *pacer) hold(ctx context.Context) error {
	for {
		p.mu.Lock()
		wait := time.Until(p.notBefore)
		if wait <= 0 && float64(p.inflight) < p.limit {
			p.inflight++
			p.mu.Unlock()
			return nil
		}
		wake := p.wake
		p.mu.Unlock()
		if wait <= 0 {
			select {
			case <-wake:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-wake:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		t.Stop()
	}
}

// done ends a request that hold let start, with its status (0: no
// response).
func (p *pacer) done(resp *http.Response, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight--
	if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
		p.backOffLocked(resp, now)
	} else if resp != nil && now.Sub(p.lastCut) >= cutCooldown {
		p.limit = min(float64(p.max), p.limit+1/p.limit)
	}
	close(p.wake)
	p.wake = make(chan struct{})
}

// backOff records a 429 of a request hold did not count (a watch).
func (p *pacer) backOff(resp *http.Response, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.backOffLocked(resp, now)
	close(p.wake)
	p.wake = make(chan struct{})
}

// backOffLocked lowers the limit for a 429, and holds the whole client
// for its Retry-After when the limit was 1 already.
func (p *pacer) backOffLocked(resp *http.Response, now time.Time) {
	p.throttled.Add(1)
	wait := noRetryAfterWait
	if s, err := strconv.Atoi(strings.TrimSpace(resp.Header.Get("Retry-After"))); err == nil && s >= 0 {
		wait = time.Duration(s) * time.Second
	}
	atOne := p.limit <= 1
	if now.Sub(p.lastCut) >= cutCooldown {
		p.limit = max(1, p.limit/2)
		p.lastCut = now
	} else {
		p.limit = max(1, p.limit-1)
	}
	if !atOne {
		return
	}
	if until := now.Add(wait); until.After(p.notBefore) {
		p.waited.Add(int64(until.Sub(maxTime(now, p.notBefore))))
		p.notBefore = until
	}
}

type pacedTransport struct {
	p    *pacer
	next http.RoundTripper
}

func (t *pacedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	long := longRunning(req)
	if !long {
		if err := t.p.hold(req.Context()); err != nil {
			return nil, err
		}
	}
	sent := time.Now()
	resp, err := t.next.RoundTrip(req)
	recv := time.Now()
	if err != nil {
		if !long {
			t.p.done(nil, recv)
		}
		return nil, err
	}
	t.p.clock.observe(sent, recv, resp.Header.Get("Date"))
	switch {
	case long && resp.StatusCode == http.StatusTooManyRequests:
		t.p.backOff(resp, recv)
	case !long:
		// The seat is the server's until the body has been read: the
		// request is done when the caller closes the body (client-go
		// always does) or reads it to the end.
		resp.Body = &releasingBody{ReadCloser: resp.Body, release: func() { t.p.done(resp, recv) }}
	}
	return resp, nil
}

// longRunning reports a request that holds its connection open (a watch),
// which APF does not seat and which must not hold a slot.
func longRunning(req *http.Request) bool {
	q := req.URL.Query()
	return q.Get("watch") == "true" || q.Get("watch") == "1" || strings.Contains(req.URL.Path, "/watch/")
}

type releasingBody struct {
	io.ReadCloser
	once    sync.Once
	release func()
}

func (b *releasingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.once.Do(b.release)
	}
	return n, err
}

func (b *releasingBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.release)
	return err
}

// serverClock estimates the API server's clock from the Date headers of
// its responses, so that lease expiry is judged on the server's time and
// not on a replica's own, possibly skewed, wall clock. A response whose
// Date is D (whole seconds) and which was sent at local s and received at
// local r says the server's clock read between D and D+1s at some moment
// in [s, r]: server = local + offset with offset in (D-r, D+1s-s). The
// clock intersects these intervals over its samples, so the bounds narrow
// to about a round trip as samples fall at different phases of the
// server's second. Local times are monotonic (time.Since of a base), so a
// step of the replica's wall clock changes nothing; a step of the
// server's clock, or drift, makes a sample disagree with the bounds, and
// the clock starts over from it.
type serverClock struct {
	base time.Time // local, with its monotonic reading

	mu     sync.Mutex
	have   bool
	lo, hi time.Duration // server unix time (since the epoch) minus local time since base
}

func newServerClock() *serverClock { return &serverClock{base: time.Now()} }

func (c *serverClock) observe(sent, recv time.Time, date string) {
	if date == "" {
		return
	}
	d, err := http.ParseTime(date)
	if err != nil {
		return
	}
	srv := time.Duration(d.UnixNano())
	lo := srv - recv.Sub(c.base)
	hi := srv + time.Second - sent.Sub(c.base)
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.have || lo > c.hi || hi < c.lo {
		c.lo, c.hi, c.have = lo, hi, true
		return
	}
	c.lo, c.hi = max(c.lo, lo), min(c.hi, hi)
}

// now returns bounds of the API server's current time: earliest and
// latest it can be. Before any response it is the local clock.
func (c *serverClock) now() (earliest, latest time.Time) {
	el := time.Since(c.base)
	c.mu.Lock()
	lo, hi, have := c.lo, c.hi, c.have
	c.mu.Unlock()
	if !have {
		n := time.Now()
		return n, n
	}
	return time.Unix(0, int64(lo+el)), time.Unix(0, int64(hi+el))
}
