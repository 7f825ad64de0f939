package watchcheck

import (
	"fmt"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

const epoch = "e0"

func mkep(svc, ip string, meta string) *registryv1.ServiceEndpoint {
	e := &registryv1.ServiceEndpoint{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip, Region: "r1", Cluster: "c1",
		Ports: []*registryv1.Port{{Name: "http", Port: 80}}}
	if meta != "" {
		e.Metadata = map[string]string{"m": meta}
	}
	return e
}

func ver(seq uint64) string { return fmt.Sprintf("%s:%d", epoch, seq) }

func change(typ registrarv1.EndpointEvent_EventType, seq uint64, e *registryv1.ServiceEndpoint) *registrarv1.EndpointEvent {
	return &registrarv1.EndpointEvent{Type: typ, Sequence: seq, Version: ver(seq), Endpoint: e}
}

// snap and progress name their epoch, as a registrar does since the field
// exists; the chunked stream of cleanStreams has a chunk without, as an
// older registrar sends.
func snap(seq uint64, eps ...*registryv1.ServiceEndpoint) *registrarv1.EndpointEvent {
	return &registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_FULL_SNAPSHOT, Sequence: seq, Version: ver(seq), Epoch: epoch, Endpoints: eps}
}

func progress(seq uint64) *registrarv1.EndpointEvent {
	return &registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_PROGRESS, Sequence: seq, Version: ver(seq), Epoch: epoch}
}

const (
	added   = registrarv1.EndpointEvent_ENDPOINT_ADDED
	updated = registrarv1.EndpointEvent_ENDPOINT_UPDATED
	removed = registrarv1.EndpointEvent_ENDPOINT_REMOVED
)

var (
	web1  = mkep("web", "10.0.0.1", "")
	db2   = mkep("db", "10.0.0.2", "")
	web3  = mkep("web", "10.0.0.3", "")
	web1b = mkep("web", "10.0.0.1", "v2")
	cache = mkep("cache", "10.0.0.4", "")
	web5  = mkep("web", "10.0.0.5", "")
	db6   = mkep("db", "10.0.0.6", "")
)

// events is the clean history after the base (sequence 1: web1). 6..8 is
// one batch.
func events() []*registrarv1.EndpointEvent {
	return []*registrarv1.EndpointEvent{
		change(added, 2, db2),
		change(added, 3, web3),
		change(updated, 4, web1b),
		change(added, 5, cache),
		change(added, 6, web5),
		change(added, 7, db6),
		change(removed, 8, web3),
		change(removed, 9, db2),
	}
}

func history() History {
	return History{
		Epoch:     epoch,
		Base:      1,
		BaseState: []*registryv1.ServiceEndpoint{web1},
		Events:    events(),
		Batches:   [][2]uint64{{6, 8}},
		Acks: []Ack{
			{Op: OpRegister, Endpoint: db2, Version: ver(2)},
			{Op: OpRegister, Endpoint: web1b, Version: ver(4)},
			{Op: OpUnregister, Endpoint: db2, Version: ver(9)},
		},
		Final:        []*registryv1.ServiceEndpoint{web1b, cache, web5, db6},
		FinalVersion: ver(9),
	}
}

func rec(name string, services []string, last string, msgs ...*registrarv1.EndpointEvent) *Recorder {
	r := NewRecorder(name, &registrarv1.WatchEndpointsRequest{Services: services, LastVersion: last})
	for _, m := range msgs {
		r.Record(proto.Clone(m).(*registrarv1.EndpointEvent))
	}
	return r
}

// Clean recordings of four kinds of stream.
func allStream() []*registrarv1.EndpointEvent {
	return append([]*registrarv1.EndpointEvent{snap(1, web1)}, append(events(), progress(9))...)
}

func webStream() []*registrarv1.EndpointEvent {
	return []*registrarv1.EndpointEvent{snap(3, web1, web3), change(updated, 4, web1b), change(added, 6, web5), change(removed, 8, web3), progress(9)}
}

func webResume() []*registrarv1.EndpointEvent {
	return []*registrarv1.EndpointEvent{change(updated, 4, web1b), change(added, 6, web5), change(removed, 8, web3), progress(9)}
}

func dbCacheResume() []*registrarv1.EndpointEvent {
	return []*registrarv1.EndpointEvent{change(added, 5, cache), change(added, 7, db6), change(removed, 9, db2), progress(9), progress(9)}
}

