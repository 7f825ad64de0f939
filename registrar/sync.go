package registrar

import (
	"context"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registrar/internal/core"
)

// maxWatchCoalesce bounds how many queued watch batches are folded into one
// snapshot update.
const maxWatchCoalesce = 256

// listingStep is about how many endpoints one step of a listing's
// application looks at while holding the lock (a few milliseconds' work).
const listingStep = 2048

// runSync keeps the snapshot in step with the backend. Watch batches are
// applied as they arrive: whatever queued up while the previous one was
// applied is folded into one update and one broadcast, so a burst coalesces
// without a fixed delay on every change (a delay would put a floor under
// cross-replica latency). A full re-list runs every SyncInterval as a
// backstop: read in the background while the watch goes on, and applied a
// few services at a time with watch batches let in between
// (core.ListingApply), so a large registry's listing never holds other
// replicas' writes back. When the watch cannot resume (compaction) the
// re-list runs in the foreground; foreground re-lists are spaced at least
// SyncDebounce apart (core.RelistWait). With SyncMode SyncPoll, which New
// picks for a store without a change feed, no watch is opened at all: the
// re-list every SyncInterval is the only way other replicas' writes
// arrive.
func (r *Registrar) runSync(ctx context.Context, rev int64) {
	pollTicker := r.clock.NewTicker(r.opts.SyncInterval)
	defer pollTicker.Stop()
	poll := pollTicker.C()

	// step applies one step of a listing (a node record the listing no
	// longer has asks for a sweep, as a watch's deletion would).
	step := func(a *core.ListingApply) (done bool) {
		r.mu.Lock()
		eff, done := r.st.StepListing(a, listingStep)
		r.act(eff)
		r.mu.Unlock()
		return done
	}
	// begin starts applying a listing; false if it is to be ignored.
	// started is when its read began (peer-watch's provisional writes
	// applied long enough before it are judged by it).
	begin := func(l backend.Listing, scope listingScope, started time.Time) *core.ListingApply {
		a := core.NewListingApply(l)
		a.Scope = scope
		a.Started = started
		r.mu.Lock()
		ok := r.st.BeginListing(a)
		if !ok {
			r.st.Untrack()
		}
		r.mu.Unlock()
		if !ok {
			return nil
		}
		return a
	}
	var lastList time.Time
	// relist lists and applies in the foreground, with no watch running:
	// every value after the watch lost its position, only changed ones
	// (backstopList) for a poll.
	relist := func(list func(context.Context) (backend.Listing, listingScope, error)) (int64, bool) {
		if wait := core.RelistWait(r.clock.Now(), lastList, r.opts.SyncDebounce); wait > 0 {
			if !retry.Sleep(ctx, wait, nil) {
				return 0, false
			}
		}
		lastList = r.clock.Now()
		started := lastList
		l, scope, err := list(ctx)
		if err != nil {
			if !isClosed(ctx, err) {
				r.log.Warn("backend listing failed; serving the current snapshot", "err", err)
			}
			return 0, false
		}
		if a := begin(l, scope, started); a != nil {
			for !step(a) {
			}
		}
		return l.Revision, true
	}
	if r.opts.SyncMode == SyncPoll || r.watcher == nil {
		for {
			select {
			case <-ctx.Done():
				return
			case <-poll:
				relist(r.backstopList)
			}
		}
	}

	watch, wcancel := r.watchFrom(ctx, rev)
	defer func() { wcancel() }()
	// applying is the backstop listing being applied, step by step.
	var applying *core.ListingApply
	// foreground counts foreground re-lists. A backstop listing read
	// across one is dropped: the foreground listing ended the tracking
	// that would keep it exact against the new watch's changes.
	foreground := 0
	// onWatch applies a watch batch and whatever queued behind it. It
	// returns false when the watch lost its position and a foreground
	// re-list and a new watch could not be set up before ctx ended.
	onWatch := func(b backend.WatchBatch, ok bool) bool {
		if ctx.Err() != nil {
			return false
		}
		if !ok || b.Compacted {
			// The watch cannot resume where it was: re-list until that
			// works, then watch from the listing.
			r.log.Info("backend watch lost its position; re-listing", "compacted", b.Compacted)
			wcancel()
			// The foreground listing supersedes a backstop one being
			// applied or read, and ends the tracking that kept it exact.
			applying = nil
			foreground++
			var rev int64
			for {
				var ok bool
				if rev, ok = relist(r.listAll); ok || ctx.Err() != nil {
					break
				}
			}
			if ctx.Err() != nil {
				return false
			}
			watch, wcancel = r.watchFrom(ctx, rev)
			return true
		}
		batches := []backend.WatchBatch{b}
	drain:
		for len(batches) < maxWatchCoalesce {
			select {
			case nb, ok := <-watch:
				if !ok || nb.Compacted {
					// Leave the loss of position to the next turn.
					break drain
				}
				batches = append(batches, nb)
			default:
				break drain
			}
		}
		r.mu.Lock()
		r.act(r.st.ApplyWatch(batches...))
		r.mu.Unlock()
		return true
	}

	// The backstop listing: at most one out at a time, its result arriving
	// on listed, then applied step by step (applying).
	type listResult struct {
		l          backend.Listing
		scope      listingScope
		err        error
		foreground int       // foreground re-lists before it was read
		started    time.Time // when its read began
	}
	var listed chan listResult // nil while none is out
	defer func() {
		if listed != nil {
			<-listed // it ends with ctx; do not leave it behind
		}
	}()
	for {
		if applying != nil {
			// A step of the listing, unless the watch has something:
			// the watch goes first.
			select {
			case <-ctx.Done():
				return
			case b, ok := <-watch:
				if !onWatch(b, ok) {
					return
				}
				continue
			default:
			}
			if step(applying) {
				applying = nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return
		case b, ok := <-watch:
			if !onWatch(b, ok) {
				return
			}
		case <-poll:
			if listed != nil {
				continue // the previous one is still out
			}
			r.mu.Lock()
			r.st.TrackForListing()
			r.mu.Unlock()
			listed = make(chan listResult, 1)
			go func(out chan<- listResult, fg int, started time.Time) {
				l, scope, err := r.backstopList(ctx)
				out <- listResult{l, scope, err, fg, started}
			}(listed, foreground, r.clock.Now())
		case res := <-listed:
			listed = nil
			if res.foreground != foreground {
				continue // superseded; its tracking ended already
			}
			if res.err != nil {
				r.mu.Lock()
				r.st.Untrack()
				r.mu.Unlock()
				if !isClosed(ctx, res.err) {
					r.log.Warn("backstop listing failed; the watch goes on", "err", res.err)
				}
				continue
			}
			applying = begin(res.l, res.scope, res.started)
		}
	}
}

// watchFrom starts a backend watch that the returned func cancels.
func (r *Registrar) watchFrom(ctx context.Context, rev int64) (<-chan backend.WatchBatch, context.CancelFunc) {
	wctx, cancel := context.WithCancel(ctx)
	return r.watcher.Watch(wctx, rev), cancel
}

// runProgress sends bookmarks to idle streams.
func (r *Registrar) runProgress(ctx context.Context) {
	t := r.clock.NewTicker(r.opts.ProgressInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			r.mu.Lock()
			v := r.st.Version()
			r.hub.progress(&registrarv1.EndpointEvent{
				Type:     registrarv1.EndpointEvent_PROGRESS,
				Version:  v.String(),
				Epoch:    v.Epoch,
				Sequence: v.Seq,
			})
			r.mu.Unlock()
		}
	}
}
