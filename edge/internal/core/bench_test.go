package core

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// benchKeys are YCSB-shaped: 18-byte keys over a uniform key space.
func benchKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("user%014d", i))
	}
	return keys
}

// BenchmarkPut measures the core's share of a Put: check, MVCC update,
// change encoding and SHA-256, event log; one core, no I/O. The issue's
// throwaway trial did about 300k puts/s.
func BenchmarkPut(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			keys := benchKeys(n)
			val := make([]byte, 32)
			s := New(1)
			r := rand.New(rand.NewPCG(1, 2))
			now := time.Unix(1_800_000_000, 0)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, _, err := s.Put(now.Add(time.Duration(i)), &pb.PutRequest{Key: keys[r.IntN(n)], Value: val}); err != nil {
					b.Fatal(err)
				}
				// Compact as a server would, keeping the history bounded.
				if i%10000 == 9999 {
					if err := s.Compact(s.Rev() - 1000); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "puts/s")
		})
	}
}

// BenchmarkRange is a YCSB read: one key.
func BenchmarkRange(b *testing.B) {
	const n = 100000
	keys := benchKeys(n)
	s := New(1)
	now := time.Unix(1_800_000_000, 0)
	for _, k := range keys {
		s.Put(now, &pb.PutRequest{Key: k, Value: make([]byte, 32)})
	}
	r := rand.New(rand.NewPCG(1, 2))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := s.Range(&pb.RangeRequest{Key: keys[r.IntN(n)]}); err != nil {
			b.Fatal(err)
		}
	}
}
