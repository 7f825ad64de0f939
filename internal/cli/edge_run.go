package cli

import (
	"context"
	"errors"
)

// runEdge serves the edge store until ctx is cancelled. Until package edge
// (h-eserver) is merged this build has no server to start.
func runEdge(ctx context.Context, s *edgeSettings) error {
	return errors.New("edge: this build has no edge server yet")
}
