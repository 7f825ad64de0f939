package client

import (
	"context"
	"sync"
	"sync/atomic"
)

// notifier calls OnChange from one goroutine, in the order changes were
// committed. The queue is unbounded on purpose: a slow callback delays only
// its own notifications, never the cache, the stream or the writer.
type notifier struct {
	fn   func(Change)
	wake chan struct{}

	mu sync.Mutex
	q  []Change

	// queued and delivered count changes, so a caller can tell when every
	// committed change has been delivered (idle).
	queued, delivered atomic.Int64
}

func newNotifier(fn func(Change)) *notifier {
	return &notifier{fn: fn, wake: make(chan struct{}, 1)}
}

// push queues changes; called with Client.mu held, which fixes their order.
func (n *notifier) push(chs []Change) {
	n.mu.Lock()
	n.q = append(n.q, chs...)
	n.queued.Add(int64(len(chs)))
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// run delivers queued changes until ctx ends; nothing is delivered after.
func (n *notifier) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.wake:
		}
		for {
			n.mu.Lock()
			batch := n.q
			n.q = nil
			n.mu.Unlock()
			if len(batch) == 0 {
				break
			}
			for _, ch := range batch {
				if ctx.Err() != nil {
					return
				}
				n.fn(ch)
				n.delivered.Add(1)
			}
		}
	}
}

// idle reports whether every change queued so far has been delivered.
func (n *notifier) idle() bool { return n.delivered.Load() == n.queued.Load() }
