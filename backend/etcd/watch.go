package etcd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/internal/retry"
	"github.com/aethermesh/aether/registry"
)

// watchBackoff spaces attempts to re-establish a watch that etcd ended. The
// cap keeps recovery prompt once etcd is back; the floor keeps a watch that
// fails at once (no leader, say) from spinning. It waits the exponential
// step itself, without jitter: one watch per store retries alone, so there
// is no crowd to spread.
var watchBackoff = retry.Backoff{Base: 50 * time.Millisecond, Max: 2 * time.Second}

// The change feed's types are package backend's.
type (
	// Event is backend.Event: one change to one endpoint.
	Event = backend.Event
	// NodeEvent is backend.NodeEvent: one change to one node record.
	NodeEvent = backend.NodeEvent
	// WatchBatch is backend.WatchBatch: what one etcd watch response
	// carried. Its Revision is the last event's, not etcd's response
	// header revision, which can run ahead of events still to come while
	// a watch catches up on history (see watchRevision).
	WatchBatch = backend.WatchBatch
)

// Watch streams changes under registry.Root with revision > afterRev, one
// WatchBatch per etcd watch response, so a Txn's events arrive together.
// Pass the Revision of a Listing (or of a WatchBatch) as afterRev.
//
// The watch runs on a clientv3.WithRequireLeader context, so a member cut
// off from quorum cancels it instead of silently serving nothing. Whenever
// the etcd watch ends for another reason than ctx or compaction, it is
// re-established from the last delivered revision after a capped exponential
// backoff (50ms..2s), logged at warn; the consumer sees neither a gap nor a
// duplicate. If that revision has been compacted, Watch sends one
// WatchBatch{Compacted: true} and closes the channel.
//
// The channel is unbuffered and closes when ctx ends (or the client is
// closed); a consumer that stops reading must cancel ctx, which also ends a
// pending send.
func (s *Store) Watch(ctx context.Context, afterRev int64) <-chan WatchBatch {
	out := make(chan WatchBatch)
	go s.watch(ctx, afterRev, out)
	return out
}

func (s *Store) watch(ctx context.Context, lastRev int64, out chan<- WatchBatch) {
	defer close(out)
	attempt := 0
	for {
		compacted, reason := s.watchOnce(ctx, &lastRev, out, &attempt)
		switch {
		case ctx.Err() != nil:
			return
		case compacted:
			s.log.Warn("etcd watch cannot resume: revision compacted; consumer must re-list", "after_revision", lastRev, "err", reason)
			select {
			case out <- WatchBatch{Revision: lastRev, Compacted: true}:
			case <-ctx.Done():
			}
			return
		case s.cli.Ctx().Err() != nil:
			// A closed client never comes back; retrying would spin forever.
			s.log.Error("etcd client closed; watch ends", "after_revision", lastRev)
			return
		}
		d := watchBackoff.Ceiling(attempt)
		attempt++
		s.log.Warn("etcd watch ended; re-establishing", "resume_revision", lastRev+1, "backoff", d, "err", reason)
		if !retry.Sleep(ctx, d, nil) {
			return
		}
	}
}

