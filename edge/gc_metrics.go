package edge

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aethermesh/aether/edge/internal/core"
)

// gcMetrics are the GC metrics (gc.go): the GC point, what the log
// dropped, and the peers that no longer hold it back or were refused.
type gcMetrics struct {
	trimmed prometheus.Counter
	refused *prometheus.CounterVec
}

func newGCMetrics(y *syncer) *gcMetrics {
	m := &gcMetrics{
		trimmed: prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_edge_gc_trimmed_changes_total",
			Help: "Changes dropped from the sync log below the stable point."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aether_edge_gc_peer_refused_total",
			Help: "Push streams refused because the peer lacks changes GC dropped (it needs re-bootstrapping)."}, []string{"peer"}),
	}
	y.s.reg.MustRegister(m.trimmed, m.refused, &gcCollector{y: y})
	return m
}

type gcCollector struct{ y *syncer }

var (
	descGCPoint = prometheus.NewDesc("aether_edge_gc_point_changes",
		"The stable point: changes (summed over replicas) that this replica and every peer holding GC back hold.", nil, nil)
	descGCStable = prometheus.NewDesc("aether_edge_gc_stable_changes",
		"The stable vector's component for each replica (label replica: its id in hex).", []string{"replica"}, nil)
	descGCHolds = prometheus.NewDesc("aether_edge_gc_peer_holds",
		"1 while the peer holds the stable point back (heard from within --peer-retention and not behind the GC point).", []string{"peer"}, nil)
	descGCBehind = prometheus.NewDesc("aether_edge_gc_peer_behind",
		"1 once the peer was found lacking changes GC dropped: it is refused until re-bootstrapped.", []string{"peer"}, nil)
)

func (c *gcCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descGCPoint
	ch <- descGCStable
	ch <- descGCHolds
	ch <- descGCBehind
}

func (c *gcCollector) Collect(ch chan<- prometheus.Metric) {
	y := c.y
	st := y.stable()
	var total uint64
	for r, n := range st {
		total += n
		ch <- prometheus.MustNewConstMetric(descGCStable, prometheus.GaugeValue, float64(n), replicaLabel(r))
	}
	ch <- prometheus.MustNewConstMetric(descGCPoint, prometheus.GaugeValue, float64(total))
	now := y.s.now()
	for _, p := range y.peers {
		g := p.gcState()
		holds, behind := 0.0, 0.0
		if y.holdsGC(g, now) {
			holds = 1
		}
		if g.behind {
			behind = 1
		}
		ch <- prometheus.MustNewConstMetric(descGCHolds, prometheus.GaugeValue, holds, p.m.name)
		ch <- prometheus.MustNewConstMetric(descGCBehind, prometheus.GaugeValue, behind, p.m.name)
	}
}

func replicaLabel(r core.ReplicaID) string { return fmt.Sprintf("%x", uint64(r)) }
