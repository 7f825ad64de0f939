package client

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/aethermesh/aether/registry"
)

// Writes and node calls retry the same failures: one function decides,
// and UNAUTHENTICATED is retried by both (certificates are reloaded
// without a restart), PERMISSION_DENIED by neither.
func TestOneClassificationForWritesAndNodeCalls(t *testing.T) {
	wantPermanent := map[codes.Code]bool{
		codes.InvalidArgument: true, codes.PermissionDenied: true, codes.FailedPrecondition: true,
		codes.Unimplemented: true, codes.OutOfRange: true,
	}
	for code := codes.OK + 1; code <= codes.Unauthenticated; code++ {
		// As the writer and the node calls see them: wrapped with what was
		// asked of which registrar.
		err := fmt.Errorf("client: renewing the lease of node n1 at 127.0.0.1:1: %w", status.Error(code, "x"))
		if got := Permanent(err); got != wantPermanent[code] {
			t.Errorf("%s: node call permanent = %v, want %v", code, got, wantPermanent[code])
		}
		for _, op := range []opKind{opRegister, opUnregister} {
			if got := permanentWrite(err, op); got != wantPermanent[code] {
				t.Errorf("%s: %s permanent = %v, want %v (as node calls)", code, op, got, wantPermanent[code])
			}
		}
	}
	if Permanent(status.Error(codes.Unauthenticated, "x")) {
		t.Error("UNAUTHENTICATED is permanent; a reloaded certificate could not heal it")
	}
	// What the client refuses before sending, and a closed client, fail
	// the same way on every attempt.
	for _, err := range []error{ErrClosed, fmt.Errorf("client: announce node: %w", &registry.FieldError{Field: "node.name", Reason: "x"})} {
		if !Permanent(err) {
			t.Errorf("%v: retryable, want permanent", err)
		}
	}
	if Permanent(nil) {
		t.Error("nil is permanent")
	}
	// Drain of an endpoint the registrar does not hold cannot succeed by
	// resending; the other writes read NotFound as their own answer.
	if !permanentWrite(status.Error(codes.NotFound, "x"), opDrain) || permanentWrite(status.Error(codes.NotFound, "x"), opRegister) {
		t.Error("NotFound: drain must be permanent, register not")
	}
}
