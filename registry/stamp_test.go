package registry

import (
	"strings"
	"testing"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func TestHLCOrdersAcrossClockSteps(t *testing.T) {
	var c HLC
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	a := c.Next(t0)
	b := c.Next(t0)                      // same millisecond
	back := c.Next(t0.Add(-time.Second)) // the wall clock stepped back
	if !(a < b && b < back) {
		t.Fatalf("readings %d %d %d: want strictly increasing whatever the wall clock does", a, b, back)
	}
	if got := HLCTime(a); !got.Equal(t0) {
		t.Fatalf("HLCTime(%d) = %v, want %v", a, got, t0)
	}
	later := c.Next(t0.Add(time.Second))
	if HLCTime(later) != t0.Add(time.Second) {
		t.Fatalf("after the clock moves on, the reading follows it: %v", HLCTime(later))
	}
	// Another replica's stamp from ahead of our clock pulls us past it.
	ahead := c.Next(t0.Add(time.Minute))
	var d HLC
	d.Observe(ahead)
	if next := d.Next(t0); next <= ahead {
		t.Fatalf("after observing %d the next reading is %d; want it ordered after", ahead, next)
	}
	var z HLC
	if r := z.Next(time.Time{}); r != 1 {
		t.Fatalf("a zero wall time reads %d; want a small counter, not a wrapped negative", r)
	}
}

func TestCompareStamps(t *testing.T) {
	s := func(h uint64, w string) *registryv1.WriteStamp { return &registryv1.WriteStamp{Hlc: h, Writer: w} }
	for _, tc := range []struct {
		a, b *registryv1.WriteStamp
		want int
	}{
		{nil, nil, 0},
		{nil, s(1, "a"), -1},
		{s(1, "a"), nil, 1},
		{s(1, "z"), s(2, "a"), -1},
		{s(2, "a"), s(2, "b"), -1},
		{s(2, "b"), s(2, "b"), 0},
	} {
		if got := CompareStamps(tc.a, tc.b); got != tc.want {
			t.Errorf("CompareStamps(%v, %v) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestTombstones(t *testing.T) {
	id := EndpointID{Region: "r", Cluster: "c", Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1, IP: "10.0.0.1"}
	k, err := TombstoneKey(id)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(k, Root) || IsEndpointKey(k) || !strings.HasSuffix(k, "/services/web/protocols/http1/endpoints/10.0.0.1") {
		t.Fatalf("tombstone key %q: want outside %q, not an endpoint key, same path below the root", k, Root)
	}
	st := &registryv1.WriteStamp{Hlc: 42, Writer: "e"}
	v, err := EncodeTombstone(st)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeTombstone(v)
	if err != nil || CompareStamps(got, st) != 0 {
		t.Fatalf("round trip: %v %v, want %v", got, err, st)
	}
	if _, err := DecodeTombstone([]byte{0xff}); err == nil {
		t.Fatal("garbage decoded as a tombstone")
	}
}
