package backendtest_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/backend/backendtest"
	"github.com/aethermesh/aether/backend/memory"
	"github.com/aethermesh/aether/registry"
)

// The suite is only worth running if it fails a store that breaks the
// contract. Each case below wraps the model with one deliberate breach and
// runs the suite function that states the broken rule against a recorder,
// which must come back failed; the unbroken model, run the same way, must
// come back clean, so that a recorder that always fails proves nothing.

// dropsAnEvent loses the third endpoint event of every watch.
type dropsAnEvent struct{ *memory.Backend }

func (b dropsAnEvent) Watch(ctx context.Context, after int64) <-chan backend.WatchBatch {
	return relay(ctx, b.Backend.Watch(ctx, after), func(in backend.WatchBatch, seen *int, out chan<- backend.WatchBatch) bool {
		var kept []backend.Event
		for _, e := range in.Events {
			if *seen++; *seen != 3 {
				kept = append(kept, e)
			}
		}
		in.Events = kept
		return send(ctx, out, in)
	})
}

// repeatsABatch delivers its second batch with events twice, as a resume
// from too early a revision that forgot to drop the replay would.
type repeatsABatch struct{ *memory.Backend }

func (b repeatsABatch) Watch(ctx context.Context, after int64) <-chan backend.WatchBatch {
	return relay(ctx, b.Backend.Watch(ctx, after), func(in backend.WatchBatch, seen *int, out chan<- backend.WatchBatch) bool {
		if len(in.Events) > 0 {
			if *seen++; *seen == 2 && !send(ctx, out, in) {
				return false
			}
		}
		return send(ctx, out, in)
	})
}

// reorders holds back its first batch with events until after the next.
type reorders struct{ *memory.Backend }

func (b reorders) Watch(ctx context.Context, after int64) <-chan backend.WatchBatch {
	var held *backend.WatchBatch
	return relay(ctx, b.Backend.Watch(ctx, after), func(in backend.WatchBatch, seen *int, out chan<- backend.WatchBatch) bool {
		if len(in.Events) > 0 {
			*seen++
			if *seen == 1 {
				held = &in
				return true
			}
		}
		if !send(ctx, out, in) {
			return false
		}
		if held != nil {
			h := *held
			held = nil
			return send(ctx, out, h)
		}
		return true
	})
}

// relay runs step on every batch of in until it or ctx says stop.
func relay(ctx context.Context, in <-chan backend.WatchBatch, step func(backend.WatchBatch, *int, chan<- backend.WatchBatch) bool) <-chan backend.WatchBatch {
	out := make(chan backend.WatchBatch)
	go func() {
		defer close(out)
		seen := 0
		for b := range in {
			if !step(b, &seen, out) {
				return
			}
		}
	}()
	return out
}

func send(ctx context.Context, out chan<- backend.WatchBatch, b backend.WatchBatch) bool {
	select {
	case out <- b:
		return true
	case <-ctx.Done():
		return false
	}
}

// lastArrivalWins lets a put that the store refused for being older
// through anyway, by restamping it just above what the store holds: the
// order of arrival, not of stamps, decides.
type lastArrivalWins struct{ *memory.Backend }

func (b lastArrivalWins) ApplyOrdered(ctx context.Context, muts []backend.Mutation) ([]backend.Outcome, error) {
	outs, err := b.Backend.ApplyOrdered(ctx, muts)
	if err != nil {
		return outs, err
	}
	for i, o := range outs {
		if !o.Superseded || muts[i].Endpoint == nil || o.CurrentStamp == nil {
			continue
		}
		ep := proto.Clone(muts[i].Endpoint).(*registryv1.ServiceEndpoint)
		ep.Stamp = &registryv1.WriteStamp{Hlc: o.CurrentStamp.GetHlc() + 1, Writer: o.CurrentStamp.GetWriter()}
		again, err := b.Backend.ApplyOrdered(ctx, []backend.Mutation{{ID: muts[i].ID, Endpoint: ep}})
		if err != nil {
			return outs, err
		}
		outs[i] = again[0]
	}
	return outs, nil
}

