package cli

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/internal/testutil/regtest"
	"github.com/aethermesh/aether/internal/testutil/wait"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registry"
	"github.com/aethermesh/aether/server"
)

// Helpers for running CLI commands against a real registrar: server.Start
// over an etcdtest member, reached over a real gRPC socket.

// The origin of the registrars the tests start, matching fixture().
const (
	testRegion  = "eu"
	testCluster = "c1"
)

// versionRE is the shape of a registrar's version token: <epoch>:<sequence>.
var versionRE = regexp.MustCompile(`^[0-9a-f]{12}:[0-9]+$`)

// liveRegistrar is a registrar started for one test, with a gRPC client of
// its own for seeding and inspecting it.
type liveRegistrar struct {
	srv       *server.Server
	c         registrarv1.RegistrarClient
	closeOnce sync.Once
}

// startRegistrar starts a registrar of testRegion/testCluster on etcd; mut
// adjusts its options. It is closed when t ends.
func startRegistrar(t *testing.T, etcd *etcdtest.Cluster, mut ...func(*server.Config)) *liveRegistrar {
	t.Helper()
	o := server.Config{
		EtcdEndpoints: etcd.Endpoints(),
		GRPCAddr:      "127.0.0.1:0",
		HTTPAddr:      "127.0.0.1:0",
		Options: registrar.Options{
			ClusterName: testCluster,
			Region:      testRegion,
			Logger:      regtest.QuietLogger(),
		},
	}
	for _, m := range mut {
		m(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv, err := server.Start(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	r := &liveRegistrar{srv: srv}
	t.Cleanup(r.close)
	r.c = regtest.Dial(t, srv.GRPCAddr())
	return r
}

func (r *liveRegistrar) addr() string { return r.srv.GRPCAddr() }

// close shuts the registrar down as a signal would: streams end with
// UNAVAILABLE, queued writes are flushed.
func (r *liveRegistrar) close() {
	r.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = r.srv.Close(ctx)
	})
}

// register registers endpoints through the gRPC API and returns the version
// after the last one.
func (r *liveRegistrar) register(t *testing.T, eps ...*registryv1.ServiceEndpoint) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var v string
	for _, ep := range eps {
		resp, err := r.c.RegisterEndpoint(ctx, &registrarv1.RegisterEndpointRequest{Endpoint: ep})
		if err != nil {
			t.Fatalf("register %s %s: %v", ep.GetService(), ep.GetIp(), err)
		}
		v = resp.GetVersion()
	}
	return v
}

// list is the registrar's own answer to ListAllEndpoints.
func (r *liveRegistrar) list(t *testing.T, services ...string) ([]*registryv1.ServiceEndpoint, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.c.ListAllEndpoints(ctx, &registrarv1.ListAllEndpointsRequest{Services: services})
	if err != nil {
		t.Fatalf("ListAllEndpoints: %v", err)
	}
	return resp.GetEndpoints(), resp.GetVersion()
}

// find returns the endpoint of this registrar's origin with the given
// identity as the registrar lists it, or nil.
func (r *liveRegistrar) find(t *testing.T, service string, proto registryv1.Protocol, ip string) *registryv1.ServiceEndpoint {
	t.Helper()
	eps, _ := r.list(t, service)
	for _, ep := range eps {
		if ep.GetProtocol() == proto && ep.GetIp() == ip && ep.GetRegion() == r.srv.Options().Region && ep.GetCluster() == r.srv.Options().ClusterName {
			return ep
		}
	}
	return nil
}

// metric reads one unlabelled counter or gauge from the registrar's /metrics.
func (r *liveRegistrar) metric(t *testing.T, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + r.srv.HTTPAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", name, err)
			}
			return f
		}
	}
	return 0
}

// versionSeq is the sequence part of a version token.
func versionSeq(t *testing.T, v string) uint64 {
	t.Helper()
	if !versionRE.MatchString(v) {
		t.Fatalf("version %q is not <epoch>:<sequence>", v)
	}
	_, seq, _ := strings.Cut(v, ":")
	n, _ := strconv.ParseUint(seq, 10, 64)
	return n
}

