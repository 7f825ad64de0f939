package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spf13/cobra"

	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/server"
	"github.com/aethermesh/aether/xds"
	"github.com/aethermesh/aether/xds/bootstrap"
)

func newXDSCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "xds",
		Short: "Tools for the xDS clients of Aether (proxyless gRPC, proxies)",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newXDSBootstrapCmd(), newXDSStatusCmd())
	return cmd
}

func newXDSBootstrapCmd() *cobra.Command {
	var c bootstrap.Config
	var out string
	cmd := &cobra.Command{
		Use:   "bootstrap",
		Short: "Print the xDS bootstrap file a proxyless gRPC client needs to reach Aether",
		Long: `Print the xDS bootstrap file (JSON) with which a proxyless gRPC client
finds Aether's xDS server: grpc-go, grpc-java and the other gRPC libraries
read it from the file named by GRPC_XDS_BOOTSTRAP, then resolve
"xds:///<service>" targets through it.

--server is the xDS server: the node's agent (its --xds-addr, loopback) or,
for a client that runs beside no agent, a registrar's --xds-addr. --node
names the client to the server (the agent's node name is a good choice);
--region and --zone are its locality, by which endpoints are ranked: its
own zone first, then its region, then the rest. --ca makes the channel TLS
(verifying the server); --cert and --key add the client's certificate for
mutual TLS.`,
		Example: `  aether xds bootstrap --node node-a --zone eu-west-1a --region eu-west-1 > /etc/aether/xds.json
  GRPC_XDS_BOOTSTRAP=/etc/aether/xds.json ./my-grpc-client   # dials xds:///web`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := bootstrap.JSON(c)
			if err != nil {
				return fmt.Errorf("xds bootstrap: %w", flagOf(err))
			}
			b = append(b, '\n')
			if out == "" || out == "-" {
				_, err = cmd.OutOrStdout().Write(b)
				return err
			}
			if err := os.WriteFile(out, b, 0o644); err != nil {
				return fmt.Errorf("xds bootstrap: --out: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Server, "server", "127.0.0.1:15010", "host:port of the xDS server (an agent's or a registrar's --xds-addr)")
	f.StringVar(&c.Node, "node", "", "node id the client presents (required)")
	f.StringVar(&c.Region, "region", "", "the client's region (optional; ranks endpoints)")
	f.StringVar(&c.Zone, "zone", "", "the client's zone (optional; ranks endpoints)")
	f.StringVar(&c.CAFile, "ca", "", "CA certificate that verifies the server (makes the channel TLS)")
	f.StringVar(&c.CertFile, "cert", "", "client certificate for mutual TLS (with --key and --ca)")
	f.StringVar(&c.KeyFile, "key", "", "client private key (with --cert)")
	f.StringVarP(&out, "out", "o", "", "write the file here instead of standard output")
	return cmd
}

// flagOf names the flag behind a bootstrap error: the package names its
// fields as the command names its flags.
func flagOf(err error) error {
	var fe *bootstrap.FieldError
	if errors.As(err, &fe) {
		return fmt.Errorf("--%s %s", fe.Field, fe.Reason)
	}
	return err
}

func newXDSStatusCmd() *cobra.Command {
	var (
		addr, output string
		timeout      time.Duration
		tf           tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show every xDS client connected to a registrar or an agent and whether it runs the latest config",
		Long: `Show every xDS stream open on a registrar's or an agent's --xds-addr, as
istioctl proxy-status does: the client's node id, its locality, the protocol variant
(sotw: state of the world, delta: incremental; with the per-type service
when the stream is not ADS), and for each resource type (CDS, EDS, LDS,
RDS) its state and version:

  SYNCED    the client ACKed the last version sent (shown)
  STALE     a version was sent (shown) and not ACKed yet
  NACKED    the client rejected the version shown and runs on the one it
            last accepted; the error detail follows the table. The
            rejected version is not sent again until the config changes.
  NOT_SENT  the client asked and was sent nothing yet
  -         the stream does not carry the type

It reads /xds/status from the HTTP port (--http-addr) of a registrar or
of an agent, which serve it only with --xds-addr; both serve the same
document. With TLS on the registrar (--tls-cert), pass --cacert; the
HTTP port asks for no client certificate. An agent's HTTP port is
plaintext (its --xds-tls-* flags secure the xDS port only).`,
		Example: `  aether xds status
  aether xds status --http-addr 10.0.0.5:8081 --cacert pki/ca.pem -o json
  aether xds status --http-addr 127.0.0.1:15000   # an agent's --http-addr`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "table", "json"); err != nil {
				return err
			}
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return fmt.Errorf("--http-addr %q: want host:port, the registrar's or agent's --http-addr", addr)
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: must be positive (e.g. 5s)", timeout)
			}
			if err := tf.validate(); err != nil {
				return err
			}
			doc, err := fetchXDSStatus(cmd.Context(), addr, timeout, &tf)
			if err != nil {
				return err
			}
			if output == "json" {
				b, err := json.MarshalIndent(doc, "", "  ")
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
				return err
			}
			if len(doc.Clients) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no xDS client is connected to the xDS server whose HTTP port is --http-addr "+addr)
			}
			return writeXDSStatus(cmd.OutOrStdout(), doc)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "http-addr", server.DefaultHTTPAddr, "the HTTP address (--http-addr) of the registrar or agent, where it serves /xds/status")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "timeout of the request")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	addTLSFlags(f, &tf)
	return cmd
}

