// Package dynalite starts a dynalite (npm dynalite@4.0.0, a DynamoDB
// implementation on LevelDB) for a test: a real DynamoDB-compatible HTTP
// server on a free loopback port, in memory, stopped at the test's end
// (package internal/dynalite runs it, behind a shield that keeps a
// client's aborted request from crashing it).
//
// The binary is found as $AETHER_DYNALITE, then `dynalite` on PATH, then
// where .ci/run installs it ($HOME/.cache/aether-dynalite). A test that
// needs it and cannot find it fails, naming the install command: the
// DynamoDB backend's tests are the point, so they never skip silently.
package dynalite

import (
	"sync/atomic"
	"testing"

	"github.com/aethermesh/aether/internal/dynalite"
)

// InstallHint is the command that installs dynalite where Path looks.
const InstallHint = dynalite.InstallHint

// Path finds the dynalite binary.
func Path() (string, error) { return dynalite.Path() }

// Server is a running dynalite.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	s        *dynalite.Server
	stopped  atomic.Bool
}

// Start runs a dynalite for t and stops it when t ends; args are more of
// its flags (e.g. "--maxItemSizeKb", "8").
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	ds, err := dynalite.Start(args...)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Endpoint: ds.Endpoint, s: ds}
	t.Cleanup(func() {
		select {
		case <-ds.Done():
			if !s.stopped.Load() {
				// It died under the test: that is the failure to see.
				t.Errorf("dynalite exited during the test: %s", ds.Output())
			}
		default:
			if t.Failed() {
				t.Logf("dynalite output: %s", ds.Output())
			}
		}
		ds.Stop()
	})
	return s
}

// Stop kills the server now (a table outage); the test's end does
// nothing more.
func (s *Server) Stop() {
	s.stopped.Store(true)
	s.s.Stop()
}