// versionEpoch is the epoch part of a version token.
func versionEpoch(v string) string {
	epoch, _, _ := strings.Cut(v, ":")
	return epoch
}

// atOrAfter reports whether version v is of the same registrar incarnation
// as ref and not before it.
func atOrAfter(t *testing.T, v, ref string) bool {
	t.Helper()
	return versionEpoch(v) == versionEpoch(ref) && versionSeq(t, v) >= versionSeq(t, ref)
}

// waitFor waits for a condition; see package wait.
var waitFor = wait.For

// streamOut is the stdout of a command running in the background: safe to
// read while the command writes, and able to hold writes back, as a slow
// pipe reader would.
type streamOut struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	gate    chan struct{} // non-nil: writes wait until it is closed
	waiting bool          // a write is waiting at the gate
}

func (s *streamOut) Write(p []byte) (int, error) {
	s.mu.Lock()
	g := s.gate
	if g != nil {
		s.waiting = true
	}
	s.mu.Unlock()
	if g != nil {
		<-g
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *streamOut) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// hold makes writes block until release.
func (s *streamOut) hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate == nil {
		s.gate = make(chan struct{})
		s.waiting = false
	}
}

func (s *streamOut) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gate != nil {
		close(s.gate)
		s.gate = nil
	}
}

// blocked reports whether a write is held back.
func (s *streamOut) blocked() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gate != nil && s.waiting
}

// bgRun is a CLI command running in the background (watch).
type bgRun struct {
	out    *streamOut
	stderr bytes.Buffer
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// startCLI runs the command tree in the background, like runCLI, with env as
// the whole environment. Cancel it with stop; it is stopped when t ends.
func startCLI(t *testing.T, env map[string]string, args ...string) *bgRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	b := &bgRun{out: &streamOut{}, cancel: cancel, done: make(chan struct{})}
	root := newRoot(deps{
		stdout: b.out,
		stderr: &b.stderr,
		lookupEnv: func(name string) (string, bool) {
			v, ok := env[name]
			return v, ok
		},
		serve: func(context.Context, server.Config) error {
			return errors.New("startCLI does not run a registrar")
		},
	})
	root.SetArgs(args)
	go func() {
		defer close(b.done)
		b.err = root.ExecuteContext(ctx)
	}()
	t.Cleanup(func() {
		b.out.release()
		cancel()
		<-b.done
	})
	return b
}

// wait waits for the command to end by itself and returns its error.
func (b *bgRun) wait(t *testing.T) error {
	t.Helper()
	select {
	case <-b.done:
		return b.err
	case <-time.After(20 * time.Second):
		t.Fatalf("command still running; stdout so far:\n%s", b.out.String())
		return nil
	}
}

// stop interrupts the command (Ctrl-C) and returns its error.
func (b *bgRun) stop(t *testing.T) error {
	t.Helper()
	b.cancel()
	return b.wait(t)
}

// waitOutput waits until stdout satisfies cond.
func (b *bgRun) waitOutput(t *testing.T, what string, cond func(string) bool) {
	t.Helper()
	wait.ForState(t, what, 10*time.Second, func() (bool, string) {
		select {
		case <-b.done:
			// Nothing more will be written: fail now rather than at the
			// deadline.
			if !cond(b.out.String()) {
				t.Fatalf("command ended (%v) before %s; stdout:\n%s", b.err, what, b.out.String())
			}
			return true, ""
		default:
		}
		out := b.out.String()
		return cond(out), "stdout:\n" + out
	})
}

// sameEndpoint compares the attributes a client controls, leaving out the
// timestamps the registrar sets.
func sameEndpoint(a, b *registryv1.ServiceEndpoint) bool {
	return registry.IDOf(a) == registry.IDOf(b) && registry.SameAttributes(a, b)
}
