package cli

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func TestUnreachableRegistrar(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"list"},
		{"watch"},
		{"register", "--service", "web", "--ip", "10.0.0.1", "--port", "80"},
		{"deregister", "--service", "web", "--ip", "10.0.0.1"},
	} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel()
			addr := unusedAddr(t)
			start := time.Now()
			res := runCLI(t, nil, nil, append(args, "--registrar", addr, "--timeout", "3s")...)
			elapsed := time.Since(start)
			want := "cannot reach registrar at " + addr + ": "
			if res.err == nil || !strings.Contains(res.err.Error(), want) {
				t.Fatalf("error %v\nwant it to contain %q", res.err, want)
			}
			if !strings.Contains(res.err.Error(), `is "aether registrar" running? (set --registrar or AETHER_REGISTRAR)`) {
				t.Errorf("error %q lacks the fix", res.err)
			}
			if elapsed >= 3*time.Second {
				t.Errorf("took %s, more than --timeout", elapsed)
			}
		})
	}
}

// TestSilentRegistrar: a peer that accepts but never speaks gRPC runs into
// --timeout.
func TestSilentRegistrar(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cmd, want string
	}{
		{"list", "list endpoints: registrar at %s did not answer within 300ms (raise --timeout or AETHER_TIMEOUT)"},
		{"watch", "watch endpoints: registrar at %s sent nothing within 300ms (raise --timeout or AETHER_TIMEOUT)"},
	} {
		t.Run(tc.cmd, func(t *testing.T) {
			t.Parallel()
			s := newSentinel(t)
			res := runCLI(t, nil, nil, tc.cmd, "--registrar", s.addr(), "--timeout", "300ms")
			want := strings.Replace(tc.want, "%s", s.addr(), 1)
			if res.err == nil || res.err.Error() != want {
				t.Fatalf("error %v\nwant %s", res.err, want)
			}
		})
	}
}

// fakeRegistrar is a scripted Registrar server for client-side tests.
type fakeRegistrar struct {
	registrarv1.UnimplementedRegistrarServer
	register func(*registrarv1.RegisterEndpointRequest) (*registrarv1.RegisterEndpointResponse, error)
	list     func(*registrarv1.ListAllEndpointsRequest) (*registrarv1.ListAllEndpointsResponse, error)
	watch    func(*registrarv1.WatchEndpointsRequest, grpc.ServerStreamingServer[registrarv1.EndpointEvent]) error
	unreg    func(*registrarv1.UnregisterEndpointRequest) (*registrarv1.UnregisterEndpointResponse, error)
}

func (f *fakeRegistrar) RegisterEndpoint(_ context.Context, r *registrarv1.RegisterEndpointRequest) (*registrarv1.RegisterEndpointResponse, error) {
	return f.register(r)
}

func (f *fakeRegistrar) UnregisterEndpoint(_ context.Context, r *registrarv1.UnregisterEndpointRequest) (*registrarv1.UnregisterEndpointResponse, error) {
	return f.unreg(r)
}

func (f *fakeRegistrar) ListAllEndpoints(_ context.Context, r *registrarv1.ListAllEndpointsRequest) (*registrarv1.ListAllEndpointsResponse, error) {
	return f.list(r)
}

func (f *fakeRegistrar) WatchEndpoints(r *registrarv1.WatchEndpointsRequest, s grpc.ServerStreamingServer[registrarv1.EndpointEvent]) error {
	return f.watch(r, s)
}

func serveFake(t *testing.T, f *fakeRegistrar) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	registrarv1.RegisterRegistrarServer(srv, f)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

