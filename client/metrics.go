package client

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are per Client; they reach a registry only through
// Config.Registerer, so nothing is global.
type metrics struct {
	reconnects prometheus.Counter
	dropped    prometheus.Counter
	reasserted prometheus.Counter
	all        []prometheus.Collector
	reg        prometheus.Registerer // set once registered
}

func newMetrics(c *Client) *metrics {
	m := &metrics{
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agent_registrar_stream_reconnects_total",
			Help: "Attempts to re-open the registrar stream after it failed or ended.",
		}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agent_registrar_writes_dropped_total",
			Help: "Writes dropped because a registrar rejected them permanently (invalid, not permitted, failed precondition, drain of an unknown endpoint).",
		}),
		reasserted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agent_registrar_reasserted_total",
			Help: "Registrations this agent sent again on its own because the registrar's state lacked them or differed from them (lost in a registrar crash before being persisted, or changed or removed by someone else).",
		}),
	}
	m.all = []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "agent_registrar_cache_age_seconds",
			Help: "0 while the registrar stream is connected and synced; otherwise seconds since it last was (the cache is serving stale data).",
		}, func() float64 { return c.CacheAge().Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "agent_registrar_pending_writes",
			Help: "Endpoints whose latest write no registrar has acknowledged yet.",
		}, func() float64 { return float64(c.PendingWrites()) }),
		m.reconnects,
		m.dropped,
		m.reasserted,
	}
	return m
}

// register registers every collector or none.
func (m *metrics) register(reg prometheus.Registerer) error {
	for i, col := range m.all {
		if err := reg.Register(col); err != nil {
			for _, done := range m.all[:i] {
				reg.Unregister(done)
			}
			return fmt.Errorf("client: registering metrics: %w (use prometheus.WrapRegistererWith to tell clients apart)", err)
		}
	}
	m.reg = reg
	return nil
}

func (m *metrics) unregister() {
	if m.reg == nil {
		return
	}
	for _, col := range m.all {
		m.reg.Unregister(col)
	}
}
