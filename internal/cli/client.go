package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/pki"
)

// DefaultRegistrarAddr is where client commands look for a registrar.
const DefaultRegistrarAddr = "127.0.0.1:9443"

// clientFlags are the flags every client command has.
type clientFlags struct {
	addr    string
	timeout time.Duration
	tls     tlsFlags
}

// tlsFlags are the client TLS flags of the client commands and the agent.
type tlsFlags struct {
	cacert, cert, key string
}

func addTLSFlags(fs *pflag.FlagSet, tf *tlsFlags) {
	fs.StringVar(&tf.cacert, "cacert", "", "connect with TLS, verifying the registrar's certificate against this CA bundle (PEM, e.g. the ca.pem of aether certs init)")
	fs.StringVar(&tf.cert, "cert", "", "client certificate (PEM) to present to the registrar (aether certs issue --node/--operator); needs --key")
	fs.StringVar(&tf.key, "key", "", "private key of --cert (PEM)")
}

// enabled reports whether any TLS flag is set: then the connection is TLS.
func (tf *tlsFlags) enabled() bool { return tf.cacert != "" || tf.cert != "" || tf.key != "" }

func (tf *tlsFlags) validate() error {
	switch {
	case tf.cert != "" && tf.key == "":
		return errors.New("--cert needs --key: give the client certificate and its private key together")
	case tf.key != "" && tf.cert == "":
		return errors.New("--key needs --cert: give the client certificate and its private key together")
	}
	return nil
}

func addClientFlags(cmd *cobra.Command) *clientFlags {
	cf := &clientFlags{}
	pf := cmd.PersistentFlags()
	pf.StringVar(&cf.addr, "registrar", DefaultRegistrarAddr, "registrar gRPC address (host:port; a bare host means port "+DefaultRegistrarPort+")")
	pf.DurationVar(&cf.timeout, "timeout", 5*time.Second, "timeout of each call to the registrar (for watch: until the first event)")
	addTLSFlags(pf, &cf.tls)
	return cf
}

func (cf *clientFlags) validate() error {
	addr, err := registrarAddr("--registrar", cf.addr)
	if err != nil {
		return err
	}
	cf.addr = addr
	if cf.timeout <= 0 {
		return fmt.Errorf("--timeout %s: must be positive (e.g. 5s)", cf.timeout)
	}
	return cf.tls.validate()
}

// connect dials the registrar. Call done when finished with the client.
func (cf *clientFlags) connect(ctx context.Context) (client registrarv1.RegistrarClient, done func(), err error) {
	conn, err := dial(ctx, cf.addr, &cf.tls)
	if err != nil {
		return nil, nil, err
	}
	return registrarv1.NewRegistrarClient(conn), func() { _ = conn.Close() }, nil
}

// transportCredentials are the credentials the TLS flags ask for: TLS with
// pki.ClientTLSConfig (static: a CLI command is short-lived) if any is set,
// plaintext otherwise.
func (tf *tlsFlags) transportCredentials() (credentials.TransportCredentials, error) {
	if !tf.enabled() {
		return insecure.NewCredentials(), nil
	}
	if err := tf.validate(); err != nil {
		return nil, err
	}
	cfg, err := pki.ClientTLSConfig(tf.cacert, tf.cert, tf.key)
	if err != nil {
		return nil, fmt.Errorf("--cacert/--cert/--key: %w", err)
	}
	return credentials.NewTLS(cfg), nil
}

// dial opens a client connection to a registrar. It is the one place that
// decides transport security and dial options. grpc.NewClient connects
// lazily; an unreachable registrar shows up as Unavailable on the first call.
func dial(ctx context.Context, addr string, tf *tlsFlags) (*grpc.ClientConn, error) {
	_ = ctx
	creds, err := tf.transportCredentials()
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(creds),
		grpc.WithUserAgent("aether-cli/"+versionString()),
	)
	if err != nil {
		return nil, fmt.Errorf("--registrar %q: %v", addr, err)
	}
	return conn, nil
}

// tlsHint explains an UNAVAILABLE that looks like a TLS mismatch (the
// connection was made, then dropped or refused in the handshake) rather
// than a registrar that is down, or returns "".
func (cf *clientFlags) tlsHint(msg string) string {
	const flags = "pass --cacert, --cert and --key (or AETHER_CACERT, AETHER_CERT and AETHER_KEY)"
	handshake := false
	for _, sign := range []string{"server preface", "tls:", "x509", "authentication handshake", "broken pipe", "connection reset", "EOF"} {
		handshake = handshake || strings.Contains(msg, sign)
	}
	switch {
	case !handshake:
		return ""
	case !cf.tls.enabled():
		return "the registrar may require TLS, and this client connected in plaintext: " + flags
	case cf.tls.cert == "":
		return "the TLS handshake failed, and no client certificate was given; the registrar may require one: " + flags
	}
	return "the TLS handshake failed: check that --cacert is the CA that issued the registrar's certificate, and that --cert/--key were issued by the CA the registrar trusts (its --tls-client-ca)"
}

// rpcError turns an error from a registrar call into a message that says
// what failed and how to fix it. what describes the attempted operation
// ("register web 10.0.0.1 (http)").
// unary validates the client flags, connects, and makes one call bounded by
// --timeout; a failure is mapped to a message naming what was attempted.
func (cf *clientFlags) unary(ctx context.Context, what string, call func(context.Context, registrarv1.RegistrarClient) error) error {
	if err := cf.validate(); err != nil {
		return err
	}
	client, done, err := cf.connect(ctx)
	if err != nil {
		return err
	}
	defer done()
	cctx, cancel := context.WithTimeout(ctx, cf.timeout)
	defer cancel()
	if err := call(cctx, client); err != nil {
		return cf.rpcError(what, err)
	}
	return nil
}

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
		if hint := cf.tlsHint(msg); hint != "" {
			return fmt.Errorf("cannot talk to registrar at %s: %s; %s", cf.addr, msg, hint)
		}
		return fmt.Errorf("cannot reach registrar at %s: %s; is \"aether registrar\" running? (set --registrar or AETHER_REGISTRAR)", cf.addr, msg)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: registrar at %s did not answer within %s (raise --timeout or AETHER_TIMEOUT)", what, cf.addr, cf.timeout)
	case codes.Canceled:
		return fmt.Errorf("%s: canceled", what)
	case codes.InvalidArgument, codes.NotFound, codes.ResourceExhausted, codes.FailedPrecondition, codes.AlreadyExists, codes.OutOfRange, codes.Aborted:
		return fmt.Errorf("%s: %s", what, msg)
	case codes.Unimplemented:
		return fmt.Errorf("%s: the registrar at %s does not implement this call (%s); is it an older version, or not an aether registrar?", what, cf.addr, msg)
	case codes.Unauthenticated:
		return fmt.Errorf("%s: refused by the registrar at %s: %s (pass a client certificate of the mesh's CA with --cert and --key, or AETHER_CERT and AETHER_KEY)", what, cf.addr, msg)
	case codes.PermissionDenied:
		return fmt.Errorf("%s: refused by the registrar at %s: %s", what, cf.addr, msg)
	default:
		return fmt.Errorf("%s: registrar at %s: %s: %s", what, cf.addr, st.Code(), msg)
	}
}