// hidesCompaction answers a read at a compacted revision with nothing
// instead of saying so.
type hidesCompaction struct{ *memory.Backend }

func (b hidesCompaction) GetAt(ctx context.Context, rev int64, eps []registry.EndpointID, nodes []registry.NodeID) (backend.Listing, error) {
	l, err := b.Backend.GetAt(ctx, rev, eps, nodes)
	if errors.Is(err, backend.ErrCompacted) {
		return backend.Listing{Revision: rev}, nil
	}
	return l, err
}

// outlivesItsLease writes node records under a lease of its own that
// nothing revokes, so revoking or abandoning the node's lease leaves the
// record behind.
type outlivesItsLease struct {
	*memory.Backend
	once sync.Once
	own  int64
}

func (b *outlivesItsLease) PutNode(ctx context.Context, n *registryv1.Node, lease int64) (int64, error) {
	if _, _, err := b.Backend.LeaseTTL(ctx, lease); err != nil {
		return 0, err
	}
	b.once.Do(func() { b.own, _ = b.Backend.GrantLease(ctx, time.Hour) })
	return b.Backend.PutNode(ctx, n, b.own)
}

// factoryOf serves the model wrapped by wrap.
func factoryOf(wrap func(*memory.Backend) backend.Store) backendtest.Factory {
	return backendtest.Factory{
		New: func(backendtest.T) backend.Store { return wrap(memory.New(memory.Options{})) },
		Compact: func(t backendtest.T, b backend.Store, rev int64) {
			if err := b.(interface{ Compact(int64) error }).Compact(rev); err != nil {
				t.Fatalf("Compact(%d): %v", rev, err)
			}
		},
	}
}

func TestSuiteFailsABrokenStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		wrap func(*memory.Backend) backend.Store
		run  func(backendtest.T, backendtest.Factory)
	}{
		{"a watch that drops an event", func(m *memory.Backend) backend.Store { return dropsAnEvent{m} }, backendtest.RunWatchResumesWithoutGap},
		{"a watch that repeats a batch", func(m *memory.Backend) backend.Store { return repeatsABatch{m} }, backendtest.RunWatchResumesWithoutGap},
		{"a watch that reorders", func(m *memory.Backend) backend.Store { return reorders{m} }, backendtest.RunWatchResumesWithoutGap},
		{"an older stamp that wins", func(m *memory.Backend) backend.Store { return lastArrivalWins{m} }, backendtest.RunApplyOrderedLastStampWins},
		{"an older stamp that wins, replayed", func(m *memory.Backend) backend.Store { return lastArrivalWins{m} }, backendtest.RunApplyIdempotent},
		{"compaction hidden", func(m *memory.Backend) backend.Store { return hidesCompaction{m} }, backendtest.RunCompactedIsReported},
		{"a record that outlives its lease", func(m *memory.Backend) backend.Store { return &outlivesItsLease{Backend: m} }, backendtest.RunLeases},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := factoryOf(tc.wrap)
			rec := backendtest.Record(func(rt backendtest.T) { tc.run(rt, f) })
			if !rec.Failed() {
				t.Fatalf("the suite passed a store with %s; its log:\n%s", tc.name, rec.Messages())
			}
			t.Logf("caught: %s", firstFailure(rec.Messages()))
			clean := backendtest.Record(func(rt backendtest.T) {
				tc.run(rt, factoryOf(func(m *memory.Backend) backend.Store { return m }))
			})
			if clean.Failed() {
				t.Fatalf("the same suite function fails the unbroken model:\n%s", clean.Messages())
			}
		})
	}
}

func firstFailure(log string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.HasPrefix(l, "FAIL: ") {
			return strings.TrimPrefix(l, "FAIL: ")
		}
	}
	return log
}
