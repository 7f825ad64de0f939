package xds

import (
	"strings"
	"sync"
	"time"

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
	latency   *prometheus.HistogramVec

	// byType is each type label's children of pushes, sent and latency,
	// looked up once: every response passes here, and a vector's
	// WithLabelValues hashes its labels under a lock each time.
	byType map[string]*typeMetrics

	// changes is when the feed made each recent version: a response of
	// one of them is a push whose latency is observed.
	changesMu sync.Mutex
	changes   map[string]time.Time
	order     []string // oldest first, at most keptChanges
}

// keptChanges bounds the versions whose change time is kept: a response
// of an older version is no push of a recent change (a client connecting
// late to a version that has not moved), so none is lost that counts.
// One change applied makes a version in each cache it moves (up to
// MaxLocalities EDS caches and three others): this keeps the last
// changes of every cache even at the bound.
const keptChanges = 8192

// typeMetrics is one type label's metric children.
type typeMetrics struct {
	pushes, sent prometheus.Counter
	latency      prometheus.Observer
}

// typeLabels are typeLabel's values.
var typeLabels = []string{"listener", "route", "cluster", "endpoint", "other"}

func newMetrics() *metrics {
	m := newMetricVecs()
	m.byType = make(map[string]*typeMetrics, len(typeLabels))
	for _, l := range typeLabels {
		m.byType[l] = &typeMetrics{pushes: m.pushes.WithLabelValues(l), sent: m.sent.WithLabelValues(l), latency: m.latency.WithLabelValues(l)}
	}
	return m
}

// of is the metric children of a type URL's label.
func (m *metrics) of(typeURL string) *typeMetrics { return m.byType[typeLabel(typeURL)] }

func newMetricVecs() *metrics {
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
			Help: "Updates of the xDS caches (one per resource type, and for endpoints per consumer locality, whose resources a change applied moved).",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "xds_push_latency_seconds",
			Help: "Time from the feed applying a change to its response being sent to a client whose watch was waiting, by resource type.",
			// 0.5 ms to about 1 s: a push on loopback takes well under a
			// millisecond; the goal of issue 14 is a p99 under 100 ms.
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 12),
		}, []string{"type"}),
		changes: map[string]time.Time{},
	}
}

// changed records when the feed made version.
func (m *metrics) changed(version string, at time.Time) {
	m.changesMu.Lock()
	defer m.changesMu.Unlock()
	if _, ok := m.changes[version]; ok {
		return
	}
	m.changes[version] = at
	m.order = append(m.order, version)
	if len(m.order) > keptChanges {
		delete(m.changes, m.order[0])
		m.order = m.order[1:]
	}
}

// pushed observes a response's push latency: when the feed made its
// version after the stream's last request of the type, the response was
// due from the change on. A response to a request that came after the
// change is an answer, not a push, and is not observed.
func (m *metrics) pushed(typeURL, version string, requested, now time.Time) {
	m.changesMu.Lock()
	at, ok := m.changes[version]
	m.changesMu.Unlock()
	if !ok || at.Before(requested) {
		return
	}
	m.of(typeURL).latency.Observe(now.Sub(at).Seconds())
}

func (m *metrics) register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.connected, m.pushes, m.sent, m.nacks, m.held, m.snapshots, m.latency} {
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
