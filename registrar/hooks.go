package registrar

import (
	"time"
)

// What the composition root (package server) reads of a running replica
// beside the in-process API (api.go).

// Now is the replica's clock, so that ages a process reports about it
// (readiness) are on the same clock as the times it records.
func (r *Registrar) Now() time.Time { return r.now() }

// Options are the options the replica runs with, defaults filled in and
// the sync mode resolved against the backend's capabilities.
func (r *Registrar) Options() Options { return r.opts }