func cleanStreams() []*Recorder {
	wr := rec("web-resume", []string{"web"}, ver(3), webResume()...)
	wr.ExpectResume = true
	return []*Recorder{
		rec("all", nil, "", allStream()...),
		rec("web", []string{"web"}, "", webStream()...),
		wr,
		rec("db+cache-resume", []string{"db", "cache"}, ver(4), dbCacheResume()...),
		// A snapshot with chunks, and a resume from a foreign epoch that
		// correctly got a snapshot.
		rec("chunked", nil, "other:3",
			&registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_FULL_SNAPSHOT, Sequence: 5, Version: ver(5), Endpoints: []*registryv1.ServiceEndpoint{web1b, web3}, SnapshotContinues: true},
			snap(5, db2, cache), change(added, 6, web5), change(added, 7, db6), change(removed, 8, web3), change(removed, 9, db2)),
	}
}

func TestCleanHistoryPasses(t *testing.T) {
	if vs := Check(history(), cleanStreams()...); len(vs) != 0 {
		t.Fatalf("clean history has violations:\n%s", Summary(vs))
	}
}

func TestHistoryFromReference(t *testing.T) {
	ref := rec("ref", nil, "", allStream()...)
	h, vs := HistoryFrom(ref)
	if len(vs) != 0 {
		t.Fatal(Summary(vs))
	}
	if h.Epoch != epoch || h.Base != 1 || h.Last() != 9 || len(h.BaseState) != 1 {
		t.Fatalf("history %s base %d last %d", h.Epoch, h.Base, h.Last())
	}
	b, err := h.BatchOf(5, web5, db6, web3)
	if err != nil || b != [2]uint64{6, 8} {
		t.Fatalf("BatchOf = %v, %v", b, err)
	}
	if _, err := h.BatchOf(5, web5, web3); err == nil {
		t.Fatal("BatchOf accepted a write split by another event")
	}
	if _, err := h.BatchOf(8, web5); err == nil {
		t.Fatal("BatchOf accepted an endpoint with no event")
	}
	if _, vs := HistoryFrom(rec("ref", []string{"web"}, "", webStream()...)); len(vs) == 0 {
		t.Fatal("a filtered stream was accepted as a reference")
	}
}

// expect asserts that vs has a violation of property p on stream, and none on
// any other stream.
func expect(t *testing.T, vs []Violation, stream string, p Property) {
	t.Helper()
	found := false
	for _, v := range vs {
		if v.Stream != stream {
			t.Errorf("unexpected violation on another stream: %v", v)
		}
		if v.Stream == stream && v.Property == p {
			found = true
		}
	}
	if !found {
		t.Fatalf("no %s violation on %s; got:\n%s", p, stream, Summary(vs))
	}
}

// corrupt replaces the stream named name in the clean set.
func corrupt(name string, r *Recorder) []*Recorder {
	out := cleanStreams()
	for i, s := range out {
		if s.Name == name {
			r.Name = name
			out[i] = r
		}
	}
	return out
}

func without(msgs []*registrarv1.EndpointEvent, i int) []*registrarv1.EndpointEvent {
	return slices.Delete(slices.Clone(msgs), i, i+1)
}

func insert(msgs []*registrarv1.EndpointEvent, i int, m ...*registrarv1.EndpointEvent) []*registrarv1.EndpointEvent {
	return slices.Insert(slices.Clone(msgs), i, m...)
}

