package edge

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/edge/internal/core"
	"github.com/aethermesh/aether/edge/internal/storage"
)

// batch is a group of applied changes persisted by one storage.Append.
type batch struct {
	recs    []storage.Record
	applied []*core.Applied
	done    chan struct{} // closed once durable (or failed)
	err     error         // set before done is closed
	// hurry: someone answers a client once this batch is durable (a
	// local write, or a read that may have seen one of its changes). A
	// batch of peer changes only is in no hurry: see committer.
	hurry bool
}

// wait blocks until the batch is durable. A caller whose context ends first
// gets its context's error; the change itself is applied and will still be
// persisted (as with etcd, a timed-out write may have happened).
func (b *batch) wait(ctx context.Context) error {
	if b == nil {
		return nil
	}
	select {
	case <-b.done:
		return b.err
	default:
	}
	select {
	case <-b.done:
		return b.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// maxYields bounds how often the committer yields to let a batch grow.
const maxYields = 8

// committer is the group-commit goroutine. Writers add applied changes while
// holding the state lock (so a batch's records are in index order and
// batches follow each other in index order); the goroutine swaps the open
// batch out whenever it is idle and persists it in one transaction. While
// one Append runs, new changes collect in the next batch: under load many
// changes share an fsync, with no timer adding latency when idle.
//
// A batch holding only changes merged from peers waits, up to lazy after
// the previous batch became durable, before it is persisted: nobody
// answers a client on it, only a peer's ack and this replica's watchers,
// and under a steady stream from peers it turns one fsync per push into
// one per lazy. A replica takes every change of every other member, so
// without it a cluster of N members on one shared disk (or one IOPS
// budget) does N fsyncs per write and the author's own fsync, the one its
// client waits for, queues behind the others'. A local write or a read
// that must wait for the batch (last) ends the wait at once.
type committer struct {
	s    *Server
	lazy time.Duration

	mu       sync.Mutex
	open     *batch // collecting
	inflight *batch // being persisted
	closed   bool
	kick     chan struct{}
	stopped  chan struct{}
	lastDone time.Time // when the previous Append returned
}

func newCommitter(s *Server, lazy time.Duration) *committer {
	c := &committer{
		s:    s,
		lazy: lazy,
		open: &batch{done: make(chan struct{})},
		// As if a batch had just been persisted: the first peer changes
		// after a start wait like the others.
		lastDone: time.Now(),
		kick:     make(chan struct{}, 1),
		stopped:  make(chan struct{}),
	}
	go c.run()
	return c
}

// add queues a change applied by a local write (or lease expiry); the
// caller holds the state lock.
func (c *committer) add(ap *core.Applied) *batch { return c.queue(ap, true) }

// addMerged queues a change merged from a peer; the caller holds the state
// lock.
func (c *committer) addMerged(ap *core.Applied) *batch { return c.queue(ap, false) }

func (c *committer) queue(ap *core.Applied, hurry bool) *batch {
	c.mu.Lock()
	b := c.open
	b.hurry = b.hurry || hurry
	b.recs = append(b.recs, storage.Record{Index: ap.Index, Rev: ap.Rev, ID: ap.ID, Change: ap.Encoded})
	b.applied = append(b.applied, ap)
	c.mu.Unlock()
	c.s.sync.applied(ap)
	if f := c.s.cfg.onApplied; f != nil {
		f(ap)
	}
	c.s.quotaUsed.Add(eventsCost(ap.Events))
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return b
}

// last returns the batch holding the newest applied change, nil when every
// applied change is durable. A read waits on it: the state it read may
// include that change; so it is persisted without waiting. The caller
// holds the state lock (read or write).
func (c *committer) last() *batch {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.open.recs) > 0 {
		if !c.open.hurry {
			c.open.hurry = true
			select {
			case c.kick <- struct{}{}:
			default:
			}
		}
		return c.open
	}
	return c.inflight
}

// lastLazy is last for a waiter in no hurry (a peer's ack of changes held
// already): the batch keeps its lazy wait.
func (c *committer) lastLazy() *batch {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.open.recs) > 0 {
		return c.open
	}
	return c.inflight
}

func (c *committer) run() {
	defer close(c.stopped)
	for {
		c.mu.Lock()
		for len(c.open.recs) == 0 {
			if c.closed {
				c.mu.Unlock()
				return
			}
			c.mu.Unlock()
			<-c.kick
			c.mu.Lock()
		}
		c.waitLazy()
		// Let writers that are already runnable add to the batch first:
		// yielding costs nothing when nobody else wants the CPU, and under
		// load it turns a stream of one-change transactions into fewer,
		// larger ones (the transaction, not the change, is what costs).
		for range maxYields {
			n := len(c.open.recs)
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
			if len(c.open.recs) == n {
				break
			}
		}
		b := c.open
		c.open = &batch{done: make(chan struct{})}
		c.inflight = b
		c.mu.Unlock()

		c.persist(b)

		c.mu.Lock()
		if c.inflight == b {
			c.inflight = nil
		}
		c.lastDone = time.Now()
		c.mu.Unlock()
	}
}

// waitLazy holds a batch of peer changes only until lazy after the
// previous Append returned, or until it is hurried or the committer
// closes. Called and returns with c.mu held.
func (c *committer) waitLazy() {
	if c.lazy <= 0 || c.open.hurry || c.closed {
		return
	}
	d := c.lazy - time.Since(c.lastDone)
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for !c.open.hurry && !c.closed {
		c.mu.Unlock()
		select {
		case <-c.kick:
			c.mu.Lock()
		case <-t.C:
			c.mu.Lock()
			return
		}
	}
}

func (c *committer) persist(b *batch) {
	s := c.s
	if errp := s.failed.Load(); errp != nil {
		b.err = *errp
		close(b.done)
		return
	}
	start := time.Now()
	if err := s.store.Append(b.recs); err != nil {
		// The core is now ahead of the disk and cannot be rolled back: stop
		// acknowledging anything (etcd panics on a backend write failure).
		ferr := status.Error(codes.Unavailable, fmt.Sprintf("edge: storage failed, the server no longer serves: %v", err))
		s.failed.CompareAndSwap(nil, &ferr)
		s.log.Error("persisting changes failed; the server stops serving", "changes", len(b.recs), "err", err)
		b.err = ferr
		close(b.done)
		return
	}
	s.metrics.observeBatch(len(b.recs), time.Since(start))
	s.sync.durable(b.recs[len(b.recs)-1].Index)
	s.ckpt.noteDurable(b.recs)
	// Watchers see the changes once durable, before the writers hear back:
	// a client that got its response and then watches from the next
	// revision cannot miss it either way.
	s.hub.publish(b.applied)
	close(b.done)
}

// close persists what is queued and stops the goroutine. The caller ensures
// no writer adds after it.
func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
	<-c.stopped
}
