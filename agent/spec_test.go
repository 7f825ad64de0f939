package agent_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/aethermesh/aether/agent"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func endpoint(svc string, p registryv1.Protocol, ip, portName string, port uint32) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: svc, Protocol: p, Ip: ip,
		Ports: []*registryv1.Port{{Name: portName, Port: port}},
		State: registryv1.State_STATE_SERVING,
	}
}

func TestParseEndpoint(t *testing.T) {
	t.Parallel()
	const (
		http1 = registryv1.Protocol_PROTOCOL_HTTP1
		http2 = registryv1.Protocol_PROTOCOL_HTTP2
		grpc  = registryv1.Protocol_PROTOCOL_GRPC
		tcp   = registryv1.Protocol_PROTOCOL_TCP
	)
	valid := []struct {
		spec string
		want *registryv1.ServiceEndpoint
	}{
		{"web=10.0.0.1:8080", endpoint("web", http1, "10.0.0.1", "http", 8080)},
		{"web=10.0.0.1:8080/http", endpoint("web", http1, "10.0.0.1", "http", 8080)},
		{"web=10.0.0.1:65535/http1", endpoint("web", http1, "10.0.0.1", "http", 65535)},
		{"web=10.0.0.1:1/h2c", endpoint("web", http2, "10.0.0.1", "h2c", 1)},
		{"web=10.0.0.1:8080/h2", endpoint("web", http2, "10.0.0.1", "h2c", 8080)},
		{"api=10.0.0.2:9090/grpc", endpoint("api", grpc, "10.0.0.2", "grpc", 9090)},
		{"api=10.0.0.2:9090/GRPC", endpoint("api", grpc, "10.0.0.2", "grpc", 9090)},
		{"db=10.0.0.3:5432/tcp", endpoint("db", tcp, "10.0.0.3", "tcp", 5432)},
		{"  my-svc.v2=10.0.0.4:80  ", endpoint("my-svc.v2", http1, "10.0.0.4", "http", 80)},
		// IPv6 in brackets, canonicalized; IPv4-mapped addresses unmapped.
		{"api=[fd00::1]:9090/grpc", endpoint("api", grpc, "fd00::1", "grpc", 9090)},
		{"api=[FD00:0:0::0001]:9090/grpc", endpoint("api", grpc, "fd00::1", "grpc", 9090)},
		{"web=[2001:db8::1]:443", endpoint("web", http1, "2001:db8::1", "http", 443)},
		{"web=[::ffff:10.0.0.5]:80", endpoint("web", http1, "10.0.0.5", "http", 80)},
	}
	for _, tc := range valid {
		t.Run(tc.spec, func(t *testing.T) {
			t.Parallel()
			got, err := agent.ParseEndpoint(tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.want) {
				t.Errorf("got %v\nwant %v", got, tc.want)
			}
		})
	}

	const form = ": expected service=ip:port[/protocol], e.g. web=10.0.0.1:8080/http"
	const brackets = " (IPv6 addresses go in brackets: [fd00::1]:8080)"
	invalid := []struct {
		spec, want string
	}{
		{"", `""` + form},
		{"web", `"web"` + form},
		{"web=", `"web="` + form},
		{"=10.0.0.1:80", `"=10.0.0.1:80"` + form},
		{"-web=10.0.0.1:80", `"-web=10.0.0.1:80": service "-web" must start and end with a letter or digit`},
		{"we b=10.0.0.1:80", `"we b=10.0.0.1:80": service "we b" contains " "; allowed are ASCII letters and digits, '.', '_' and '-'`},
		{"web=10.0.0.1:80/udp", `"web=10.0.0.1:80/udp": unknown protocol "udp" (use one of http, h2c, grpc, tcp)`},
		{"web=10.0.0.1:80/", `"web=10.0.0.1:80/": unknown protocol "" (use one of http, h2c, grpc, tcp)`},
		{"web=10.0.0.1", `"web=10.0.0.1": address 10.0.0.1: missing port in address` + brackets},
		{"web=fd00::1:80", `"web=fd00::1:80": address fd00::1:80: too many colons in address` + brackets},
		{"web=[fd00::1]", `"web=[fd00::1]": address [fd00::1]: missing port in address` + brackets},
		{"web=host:80", `"web=host:80": ip "host" is not an IPv4 or IPv6 address`},
		{"web=:80", `"web=:80": ip must not be empty`},
		{"web=0.0.0.0:80", `"web=0.0.0.0:80": ip "0.0.0.0" is the unspecified address; register the address peers dial`},
		{"web=[fe80::1%eth0]:80", `"web=[fe80::1%eth0]:80": ip "fe80::1%eth0" has a zone; use an address without %zone`},
		{"web=10.0.0.1:0", `"web=10.0.0.1:0": port "0" is not a port number (1-65535)`},
		{"web=10.0.0.1:65536", `"web=10.0.0.1:65536": port "65536" is not a port number (1-65535)`},
		{"web=10.0.0.1:http", `"web=10.0.0.1:http": port "http" is not a port number (1-65535)`},
		{"web=10.0.0.1:", `"web=10.0.0.1:": port "" is not a port number (1-65535)`},
	}
	for _, tc := range invalid {
		t.Run("invalid "+tc.spec, func(t *testing.T) {
			t.Parallel()
			got, err := agent.ParseEndpoint(tc.spec)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("ParseEndpoint(%q) = %v, %v\nwant error %s", tc.spec, got, err, tc.want)
			}
		})
	}
}

