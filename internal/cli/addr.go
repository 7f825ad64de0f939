package cli

import (
	"fmt"
	"net"
	"strings"
)

// DefaultRegistrarPort is the port of a registrar's gRPC API when an
// address gives none: the registrar's own default (--grpc-addr
// 127.0.0.1:9443), not gRPC's, which is 443 for a bare host.
const DefaultRegistrarPort = "9443"

// registrarAddr completes a --registrar value to host:port. A bare host or
// IP gets DefaultRegistrarPort; gRPC's resolver would otherwise dial 443, a
// port no registrar listens on by default, and the call would only time
// out. A target with a scheme (dns:///, unix:, passthrough:///) is left for
// gRPC to resolve as written.
func registrarAddr(flag, addr string) (string, error) {
	addr = strings.TrimSpace(addr)
	if addr == "" {
		return "", fmt.Errorf("%s must not be empty; give the registrar's host:port (e.g. 127.0.0.1:%s)", flag, DefaultRegistrarPort)
	}
	if strings.Contains(addr, ":/") || strings.HasPrefix(addr, "unix:") {
		return addr, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		if host == "" || port == "" {
			return "", fmt.Errorf("%s %q: give both host and port (e.g. 127.0.0.1:%s)", flag, addr, DefaultRegistrarPort)
		}
		return addr, nil
	}
	bare := addr
	if strings.HasPrefix(addr, "[") && strings.HasSuffix(addr, "]") {
		bare = addr[1 : len(addr)-1]
	}
	if ip := net.ParseIP(bare); ip != nil {
		return net.JoinHostPort(bare, DefaultRegistrarPort), nil // IPv6 needs the brackets
	}
	if strings.ContainsAny(addr, ":[]") {
		return "", fmt.Errorf("%s %q: not a host:port address (%v); e.g. 127.0.0.1:%s or [::1]:%s", flag, addr, unwrapAddrErr(err), DefaultRegistrarPort, DefaultRegistrarPort)
	}
	return net.JoinHostPort(addr, DefaultRegistrarPort), nil
}
