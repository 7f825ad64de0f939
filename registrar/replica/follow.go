package replica

import (
	"context"
	"log/slog"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/internal/retry"
)

// Subscriber is a replica's Subscribe: *registrar.Registrar has it, and a
// front end names it over this package's types (see the package doc).
type Subscriber interface {
	Subscribe(services []string, fromVersion string) (*Subscription, error)
}

// Follower is what Follow hands a replica's view to: a front end that
// keeps a copy of it (an xDS feed, the EndpointSlice reconciler).
type Follower struct {
	// Name starts the follower's log lines ("xds feed").
	Name string
	Log  *slog.Logger
	// Backoff spaces the subscribe attempts after a refusal.
	Backoff retry.Backoff
	// Start applies a subscription's start: a resumed start's missed
	// events on top of what the follower holds, else a snapshot that
	// replaces it. A chunked FULL_SNAPSHOT half read from the subscription
	// before belongs to a cut one: Start is where to forget it.
	Start func(Start)
	// Batch applies a batch of Next's, in order.
	Batch func([]*registrarv1.EndpointEvent)
}

// Follow follows src's view of services (all when empty) until ctx ends:
// subscribe, apply the start and every batch, and on a cut subscribe again
// from the version of the last event applied, so that a resumable cut
// costs the events missed rather than a snapshot. Refusals (ErrNotReady
// before the replica has loaded, ErrShuttingDown as it stops) are retried
// after f.Backoff's ceiling: one follower of one replica has no crowd of
// retries to spread. Start and Batch run on the caller's goroutine.
func Follow(ctx context.Context, src Subscriber, services []string, f Follower) {
	last := ""
	for attempt := 0; ctx.Err() == nil; {
		sub, err := src.Subscribe(services, last)
		if err != nil {
			f.Log.Debug(f.Name+": subscribe failed, retrying", "err", err, "attempt", attempt)
			retry.Sleep(ctx, f.Backoff.Ceiling(attempt), nil)
			attempt++
			continue
		}
		attempt = 0
		start := sub.TakeStart()
		f.Start(start)
		last = start.At.String()
		for {
			batch, err := sub.Next(ctx)
			if err != nil {
				if ctx.Err() == nil {
					f.Log.Info(f.Name+": subscription cut, resuming", "err", err, "from", last)
				}
				break
			}
			f.Batch(batch)
			// A batch's events carry versions in order; one without a
			// version (a snapshot chunk) leaves the resume point where it was.
			for _, ev := range batch {
				if ev.GetVersion() != "" {
					last = ev.GetVersion()
				}
			}
		}
		sub.Close()
	}
}
