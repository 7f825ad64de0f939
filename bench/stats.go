package bench

import (
	"fmt"
	"sort"
	"time"
)

// Latencies summarises a sample of durations.
type Latencies struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`
}

func summarize(ds []time.Duration) Latencies {
	if len(ds) == 0 {
		return Latencies{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) float64 {
		i := int(p*float64(len(s))+0.5) - 1
		i = max(0, min(i, len(s)-1))
		return ms(s[i])
	}
	return Latencies{N: len(s), P50: q(0.50), P99: q(0.99), P999: q(0.999), Max: ms(s[len(s)-1])}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (l Latencies) String() string {
	return fmt.Sprintf("n=%d p50=%.2fms p99=%.2fms p99.9=%.2fms max=%.2fms", l.N, l.P50, l.P99, l.P999, l.Max)
}

// benchIP is the i-th of up to 15 million distinct, valid unicast addresses.
func benchIP(i int) string {
	return fmt.Sprintf("10.%d.%d.%d", (i/62500)%250+1, (i/250)%250, i%250+1)
}

// benchNode spreads endpoints over nodes of 100, as pods spread over
// hosts (and inside the registrar's --max-endpoints-per-node).
func benchNode(i int) string { return fmt.Sprintf("bench-node-%d", i/100) }
