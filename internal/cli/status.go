package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/aethermesh/aether/console"
	"github.com/aethermesh/aether/pki"
	"github.com/aethermesh/aether/server"
)

func newStatusCmd() *cobra.Command {
	var (
		addr, output string
		timeout      time.Duration
		tf           tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show a registrar's overview: readiness, backend, persistence lag, regions and clusters",
		Long: `Show the overview of one registrar, as its status page (/ui) does: the
replica, its readiness checks, its backend (kind, endpoints, health, the
persistence lag: the age of the oldest acknowledged write not yet in the
backend), the regions and clusters it holds with their endpoint and node
counts, its replication peers and xDS clients, and the events per second
of its event stream.

It reads /ui/api/overview from the registrar's HTTP port (--http-addr).
With TLS on the registrar (--tls-cert), pass --cacert; with mTLS
(--tls-client-ca) the console is for operators: pass --cert and --key of an
operator certificate (aether certs issue --operator NAME).

Exit status: 0 when the replica is ready; 1 when it is not (its snapshot
is not loaded, or persistence is stuck: the oldest unpersisted write is
older than the registrar's limit, ten --write-batch-interval and at least
10s, which is also what fails its /readyz), or when it cannot be asked.
So "aether status" works as a probe; the overview is printed either way.`,
		Example: `  aether status
  aether status --http-addr 10.0.0.5:8081 --cacert pki/ca.pem --cert pki/operator-alice.pem --key pki/operator-alice-key.pem
  aether status -o json | jq .backend.oldest_unpersisted_seconds`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "table", "json"); err != nil {
				return err
			}
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return fmt.Errorf("--http-addr %q: want host:port, the registrar's --http-addr", addr)
			}
			if timeout <= 0 {
				return fmt.Errorf("--timeout %s: must be positive (e.g. 5s)", timeout)
			}
			if err := tf.validate(); err != nil {
				return err
			}
			var ov console.Overview
			if err := fetchConsoleJSON(cmd.Context(), addr, console.OverviewPath, timeout, &tf, &ov); err != nil {
				return err
			}
			if output == "json" {
				b, err := json.MarshalIndent(ov, "", "  ")
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b); err != nil {
					return err
				}
			} else if err := writeStatus(cmd.OutOrStdout(), &ov); err != nil {
				return err
			}
			return statusVerdict(&ov)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "http-addr", server.DefaultHTTPAddr, "the registrar's HTTP address (its --http-addr), where it serves /ui")
	f.DurationVar(&timeout, "timeout", 5*time.Second, "timeout of the request")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	addTLSFlags(f, &tf)
	return cmd
}

// statusVerdict is the probe's answer: nil when the replica is ready and
// persisting, else an error saying what is wrong (exit status 1).
func statusVerdict(ov *console.Overview) error {
	var failed []string
	for _, c := range ov.Checks {
		if !c.OK {
			failed = append(failed, c.Name+": "+c.Detail)
		}
	}
	switch {
	case ov.Backend.Stuck:
		return fmt.Errorf("persistence stuck: the oldest unpersisted write is %s old (limit %s), %d pending; the backend (%s) is not taking writes",
			secs(ov.Backend.OldestUnpersistedSeconds), secs(ov.Backend.StuckAfterSeconds), ov.Backend.Pending, ov.Backend.Kind)
	case !ov.Replica.Ready && len(failed) > 0:
		return fmt.Errorf("registrar not ready: %s", strings.Join(failed, "; "))
	case !ov.Replica.Ready:
		return fmt.Errorf("registrar not ready")
	}
	return nil
}