// watchOnce runs one etcd watch from *lastRev+1 until it ends, delivering
// its batches and advancing *lastRev. It reports why the watch ended and
// whether that was compaction. A delivered batch restarts the caller's
// backoff (*attempt).
func (s *Store) watchOnce(ctx context.Context, lastRev *int64, out chan<- WatchBatch, attempt *int) (compacted bool, reason error) {
	// A child context per attempt: cancelling it ends exactly this etcd
	// watch, which a retry must do before opening the next.
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(wctx, registry.Root,
		clientv3.WithPrefix(),
		clientv3.WithRev(*lastRev+1),
		clientv3.WithProgressNotify(),
	)
	for resp := range wch {
		if resp.CompactRevision != 0 {
			return true, fmt.Errorf("resume revision %d compacted (compact revision %d)", *lastRev+1, resp.CompactRevision)
		}
		if err := resp.Err(); err != nil {
			return false, err
		}
		if resp.Created {
			continue // only sent on request; carries nothing
		}
		b, ok := s.batch(resp, *lastRev)
		if !ok {
			continue
		}
		select {
		case out <- b:
		case <-ctx.Done():
			return false, ctx.Err()
		}
		*lastRev = b.Revision
		// Delivering means the watch works; the next failure starts the
		// backoff afresh instead of inheriting a long outage's delay.
		*attempt = 0
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	return false, errors.New("etcd watch channel closed without an error")
}

// batch converts a watch response, dropping what was already delivered up to
// lastRev. It reports false if nothing new is left to deliver.
//
// Dropping by revision is exact because etcd never splits one revision's
// events across responses, and it is needed because a re-established watch
// (ours, or the client's own transparent resume) may replay from before
// what the consumer has seen.
func (s *Store) batch(resp clientv3.WatchResponse, lastRev int64) (WatchBatch, bool) {
	rev := watchRevision(resp)
	if rev <= lastRev {
		return WatchBatch{}, false
	}
	b := WatchBatch{Revision: rev}
	for _, ev := range resp.Events {
		if ev.Kv.ModRevision <= lastRev {
			continue
		}
		if ne, ok := s.nodeEvent(ev); ok {
			b.Nodes = append(b.Nodes, ne)
			continue
		}
		if e, ok := s.event(ev); ok {
			b.Events = append(b.Events, e)
		}
	}
	return b, true
}

// watchRevision is how far a response proves the watcher current.
//
// For events that is the last event's revision, not the header's: a watcher
// catching up on history gets its events in chunks (etcd's
// watchBatchMaxRevs), each stamped with the current store revision while
// later chunks are still to come, so the header can run ahead of what was
// delivered. Resuming from the header would then skip events; clientv3
// itself resumes from the last event for the same reason. A progress
// notification is only sent to a watcher that is caught up, so its header is
// exact.
func watchRevision(resp clientv3.WatchResponse) int64 {
	if n := len(resp.Events); n > 0 {
		return resp.Events[n-1].Kv.ModRevision
	}
	return resp.Header.GetRevision()
}

// event converts one etcd event. Keys that are not endpoint keys are
// dropped silently. A put whose value does not decode becomes a delete,
// logged at warn: List leaves such a key out of its listing, and a watch
// that kept the previous value instead would disagree with the next listing.
func (s *Store) event(ev *clientv3.Event) (Event, bool) {
	key := string(ev.Kv.Key)
	if !registry.IsEndpointKey(key) {
		return Event{}, false
	}
	id, err := registry.ParseEndpointKey(key)
	if err != nil {
		// No identity to report a removal for: nothing can have been
		// derived from this key either.
		s.log.Warn("skipping change to a malformed endpoint key", "key", key, "revision", ev.Kv.ModRevision, "err", err)
		return Event{}, false
	}
	e := Event{ID: id, Revision: ev.Kv.ModRevision}
	if ev.Type == mvccpb.DELETE {
		return e, true
	}
	ep, err := registry.DecodeEndpoint(key, ev.Kv.Value)
	if err != nil {
		s.log.Warn("undecodable endpoint record; treating it as removed", "key", key, "revision", ev.Kv.ModRevision, "err", err)
		return e, true
	}
	e.Endpoint = ep
	return e, true
}

// nodeEvent converts a change to a node record key; false for other keys.
// An undecodable record counts as deleted, as for endpoints.
func (s *Store) nodeEvent(ev *clientv3.Event) (NodeEvent, bool) {
	key := string(ev.Kv.Key)
	if !registry.IsNodeKey(key) {
		return NodeEvent{}, false
	}
	id, err := registry.ParseNodeKey(key)
	if err != nil {
		s.log.Warn("skipping change to a malformed node key", "key", key, "revision", ev.Kv.ModRevision, "err", err)
		return NodeEvent{}, false
	}
	ne := NodeEvent{ID: id, Revision: ev.Kv.ModRevision}
	if ev.Type == mvccpb.DELETE {
		return ne, true
	}
	n, err := registry.DecodeNode(key, ev.Kv.Value)
	if err != nil {
		s.log.Warn("undecodable node record; treating it as removed", "key", key, "revision", ev.Kv.ModRevision, "err", err)
		return ne, true
	}
	ne.Node = n
	return ne, true
}
