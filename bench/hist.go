package bench

import (
	"math/bits"
	"sync/atomic"
	"time"
)

// histogram counts latencies in microsecond buckets of at most 1/64
// (1.6%) relative width, HDR-style: values below 128 µs are exact, larger
// ones share a bucket with the values of the same power of two and the same
// 6 bits after the leading one. Recording is one atomic add, so thousands of receiving
// goroutines can record at once without a lock or an allocation.
type histogram struct {
	counts [histBuckets]atomic.Uint64
	n      atomic.Int64
	max    atomic.Int64 // µs
}

const (
	histSubBits = 7 // values below 2^7 µs are exact
	histSub     = 1 << histSubBits
	histHalf    = histSub / 2 // buckets per power of two above that
	histMaxExp  = 40          // values up to 2^41 µs (25 days); larger are clamped
	histBuckets = histSub + (histMaxExp-histSubBits+1)*histHalf
)

func histIndex(us int64) int {
	if us < histSub {
		return int(max(us, 0))
	}
	exp := bits.Len64(uint64(us)) - 1 // us is in [2^exp, 2^(exp+1))
	if exp > histMaxExp {
		return histBuckets - 1
	}
	// The 6 bits after the leading one pick the bucket within the power.
	sub := int(us>>(exp-histSubBits+1)) & (histHalf - 1)
	return histSub + (exp-histSubBits)*histHalf + sub
}

// histValue is a representative value (the midpoint) of bucket i, in µs.
func histValue(i int) int64 {
	if i < histSub {
		return int64(i)
	}
	j := i - histSub
	exp := histSubBits + j/histHalf
	shift := exp - histSubBits + 1
	lo := int64(1)<<exp | int64(j%histHalf)<<shift
	return lo + int64(1)<<shift/2
}

func (h *histogram) record(d time.Duration) {
	us := d.Microseconds()
	if us < 0 {
		us = 0 // clocks of one process; a negative value is rounding
	}
	h.counts[histIndex(us)].Add(1)
	h.n.Add(1)
	for {
		m := h.max.Load()
		if us <= m || h.max.CompareAndSwap(m, us) {
			break
		}
	}
}

func (h *histogram) count() int64 { return h.n.Load() }

// latencies summarizes the histogram as the harness's other scenarios do
// (nearest rank), in milliseconds; the maximum is exact.
func (h *histogram) latencies() Latencies {
	n := h.n.Load()
	if n == 0 {
		return Latencies{}
	}
	q := func(p float64) float64 {
		rank := int64(p*float64(n) + 0.5)
		rank = max(1, min(rank, n))
		var seen int64
		for i := range h.counts {
			if seen += int64(h.counts[i].Load()); seen >= rank {
				return float64(min(histValue(i), h.max.Load())) / 1000
			}
		}
		return float64(h.max.Load()) / 1000
	}
	return Latencies{N: int(n), P50: q(0.50), P99: q(0.99), P999: q(0.999), Max: float64(h.max.Load()) / 1000}
}
