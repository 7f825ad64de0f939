package endpointslice

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are per Reconciler, registered on the Registerer it is given
// (the registrar's registry in a registrar process), named in the
// registrar's style: the component first, units and _total as suffixes.
type metrics struct {
	writes           *prometheus.CounterVec
	errors           *prometheus.CounterVec
	conflicts        prometheus.Counter
	slices           prometheus.Gauge
	skippedEndpoints *prometheus.GaugeVec
	skippedServices  *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "endpointslice_writes_total",
			Help: "EndpointSlice writes the API server accepted, by operation (create, update, delete).",
		}, []string{"op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "endpointslice_errors_total",
			Help: "EndpointSlice API calls that failed, by operation (create, update, delete, list); conflicts among them are relisted and retried.",
		}, []string{"op"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "endpointslice_conflicts_total",
			Help: "Writes refused because a slice changed since it was read (409, or already exists, or gone), each followed by a relist of the service's slices.",
		}),
		slices: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "endpointslice_slices",
			Help: "EndpointSlices this registrar manages.",
		}),
		skippedEndpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "endpointslice_skipped_endpoints",
			Help: "Endpoints (or ports of endpoints) not published in EndpointSlices now, by reason (address, port_name, no_valid_ports, duplicate_address).",
		}, []string{"reason"}),
		skippedServices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "endpointslice_skipped_services",
			Help: "Services not published in EndpointSlices now, by reason (service_name: not a Kubernetes Service name).",
		}, []string{"reason"}),
	}
	for _, op := range []string{"create", "update", "delete"} {
		m.writes.WithLabelValues(op)
		m.errors.WithLabelValues(op)
	}
	m.errors.WithLabelValues("list")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.writes, m.errors, m.conflicts, m.slices, m.skippedEndpoints, m.skippedServices} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, fmt.Errorf("endpointslice: metrics already registered (one reconciler per registry): %w", err)
			}
			return nil, fmt.Errorf("endpointslice: register metrics: %w", err)
		}
	}
	return m, nil
}
