package agent

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// ParseEndpoint parses "service=ip:port[/protocol]" (IPv6 as [addr]:port),
// the form of --endpoint and of each line of --endpoints-file. The protocol
// defaults to http; the port is named after the protocol.
func ParseEndpoint(spec string) (*registryv1.ServiceEndpoint, error) {
	svc, rest, ok := strings.Cut(strings.TrimSpace(spec), "=")
	if !ok || svc == "" || rest == "" {
		return nil, fmt.Errorf("%q: expected service=ip:port[/protocol], e.g. web=10.0.0.1:8080/http", spec)
	}
	if err := registry.ValidateName("service", svc); err != nil {
		return nil, fmt.Errorf("%q: %w", spec, err)
	}
	hostport, protoName, hasProto := strings.Cut(rest, "/")
	proto := registryv1.Protocol_PROTOCOL_HTTP1
	if hasProto {
		p, err := registry.ParseProtocol(protoName)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", spec, err)
		}
		proto = p
	}
	host, portStr, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, fmt.Errorf("%q: %v (IPv6 addresses go in brackets: [fd00::1]:8080)", spec, err)
	}
	ip, err := registry.CanonicalIP(host)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", spec, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || port == 0 {
		return nil, fmt.Errorf("%q: port %q is not a port number (1-65535)", spec, portStr)
	}
	return &registryv1.ServiceEndpoint{
		Service:  svc,
		Protocol: proto,
		Ip:       ip,
		Ports:    []*registryv1.Port{{Name: registry.ProtocolName(proto), Port: uint32(port)}},
		State:    registryv1.State_STATE_SERVING,
	}, nil
}

// ReadEndpointsFile reads one endpoint spec per line; blank lines and
// comments (from # to the end of the line) are ignored. Errors name the file and line.
func ReadEndpointsFile(path string) ([]*registryv1.ServiceEndpoint, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []*registryv1.ServiceEndpoint
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 { // '#' appears in no valid spec
			text = text[:i]
		}
		if text = strings.TrimSpace(text); text == "" {
			continue
		}
		ep, err := ParseEndpoint(text)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		out = append(out, ep)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}
