package edge

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aethermesh/aether/edge/internal/core"
)

// gcMetrics are the GC metrics (gc.go): the GC point, what the log
// dropped, and the peers that no longer hold it back or were refused.
type gcMetrics struct {
	trimmed         prometheus.Counter
	refused         *prometheus.CounterVec
	collectedHashes prometheus.Counter
	collectedKeys   prometheus.Counter
	collectedFields prometheus.Counter
	tombstones      prometheus.Gauge
	collectPoint    prometheus.Gauge
	// Snapshot transfers (snapshot_transfer.go), by peer and direction.
	snapshotsSent     *prometheus.CounterVec
	snapshotsRecv     *prometheus.CounterVec
	snapshotBytesSent *prometheus.CounterVec
	snapshotBytesRecv *prometheus.CounterVec
}

func newGCMetrics(y *syncer) *gcMetrics {
	m := &gcMetrics{
		trimmed: prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_edge_gc_trimmed_changes_total",
			Help: "Changes dropped from the sync log below the stable point."}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aether_edge_gc_peer_refused_total",
			Help: "Push streams refused because the peer lacks changes GC dropped (it needs re-bootstrapping)."}, []string{"peer"}),
	}
	m.collectedHashes = prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_edge_gc_collected_hashes_total",
		Help: "Change hashes the core forgot (causally stable: never named as a parent again)."})
	m.collectedKeys = prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_edge_gc_collected_keys_total",
		Help: "Compacted tombstone key records the core dropped once their winner was causally stable."})
	m.collectedFields = prometheus.NewCounter(prometheus.CounterOpts{Name: "aether_edge_gc_collected_fields_total",
		Help: "JSON field tombstones and deleted documents the core dropped once causally stable."})
	m.tombstones = prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_edge_gc_tombstones",
		Help: "Key records kept only for their winner (compacted tombstones not yet causally stable), after the last collection."})
	m.collectPoint = prometheus.NewGauge(prometheus.GaugeOpts{Name: "aether_edge_gc_collected_point_changes",
		Help: "The vector the core last collected at, summed over replicas."})
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"peer"})
	}
	m.snapshotsSent = counter("aether_edge_snapshot_transfers_sent_total", "State snapshots sent to the peer instead of changes (it was behind a GC point).")
	m.snapshotsRecv = counter("aether_edge_snapshot_transfers_received_total", "State snapshots received from the peer and merged.")
	m.snapshotBytesSent = counter("aether_edge_snapshot_bytes_sent_total", "Bytes of state snapshots sent to the peer.")
	m.snapshotBytesRecv = counter("aether_edge_snapshot_bytes_received_total", "Bytes of state snapshots received from the peer.")
	y.s.reg.MustRegister(m.trimmed, m.refused, m.collectedHashes, m.collectedKeys, m.collectedFields, m.tombstones, m.collectPoint,
		m.snapshotsSent, m.snapshotsRecv, m.snapshotBytesSent, m.snapshotBytesRecv, &gcCollector{y: y})
	if peers, err := y.s.syncPeers(); err == nil {
		for _, p := range peers {
			for _, v := range []*prometheus.CounterVec{m.refused, m.snapshotsSent, m.snapshotsRecv, m.snapshotBytesSent, m.snapshotBytesRecv} {
				v.WithLabelValues(p.name)
			}
		}
	}
	return m
}

func (m *gcMetrics) setCollectPoint(at vector) { m.collectPoint.Set(float64(at.sum())) }

type gcCollector struct{ y *syncer }

var (
	descGCPoint = prometheus.NewDesc("aether_edge_gc_point_changes",
		"The stable point: changes (summed over replicas) that this replica and every peer holding GC back hold.", nil, nil)
	descGCStable = prometheus.NewDesc("aether_edge_gc_stable_changes",
		"The stable vector's component for each replica (label replica: its id in hex).", []string{"replica"}, nil)
	descGCHolds = prometheus.NewDesc("aether_edge_gc_peer_holds",
		"1 while the member (label peer: every other member, sync peer or not) holds the stable point back: heard of within --peer-retention and not behind the GC point.", []string{"peer"}, nil)
	descGCBehind = prometheus.NewDesc("aether_edge_gc_peer_behind",
		"1 while the sync peer is found behind this replica's GC point after a snapshot was offered.", []string{"peer"}, nil)
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
	names := map[uint64]string{}
	for _, m := range y.s.members {
		names[m.id] = m.name
	}
	for _, m := range y.stab.snapshot() {
		holds := 0.0
		if y.holdsGC(m, now) {
			holds = 1
		}
		ch <- prometheus.MustNewConstMetric(descGCHolds, prometheus.GaugeValue, holds, names[m.id])
	}
	for _, p := range y.peers {
		behind := 0.0
		p.mu.Lock()
		if p.behind {
			behind = 1
		}
		p.mu.Unlock()
		ch <- prometheus.MustNewConstMetric(descGCBehind, prometheus.GaugeValue, behind, p.m.name)
	}
}

func replicaLabel(r core.ReplicaID) string { return fmt.Sprintf("%x", uint64(r)) }
