package client

import (
	"time"

	"github.com/aethermesh/aether/internal/retry"
)

// backoff is the delay before retry number attempt of the stream and the
// writer, within the client's bounds (Config.BackoffBase, BackoffMax).
func (c *Client) backoff(attempt int) time.Duration {
	return retry.Backoff{Base: c.cfg.BackoffBase, Max: c.cfg.BackoffMax}.Delay(attempt)
}
