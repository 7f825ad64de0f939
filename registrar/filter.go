package registrar

import (
	"fmt"

	"github.com/aethermesh/aether/registry"
)

// filter is a stream's demand scope: the set of services it watches, or all
// services when nil.
type filter map[string]struct{}

// newFilter validates and de-duplicates requested service names. No names
// means all services.
func newFilter(services []string) (filter, error) {
	if len(services) == 0 {
		return nil, nil
	}
	f := make(filter, len(services))
	for i, s := range services {
		if err := registry.ValidateName("service", s); err != nil {
			return nil, fmt.Errorf("services[%d]: %w", i, err)
		}
		f[s] = struct{}{}
	}
	return f, nil
}

func (f filter) all() bool { return f == nil }

func (f filter) matches(service string) bool {
	if f == nil {
		return true
	}
	_, ok := f[service]
	return ok
}