func TestReadEndpointsFile(t *testing.T) {
	t.Parallel()
	write := func(t *testing.T, content string) string {
		t.Helper()
		path := filepath.Join(t.TempDir(), "endpoints")
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}

	t.Run("comments and blank lines", func(t *testing.T) {
		t.Parallel()
		path := write(t, strings.Join([]string{
			"# endpoints of node-a",
			"web=10.0.1.5:8080/http # the web tier",
			"",
			"   # indented comment",
			"\tapi=[fd00::5]:9090/grpc   ",
			"#db=10.0.1.5:5432/tcp",
			"",
			"db=10.0.1.5:5432/tcp", // no newline at the end
		}, "\n"))
		got, err := agent.ReadEndpointsFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want := []*registryv1.ServiceEndpoint{
			endpoint("web", registryv1.Protocol_PROTOCOL_HTTP1, "10.0.1.5", "http", 8080),
			endpoint("api", registryv1.Protocol_PROTOCOL_GRPC, "fd00::5", "grpc", 9090),
			endpoint("db", registryv1.Protocol_PROTOCOL_TCP, "10.0.1.5", "tcp", 5432),
		}
		if len(got) != len(want) {
			t.Fatalf("got %d endpoints %v, want %d", len(got), got, len(want))
		}
		for i := range want {
			if !proto.Equal(got[i], want[i]) {
				t.Errorf("endpoint %d = %v\nwant %v", i, got[i], want[i])
			}
		}
	})

	t.Run("empty and comment-only files", func(t *testing.T) {
		t.Parallel()
		for _, content := range []string{"", "\n\n", "# nothing here\n  \n"} {
			got, err := agent.ReadEndpointsFile(write(t, content))
			if err != nil || len(got) != 0 {
				t.Errorf("%q: %v, %v; want no endpoints", content, got, err)
			}
		}
	})

	t.Run("errors name file and line", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			content, want string
		}{
			{"web=10.0.0.1:80\n\n# comment\nweb=10.0.0.1\n", `:4: "web=10.0.0.1": address 10.0.0.1: missing port in address (IPv6 addresses go in brackets: [fd00::1]:8080)`},
			{"web=10.0.0.1:0\nweb=10.0.0.2:80\n", `:1: "web=10.0.0.1:0": port "0" is not a port number (1-65535)`},
			{"\r\nweb=10.0.0.1:80\r\napi=host:9090/grpc\r\n", `:3: "api=host:9090/grpc": ip "host" is not an IPv4 or IPv6 address`},
			{"web=10.0.0.1:80\nnonsense\n", `:2: "nonsense": expected service=ip:port[/protocol], e.g. web=10.0.0.1:8080/http`},
		} {
			path := write(t, tc.content)
			got, err := agent.ReadEndpointsFile(path)
			if err == nil || err.Error() != path+tc.want {
				t.Errorf("%q: %v, %v\nwant error %s%s", tc.content, got, err, path, tc.want)
			}
		}
	})

	t.Run("overlong line", func(t *testing.T) {
		t.Parallel()
		path := write(t, "web=10.0.0.1:80\n# "+strings.Repeat("x", 70000)+"\n")
		_, err := agent.ReadEndpointsFile(path)
		if want := path + ": bufio.Scanner: token too long"; err == nil || err.Error() != want {
			t.Errorf("error %v\nwant %s", err, want)
		}
	})

	t.Run("missing file", func(t *testing.T) {
		t.Parallel()
		path := filepath.Join(t.TempDir(), "nope")
		_, err := agent.ReadEndpointsFile(path)
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
			t.Errorf("error %v, want a not-exist error naming %s", err, path)
		}
	})
}
