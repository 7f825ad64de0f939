package cli

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// waitFlags are --wait and --wait-timeout of the commands that write an
// endpoint (register, drain, deregister). A registrar acknowledges a write
// once it is applied to its snapshot and broadcast, and persists it to its
// backend write-behind, shortly after; --wait asks it to answer only once
// the write is persisted, so that a crash of the registrar right after the
// answer cannot lose it.
type waitFlags struct {
	wait    bool
	timeout time.Duration
}

func addWaitFlags(cmd *cobra.Command) *waitFlags {
	wf := &waitFlags{}
	f := cmd.Flags()
	f.BoolVar(&wf.wait, "wait", false, "answer only once the write is persisted to the registrar's backend, not just applied and broadcast (bounded by --wait-timeout)")
	f.DurationVar(&wf.timeout, "wait-timeout", 10*time.Second, "with --wait: how long to wait for the write to be persisted; the call's deadline instead of --timeout")
	return wf
}

func (wf *waitFlags) validate() error {
	if wf.timeout <= 0 {
		return fmt.Errorf("--wait-timeout %s: must be positive (e.g. 10s)", wf.timeout)
	}
	return nil
}

// callFlags are the client flags to make the call with: with --wait the
// call lasts as long as the registrar takes to persist, so its deadline is
// --wait-timeout rather than --timeout.
func (wf *waitFlags) callFlags(cf *clientFlags) *clientFlags {
	if !wf.wait {
		return cf
	}
	c := *cf
	c.timeout = wf.timeout
	return &c
}

// failed turns the error of a call made with --wait into one that says
// what became of the write, or returns nil to leave err to the usual
// mapping. A deadline that passes while the registrar waits for its
// backend leaves the write acknowledged: applied to the registrar's
// snapshot, broadcast, and queued until the backend takes it.
func (wf *waitFlags) failed(what string, err error) error {
	if !wf.wait || status.Code(err) != codes.DeadlineExceeded {
		return nil
	}
	const advice = "raise --wait-timeout to wait longer, or check the registrar's backend (its /readyz?verbose)"
	if msg := status.Convert(err).Message(); strings.Contains(msg, "acknowledged") {
		// The registrar's own answer: it gave up waiting on a write it
		// had acknowledged.
		return fmt.Errorf("%s: not persisted within %s (--wait-timeout): the registrar acknowledged the write and keeps it queued until its backend takes it, but it is not persisted yet (registrar: %s); %s",
			what, wf.timeout, msg, advice)
	}
	// This client's deadline passed first (both ends share it), so what
	// the registrar made of the write cannot be told from here.
	return fmt.Errorf("%s: not persisted within %s (--wait-timeout): a registrar acknowledges a write before persisting it, so the write may be acknowledged and queued, but it is not persisted yet; %s",
		what, wf.timeout, advice)
}

// confirm checks the answer to a write made with --wait: a registrar that
// ignores the request (one older than --wait) answers at once, with
// persisted unset, and the caller must not take that for durability.
func (wf *waitFlags) confirm(what, addr string, persisted bool) error {
	if !wf.wait || persisted {
		return nil
	}
	return errors.New(what + ": the registrar at " + addr + " acknowledged the write but did not report it persisted: it does not support --wait (an older version?); " +
		"the write is applied and will be persisted write-behind, with no confirmation")
}

// note is what the success line of a write adds: that it is persisted.
func note(persisted bool) string {
	if persisted {
		return ", persisted"
	}
	return ""
}
