package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

// DefaultRegistrarAddr is where client commands look for a registrar.
const DefaultRegistrarAddr = "127.0.0.1:9443"

// clientFlags are the flags every client command has.
type clientFlags struct {
	addr    string
	timeout time.Duration
}

func addClientFlags(cmd *cobra.Command) *clientFlags {
	cf := &clientFlags{}
	pf := cmd.PersistentFlags()
	pf.StringVar(&cf.addr, "registrar", DefaultRegistrarAddr, "registrar gRPC address (host:port)")
	pf.DurationVar(&cf.timeout, "timeout", 5*time.Second, "timeout of each call to the registrar (for watch: until the first event)")
	return cf
}

func (cf *clientFlags) validate() error {
	if cf.addr == "" {
		return errors.New("--registrar must not be empty; give the registrar's host:port")
	}
	if cf.timeout <= 0 {
		return fmt.Errorf("--timeout %s: must be positive (e.g. 5s)", cf.timeout)
	}
	return nil
}

// connect dials the registrar. Call done when finished with the client.
func (cf *clientFlags) connect(ctx context.Context) (client registrarv1.RegistrarClient, done func(), err error) {
	conn, err := dial(ctx, cf.addr)
	if err != nil {
		return nil, nil, err
	}
	return registrarv1.NewRegistrarClient(conn), func() { _ = conn.Close() }, nil
}

// dial opens a client connection to a registrar. It is the one place that
// decides transport security and dial options. grpc.NewClient connects
// lazily; an unreachable registrar shows up as Unavailable on the first call.
func dial(ctx context.Context, addr string) (*grpc.ClientConn, error) {
	_ = ctx // reserved for credential loading (TLS comes later)
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUserAgent("aether-cli/"+versionString()),
	)
	if err != nil {
		return nil, fmt.Errorf("--registrar %q: %v", addr, err)
	}
	return conn, nil
}

// rpcError turns an error from a registrar call into a message that says
// what failed and how to fix it. what describes the attempted operation
// ("register web 10.0.0.1 (http)").
func (cf *clientFlags) rpcError(what string, err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("%s: %w", what, err)
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unavailable:
		return fmt.Errorf("cannot reach registrar at %s: %s; is \"aether registrar\" running? (set --registrar or AETHER_REGISTRAR)", cf.addr, msg)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: registrar at %s did not answer within %s (raise --timeout or AETHER_TIMEOUT)", what, cf.addr, cf.timeout)
	case codes.Canceled:
		return fmt.Errorf("%s: canceled", what)
	case codes.InvalidArgument, codes.NotFound, codes.ResourceExhausted, codes.FailedPrecondition, codes.AlreadyExists, codes.OutOfRange, codes.Aborted:
		return fmt.Errorf("%s: %s", what, msg)
	case codes.Unimplemented:
		return fmt.Errorf("%s: the registrar at %s does not implement this call (%s); is it an older version, or not an aether registrar?", what, cf.addr, msg)
	case codes.Unauthenticated, codes.PermissionDenied:
		return fmt.Errorf("%s: refused by the registrar at %s: %s", what, cf.addr, msg)
	default:
		return fmt.Errorf("%s: registrar at %s: %s: %s", what, cf.addr, st.Code(), msg)
	}
}
