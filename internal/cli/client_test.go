package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/server"
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

func TestRegisterAgainstRegistrar(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd)
	registered := regexp.MustCompile(`^registered api 10\.0\.0\.2 \(grpc\) version (\S+)\n$`)

	// Every flag reaches the registrar; the address comes from the environment.
	res := runCLI(t, nil, map[string]string{"AETHER_REGISTRAR": r.addr()},
		"register", "--service", "api", "--ip", "::ffff:10.0.0.2", "--protocol", "grpc",
		"--port", "admin=9091", "--port", "9090", "--port-name", "grpc",
		"--node", "n1", "--zone", "z1", "--weight", "3", "--meta", "version=1.4.2", "--meta", "url=a=b", "--draining")
	if res.err != nil {
		t.Fatal(res.err)
	}
	m := registered.FindStringSubmatch(res.stdout)
	if m == nil {
		t.Fatalf("stdout %q", res.stdout)
	}
	v1 := m[1]
	_, listed := r.list(t)
	if versionEpoch(v1) != versionEpoch(listed) || versionSeq(t, v1) > versionSeq(t, listed) {
		t.Errorf("register printed version %s; the registrar is at %s", v1, listed)
	}
	want := &registryv1.ServiceEndpoint{
		Service: "api", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "10.0.0.2",
		Ports: []*registryv1.Port{{Name: "admin", Port: 9091}, {Name: "grpc", Port: 9090}},
		Node:  "n1", Zone: "z1", Cluster: testCluster, Region: testRegion,
		State: registryv1.State_STATE_DRAINING, Weight: 3,
		Metadata: map[string]string{"version": "1.4.2", "url": "a=b"},
	}
	got := r.find(t, "api", registryv1.Protocol_PROTOCOL_GRPC, "10.0.0.2")
	if got == nil || !sameEndpoint(got, want) || got.GetCreatedAt() == nil {
		t.Fatalf("registrar has %v\nwant %v", got, want)
	}

	// Registering the same endpoint again replaces its attributes.
	res = runCLI(t, nil, nil, "register", "--registrar", r.addr(), "--service", "api", "--ip", "10.0.0.2",
		"--protocol", "grpc", "--port", "grpc=9090", "--weight", "5")
	if res.err != nil {
		t.Fatal(res.err)
	}
	m = registered.FindStringSubmatch(res.stdout)
	if m == nil {
		t.Fatalf("stdout %q", res.stdout)
	}
	if versionSeq(t, m[1]) <= versionSeq(t, v1) {
		t.Errorf("update printed version %s, not after %s", m[1], v1)
	}
	want.Ports, want.Node, want.Zone, want.State, want.Weight, want.Metadata = want.Ports[1:], "", "", registryv1.State_STATE_SERVING, 5, nil
	if got := r.find(t, "api", registryv1.Protocol_PROTOCOL_GRPC, "10.0.0.2"); got == nil || !sameEndpoint(got, want) {
		t.Fatalf("after the update the registrar has %v\nwant %v", got, want)
	}

	// What only the registrar checks comes back as its InvalidArgument
	// message, and nothing is registered.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--weight", "70000"}, "register web 10.0.0.1 (http): endpoint.weight: 70000 exceeds the limit of 65536"},
		{[]string{"--meta", "build id=7"}, `register web 10.0.0.1 (http): endpoint.metadata: key "build id" contains " "; allowed are ASCII letters and digits, '.', '_', '-' and '/'`},
	} {
		args := append([]string{"register", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1", "--port", "80"}, tc.args...)
		res := runCLI(t, nil, nil, args...)
		if res.err == nil || res.err.Error() != tc.want {
			t.Errorf("%v: error %v\nwant %s", tc.args, res.err, tc.want)
		}
		if res.stdout != "" {
			t.Errorf("%v: stdout %q on error", tc.args, res.stdout)
		}
	}
	if got := r.find(t, "web", registryv1.Protocol_PROTOCOL_HTTP1, "10.0.0.1"); got != nil {
		t.Errorf("a rejected registration is listed: %v", got)
	}
}

func TestDeregisterAgainstRegistrar(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd)
	r.register(t,
		&registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP2, Ip: "10.0.0.1", Ports: []*registryv1.Port{{Port: 8080}}},
		&registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.2", Ports: []*registryv1.Port{{Port: 8080}}},
	)

	// The default protocol (http) names no registered endpoint.
	res := runCLI(t, nil, nil, "deregister", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1")
	want := "deregister web 10.0.0.1 (http): endpoint is not registered: /aether/v1/regions/eu/clusters/c1/services/web/protocols/http1/endpoints/10.0.0.1" +
		" (check --protocol; see what is registered with: aether list --service web)"
	if res.err == nil || res.err.Error() != want {
		t.Errorf("error %v\nwant %s", res.err, want)
	}
	if r.find(t, "web", registryv1.Protocol_PROTOCOL_HTTP2, "10.0.0.1") == nil {
		t.Fatal("the h2c endpoint is gone after a failed deregister")
	}

	res = runCLI(t, nil, nil, "deregister", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1", "--protocol", "h2")
	m := regexp.MustCompile(`^deregistered web 10\.0\.0\.1 \(h2c\) version (\S+)\n$`).FindStringSubmatch(res.stdout)
	if res.err != nil || m == nil {
		t.Fatalf("got %v, %q", res.err, res.stdout)
	}
	if eps, v := r.list(t, "web"); len(eps) != 1 || eps[0].GetIp() != "10.0.0.2" || versionSeq(t, m[1]) > versionSeq(t, v) {
		t.Errorf("after deregister (version %s) the registrar lists %v at %s, want only web 10.0.0.2", m[1], eps, v)
	}

	// Once gone, it is not found under its own protocol either.
	res = runCLI(t, nil, nil, "deregister", "--registrar", r.addr(), "--service", "web", "--ip", "10.0.0.1", "--protocol", "h2c")
	want = "deregister web 10.0.0.1 (h2c): endpoint is not registered: /aether/v1/regions/eu/clusters/c1/services/web/protocols/http2/endpoints/10.0.0.1" +
		" (check --protocol; see what is registered with: aether list --service web)"
	if res.err == nil || res.err.Error() != want {
		t.Errorf("error %v\nwant %s", res.err, want)
	}
}

func TestListAgainstRegistrar(t *testing.T) {
	t.Parallel()
	etcd := etcdtest.Start(t)
	r := startRegistrar(t, etcd)
	r.register(t, fixture()...)
	r.register(t, &registryv1.ServiceEndpoint{Service: "cache", Protocol: registryv1.Protocol_PROTOCOL_TCP, Ip: "10.0.0.20", Ports: []*registryv1.Port{{Port: 6379}}})

	// --service filters at the registrar; db has no endpoints, cache is left out.
	res := runCLI(t, nil, nil, "list", "--registrar", r.addr(), "--service", "web,api", "--service", "db")
	if res.err != nil {
		t.Fatal(res.err)
	}
	wantTable := `SERVICE  PROTOCOL  IP           PORTS                 NODE  CLUSTER  REGION  ZONE   STATE     WEIGHT
api      grpc      2001:db8::1  admin:9091,grpc:9090  -     c1       eu      -      SERVING   3
web      grpc      10.0.0.9     grpc:9090             -     c1       eu      -      SERVING   1
web      http      10.0.0.9     http:8080             n1    c1       eu      eu-1b  SERVING   1
web      http      10.0.0.10    http:8080             n2    c1       eu      eu-1a  DRAINING  1
`
	if res.stdout != wantTable {
		t.Errorf("table:\n%s\nwant:\n%s", res.stdout, wantTable)
	}

	// JSON from the environment: the registrar's version and its endpoints,
	// timestamps included, in table order.
	res = runCLI(t, nil, map[string]string{"AETHER_OUTPUT": "json"}, "list", "--registrar", r.addr())
	if res.err != nil {
		t.Fatal(res.err)
	}
	eps, version := r.list(t)
	if want := "{\n  \"version\": \"" + version + "\",\n  \"endpoints\": [\n"; !strings.HasPrefix(res.stdout, want) {
		t.Fatalf("json does not start with %q:\n%s", want, res.stdout)
	}
	var doc struct {
		Version   string            `json:"version"`
		Endpoints []json.RawMessage `json:"endpoints"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &doc); err != nil {
		t.Fatalf("%v\n%s", err, res.stdout)
	}
	if len(doc.Endpoints) != len(eps) || len(eps) != 5 {
		t.Fatalf("json lists %d endpoints, the registrar %d, want 5:\n%s", len(doc.Endpoints), len(eps), res.stdout)
	}
	for i, want := range sortedEndpoints(eps) {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(doc.Endpoints[i], &fields); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"service", "protocol", "ip", "ports", "cluster", "region", "state", "weight", "created_at", "updated_at"} {
			if _, ok := fields[k]; !ok {
				t.Errorf("endpoint %d lacks %q: %s", i, k, doc.Endpoints[i])
			}
		}
		got := &registryv1.ServiceEndpoint{}
		if err := protojson.Unmarshal(doc.Endpoints[i], got); err != nil {
			t.Fatalf("endpoint %d: %v", i, err)
		}
		if !proto.Equal(got, want) {
			t.Errorf("endpoint %d is %v\nthe registrar has %v", i, got, want)
		}
	}

	// A filter that matches nothing: the header, or an empty list.
	res = runCLI(t, nil, nil, "list", "--registrar", r.addr(), "--service", "db")
	if res.err != nil || res.stdout != "SERVICE  PROTOCOL  IP  PORTS  NODE  CLUSTER  REGION  ZONE  STATE  WEIGHT\n" {
		t.Errorf("empty table: %v, %q", res.err, res.stdout)
	}
	res = runCLI(t, nil, nil, "list", "--registrar", r.addr(), "--service", "db", "-o", "json")
	if want := "{\n  \"version\": \"" + version + "\",\n  \"endpoints\": []\n}\n"; res.err != nil || res.stdout != want {
		t.Errorf("empty json: %v, %q\nwant %q", res.err, res.stdout, want)
	}
}

func TestWatchAgainstRegistrar(t *testing.T) {
	t.Parallel()
	// One etcd for all subtests, each with its own registrar (all of
	// cluster c1) and its own services, so that they do not see each
	// other's changes.
	etcd := etcdtest.Start(t)
	eps := fixture()

	t.Run("snapshot, changes, resume", func(t *testing.T) {
		t.Parallel()
		r := startRegistrar(t, etcd)
		v0 := r.register(t, eps[0], eps[1], &registryv1.ServiceEndpoint{Service: "db", Protocol: registryv1.Protocol_PROTOCOL_TCP, Ip: "10.0.0.30", Ports: []*registryv1.Port{{Port: 5432}}})

		w := startCLI(t, nil, "watch", "--registrar", r.addr(), "--service", "web,api")
		// Other subtests' endpoints reach this registrar through etcd and
		// advance its version, though not this stream.
		snapRE := regexp.MustCompile(`^SNAPSHOT 2 endpoints v=(\S+)\n  api 2001:db8::1 \(grpc\) admin:9091,grpc:9090 SERVING\n  web 10\.0\.0\.10 \(http\) http:8080 DRAINING\n`)
		w.waitOutput(t, "the snapshot", snapRE.MatchString)
		m := snapRE.FindStringSubmatch(w.out.String())
		snapshot := m[0]
		if !atOrAfter(t, m[1], v0) {
			t.Errorf("snapshot at version %s, before the seeding's %s", m[1], v0)
		}

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		unreg, err := r.c.UnregisterEndpoint(ctx, &registrarv1.UnregisterEndpointRequest{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.10"})
		if err != nil {
			t.Fatal(err)
		}
		v1 := unreg.GetVersion()
		r.register(t, &registryv1.ServiceEndpoint{Service: "db", Protocol: registryv1.Protocol_PROTOCOL_TCP, Ip: "10.0.0.31", Ports: []*registryv1.Port{{Port: 5432}}}) // not watched
		v2 := r.register(t, eps[2])
		added := "ADDED web 10.0.0.9 (http) http:8080 SERVING v=" + v2 + "\n"
		w.waitOutput(t, "the last change", func(s string) bool { return strings.HasSuffix(s, added) })
		if err := w.stop(t); err != nil {
			t.Fatalf("interrupted watch: %v, want a clean exit", err)
		}
		want := snapshot + "REMOVED web 10.0.0.10 (http) http:8080 DRAINING v=" + v1 + "\n" + added
		if got := w.out.String(); got != want {
			t.Errorf("stdout:\n%s\nwant:\n%s", got, want)
		}

		// --from-version resumes after the removal: only the addition
		// follows, no snapshot.
		w = startCLI(t, nil, "watch", "--registrar", r.addr(), "--service", "web,api", "--from-version", v1)
		w.waitOutput(t, "the missed change", func(s string) bool { return strings.Contains(s, added) })
		if err := w.stop(t); err != nil {
			t.Fatalf("interrupted watch: %v, want a clean exit", err)
		}
		if got := w.out.String(); got != added {
			t.Errorf("resumed stdout:\n%s\nwant:\n%s", got, added)
		}
	})

	t.Run("cut off as slow consumer, then resumed", func(t *testing.T) {
		t.Parallel()
		// A registrar that keeps few messages for a stream: a client that
		// stops reading is evicted soon.
		r := startRegistrar(t, etcd, func(o *server.Config) { o.WatchBuffer = 8 })
		w := startCLI(t, nil, "watch", "--registrar", r.addr(), "--service", "bulk")
		w.waitOutput(t, "the snapshot", func(s string) bool { return strings.HasPrefix(s, "SNAPSHOT 0 endpoints v=") })
		if n := r.metric(t, "registrar_connected_agents"); n != 1 {
			t.Fatalf("registrar has %v streams, want the watch's", n)
		}

		// Stdout stops taking output, like a pipe nobody reads, so the
		// client stops reading its stream. Changes keep coming (large ones,
		// to fill the flow-control windows quickly) until the registrar
		// drops the stream from its fan-out.
		w.out.hold()
		md := map[string]string{}
		for i := range 15 {
			md[fmt.Sprintf("k%02d", i)] = strings.Repeat("x", 256)
		}
		n, lastV := 0, ""
		for r.metric(t, "registrar_connected_agents") != 0 {
			if n >= 5000 {
				t.Fatalf("stream not dropped after %d changes", n)
			}
			for range 10 {
				n++
				lastV = r.register(t, &registryv1.ServiceEndpoint{
					Service: "bulk", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: fmt.Sprintf("10.4.%d.%d", n/250, n%250+1),
					Ports: []*registryv1.Port{{Port: 80}}, Metadata: md,
				})
			}
		}
		if !w.out.blocked() {
			t.Fatal("the stream was dropped although the client kept reading")
		}
		t.Logf("dropped after %d changes", n)

		// Once stdout drains, the client prints what reached it and
		// then the cut-off, with the version to resume from.
		w.out.release()
		err := w.wait(t)
		m := regexp.MustCompile(`^watch endpoints: cut off by the registrar because this client fell behind: ` +
			`watch stream evicted: the client fell 8 messages behind \(--watch-buffer\); resume with last_version="(\S+)"; ` +
			`last version (\S+): resume with --from-version (\S+)$`).FindStringSubmatch(fmt.Sprint(err))
		if m == nil {
			t.Fatalf("error %v, want a cut-off naming the resume version", err)
		}
		last := m[2]
		if m[1] != last || m[3] != last {
			t.Errorf("versions in %q disagree", err)
		}
		lines := strings.Split(strings.TrimSuffix(w.out.String(), "\n"), "\n")
		got := len(lines) - 1 // after the snapshot line
		if got < 1 || got >= n || !strings.HasSuffix(lines[len(lines)-1], " v="+last) {
			t.Fatalf("printed %d of %d changes, the last %q; want a prefix ending at %s", got, n, lines[len(lines)-1], last)
		}
		if v := r.metric(t, "registrar_watch_evictions_total"); v != 1 {
			t.Errorf("evictions metric = %v, want 1", v)
		}

		// Resuming where the cut-off says delivers exactly the rest.
		w = startCLI(t, nil, "watch", "--registrar", r.addr(), "--service", "bulk", "--from-version", last)
		w.waitOutput(t, "the rest of the changes", func(s string) bool { return strings.Count(s, "\n") >= n-got })
		if err := w.stop(t); err != nil {
			t.Fatalf("interrupted watch: %v, want a clean exit", err)
		}
		rest := strings.Split(strings.TrimSuffix(w.out.String(), "\n"), "\n")
		if len(rest) != n-got || !strings.HasPrefix(rest[0], "ADDED bulk ") {
			t.Errorf("resumed watch printed %d lines starting %q, want the %d missed ADDED", len(rest), rest[0], n-got)
		}
		if !strings.HasSuffix(rest[len(rest)-1], " v="+lastV) {
			t.Errorf("resumed watch ends with %q, want the last change's version %s", rest[len(rest)-1], lastV)
		}
	})

	t.Run("bad from-version", func(t *testing.T) {
		t.Parallel()
		r := startRegistrar(t, etcd)
		res := runCLI(t, nil, nil, "watch", "--registrar", r.addr(), "--from-version", "x")
		want := `watch endpoints: --from-version "x": last_version "x" is not a version token (expected <epoch>:<sequence> as sent by the registrar; leave it empty for a fresh snapshot)`
		if res.err == nil || res.err.Error() != want {
			t.Errorf("error %v\nwant %s", res.err, want)
		}
		if res.stdout != "" {
			t.Errorf("stdout %q", res.stdout)
		}
	})

	t.Run("interrupted exits cleanly", func(t *testing.T) {
		t.Parallel()
		r := startRegistrar(t, etcd)
		v := r.register(t, &registryv1.ServiceEndpoint{Service: "intr", Protocol: registryv1.Protocol_PROTOCOL_GRPC, Ip: "2001:db8::1", Ports: []*registryv1.Port{{Port: 9090}}})
		// The timeout is far shorter than the stream's life: it bounds only
		// the wait for the first event.
		w := startCLI(t, nil, "watch", "--registrar", r.addr(), "--service", "intr", "-o", "json", "--timeout", "500ms")
		w.waitOutput(t, "the snapshot", func(s string) bool { return strings.HasSuffix(s, "\n") })
		time.Sleep(800 * time.Millisecond) // outlive --timeout
		if err := w.stop(t); err != nil {
			t.Fatalf("error %v, want a clean exit", err)
		}
		out := w.out.String()
		m := regexp.MustCompile(`^\{"type":"FULL_SNAPSHOT","version":"(\S+?)",`).FindStringSubmatch(out)
		if m == nil || !atOrAfter(t, m[1], v) || strings.Count(out, "\n") != 1 {
			t.Fatalf("stdout %q, want one snapshot at %s or later", out, v)
		}
		ev := &registrarv1.EndpointEvent{}
		if err := protojson.Unmarshal([]byte(out), ev); err != nil {
			t.Fatal(err)
		}
		if len(ev.GetEndpoints()) != 1 || ev.GetEndpoints()[0].GetIp() != "2001:db8::1" || ev.GetSnapshotContinues() {
			t.Errorf("snapshot event %v", ev)
		}
	})

	// The real registrar never ends a stream with OK; when it shuts down it
	// ends streams with UNAVAILABLE and the version to resume from.
	t.Run("registrar shuts down", func(t *testing.T) {
		t.Parallel()
		r := startRegistrar(t, etcd)
		registered := r.register(t, &registryv1.ServiceEndpoint{Service: "shut", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: "10.0.0.40", Ports: []*registryv1.Port{{Port: 80}}})
		w := startCLI(t, nil, "watch", "--registrar", r.addr(), "--service", "shut")
		var v string
		snapRE := regexp.MustCompile(`^SNAPSHOT 1 endpoints v=(\S+)\n  shut 10\.0\.0\.40 \(http\) http:80 SERVING\n$`)
		w.waitOutput(t, "the snapshot", snapRE.MatchString)
		if v = snapRE.FindStringSubmatch(w.out.String())[1]; !atOrAfter(t, v, registered) {
			t.Fatalf("snapshot at %s, before the registration at %s", v, registered)
		}
		r.close()
		err := w.wait(t)
		want := "cannot reach registrar at " + r.addr() + `: registrar is shutting down; reconnect and resume with last_version="` + v + `"; ` +
			`is "aether registrar" running? (set --registrar or AETHER_REGISTRAR); last version ` + v + ": resume with --from-version " + v
		if err == nil || err.Error() != want {
			t.Errorf("error %v\nwant %s", err, want)
		}
	})
}