func secs(s float64) string {
	return (time.Duration(s * float64(time.Second))).Round(time.Millisecond).String()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func writeStatus(w io.Writer, ov *console.Overview) error {
	r, b, t := ov.Replica, ov.Backend, ov.Totals
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	zone := ""
	if r.Zone != "" {
		zone = " zone " + r.Zone
	}
	fmt.Fprintf(tw, "REPLICA\t%s/%s%s\tgrpc %s\thttp %s\tversion %s\n", r.Region, r.Cluster, zone, orDash(r.GRPCAddr), orDash(r.HTTPAddr), orDash(r.Version))
	ready := yesNo(r.Ready)
	if r.ShuttingDown {
		ready += " (shutting down)"
	}
	fmt.Fprintf(tw, "READY\t%s\n", ready)
	for _, c := range ov.Checks {
		mark := "[+]"
		if !c.OK {
			mark = "[-]"
		}
		line := mark + c.Name
		if c.Detail != "" {
			line += ": " + c.Detail
		}
		fmt.Fprintln(tw, "\t"+line)
	}
	health := "healthy"
	if !b.Healthy {
		health = "flush failing: " + b.LastFlushError
	}
	fmt.Fprintf(tw, "BACKEND\t%s\t%s\t%s\n", orDash(b.Kind), orDash(strings.Join(b.Endpoints, ",")), health)
	fmt.Fprintf(tw, "PERSISTENCE\tlag %s\t%d pending\tstuck %s (limit %s)\t%d isolated\n",
		secs(b.OldestUnpersistedSeconds), b.Pending, yesNo(b.Stuck), secs(b.StuckAfterSeconds), b.Isolated)
	fmt.Fprintf(tw, "PLANE\t%d services\t%d endpoints (%d serving, %d draining)\t%d nodes\n", t.Services, t.Endpoints, t.Serving, t.Draining, t.Nodes)
	now, peak := 0, 0
	if n := len(ov.Events.PerSecond); n > 0 {
		// The last second is still filling up: the one before is "now".
		now = ov.Events.PerSecond[max(n-2, 0)]
		for _, v := range ov.Events.PerSecond {
			peak = max(peak, v)
		}
	}
	fmt.Fprintf(tw, "EVENTS\t%d total\t%d/s last second\tpeak %d/s over %ds\n", ov.Events.Total, now, peak, console.RateWindow)
	if p := ov.Propagation; p.Samples > 0 {
		peak := 0.0
		for _, v := range p.MaxMillis {
			peak = max(peak, v)
		}
		fmt.Fprintf(tw, "PROPAGATION\t%d writes of other replicas measured while a page was open\tmax %.1fms over %ds\n", p.Samples, peak, console.RateWindow)
	}
	if ov.XDS.Enabled {
		fmt.Fprintf(tw, "XDS\t%d clients\t%d synced, %d stale, %d nacked\n", ov.XDS.Clients, ov.XDS.Synced, ov.XDS.Stale, ov.XDS.NACKed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "REGION\tCLUSTER\tENDPOINTS\tSERVING\tDRAINING\tNODES")
	for _, reg := range ov.Regions {
		for _, c := range reg.Clusters {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\n", reg.Name, c.Name, c.Endpoints, c.Serving, c.Draining, c.Nodes)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if ov.Replicas.PeerWatch {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "REPLICA\tEPOCH\tPEER-WATCH\tWRITES RECEIVED")
		for _, p := range ov.Replicas.Peers {
			stream := "not connected"
			if p.Connected {
				stream = "connected"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", p.Addr, p.Epoch, stream, p.Writes)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if ov.Replication.Enabled {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PEER\tREACHABLE\tSYNCED\tLEADER\tLAG\tLEASE LEFT\tKEYS\tLAST ERROR")
		for _, p := range ov.Replication.Peers {
			leader := orDash(p.Leader)
			if p.IsLeader {
				leader = "this replica"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", p.Region, yesNo(p.Reachable), yesNo(p.Synced), leader,
				secs(p.LagSeconds), secs(p.LeaseTTLRemainingSeconds), p.KeysMirrored, orDash(p.LastError))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// fetchConsoleJSON GETs one of the console's JSON documents into v; its
// errors say what to change, by flag.
func fetchConsoleJSON(ctx context.Context, addr, path string, timeout time.Duration, tf *tlsFlags, v any) error {
	scheme, tr := "http", &http.Transport{}
	if tf.enabled() {
		cfg, err := pki.ClientTLSConfig(tf.cacert, tf.cert, tf.key)
		if err != nil {
			return fmt.Errorf("--cacert/--cert/--key: %w", err)
		}
		scheme, tr.TLSClientConfig = "https", cfg
	}
	defer tr.CloseIdleConnections()
	url := scheme + "://" + addr + path
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("--http-addr %q: %v", addr, err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "first record does not look like a TLS handshake"):
			return fmt.Errorf("GET %s: the registrar's HTTP port is plaintext: leave --cacert, --cert and --key out (and AETHER_CACERT, AETHER_CERT, AETHER_KEY)", url)
		case strings.Contains(msg, "x509") || strings.Contains(msg, "tls:"):
			return fmt.Errorf("GET %s: %v: check that --cacert is the CA that issued the registrar's certificate, and --cert one it trusts", url, err)
		case ctx.Err() != nil:
			return fmt.Errorf("GET %s: no answer within %s (raise --timeout or AETHER_TIMEOUT)", url, timeout)
		}
		return fmt.Errorf("cannot reach the registrar's HTTP port at %s: %v; is \"aether registrar\" running there with --http-addr %s? (set --http-addr or AETHER_HTTP_ADDR)", addr, err, addr)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("GET %s: %v", url, err)
	}
	switch {
	case resp.StatusCode == http.StatusBadRequest && strings.Contains(string(body), "HTTPS server"):
		return fmt.Errorf("GET %s: the registrar's HTTP port serves TLS: pass --cacert (or AETHER_CACERT) with the CA of its certificate", url)
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return fmt.Errorf("GET %s: %s: pass --cert and --key of an operator certificate (aether certs issue --operator NAME)", url, strings.TrimSpace(string(body)))
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("GET %s: 404: the server at --http-addr %s serves no console; is it an aether registrar's --http-addr (not an agent's)?", url, addr)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: not the console's JSON (%v); is --http-addr an aether registrar's --http-addr?", url, err)
	}
	return nil
}
