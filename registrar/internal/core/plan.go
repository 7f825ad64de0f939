package core

import (
	"time"

	"github.com/aethermesh/aether/registry"
)

// The planners: the registrar's scheduling rules, as pure functions of
// what the loop knows and the time now. The loops keep their I/O and
// their timers; they ask a planner what to do and when to wake, so the
// rules can be tested without waiting on a clock.

// FlushInput is what the flusher knows when it decides.
type FlushInput struct {
	Now time.Time
	// LastFlush is when the last flush began; zero when none did, or when
	// one failed and its backoff is over (retry at once).
	LastFlush time.Time
	Pending   int       // State.Pending
	RetryAt   time.Time // State.NextRetry
	Interval  time.Duration
	BatchSize int
}

// FlushPlan is the flusher's decision: flush now, or wait for a kick
// (Effects.Flush) and, when Timer is set, at most Wait.
type FlushPlan struct {
	Flush bool
	Timer bool
	Wait  time.Duration
}

// PlanFlush spaces flushes at least Interval apart, so the backend sees at
// most one transaction per interval however many writes arrive, except
// that a batch's worth of pending writes is flushed at once. The spacing
// is leading-edge: a write arriving when no flush began within the last
// interval is flushed immediately, so a quiet cluster pays no batching
// delay; under churn the writes of an interval coalesce into one flush at
// its end. Isolated writes alone wait for their retry time.
func PlanFlush(in FlushInput) FlushPlan {
	pending := in.Pending
	wait := in.Interval - in.Now.Sub(in.LastFlush)
	if !in.RetryAt.IsZero() && pending == 0 {
		// Only isolated writes wait: offer them again when due.
		if until := in.RetryAt.Sub(in.Now); until > 0 {
			wait = max(wait, until)
		} else {
			pending = 1
		}
	}
	if pending > 0 && (wait <= 0 || pending >= in.BatchSize) {
		return FlushPlan{Flush: true}
	}
	if pending > 0 || !in.RetryAt.IsZero() {
		return FlushPlan{Timer: true, Wait: max(wait, 0)}
	}
	return FlushPlan{} // nothing queued: sleep until a write kicks
}

// fullFetchRatio: when more than one key in this many needs its value, a
// full listing is cheaper than fetching them a Txn at a time.
const fullFetchRatio = 8

// fetchAlways is how many values are fetched key by key whatever the
// ratio: two Txns, cheaper than any full listing.
const fetchAlways = 256

// BackstopListsAll decides the backstop's second read, after a keys-only
// listing of total keys of which needs have values the snapshot lacks:
// true for a full listing, false for fetching just those values.
func BackstopListsAll(needs, total int) bool {
	return needs*fullFetchRatio > total && needs > fetchAlways
}

// backstopSpread is the share of --sync-interval over which the backstop
// spreads its work when a watch is running, and maxBackstopPause the
// longest pause between two of its steps.
const (
	backstopSpread   = 2
	maxBackstopPause = 100 * time.Millisecond
)

// BackstopPause is the pause between the backstop's steps (parts of its
// listing, steps of its comparison), for about steps of them. With a watch
// running the backstop is a check in the background, so its work is
// spread over half the interval: done at once, a check of 100k keys is a
// burst of CPU in the backend and the registrar that every write and
// watch event queues behind. Polling learns of every change this way, so
// it does not wait.
func BackstopPause(poll bool, interval time.Duration, steps int) time.Duration {
	if poll || steps <= 0 {
		return 0
	}
	return min(interval/backstopSpread/time.Duration(steps), maxBackstopPause)
}

// RelistWait is how long a foreground re-list must wait so that re-lists
// are spaced at least debounce apart: a watch that keeps losing its
// position must not turn into back-to-back full listings.
func RelistWait(now, last time.Time, debounce time.Duration) time.Duration {
	return max(debounce-now.Sub(last), 0)
}

// SweepEvery is the backstop period of the ghost sweep: a third of the
// node TTL, so a ghost a missed deletion left behind lasts at most about
// a TTL more; never more often than once a second.
func SweepEvery(nodeTTL time.Duration) time.Duration { return max(nodeTTL/3, time.Second) }

// SweepChunk is how many of services one hold of the lock looks at: whole
// services until about budget endpoints. A walk of every endpoint in one
// hold would hold back every write and watch event on a large registry.
func SweepChunk(services []string, size func(string) int, budget int) int {
	n := 0
	for seen := 0; n < len(services) && seen < budget; n++ {
		seen += size(services[n])
	}
	return n
}

// Swept is an endpoint the sweep removed, and the node it belonged to.
type Swept struct {
	ID   registry.EndpointID
	Node string
}

// SweepStep removes the ghosts among services (ghostsIn) through the
// ordinary unregister path, so watchers see REMOVED and the deletes are
// persisted write-behind. A full queue stops it: deferred names the ghost
// it could not remove and err why; the next round tries again.
func (s *State) SweepStep(services []string, region, cluster string, now time.Time, grace time.Duration) (eff Effects, swept []Swept, deferred registry.EndpointID, err error) {
	for _, id := range s.ghostsIn(services, region, cluster, now, grace) {
		node := s.Get(id).GetNode()
		_, e, uerr := s.Unregister(id, now)
		if uerr != nil {
			return eff, swept, id, uerr
		}
		eff.Add(e)
		swept = append(swept, Swept{ID: id, Node: node})
	}
	// The sweep wakes the flusher whatever the queue's size: its deletes
	// are what makes the node's endpoints go away on the other replicas.
	eff.Flush = eff.Flush || len(swept) > 0
	return eff, swept, registry.EndpointID{}, nil
}