func TestCorruptionsAreCaught(t *testing.T) {
	web := []string{"web"}
	swapped := slices.Clone(allStream())
	swapped[3], swapped[4] = swapped[4], swapped[3]      // events 4 and 5
	bookmarkSplit := insert(allStream(), 6, progress(6)) // after event 6, inside batch 6..8
	resumeSnap := rec("web-resume", web, ver(3), webStream()...)
	resumeSnap.ExpectResume = true
	for _, tc := range []struct {
		name   string
		stream *Recorder
		want   Property
	}{
		{"dropped event", rec("all", nil, "", without(allStream(), 3)...), Reliable},
		{"dropped last event before bookmark", rec("all", nil, "", without(allStream(), 8)...), Bookmarkable},
		{"duplicated event", rec("all", nil, "", insert(allStream(), 4, change(updated, 4, web1b))...), Unique},
		{"event the snapshot reflected", rec("web", web, "", insert(webStream(), 1, change(added, 3, web3))...), Unique},
		{"swapped events", rec("all", nil, "", swapped...), Ordered},
		{"event outside the filter", rec("web", web, "", insert(webStream(), 3, change(added, 7, db6))...), Filtered},
		{"bookmark before a missing event", rec("all", nil, "", insert(allStream(), 4, progress(5))...), Bookmarkable},
		{"resume skips an event", rec("db+cache-resume", []string{"db", "cache"}, ver(4), without(dbCacheResume(), 1)...), Resumable},
		{"resume repeats an event", rec("web-resume", web, ver(3), insert(webResume(), 0, change(added, 3, web3))...), Resumable},
		{"resume sends a snapshot inside the window", resumeSnap, Resumable},
		{"resume from a foreign epoch", rec("db+cache-resume", []string{"db", "cache"}, "other:4", dbCacheResume()...), Resumable},
		{"snapshot missing an endpoint", rec("web", web, "", insert(without(webStream(), 0), 0, snap(3, web1))...), Filtered},
		{"snapshot with a foreign endpoint", rec("web", web, "", insert(without(webStream(), 0), 0, snap(3, web1, web3, db2))...), Filtered},
		{"snapshot with a stale value", rec("web", web, "", insert(without(webStream(), 0), 0, snap(4, web1, web3))...), Filtered},
		{"stream starts inside a batch", rec("web", web, "", snap(7, web1b, web5, web3), change(removed, 8, web3), progress(9)), Atomic},
		{"bookmark splits a batch", rec("all", nil, "", bookmarkSplit...), Atomic},
		{"event not in the history", rec("all", nil, "", insert(allStream(), 9, change(added, 10, db2))...), Faithful},
		{"event differs from the history", rec("web", web, "", insert(without(webStream(), 2), 2, change(added, 6, web3))...), Faithful},
		{"foreign epoch version", rec("all", nil, "", append(allStream(), &registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_PROGRESS, Sequence: 9, Version: "other:9"})...), Faithful},
		{"foreign epoch field", rec("all", nil, "", append(allStream(), &registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_PROGRESS, Sequence: 9, Version: ver(9), Epoch: "other"})...), Faithful},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expect(t, Check(history(), corrupt(tc.stream.Name, tc.stream)...), tc.stream.Name, tc.want)
		})
	}
}

func TestBatchWithHoleIsCaught(t *testing.T) {
	// The db stream's view of batch 6..8 is only event 7, so use a web+db
	// stream that gets 6 and 8 but not 7.
	r := rec("web+db", []string{"web", "db"}, "", snap(5, web1b, db2, web3), change(added, 6, web5), change(removed, 8, web3), change(removed, 9, db2))
	vs := Check(history(), r)
	expect(t, vs, "web+db", Atomic)
	expect(t, vs, "web+db", Reliable)
}

func TestCorruptReferenceIsCaught(t *testing.T) {
	for name, mut := range map[string]func(h *History){
		"gap":             func(h *History) { h.Events = without(h.Events, 3) },
		"duplicate":       func(h *History) { h.Events = insert(h.Events, 3, h.Events[2]) },
		"swap":            func(h *History) { h.Events[1], h.Events[2] = h.Events[2], h.Events[1] },
		"inconsistent":    func(h *History) { h.Events[0] = change(removed, 2, db2) },
		"ack elsewhere":   func(h *History) { h.Acks = append(h.Acks, Ack{Op: OpRegister, Endpoint: cache, Version: ver(6)}) },
		"ack wrong op":    func(h *History) { h.Acks = append(h.Acks, Ack{Op: OpUnregister, Endpoint: cache, Version: ver(5)}) },
		"ack beyond":      func(h *History) { h.Acks = append(h.Acks, Ack{Op: OpRegister, Endpoint: cache, Version: ver(12)}) },
		"final differs":   func(h *History) { h.Final = h.Final[1:] },
		"batch not range": func(h *History) { h.Batches = append(h.Batches, [2]uint64{8, 12}) },
	} {
		t.Run(name, func(t *testing.T) {
			h := history()
			mut(&h)
			found := false
			for _, v := range h.Validate() {
				found = found || v.Property == Reference
			}
			if !found {
				t.Fatal("corrupt reference passed validation")
			}
		})
	}
}
