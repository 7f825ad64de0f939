package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func newWatchCmd() *cobra.Command {
	var services []string
	var fromVersion, output string
	var cf *clientFlags
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "Stream endpoint changes",
		Long: `Stream the endpoints of some or all services: first a snapshot, then every
change, until interrupted (Ctrl-C exits with status 0).

-o text prints a "SNAPSHOT <n> endpoints" header followed by the endpoints,
then one line per change (ADDED, UPDATED, REMOVED). -o json prints each
EndpointEvent as one line of JSON with the API's field names; a large
snapshot arrives as several FULL_SNAPSHOT events, all but the last with
"snapshot_continues": true.

--from-version resumes after the given version (from an earlier watch or
"aether list -o json"): the registrar sends only the missed changes if it
still has them, and a fresh snapshot otherwise.`,
		Example: `  aether watch
  aether watch --service web -o json
  aether watch --service web --from-version 5f1c2a9b0e3d:1042`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output, "text", "json"); err != nil {
				return err
			}
			if err := validateServices(services); err != nil {
				return err
			}
			if err := cf.validate(); err != nil {
				return err
			}
			client, done, err := cf.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			return runWatch(cmd.Context(), client, cf, &registrarv1.WatchEndpointsRequest{
				LastVersion: fromVersion,
				Services:    services,
			}, &watchPrinter{w: cmd.OutOrStdout(), json: output == "json"})
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&services, "service", nil, "only these services; repeatable or comma-separated (default: all)")
	f.StringVar(&fromVersion, "from-version", "", "resume after this version instead of starting with a snapshot")
	f.StringVarP(&output, "output", "o", "text", "output format: text or json")
	cf = addClientFlags(cmd)
	return cmd
}

// runWatch streams events to p until ctx is cancelled (nil) or the stream
// fails (an error saying how to resume). --timeout bounds the wait for the
// first event; after that the stream may be idle for any time.
func runWatch(ctx context.Context, client registrarv1.RegistrarClient, cf *clientFlags, req *registrarv1.WatchEndpointsRequest, p *watchPrinter) error {
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// first is waiting until the first event arrives or the timer fires,
	// whichever wins; the loser sees the winner's state.
	const (
		waiting int32 = iota
		received
		timedOut
	)
	var first atomic.Int32
	timer := time.AfterFunc(cf.timeout, func() {
		if first.CompareAndSwap(waiting, timedOut) {
			cancel()
		}
	})
	defer timer.Stop()

	fail := func(err error) error {
		if ctx.Err() != nil {
			return nil // interrupted: a normal end of a watch
		}
		var msg error
		switch {
		case first.Load() == timedOut:
			msg = fmt.Errorf("watch endpoints: registrar at %s sent nothing within %s (raise --timeout or AETHER_TIMEOUT)", cf.addr, cf.timeout)
		case errors.Is(err, io.EOF):
			msg = fmt.Errorf("watch endpoints: the registrar at %s ended the stream", cf.addr)
		case status.Code(err) == codes.ResourceExhausted:
			msg = fmt.Errorf("watch endpoints: cut off by the registrar because this client fell behind: %s", status.Convert(err).Message())
		case status.Code(err) == codes.InvalidArgument && req.GetLastVersion() != "":
			msg = fmt.Errorf("watch endpoints: --from-version %q: %s", req.GetLastVersion(), status.Convert(err).Message())
		default:
			msg = cf.rpcError("watch endpoints", err)
		}
		if p.lastVersion != "" {
			msg = fmt.Errorf("%w; last version %s: resume with --from-version %s", msg, p.lastVersion, p.lastVersion)
		}
		return msg
	}

	stream, err := client.WatchEndpoints(streamCtx, req)
	if err != nil {
		return fail(err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return fail(err)
		}
		if first.Load() != received && !first.CompareAndSwap(waiting, received) {
			return fail(context.DeadlineExceeded) // the timer fired first
		}
		if err := p.handle(ev); err != nil {
			return err
		}
	}
}

// watchPrinter renders watch events and tracks the resume version: the
// version of the last event fully applied (a snapshot counts once its last
// part has arrived).
type watchPrinter struct {
	w    io.Writer
	json bool

	snapshot    []*registryv1.ServiceEndpoint // text mode: parts so far
	lastVersion string
}

func (p *watchPrinter) handle(ev *registrarv1.EndpointEvent) error {
	partial := ev.GetType() == registrarv1.EndpointEvent_FULL_SNAPSHOT && ev.GetSnapshotContinues()
	if !partial {
		p.lastVersion = ev.GetVersion()
	}
	if p.json {
		b, err := eventJSON(ev)
		if err != nil {
			return fmt.Errorf("encode event at version %s: %w", ev.GetVersion(), err)
		}
		_, err = p.w.Write(append(b, '\n'))
		return err
	}

	switch ev.GetType() {
	case registrarv1.EndpointEvent_FULL_SNAPSHOT:
		p.snapshot = append(p.snapshot, ev.GetEndpoints()...)
		if partial {
			return nil
		}
		eps := sortedEndpoints(p.snapshot)
		p.snapshot = nil
		if _, err := fmt.Fprintf(p.w, "SNAPSHOT %d endpoints v=%s\n", len(eps), ev.GetVersion()); err != nil {
			return err
		}
		for _, ep := range eps {
			if _, err := fmt.Fprintf(p.w, "  %s\n", endpointLine(ep)); err != nil {
				return err
			}
		}
		return nil
	case registrarv1.EndpointEvent_PROGRESS:
		return nil // a bookmark: nothing changed
	default:
		line := eventTypeName(ev.GetType())
		if ep := ev.GetEndpoint(); ep != nil {
			line += " " + endpointLine(ep)
		}
		_, err := fmt.Fprintf(p.w, "%s v=%s\n", line, ev.GetVersion())
		return err
	}
}
