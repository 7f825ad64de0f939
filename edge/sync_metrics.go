package edge

import (
	"github.com/prometheus/client_golang/prometheus"
)

// syncMetrics are replication's metrics, per peer (label peer: the
// member's name), on the server's registry.
type syncMetrics struct {
	rounds      *prometheus.CounterVec
	changesSent *prometheus.CounterVec
	bytesSent   *prometheus.CounterVec
	changesRecv *prometheus.CounterVec
	bytesRecv   *prometheus.CounterVec
}

func newSyncMetrics(y *syncer) *syncMetrics {
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"peer"})
	}
	m := &syncMetrics{
		rounds:      counter("aether_edge_sync_rounds_total", "Anti-entropy rounds completed with the peer: stream openings (vector exchange) and answered probes."),
		changesSent: counter("aether_edge_sync_changes_sent_total", "Changes sent to the peer."),
		bytesSent:   counter("aether_edge_sync_bytes_sent_total", "Bytes of push messages sent to the peer."),
		changesRecv: counter("aether_edge_sync_changes_received_total", "Changes received from the peer (held ones included)."),
		bytesRecv:   counter("aether_edge_sync_bytes_received_total", "Bytes of push messages received from the peer."),
	}
	reg := y.s.reg
	reg.MustRegister(m.rounds, m.changesSent, m.bytesSent, m.changesRecv, m.bytesRecv, &syncCollector{y: y})
	// Every peer's series exist from the start, at 0: a rate() over a
	// counter that appears only at its first increment misses that one.
	if peers, err := y.s.syncPeers(); err == nil {
		for _, p := range peers {
			for _, v := range []*prometheus.CounterVec{m.rounds, m.changesSent, m.bytesSent, m.changesRecv, m.bytesRecv, y.s.metrics.merged} {
				v.WithLabelValues(p.name)
			}
		}
	}
	return m
}

// syncCollector computes the gauges at scrape time from the log and the
// peers' acked vectors.
type syncCollector struct{ y *syncer }

var (
	descLag = prometheus.NewDesc("aether_edge_sync_lag_changes",
		"Changes durable here that the peer is not known to hold (from its last ack).", []string{"peer"}, nil)
	descLagSeconds = prometheus.NewDesc("aether_edge_sync_lag_seconds",
		"How long ago the oldest change the peer is not known to hold became durable here; 0 when it holds everything.", []string{"peer"}, nil)
	descConnected = prometheus.NewDesc("aether_edge_sync_peer_connected",
		"1 while this replica's push stream to the peer is open.", []string{"peer"}, nil)
	descLastSync = prometheus.NewDesc("aether_edge_sync_last_ack_timestamp_seconds",
		"Unix time of the peer's last ack.", []string{"peer"}, nil)
	descDAGChanges = prometheus.NewDesc("aether_edge_dag_changes",
		"Changes in the replica's change DAG (all applied, local and merged).", nil, nil)
	descDAGBytes = prometheus.NewDesc("aether_edge_dag_bytes",
		"Encoded bytes of the changes in the DAG.", nil, nil)
)

func (c *syncCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descLag
	ch <- descLagSeconds
	ch <- descConnected
	ch <- descLastSync
	ch <- descDAGChanges
	ch <- descDAGBytes
}

func (c *syncCollector) Collect(ch chan<- prometheus.Metric) {
	mine := c.y.log.durableVector()
	for _, p := range c.y.peers {
		st := p.state()
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, float64(mine.lacks(st.acked)), p.m.name)
		secs := 0.0
		if at, ok := c.y.log.oldestLacking(st.acked); ok {
			secs = max(c.y.s.now().Sub(at).Seconds(), 0)
		}
		ch <- prometheus.MustNewConstMetric(descLagSeconds, prometheus.GaugeValue, secs, p.m.name)
		conn := 0.0
		if st.connected {
			conn = 1
		}
		ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, conn, p.m.name)
		last := 0.0
		if !st.lastSync.IsZero() {
			last = float64(st.lastSync.UnixNano()) / 1e9
		}
		ch <- prometheus.MustNewConstMetric(descLastSync, prometheus.GaugeValue, last, p.m.name)
	}
	n, b := c.y.log.stats()
	ch <- prometheus.MustNewConstMetric(descDAGChanges, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(descDAGBytes, prometheus.GaugeValue, float64(b))
}
