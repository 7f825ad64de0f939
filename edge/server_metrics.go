package edge

import "github.com/prometheus/client_golang/prometheus"

// serverMetrics are the shell's own metrics, on the server's registry.
type serverMetrics struct {
	batchSize prometheus.Histogram
	changes   prometheus.Counter
}

func newServerMetrics(reg *prometheus.Registry) *serverMetrics {
	m := &serverMetrics{
		batchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "aether_edge_commit_batch_changes",
			Help:    "Changes persisted per group commit (one storage transaction, one fsync).",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "aether_edge_changes_committed_total",
			Help: "Changes made durable by this replica.",
		}),
	}
	reg.MustRegister(m.batchSize, m.changes)
	return m
}

func (m *serverMetrics) observeBatch(n int) {
	m.batchSize.Observe(float64(n))
	m.changes.Add(float64(n))
}