func TestRegisterAgainstFake(t *testing.T) {
	t.Parallel()
	var got *registrarv1.RegisterEndpointRequest
	addr := serveFake(t, &fakeRegistrar{register: func(r *registrarv1.RegisterEndpointRequest) (*registrarv1.RegisterEndpointResponse, error) {
		got = r
		if r.GetEndpoint().GetWeight() > 100 {
			return nil, status.Error(codes.InvalidArgument, "endpoint.weight: 500 exceeds the limit of 100")
		}
		ep := proto.Clone(r.GetEndpoint()).(*registryv1.ServiceEndpoint)
		return &registrarv1.RegisterEndpointResponse{Endpoint: ep, Version: "e:12"}, nil
	}})

	res := runCLI(t, nil, map[string]string{"AETHER_REGISTRAR": addr},
		"register", "--service", "api", "--ip", "::ffff:10.0.0.2", "--protocol", "grpc",
		"--port", "admin=9091", "--port", "9090", "--port-name", "grpc",
		"--node", "n1", "--zone", "z1", "--weight", "3", "--meta", "version=1.4.2", "--meta", "url=a=b", "--draining")
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.stdout != "registered api 10.0.0.2 (grpc) version e:12\n" {
		t.Errorf("stdout %q", res.stdout)
	}
	want := &registryv1.ServiceEndpoint{
		Service: "api", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "10.0.0.2",
		Ports: []*registryv1.Port{{Name: "admin", Port: 9091}, {Name: "grpc", Port: 9090}},
		Node:  "n1", Zone: "z1", State: registryv1.State_STATE_DRAINING, Weight: 3,
		Metadata: map[string]string{"version": "1.4.2", "url": "a=b"},
	}
	if !proto.Equal(got.GetEndpoint(), want) {
		t.Errorf("sent %v\nwant %v", got.GetEndpoint(), want)
	}

	res = runCLI(t, nil, nil, "register", "--registrar", addr, "--service", "web", "--ip", "10.0.0.1", "--port", "80", "--weight", "500")
	wantErr := "register web 10.0.0.1 (http): endpoint.weight: 500 exceeds the limit of 100"
	if res.err == nil || res.err.Error() != wantErr {
		t.Errorf("error %v\nwant %s", res.err, wantErr)
	}
}

func TestDeregisterAgainstFake(t *testing.T) {
	t.Parallel()
	addr := serveFake(t, &fakeRegistrar{unreg: func(r *registrarv1.UnregisterEndpointRequest) (*registrarv1.UnregisterEndpointResponse, error) {
		if r.GetProtocol() != registryv1.Protocol_PROTOCOL_HTTP2 {
			return nil, status.Errorf(codes.NotFound, "endpoint %s/%s not found", r.GetService(), r.GetIp())
		}
		return &registrarv1.UnregisterEndpointResponse{Version: "e:13"}, nil
	}})
	res := runCLI(t, nil, nil, "deregister", "--registrar", addr, "--service", "web", "--ip", "10.0.0.1", "--protocol", "h2")
	if res.err != nil || res.stdout != "deregistered web 10.0.0.1 (h2c) version e:13\n" {
		t.Errorf("got %v, %q", res.err, res.stdout)
	}
	res = runCLI(t, nil, nil, "deregister", "--registrar", addr, "--service", "web", "--ip", "10.0.0.1")
	want := "deregister web 10.0.0.1 (http): endpoint web/10.0.0.1 not found (check --protocol; see what is registered with: aether list --service web)"
	if res.err == nil || res.err.Error() != want {
		t.Errorf("error %v\nwant %s", res.err, want)
	}
}

func TestListAgainstFake(t *testing.T) {
	t.Parallel()
	var services []string
	addr := serveFake(t, &fakeRegistrar{list: func(r *registrarv1.ListAllEndpointsRequest) (*registrarv1.ListAllEndpointsResponse, error) {
		services = r.GetServices()
		return &registrarv1.ListAllEndpointsResponse{Endpoints: fixture(), Version: "e:9"}, nil
	}})
	res := runCLI(t, nil, nil, "list", "--registrar", addr, "--service", "web,api", "--service", "db")
	if res.err != nil {
		t.Fatal(res.err)
	}
	if strings.Join(services, ",") != "web,api,db" {
		t.Errorf("requested services %q", services)
	}
	if lines := strings.Split(strings.TrimSpace(res.stdout), "\n"); len(lines) != 5 || !strings.HasPrefix(lines[1], "api ") {
		t.Errorf("table:\n%s", res.stdout)
	}
	res = runCLI(t, nil, map[string]string{"AETHER_OUTPUT": "json"}, "list", "--registrar", addr)
	if res.err != nil || !strings.HasPrefix(res.stdout, "{\n  \"version\": \"e:9\",\n  \"endpoints\": [") {
		t.Errorf("json: %v\n%s", res.err, res.stdout)
	}
}

