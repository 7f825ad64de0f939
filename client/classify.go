package client

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/registry"
)

// Permanent reports whether err, returned by a Client call or by a
// registrar to one of the client's writes, means that making the same
// call again can never succeed: the registrar refused the request itself
// (invalid, not allowed, a precondition that does not hold, not
// implemented, out of range), the client refused it before sending it, or
// the client is closed. Everything else is worth retrying: Unavailable and
// deadlines, ResourceExhausted from a registrar's full write queue,
// Internal, and Unauthenticated.
//
// Unauthenticated is retried on purpose. An agent's certificate files are
// re-read while it runs (pki.ClientCredentials), so the identity a
// registrar refuses now (a certificate that expired, or one the registrars
// do not trust yet while a CA is rotated in) is replaced by the renewed
// one on the next connection. Giving up would make every agent whose
// renewal is late exit, and stay down until someone restarts it, while
// retrying costs a logged warning per attempt until the renewal lands.
// PermissionDenied stays permanent: the identity is established and the
// policy refuses it this operation, which no reload of the same identity
// changes.
//
// Writes and node calls are classified by this one function; what NotFound
// means is the call's own answer (see Drain, Unregister, Heartbeat and
// LeaveNode), not a question of retrying.
func Permanent(err error) bool {
	if err == nil {
		return false
	}
	var fe *registry.FieldError
	if errors.Is(err, ErrClosed) || errors.As(err, &fe) {
		return true
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.FailedPrecondition, codes.Unimplemented, codes.OutOfRange:
		return true
	}
	return false
}

// unreachable reports whether err says that the registrar asked could not
// be reached or did not answer in time, so another registrar may answer,
// rather than what that registrar answered.
func unreachable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// eachRegistrar runs call against the registrar in use, then against each
// other one in turn while the failure is unreachable, every attempt bounded
// by timeout; it returns the last attempt's error. It leaves the cursor
// (addr) where it is: only the stream loop moves it, and the stream soon
// moves off a registrar that cannot be reached.
func (c *Client) eachRegistrar(ctx context.Context, timeout time.Duration, call func(ctx context.Context, idx int) error) error {
	n := len(c.rpc)
	first := c.current()
	var err error
	for i := range n {
		idx := (first + i) % n
		actx, cancel := context.WithTimeout(ctx, timeout)
		err = call(actx, idx)
		cancel()
		if err == nil || ctx.Err() != nil || !unreachable(err) {
			return err
		}
	}
	return err
}
