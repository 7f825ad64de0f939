// Package backendtest is the conformance suite of package backend's
// contract. Every backend runs it from its own tests, each Run function
// against a fresh store from the backend's Factory:
//
//	func TestConformance(t *testing.T) {
//		backendtest.RunAll(t, backendtest.Factory{New: ..., Compact: ...})
//	}
//
// The functions state the contract from the outside, through the backend
// interfaces only, so they hold for any store: they never assume where
// revisions start or by how much they grow, only that they are per store
// and increase with every write. A capability the store lacks, or a hook
// the factory leaves nil, leaves out the checks that need it; RunAll runs
// exactly the functions that apply.
//
// The Run functions take a T, which *testing.T satisfies; Record runs one
// against a recorder instead, which is how the suite's own tests prove it
// fails a broken store.
package backendtest

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aethermesh/aether/backend"
)

// T is the part of testing.TB the suite uses.
type T interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Failed() bool
	Cleanup(func())
}

// Factory makes the stores under test.
type Factory struct {
	// New returns a fresh store: nothing under registry.Root, and no
	// watch or lease of an earlier test still in force. Its revision may
	// be anywhere. Whatever it starts it stops with t.Cleanup.
	New func(t T) backend.Store
	// Compact, if set, makes b forget its history before rev (rev itself
	// stays readable), as etcd's compaction at rev does; nil for a store
	// that cannot be told to.
	Compact func(t T, b backend.Store, rev int64)
	// Advance, if set, moves the clock b's leases run out by forward by
	// d. Without it RunLeases waits for a lease to lapse in real time.
	Advance func(t T, b backend.Store, d time.Duration)
}

// RunAll runs every function of the suite that applies to what
// f.New's store offers and to f's hooks, each as a subtest.
func RunAll(t *testing.T, f Factory) {
	probe := f.New(t)
	_, watches := probe.(backend.Watcher)
	_, digests := probe.(backend.Digester)
	_, leases := probe.(backend.Leases)
	_, members := probe.(backend.Members)
	run := func(name string, fn func(T, Factory)) {
		t.Run(name, func(t *testing.T) { fn(t, f) })
	}
	run("ApplyOrderedLastStampWins", RunApplyOrderedLastStampWins)
	run("ApplyIdempotent", RunApplyIdempotent)
	run("ApplyRefusesAlone", RunApplyRefusesAlone)
	run("GetEndpoint", RunGetEndpoint)
	run("ListAtOneRevision", RunListAtOneRevision)
	run("GetAt", RunGetAt)
	if watches {
		run("WatchResumesWithoutGap", RunWatchResumesWithoutGap)
	}
	if digests {
		run("Digest", RunDigest)
	}
	if f.Compact != nil {
		run("CompactedIsReported", RunCompactedIsReported)
	}
	if leases {
		run("Leases", RunLeases)
	}
	if leases && members {
		run("Members", RunMembers)
	}
}

// Recording is what Record saw of a run.
type Recording struct {
	mu       sync.Mutex
	failed   bool
	messages []string
	cleanups []func()
}

// Record runs fn against a recorder that counts a failure instead of
// failing the caller, runs fn's cleanups, and returns what it saw. Fatalf
// ends fn, as it does a test.
func Record(fn func(T)) *Recording {
	r := &Recording{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			for i := len(r.cleanups) - 1; i >= 0; i-- {
				r.cleanups[i]()
			}
		}()
		fn(r)
	}()
	<-done
	return r
}

// Failed reports whether the run failed.
func (r *Recording) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

// Messages are the run's failure messages and logs.
func (r *Recording) Messages() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.messages, "\n")
}

func (r *Recording) Helper() {}

func (r *Recording) Logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.messages = append(r.messages, fmt.Sprintf(format, args...))
}

func (r *Recording) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.messages = append(r.messages, "FAIL: "+fmt.Sprintf(format, args...))
}

// Fatalf records a failure and ends the calling goroutine, as
// testing.T.Fatalf does; the suite calls it only from the goroutine that
// runs the function under Record.
func (r *Recording) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *Recording) Cleanup(f func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, f)
}

// testCtx bounds one function's calls, so a store that hangs fails the
// test instead of eating the whole run's timeout.
func testCtx(t T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