func TestWatchAgainstFake(t *testing.T) {
	t.Parallel()
	eps := fixture()

	t.Run("cut off as slow consumer", func(t *testing.T) {
		t.Parallel()
		var req *registrarv1.WatchEndpointsRequest
		addr := serveFake(t, &fakeRegistrar{watch: func(r *registrarv1.WatchEndpointsRequest, s grpc.ServerStreamingServer[registrarv1.EndpointEvent]) error {
			req = r
			for _, ev := range []*registrarv1.EndpointEvent{
				{Version: "e:3", Endpoints: eps[:1], SnapshotContinues: true},
				{Version: "e:3", Endpoints: eps[1:2]},
				{Type: registrarv1.EndpointEvent_ENDPOINT_REMOVED, Endpoint: eps[0], Version: "e:4"},
			} {
				if err := s.Send(ev); err != nil {
					return err
				}
			}
			return status.Error(codes.ResourceExhausted, "watch buffer of 4096 messages full")
		}})
		res := runCLI(t, nil, nil, "watch", "--registrar", addr, "--service", "web", "--from-version", "e:1")
		want := "watch endpoints: cut off by the registrar because this client fell behind: watch buffer of 4096 messages full; last version e:4: resume with --from-version e:4"
		if res.err == nil || res.err.Error() != want {
			t.Errorf("error %v\nwant %s", res.err, want)
		}
		if req.GetLastVersion() != "e:1" || strings.Join(req.GetServices(), ",") != "web" {
			t.Errorf("request %v", req)
		}
		wantOut := "SNAPSHOT 2 endpoints v=e:3\n  api 2001:db8::1 (grpc) admin:9091,grpc:9090 SERVING\n  web 10.0.0.10 (http) http:8080 DRAINING\nREMOVED web 10.0.0.10 (http) http:8080 DRAINING v=e:4\n"
		if res.stdout != wantOut {
			t.Errorf("stdout:\n%s\nwant:\n%s", res.stdout, wantOut)
		}
	})

	t.Run("bad from-version", func(t *testing.T) {
		t.Parallel()
		addr := serveFake(t, &fakeRegistrar{watch: func(r *registrarv1.WatchEndpointsRequest, _ grpc.ServerStreamingServer[registrarv1.EndpointEvent]) error {
			return status.Errorf(codes.InvalidArgument, "last_version %q is not a version token", r.GetLastVersion())
		}})
		res := runCLI(t, nil, nil, "watch", "--registrar", addr, "--from-version", "x")
		want := `watch endpoints: --from-version "x": last_version "x" is not a version token`
		if res.err == nil || res.err.Error() != want {
			t.Errorf("error %v\nwant %s", res.err, want)
		}
	})

	t.Run("interrupted exits cleanly", func(t *testing.T) {
		t.Parallel()
		sent := make(chan struct{})
		addr := serveFake(t, &fakeRegistrar{watch: func(_ *registrarv1.WatchEndpointsRequest, s grpc.ServerStreamingServer[registrarv1.EndpointEvent]) error {
			if err := s.Send(&registrarv1.EndpointEvent{Version: "e:3", Endpoints: eps[:1]}); err != nil {
				return err
			}
			close(sent)
			<-s.Context().Done()
			return s.Context().Err()
		}})
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-sent
			time.Sleep(800 * time.Millisecond) // outlive --timeout
			cancel()
		}()
		// The timeout is far shorter than the stream's life: it bounds only
		// the wait for the first event.
		res := runCLI(t, ctx, nil, "watch", "--registrar", addr, "-o", "json", "--timeout", "500ms")
		if res.err != nil {
			t.Fatalf("error %v, want a clean exit", res.err)
		}
		if !strings.HasPrefix(res.stdout, `{"type":"FULL_SNAPSHOT","version":"e:3",`) {
			t.Errorf("stdout %q", res.stdout)
		}
	})

	t.Run("stream ended", func(t *testing.T) {
		t.Parallel()
		addr := serveFake(t, &fakeRegistrar{watch: func(_ *registrarv1.WatchEndpointsRequest, s grpc.ServerStreamingServer[registrarv1.EndpointEvent]) error {
			return s.Send(&registrarv1.EndpointEvent{Version: "e:3"})
		}})
		res := runCLI(t, nil, nil, "watch", "--registrar", addr)
		want := "watch endpoints: the registrar at " + addr + " ended the stream; last version e:3: resume with --from-version e:3"
		if res.err == nil || res.err.Error() != want {
			t.Errorf("error %v\nwant %s", res.err, want)
		}
	})
}
