package registry

import (
	"fmt"
	"net/netip"
)

// CanonicalIP parses an endpoint address and returns its canonical text form,
// which is what goes into the key: one address has exactly one key.
// IPv4-mapped IPv6 addresses are unmapped. Zoned, unspecified, multicast and
// broadcast addresses cannot serve a service and are rejected.
func CanonicalIP(s string) (string, error) {
	if s == "" {
		return "", fmt.Errorf("ip must not be empty")
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return "", fmt.Errorf("ip %q is not an IPv4 or IPv6 address", s)
	}
	if a.Zone() != "" {
		return "", fmt.Errorf("ip %q has a zone; use an address without %%zone", s)
	}
	a = a.Unmap()
	switch {
	case a.IsUnspecified():
		return "", fmt.Errorf("ip %q is the unspecified address; register the address peers dial", s)
	case a.IsMulticast():
		return "", fmt.Errorf("ip %q is a multicast address", s)
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "", fmt.Errorf("ip %q is the broadcast address", s)
	}
	return a.String(), nil
}
