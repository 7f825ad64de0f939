//go:build unix

package etcdtest

import (
	"fmt"
	"net/netip"
	"syscall"
)

// reserve binds addr (an IPv4 host:port) without listening on it, until
// the returned release. A connection to the port is refused meanwhile, as
// to any stopped server's, but the port is no longer free: the kernel
// gives it to no socket that binds port 0 and to no outgoing connection,
// so it cannot be handed to another test's server while this member is
// down. SO_REUSEADDR lets the reservation bind past the member's own
// connections still in TIME_WAIT.
func reserve(addr string) (release func(), err error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		return nil, fmt.Errorf("reserve %s: not an IPv4 host:port", addr)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, syscall.IPPROTO_TCP)
	if err != nil {
		return nil, fmt.Errorf("reserve %s: %w", addr, err)
	}
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("reserve %s: %w", addr, err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("reserve %s: %w", addr, err)
	}
	return func() { syscall.Close(fd) }, nil
}
