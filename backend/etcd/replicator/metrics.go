package replicator

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Full-sync reasons, the values of replicator_full_syncs_total{reason}.
const (
	syncStart     = "start"      // first sync of a leadership
	syncCompacted = "compacted"  // the local watch could not resume: revision compacted
	syncLeaseLost = "lease_lost" // the peer lease expired (partition longer than the TTL)
	syncError     = "error"      // after a peer or local error
)

// metrics are per Replicator; they reach a registry only through
// Config.Registerer, so nothing is global.
type metrics struct {
	mirrorErrors       *prometheus.CounterVec
	keepaliveFailures  *prometheus.CounterVec
	ops                *prometheus.CounterVec
	fullSyncs          *prometheus.CounterVec
	collectors         []prometheus.Collector
	descLag, descKeys  *prometheus.Desc
	descLeader, descRT *prometheus.Desc
}

func newMetrics(r *Replicator) *metrics {
	m := &metrics{
		mirrorErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "replicator_mirror_errors_total",
			Help: "Peer sessions that ended in an error (peer or local side); each is followed by a backoff and a full sync.",
		}, []string{"peer"}),
		keepaliveFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "replicator_keepalive_failures_total",
			Help: "Origin-lease keepalives on a peer that failed (timeout, unreachable, or lease found expired).",
		}, []string{"peer"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "replicator_mirrored_ops_total",
			Help: "Keys written to a peer, by operation (put, delete), from syncs and the watch.",
		}, []string{"peer", "op"}),
		fullSyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "replicator_full_syncs_total",
			Help: "Full syncs of a peer completed, by why they ran (start, compacted, lease_lost, error).",
		}, []string{"peer", "reason"}),
		descLag: prometheus.NewDesc("replicator_lag_seconds",
			"While leading: how long the oldest local change not yet mirrored to the peer has waited; 0 when caught up.", []string{"peer"}, nil),
		descKeys: prometheus.NewDesc("replicator_keys_mirrored",
			"While leading: keys of this region's subtree mirrored on the peer as of the last mirrored revision.", []string{"peer"}, nil),
		descLeader: prometheus.NewDesc("replicator_leader",
			"1 while this replica leads its region's replication, else 0.", nil, nil),
		descRT: prometheus.NewDesc("replicator_lease_ttl_remaining_seconds",
			"While leading: seconds left on the peer's origin lease as of its last successful keepalive (a lower bound).", []string{"peer"}, nil),
	}
	for _, p := range r.peers {
		name := p.cfg.Region
		m.mirrorErrors.WithLabelValues(name)
		m.keepaliveFailures.WithLabelValues(name)
		m.ops.WithLabelValues(name, "put")
		m.ops.WithLabelValues(name, "delete")
		for _, reason := range []string{syncStart, syncCompacted, syncLeaseLost, syncError} {
			m.fullSyncs.WithLabelValues(name, reason)
		}
	}
	m.collectors = []prometheus.Collector{m.mirrorErrors, m.keepaliveFailures, m.ops, m.fullSyncs, &gaugeCollector{r: r, m: m}}
	return m
}

// register registers every collector or none.
func (m *metrics) register(reg prometheus.Registerer) error {
	for i, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range m.collectors[:i] {
				reg.Unregister(done)
			}
			return err
		}
	}
	return nil
}

// gaugeCollector reads the gauges from Status at scrape time, so lag keeps
// growing while a peer is down without anything having to update it.
type gaugeCollector struct {
	r *Replicator
	m *metrics
}

func (c *gaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.m.descLag
	ch <- c.m.descKeys
	ch <- c.m.descLeader
	ch <- c.m.descRT
}

func (c *gaugeCollector) Collect(ch chan<- prometheus.Metric) {
	leader := 0.0
	sts := c.r.Status()
	for _, s := range sts {
		if !s.IsLeader {
			continue
		}
		leader = 1
		ch <- prometheus.MustNewConstMetric(c.m.descLag, prometheus.GaugeValue, s.Lag.Seconds(), s.Region)
		ch <- prometheus.MustNewConstMetric(c.m.descKeys, prometheus.GaugeValue, float64(s.KeysMirrored), s.Region)
		ch <- prometheus.MustNewConstMetric(c.m.descRT, prometheus.GaugeValue, s.LeaseTTLRemaining.Seconds(), s.Region)
	}
	ch <- prometheus.MustNewConstMetric(c.m.descLeader, prometheus.GaugeValue, leader)
}
