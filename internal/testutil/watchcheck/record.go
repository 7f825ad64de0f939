// Package watchcheck records what registrar watch streams delivered and
// checks it against an authoritative history of the registrar's changes.
//
// The history is one registrar epoch's event sequence, taken from an
// unfiltered "reference" stream opened before the writes of interest (see
// HistoryFrom). The reference is not trusted blindly: History.Validate
// checks that its sequence is gap-free and replays consistently, that every
// acknowledged write appears at the version its response named, and that the
// replayed final state equals the registrar's own listing. Check then judges
// every other recorded stream against it; see Check for the properties.
// Subscribe streams, whose filter changes while they live, are recorded with
// Subscribe and judged by Check as well.
//
// CheckEpochs extends Check across registrar restarts (one history per
// epoch, and the state at each epoch switch checked against the previous
// epoch's end), and CheckView judges a view derived from the streams, such
// as the client library's cache or a peer region's registrar, per endpoint
// against the histories.
package watchcheck

import (
	"context"
	"fmt"
	"sync"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/registry"
)

// Recorder keeps every message one watch stream received, in order, together
// with what the stream asked for (its service filter and resume token), so
// that Check can tell what it should have received.
type Recorder struct {
	// Name identifies the stream in violations.
	Name string
	// Services is the stream's filter; empty means all services.
	Services []string
	// LastVersion is the resume token the stream was opened with; empty
	// for a fresh stream.
	LastVersion string
	// ExpectResume says the token is known to be inside the registrar's
	// retention window, so the stream must resume (missed events then
	// PROGRESS) rather than start over with a FULL_SNAPSHOT.
	ExpectResume bool

	mu      sync.Mutex
	msgs    []*registrarv1.EndpointEvent
	updates []Update // Subscribe streams: service changes the client sent
	err     error
	done    bool
	cancel  context.CancelFunc
	send    func(*registrarv1.SubscribeRequest) error // Subscribe streams opened by Subscribe
}

// NewRecorder makes a recorder for a stream opened with req. Feed it with
// Record and End, or use Watch, which does both.
func NewRecorder(name string, req *registrarv1.WatchEndpointsRequest) *Recorder {
	return &Recorder{
		Name:        name,
		Services:    append([]string(nil), req.GetServices()...),
		LastVersion: req.GetLastVersion(),
	}
}

// Record appends one received message.
func (r *Recorder) Record(ev *registrarv1.EndpointEvent) {
	r.mu.Lock()
	r.msgs = append(r.msgs, ev)
	r.mu.Unlock()
}

// End records how the stream ended.
func (r *Recorder) End(err error) {
	r.mu.Lock()
	r.err, r.done = err, true
	r.mu.Unlock()
}

// Messages returns a copy of what was received so far.
func (r *Recorder) Messages() []*registrarv1.EndpointEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*registrarv1.EndpointEvent(nil), r.msgs...)
}

// Ended reports whether the stream ended, and with what error.
func (r *Recorder) Ended() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done, r.err
}

// Cancel ends a stream started by Watch.
func (r *Recorder) Cancel() {
	if r.cancel != nil {
		r.cancel()
	}
}

// LastToken is the version of the last message received: the token a client
// resumes with. Empty if nothing was received.
func (r *Recorder) LastToken() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.msgs) == 0 {
		return ""
	}
	return r.msgs[len(r.msgs)-1].GetVersion()
}

// Covered is the highest sequence the stream is known current up to: the
// sequence of its last complete snapshot, change event or bookmark. ok is
// false until the stream's start (snapshot or resume bookmark) is complete.
func (r *Recorder) Covered() (seq uint64, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ev := range r.msgs {
		switch ev.GetType() {
		case registrarv1.EndpointEvent_FULL_SNAPSHOT:
			if !ev.GetSnapshotContinues() {
				ok = true
			}
		case registrarv1.EndpointEvent_PROGRESS:
			ok = true
		}
		if ev.GetSequence() > seq {
			seq = ev.GetSequence()
		}
	}
	return seq, ok
}

// WaitCovered waits until the stream is current up to seq, the stream ends,
// or d passes; it reports whether the stream got there.
func (r *Recorder) WaitCovered(seq uint64, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		if c, ok := r.Covered(); ok && c >= seq {
			return true
		}
		if done, _ := r.Ended(); done || time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Watch opens a WatchEndpoints stream with req and records it until ctx is
// done or the stream ends.
func Watch(ctx context.Context, c registrarv1.RegistrarClient, name string, req *registrarv1.WatchEndpointsRequest) (*Recorder, error) {
	ctx, cancel := context.WithCancel(ctx)
	stream, err := c.WatchEndpoints(ctx, req)
	if err != nil {
		cancel()
		return nil, err
	}
	r := NewRecorder(name, req)
	r.cancel = cancel
	go r.recordFrom(stream)
	return r, nil
}

// recordFrom records what a stream receives until it ends.
func (r *Recorder) recordFrom(stream interface {
	Recv() (*registrarv1.EndpointEvent, error)
}) {
	for {
		ev, err := stream.Recv()
		if err != nil {
			r.End(err)
			return
		}
		r.Record(ev)
	}
}

// ParseVersion splits a version token "<epoch>:<sequence>" with
// registry.ParsePosition, the registrar's own parser, so a check reads tokens
// exactly as the registrar does. Unlike a resume token, a token the checks
// read names a position: the empty token is refused.
func ParseVersion(v string) (epoch string, seq uint64, err error) {
	if v == "" {
		return "", 0, fmt.Errorf("version %q is not <epoch>:<sequence>", v)
	}
	p, err := registry.ParsePosition(v)
	if err != nil {
		return "", 0, err
	}
	return p.Epoch, p.Seq, nil
}
