package registrar

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
)

// metrics are per Registrar (no global registry), so several registrars can
// live in one test process.
type metrics struct {
	reg            *prometheus.Registry
	syncDuration   prometheus.Histogram
	syncErrors     prometheus.Counter
	syncFetched    prometheus.Counter
	batchSize      prometheus.Histogram
	flushDuration  prometheus.Histogram
	flushErrors    prometheus.Counter
	writesRefused  prometheus.Counter
	superseded     prometheus.Counter
	broadcast      *prometheus.CounterVec
	broadcastByTyp map[registrarv1.EndpointEvent_EventType]prometheus.Counter
	swept          prometheus.Counter
	peer           *peerMetrics
}

func newMetrics(r *Registrar) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		syncDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "registrar_sync_duration_seconds",
			Help:    "Time to list the backend and reconcile the snapshot with it.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		syncErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "registrar_sync_errors_total",
			Help: "Backend listings that failed.",
		}),
		syncFetched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "registrar_sync_values_fetched_total",
			Help: "Values read from the backend by listings: all of them for a full listing, only those not already held at the listed revision for the backstop's keys-only listing.",
		}),
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "registrar_write_batch_size",
			Help:    "Writes per write-behind flush.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		flushDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "registrar_write_flush_duration_seconds",
			Help:    "Time for one write-behind flush to be committed by the backend.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		flushErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "registrar_write_flush_errors_total",
			Help: "Write-behind flushes that failed and will be retried.",
		}),
		writesRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "registrar_writes_refused_total",
			Help: "Writes the backend refused permanently (too large, invalid); each is isolated so the others still persist.",
		}),
		superseded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "registrar_writes_superseded_total",
			Help: "Writes found overtaken at flush time by a write of the same endpoint stamped later through another replica; the later one stays.",
		}),
		broadcast: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "registrar_event_broadcast_total",
			Help: "Events handed to watching streams, by type (one per stream).",
		}, []string{"type"}),
		swept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "registrar_ghost_endpoints_swept_total",
			Help: "Endpoints removed because their node's record (lease) was gone.",
		}),
	}
	m.broadcastByTyp = map[registrarv1.EndpointEvent_EventType]prometheus.Counter{}
	for v, name := range registrarv1.EndpointEvent_EventType_name {
		m.broadcastByTyp[registrarv1.EndpointEvent_EventType(v)] = m.broadcast.WithLabelValues(name)
	}
	m.reg.MustRegister(
		m.syncDuration, m.syncErrors, m.syncFetched, m.batchSize, m.flushDuration, m.flushErrors,
		m.writesRefused, m.superseded,
		m.broadcast, m.swept,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{r: r},
		// Read from the write-behind at scrape time, like stateCollector.
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "registrar_persistence_lag_seconds",
			Help: "Age of the oldest acknowledged write not yet persisted to the backend (0 when every write is persisted); /readyz fails once it passes max(10 x --write-batch-interval, 10s).",
		}, func() float64 { return r.PersistenceStatus().Oldest.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "registrar_persistence_isolated_writes",
			Help: "Acknowledged writes the backend refused permanently, held back so the others persist; listed by /readyz?verbose.",
		}, func() float64 { return float64(len(r.PersistenceStatus().Isolated)) }),
	)
	m.peer = newPeerMetrics(m.reg) // peer.go
	return m
}

func (m *metrics) delivered(typ registrarv1.EndpointEvent_EventType, n int) {
	if c, ok := m.broadcastByTyp[typ]; ok {
		c.Add(float64(n))
	}
}

// stateCollector reads gauges straight from the state at scrape time, so the
// write path does no metric bookkeeping for them.
type stateCollector struct{ r *Registrar }

var (
	descConnected = prometheus.NewDesc("registrar_connected_agents", "Open watch streams.", nil, nil)
	// Not "_count": Prometheus reserves that suffix for histograms and
	// summaries, and promtool check metrics flags it.
	descEndpoints = prometheus.NewDesc("registrar_endpoints", "Endpoints in the snapshot, by origin cluster.", []string{"cluster"}, nil)
	descQueue     = prometheus.NewDesc("registrar_write_queue_depth", "Endpoints with acknowledged writes not yet persisted.", nil, nil)
	descBackend   = prometheus.NewDesc("registrar_backend_revision", "Backend revision the snapshot reflects.", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descConnected
	ch <- descEndpoints
	ch <- descQueue
	ch <- descBackend
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.mu.Lock()
	connected := c.r.hub.len()
	counts := c.r.st.ClusterCounts()
	depth := c.r.st.Depth()
	rev := c.r.st.BackendRevision()
	c.r.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, float64(connected))
	for cl, n := range counts {
		ch <- prometheus.MustNewConstMetric(descEndpoints, prometheus.GaugeValue, float64(n), cl)
	}
	ch <- prometheus.MustNewConstMetric(descQueue, prometheus.GaugeValue, float64(depth))
	ch <- prometheus.MustNewConstMetric(descBackend, prometheus.GaugeValue, float64(rev))
}
