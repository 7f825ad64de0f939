package registry

import (
	"fmt"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// validatePortNumbers refuses two ports of one endpoint with the same
// number. A port's name is how a consumer picks it, so two names for one
// number would make the consumer's choice mean nothing, and whichever name
// a proxy reads first would win. It runs on the request's order, before
// normalizePorts sorts by name, so the indexes it reports are the caller's.
// Numbers out of range and nil ports are left to normalizePorts, which
// reports them.
func validatePortNumbers(ports []*registryv1.Port) error {
	first := make(map[uint32]int, len(ports))
	for i, p := range ports {
		if p == nil || p.Port == 0 || p.Port > 65535 {
			continue
		}
		if j, dup := first[p.Port]; dup {
			return &FieldError{
				Field:  fmt.Sprintf("endpoint.ports[%d].port", i),
				Reason: fmt.Sprintf("%d is already the number of endpoint.ports[%d] (%q); each port of an endpoint needs its own number", p.Port, j, ports[j].GetName()),
			}
		}
		first[p.Port] = i
	}
	return nil
}

// checkPorts is NormalizeEndpoint's port step: the numbers in the request's
// order, then normalizePorts (names, ranges, sort).
func checkPorts(ep *registryv1.ServiceEndpoint, lim Limits) error {
	if err := validatePortNumbers(ep.Ports); err != nil {
		return err
	}
	return normalizePorts(ep, lim)
}
