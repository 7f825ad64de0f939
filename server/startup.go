package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registrar"
)

// startup is what a Server waits for before it serves: which step it is
// at, and the last thing that went wrong at that step. Until ready, every
// call of the Registrar service is answered UNAVAILABLE with that reason
// (unary and stream below), so a client learns at once that this replica
// cannot answer yet and why, and may try another; gRPC health and
// reflection answer as usual (health says NOT_SERVING).
type startup struct {
	log     *slog.Logger
	isReady atomic.Bool

	mu       sync.Mutex
	what     string // "loading its snapshot from etcd at ..."
	probeErr error  // the last connection probe's failure (nil: etcd answers)
	listErr  error  // the last listing's failure
	failed   error  // the start failed for good
	gaveUp   error  // the start was abandoned (its context ended): not a failure
	logged   string // the reason last logged, so a steady one is logged once
}

func newStartup(log *slog.Logger) *startup {
	return &startup{log: log, what: "starting"}
}

// waitFor moves on to the next step; its errors start afresh.
func (s *startup) waitFor(what string) {
	s.mu.Lock()
	s.what, s.probeErr, s.listErr = what, nil, nil
	s.mu.Unlock()
}

func (s *startup) ready() { s.isReady.Store(true) }

func (s *startup) fail(err error) {
	s.mu.Lock()
	s.failed = err
	s.mu.Unlock()
	s.log.Error("registrar failed to start", "err", err)
}

// abandon records a start ended by its context (shutdown, or the caller's
// deadline): what it was waiting for stays the reason.
func (s *startup) abandon(err error) {
	s.mu.Lock()
	s.gaveUp = err
	r := s.reasonLocked()
	s.mu.Unlock()
	s.log.Info("start abandoned before the registrar was ready", "waiting_for", r, "err", err)
}

// outcome is what a start that has ended came to: nil when ready.
func (s *startup) outcome() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.failed != nil:
		return s.failed
	case s.gaveUp != nil:
		return fmt.Errorf("registrar not ready: %s: start abandoned: %w", s.reasonLocked(), s.gaveUp)
	}
	return nil
}

// failure is why the start failed, nil if it did not (yet).
func (s *startup) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
}

// reason says what the server waits for, with the last error on the way.
func (s *startup) reason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reasonLocked()
}

func (s *startup) reasonLocked() string {
	switch {
	case s.failed != nil:
		return "registrar failed to start: " + s.failed.Error()
	case s.probeErr != nil:
		return fmt.Sprintf("registrar is %s: %v", s.what, s.probeErr)
	case s.listErr != nil:
		return fmt.Sprintf("registrar is %s: %v", s.what, s.listErr)
	}
	return fmt.Sprintf("registrar is %s", s.what)
}

// note records the outcome of a probe or a listing and logs the reason
// when it changed: the log says what callers are told.
func (s *startup) note(probe bool, err error) {
	s.mu.Lock()
	if probe {
		s.probeErr = err
	} else {
		s.listErr = err
	}
	r := s.reasonLocked()
	changed := r != s.logged && (s.probeErr != nil || s.listErr != nil)
	if changed {
		s.logged = r
	}
	s.mu.Unlock()
	if changed && !s.isReady.Load() {
		s.log.Warn(r + "; until it has, gRPC calls get UNAVAILABLE and /readyz fails")
	}
}

// status is the UNAVAILABLE status of a call made before the server is
// ready, nil once it is.
func (s *startup) status() error {
	if s.isReady.Load() {
		return nil
	}
	return status.Error(codes.Unavailable, s.reason()+"; retry (this call changed nothing)")
}

var registrarMethods = "/" + registrarv1.Registrar_ServiceDesc.ServiceName + "/"

func (s *startup) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if strings.HasPrefix(info.FullMethod, registrarMethods) {
		if err := s.status(); err != nil {
			return nil, err
		}
	}
	return handler(ctx, req)
}

func (s *startup) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if strings.HasPrefix(info.FullMethod, registrarMethods) {
		if err := s.status(); err != nil {
			return err
		}
	}
	return handler(srv, ss)
}

// probe asks every etcd endpoint, once a second until ctx ends, whether
// it answers, over a connection of its own that fails fast. The etcd
// client waits for a connection and retries inside the listing's timeout,
// so a failed listing says only "context deadline exceeded", and only
// after that timeout; a fail-fast call says at once what is wrong (refused,
// unresolvable host, failed TLS handshake).
func (s *startup) probe(ctx context.Context, endpoints []string, tlsCfg *tls.Config) {
	var conns []*grpc.ClientConn
	var names []string
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for _, ep := range endpoints {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			continue // unix sockets and the like: the listing's error will do
		}
		creds := insecure.NewCredentials()
		if u.Scheme == "https" || tlsCfg != nil {
			cfg := &tls.Config{MinVersion: tls.VersionTLS12}
			if tlsCfg != nil {
				cfg = tlsCfg.Clone()
			}
			creds = credentials.NewTLS(cfg)
		}
		c, err := grpc.NewClient("passthrough:///"+u.Host, grpc.WithTransportCredentials(creds))
		if err != nil {
			continue
		}
		conns, names = append(conns, c), append(names, ep)
	}
	if len(conns) == 0 {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		var errs []string
		for i, c := range conns {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := healthpb.NewHealthClient(c).Check(pctx, &healthpb.HealthCheckRequest{})
			cancel()
			if err == nil {
				errs = nil // one answering endpoint is enough for the listing
				break
			}
			msg := status.Convert(err).Message()
			if len(conns) > 1 {
				msg = names[i] + ": " + msg // the reason names them all already
			}
			errs = append(errs, msg)
		}
		if ctx.Err() != nil {
			return
		}
		var err error
		if len(errs) > 0 {
			err = errors.New(strings.Join(errs, "; "))
		}
		s.note(true, err)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// startupBackend is the registrar's backend, set once etcd is connected,
// reporting every listing's outcome to the start-up status.
type startupBackend struct {
	registrar.Backend
	startup *startup
}

func (b *startupBackend) List(ctx context.Context) (backend.Listing, error) {
	l, err := b.Backend.List(ctx)
	if !b.startup.isReady.Load() {
		b.startup.note(false, err)
	}
	return l, err
}
