package xds

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are per Server, registered on the Registerer it is given (the
// registrar's registry in a registrar process), named in the registrar's
// style: the component first (xds_), units and _total as suffixes.
type metrics struct {
	connected *prometheus.GaugeVec
	pushes    *prometheus.CounterVec
	sent      *prometheus.CounterVec
	nacks     *prometheus.CounterVec
	held      prometheus.Gauge
	snapshots prometheus.Counter
}

func newMetrics() *metrics {
	return &metrics{
		connected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "xds_connected_clients",
			Help: "Open xDS streams, by protocol variant (sotw: state of the world, delta: incremental) and service (ads, or the per-type service: cds, eds, lds, rds).",
		}, []string{"variant", "service"}),
		pushes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xds_pushes_total",
			Help: "xDS responses sent to clients, by resource type.",
		}, []string{"type"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xds_resources_sent_total",
			Help: "Resources carried by xDS responses, by resource type.",
		}, []string{"type"}),
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "xds_nacks_total",
			Help: "xDS responses a client rejected (a request carrying error_detail), by resource type; the client keeps its previous configuration.",
		}, []string{"type"}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "xds_targets",
			Help: "xDS targets served (each a Listener, RouteConfiguration, Cluster and ClusterLoadAssignment of one name).",
		}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "xds_snapshot_updates_total",
			Help: "Snapshots set in the xDS cache (one per consumer locality per change applied).",
		}),
	}
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.connected, m.pushes, m.sent, m.nacks, m.held, m.snapshots} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (m *metrics) resources(targets int) { m.held.Set(float64(targets)) }

// typeLabel is a type URL's short name; a URL not of the four types the
// feed serves is "other", so a client cannot grow the label set.
func typeLabel(url string) string {
	switch {
	case strings.HasSuffix(url, ".Listener"):
		return "listener"
	case strings.HasSuffix(url, ".RouteConfiguration"):
		return "route"
	case strings.HasSuffix(url, ".Cluster"):
		return "cluster"
	case strings.HasSuffix(url, ".ClusterLoadAssignment"):
		return "endpoint"
	}
	return "other"
}

// serviceLabel names the gRPC service of a stream from the type URL
// go-control-plane opens it with ("" for ADS).
func serviceLabel(url string) string {
	switch typeLabel(url) {
	case "listener":
		return "lds"
	case "route":
		return "rds"
	case "cluster":
		return "cds"
	case "endpoint":
		return "eds"
	}
	if url == "" {
		return "ads"
	}
	return "other"
}
