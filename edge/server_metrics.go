package edge

import (
	"context"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// serverMetrics are the server's metrics, on its own registry. Where etcd
// has a metric for the same thing, it has etcd's name, so dashboards and
// alerts written for etcd read the edge store unchanged; the edge store's
// own additions are named aether_edge_*.
type serverMetrics struct {
	batchSize prometheus.Histogram
	changes   prometheus.Counter
	fsync     prometheus.Histogram
	watchers  prometheus.Gauge
	started   *prometheus.CounterVec
	handled   *prometheus.CounterVec
	// merged counts, per peer, the pushed changes that were new here (the
	// rest of aether_edge_sync_changes_received_total were held already,
	// usually reached through another peer first).
	merged *prometheus.CounterVec
}

func newServerMetrics(s *Server) *serverMetrics {
	reg := s.reg
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
		// etcd's buckets for its WAL fsync; here it times the storage
		// transaction that makes a batch durable.
		fsync: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "etcd", Subsystem: "disk", Name: "wal_fsync_duration_seconds",
			Help:    "The latency distributions of fsync called by the group commit (one storage transaction per batch).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}),
		watchers: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "etcd_debugging", Subsystem: "mvcc", Name: "watcher_total",
			Help: "Total number of watchers.",
		}),
		started: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_started_total", Help: "Total number of RPCs started on the server.",
		}, []string{"grpc_type", "grpc_service", "grpc_method"}),
		handled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grpc_server_handled_total", Help: "Total number of RPCs completed on the server, regardless of success or failure.",
		}, []string{"grpc_type", "grpc_service", "grpc_method", "grpc_code"}),
		merged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aether_edge_sync_changes_merged_total",
			Help: "Changes received from the peer that were new here and were merged (the rest were held already).",
		}, []string{"peer"}),
	}
	gauge := func(ns, sub, name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, f)
	}
	one := func() float64 { return 1 }
	index := func() float64 {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return float64(s.st.Index())
	}
	reg.MustRegister(m.batchSize, m.changes, m.fsync, m.watchers, m.started, m.handled, m.merged,
		// The DAG's frontier: more than one head means concurrent changes
		// not yet merged over by a later one (aether_edge_dag_changes,
		// with the sync metrics, is its size).
		gauge("aether_edge", "dag", "heads", "Heads of the replica's change DAG (changes no other change here has as parent).", func() float64 {
			s.mu.RLock()
			defer s.mu.RUnlock()
			return float64(len(s.st.Heads()))
		}),
		// A replica is always its own leader: etcd's leader metrics say so.
		gauge("etcd", "server", "has_leader", "Whether or not a leader exists. 1 is existence, 0 is not.", one),
		gauge("etcd", "server", "is_leader", "Whether or not this member is a leader. 1 if is, 0 otherwise.", one),
		gauge("etcd", "server", "proposals_committed_total", "The total number of consensus proposals committed.", index),
		gauge("etcd", "server", "proposals_applied_total", "The total number of consensus proposals applied.", index),
		gauge("etcd", "mvcc", "db_total_size_in_bytes", "Total size of the underlying database physically allocated in bytes.",
			func() float64 { return float64(s.store.Size()) }),
		gauge("etcd_debugging", "mvcc", "current_revision", "The current revision of store.", func() float64 {
			return float64(s.currentRev())
		}),
		gauge("etcd_debugging", "mvcc", "compact_revision", "The revision of the last compaction in store.", func() float64 {
			s.mu.RLock()
			defer s.mu.RUnlock()
			return float64(s.st.CompactRev())
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "etcd", Subsystem: "server", Name: "version", Help: "Which version is running. 1 for 'server_version' label with current version.",
			ConstLabels: prometheus.Labels{"server_version": Version},
		}, one),
	)
	return m
}

func (m *serverMetrics) observeBatch(n int, took time.Duration) {
	m.batchSize.Observe(float64(n))
	m.changes.Add(float64(n))
	m.fsync.Observe(took.Seconds())
}

// splitMethod turns "/etcdserverpb.KV/Range" into service and method.
func splitMethod(full string) (string, string) {
	full = strings.TrimPrefix(full, "/")
	if i := strings.LastIndex(full, "/"); i >= 0 {
		return full[:i], full[i+1:]
	}
	return "unknown", full
}

// The interceptors count RPCs under grpc-prometheus' names, as etcd exports
// them.
func (m *serverMetrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	svc, meth := splitMethod(info.FullMethod)
	m.started.WithLabelValues("unary", svc, meth).Inc()
	resp, err := h(ctx, req)
	m.handled.WithLabelValues("unary", svc, meth, status.Code(err).String()).Inc()
	return resp, err
}

func (m *serverMetrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	svc, meth := splitMethod(info.FullMethod)
	typ := "bidi_stream"
	switch {
	case info.IsClientStream && !info.IsServerStream:
		typ = "client_stream"
	case !info.IsClientStream && info.IsServerStream:
		typ = "server_stream"
	}
	m.started.WithLabelValues(typ, svc, meth).Inc()
	err := h(srv, ss)
	m.handled.WithLabelValues(typ, svc, meth, status.Code(err).String()).Inc()
	return err
}
