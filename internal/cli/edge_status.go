package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	edgev1 "github.com/aethermesh/aether/api/edge/v1"
)

// newEdgeStatusCmd is `aether edge status`: one replica's view of its
// peers, from the extension API (aether.edge.v1.Edge/ReplicationStatus
// asked about the replica's heads).
func newEdgeStatusCmd() *cobra.Command {
	var endpoint, cacert, cert, key string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show an edge replica's peers: connected, last sync, changes behind",
		Long: `Asks one edge replica (its client URL) what sync has learned of each of its
peers: whether its push stream to the peer is open, when the peer last
acknowledged, how many of the replica's changes the peer is not known to
hold, and whether the peer holds the replica's current heads (everything
the replica has).`,
		Example: `  aether edge status --endpoint http://127.0.0.1:2379`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			return edgeStatus(ctx, cmd, endpoint, cacert, cert, key)
		},
	}
	f := cmd.Flags()
	f.StringVar(&endpoint, "endpoint", "http://127.0.0.1:2379", "client URL of the replica to ask")
	f.StringVar(&cacert, "cacert", "", "CA bundle to verify an https endpoint")
	f.StringVar(&cert, "cert", "", "client certificate for an https endpoint")
	f.StringVar(&key, "key", "", "client key for an https endpoint")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for the answer")
	return cmd
}

func edgeStatus(ctx context.Context, cmd *cobra.Command, endpoint, cacert, cert, key string) error {
	conn, err := dialEdge(endpoint, cacert, cert, key)
	if err != nil {
		return err
	}
	defer conn.Close()
	ext := edgev1.NewEdgeClient(conn)
	heads, err := ext.Heads(ctx, &edgev1.HeadsRequest{})
	if err != nil {
		return fmt.Errorf("heads of %s: %w", endpoint, err)
	}
	st, err := ext.ReplicationStatus(ctx, &edgev1.ReplicationStatusRequest{Hashes: heads.Heads})
	if err != nil {
		return fmt.Errorf("replication status of %s: %w", endpoint, err)
	}
	h := st.GetHeader()
	out := cmd.OutOrStdout()
	fmt.Fprintf(out, "member %x  revision %d  index %d  heads %d\n", h.GetMemberId(), h.GetRevision(), h.GetIndex(), len(heads.Heads))
	if len(st.Peers) == 0 {
		fmt.Fprintln(out, "no peers")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PEER\tMEMBER\tCONNECTED\tLAST SYNC\tCHANGES BEHIND\tHOLDS HEADS")
	for _, p := range st.Peers {
		last := "never"
		if p.LastSyncUnixNano != 0 {
			last = time.Unix(0, p.LastSyncUnixNano).UTC().Format(time.RFC3339Nano)
		}
		holds := len(p.Has) > 0
		for _, ok := range p.Has {
			holds = holds && ok
		}
		fmt.Fprintf(tw, "%s\t%x\t%v\t%s\t%d\t%s\n", p.Name, p.MemberId, p.Connected, last, p.ChangesBehind, yesNo(holds))
	}
	return tw.Flush()
}

// dialEdge connects to a replica's client URL (https: with the given CA,
// certificate and key).
func dialEdge(endpoint, cacert, cert, key string) (*grpc.ClientConn, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--endpoint %q: want a URL such as http://127.0.0.1:2379", endpoint)
	}
	creds := insecure.NewCredentials()
	if u.Scheme == "https" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if cacert != "" {
			pem, err := os.ReadFile(cacert)
			if err != nil {
				return nil, fmt.Errorf("--cacert: %w", err)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("--cacert %s: no certificate found", cacert)
			}
		}
		if cert != "" || key != "" {
			c, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				return nil, fmt.Errorf("--cert/--key: %w", err)
			}
			tc.Certificates = []tls.Certificate{c}
		}
		creds = credentials.NewTLS(tc)
	}
	conn, err := grpc.NewClient(u.Host, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", endpoint, err)
	}
	return conn, nil
}
