package core

import (
	"fmt"

	"github.com/aethermesh/aether/registry"
)

// Filter is a stream's demand scope: the set of services it watches, or all
// services when nil.
type Filter map[string]struct{}

// newFilter validates and de-duplicates requested service names. No names
// means all services.
func NewFilter(services []string) (Filter, error) {
	if len(services) == 0 {
		return nil, nil
	}
	f := make(Filter, len(services))
	for i, s := range services {
		if err := registry.ValidateName("service", s); err != nil {
			return nil, fmt.Errorf("services[%d]: %w", i, err)
		}
		f[s] = struct{}{}
	}
	return f, nil
}

func (f Filter) All() bool { return f == nil }

func (f Filter) Matches(service string) bool {
	if f == nil {
		return true
	}
	_, ok := f[service]
	return ok
}
