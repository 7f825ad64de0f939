package registrar

import "github.com/aethermesh/aether/registrar/internal/core"

// filter is a stream's demand scope: the set of services it watches, or all
// services when nil (core.Filter, with the methods the streams use).
type filter map[string]struct{}

// newFilter validates and de-duplicates requested service names. No names
// means all services.
func newFilter(services []string) (filter, error) {
	f, err := core.NewFilter(services)
	return filter(f), err
}

func (f filter) all() bool { return f == nil }

func (f filter) matches(service string) bool { return core.Filter(f).Matches(service) }