// fetchXDSStatus GETs /xds/status; its errors say what to change, by flag.
func fetchXDSStatus(ctx context.Context, addr string, timeout time.Duration, tf *tlsFlags) (*xds.StatusDocument, error) {
	scheme, tr := "http", &http.Transport{}
	if tf.enabled() {
		cfg, err := pki.ClientTLSConfig(tf.cacert, tf.cert, tf.key)
		if err != nil {
			return nil, fmt.Errorf("--cacert/--cert/--key: %w", err)
		}
		scheme, tr.TLSClientConfig = "https", cfg
	}
	defer tr.CloseIdleConnections()
	url := scheme + "://" + addr + "/xds/status"
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("--http-addr %q: %v", addr, err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "first record does not look like a TLS handshake"):
			return nil, fmt.Errorf("GET %s: the HTTP port is plaintext (an agent's always is): leave --cacert, --cert and --key out (and AETHER_CACERT, AETHER_CERT, AETHER_KEY)", url)
		case strings.Contains(msg, "x509") || strings.Contains(msg, "tls:"):
			return nil, fmt.Errorf("GET %s: %v: check that --cacert is the CA that issued the registrar's certificate", url, err)
		case ctx.Err() != nil:
			return nil, fmt.Errorf("GET %s: no answer within %s (raise --timeout or AETHER_TIMEOUT)", url, timeout)
		}
		return nil, fmt.Errorf("cannot reach the HTTP port at %s: %v; is \"aether registrar\" or \"aether agent\" running there with --http-addr %s? (set --http-addr or AETHER_HTTP_ADDR to its --http-addr)", addr, err, addr)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %v", url, err)
	}
	switch {
	case resp.StatusCode == http.StatusBadRequest && strings.Contains(string(body), "HTTPS server"):
		return nil, fmt.Errorf("GET %s: the registrar's HTTP port serves TLS: pass --cacert (or AETHER_CACERT) with the CA of its certificate", url)
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("the registrar or agent at --http-addr %s serves no xDS (no /xds/status): start it with --xds-addr to serve xDS clients", addr)
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	var doc xds.StatusDocument
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("GET %s: not an xDS status document (%v); is --http-addr an aether registrar's or agent's --http-addr?", url, err)
	}
	return &doc, nil
}

// xdsColumns are the status table's type columns, in istioctl's order.
var xdsColumns = []struct{ name, typeURL string }{
	{"CDS", resourcev3.ClusterType},
	{"EDS", resourcev3.EndpointType},
	{"LDS", resourcev3.ListenerType},
	{"RDS", resourcev3.RouteType},
}

func writeXDSStatus(w io.Writer, doc *xds.StatusDocument) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "NODE\tLOCALITY\tVARIANT")
	for _, c := range xdsColumns {
		fmt.Fprint(tw, "\t"+c.name)
	}
	fmt.Fprintln(tw)
	var nacks []string
	for _, c := range doc.Clients {
		variant := c.Variant
		if c.Service != "ads" {
			variant += " " + c.Service
		}
		fmt.Fprintf(tw, "%s\t%s\t%s", orDash(c.Node), localityString(c.Locality), variant)
		for _, col := range xdsColumns {
			ts, ok := c.Types[col.typeURL]
			fmt.Fprint(tw, "\t"+typeCell(ts, ok))
			if ok && ts.State == xds.NACKed && ts.LastNACK != nil {
				nacks = append(nacks, fmt.Sprintf("%s %s: version %s rejected at %s (runs on %s): %s", orDash(c.Node), col.name,
					ts.LastNACK.Version, ts.LastNACK.At.UTC().Format(time.RFC3339), orDash(ts.AckedVersion), ts.LastNACK.Detail))
			}
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(nacks) > 0 {
		fmt.Fprintln(w, "\nNACKED:")
		for _, n := range nacks {
			fmt.Fprintln(w, "  "+n)
		}
	}
	return nil
}

// typeCell is a type's state and the version that goes with it: the one
// the client runs (SYNCED), waits on (STALE) or rejected (NACKED).
func typeCell(ts xds.TypeStatus, ok bool) string {
	switch {
	case !ok:
		return "-"
	case ts.State == xds.Synced:
		return "SYNCED " + ts.AckedVersion
	case ts.State == xds.Stale:
		return "STALE " + ts.SentVersion
	case ts.State == xds.NACKed:
		return "NACKED " + ts.SentVersion
	}
	return string(ts.State)
}

func localityString(l *xds.NodeLocality) string {
	if l == nil {
		return "-" // none sent: served as the server's own (the registrar's or agent's)
	}
	s := l.Region + "/" + l.Zone
	if l.SubZone != "" {
		s += "/" + l.SubZone
	}
	return s
}
