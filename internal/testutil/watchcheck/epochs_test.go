package watchcheck

import (
	"fmt"
	"testing"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// The second incarnation, epoch e1, loads the first's end state (web1b,
// cache, web5, db6) as its sequences 1..4, then adds web3 again (with new
// metadata) at 5 and removes cache at 6.
const epoch1 = "e1"

func ver1(seq uint64) string { return fmt.Sprintf("%s:%d", epoch1, seq) }

var web3c = mkep("web", "10.0.0.3", "v3")

func in1(m *registrarv1.EndpointEvent) *registrarv1.EndpointEvent {
	m.Version = ver1(m.GetSequence())
	if m.Epoch != "" {
		m.Epoch = epoch1
	}
	return m
}

func history1() History {
	return History{
		Epoch:     epoch1,
		Base:      4,
		BaseState: []*registryv1.ServiceEndpoint{web1b, cache, web5, db6},
		Events:    []*registrarv1.EndpointEvent{in1(change(added, 5, web3c)), in1(change(removed, 6, cache))},
		Acks: []Ack{
			{Op: OpRegister, Endpoint: web3c, Version: ver1(5)},
			{Op: OpUnregister, Endpoint: cache, Version: ver1(6)},
		},
		Final:        []*registryv1.ServiceEndpoint{web1b, web5, db6, web3c},
		FinalVersion: ver1(6),
	}
}

// Streams opened on e1 with tokens of e0: each must start over with a
// snapshot of e1.
func webAfterRestart() []*registrarv1.EndpointEvent {
	return []*registrarv1.EndpointEvent{in1(snap(4, web1b, web5)), in1(change(added, 5, web3c)), in1(progress(6))}
}

func allAfterRestart() []*registrarv1.EndpointEvent {
	return []*registrarv1.EndpointEvent{in1(snap(4, web1b, cache, web5, db6)), in1(change(added, 5, web3c)), in1(change(removed, 6, cache))}
}

func cleanEpochs() []Epoch {
	return []Epoch{
		{History: history(), Streams: cleanStreams()},
		{History: history1(), Streams: []*Recorder{
			rec("web-after-restart", []string{"web"}, ver(9), webAfterRestart()...),
			rec("all-after-restart", nil, ver(8), allAfterRestart()...),
		}},
	}
}

func TestCleanEpochsPass(t *testing.T) {
	if vs := CheckEpochs(cleanEpochs()...); len(vs) != 0 {
		t.Fatalf("clean epochs have violations:\n%s", Summary(vs))
	}
	// The old reference ended before the last write was answered, while
	// the other streams got its event: the ack at 9 is late, and is the
	// event they got.
	es := cleanEpochs()
	es[0].History.Events = es[0].History.Events[:7]
	es[0].History.Final, es[0].History.FinalVersion = nil, ""
	if vs := CheckEpochs(es...); len(vs) != 0 {
		t.Fatalf("a late ack is not accounted for:\n%s", Summary(vs))
	}
	// A stream's event beyond the reference that no late ack explains is
	// not in the history.
	es[0].History.Acks = es[0].History.Acks[:2]
	es[1].History.BaseState = append(es[1].History.BaseState, db2)
	es[1].History.Final = append(es[1].History.Final, db2)
	es[1].Streams = nil
	vs := CheckEpochs(es...)
	found := false
	for _, v := range vs {
		found = found || (v.Stream == "all" && v.Property == Faithful)
	}
	if !found {
		t.Fatalf("an event beyond the reference went unnoticed:\n%s", Summary(vs))
	}
}

func TestEpochCorruptionsAreCaught(t *testing.T) {
	web := []string{"web"}
	for _, tc := range []struct {
		name   string
		mut    func(es []Epoch)
		stream string
		want   Property
	}{
		{"post-restart snapshot missing an acknowledged endpoint", func(es []Epoch) {
			es[1].Streams[0] = rec("web-after-restart", web, ver(9), insert(without(webAfterRestart(), 0), 0, in1(snap(4, web1b)))...)
		}, "web-after-restart", Filtered},
		{"post-restart snapshot with an unregistered endpoint", func(es []Epoch) {
			es[1].Streams[1] = rec("all-after-restart", nil, ver(8), insert(without(allAfterRestart(), 0), 0, in1(snap(4, web1b, cache, web5, db6, db2)))...)
		}, "all-after-restart", Filtered},
		{"stale-epoch delta after the switch", func(es []Epoch) {
			es[1].Streams[0] = rec("web-after-restart", web, ver(9), insert(webAfterRestart(), 2, change(added, 5, web3c))...)
		}, "web-after-restart", Faithful},
		{"resumed across the restart instead of a snapshot", func(es []Epoch) {
			es[1].Streams[0] = rec("web-after-restart", web, ver(3), webResume()...)
		}, "web-after-restart", Resumable},
		{"post-restart snapshot of the old epoch", func(es []Epoch) {
			es[1].Streams[0] = rec("web-after-restart", web, ver(9), snap(9, web1b, web5), in1(change(added, 5, web3c)))
		}, "web-after-restart", Faithful},
		{"new epoch lost an acknowledged endpoint", func(es []Epoch) {
			h := &es[1].History
			h.BaseState = []*registryv1.ServiceEndpoint{web1b, cache, db6}
			h.Final = []*registryv1.ServiceEndpoint{web1b, db6, web3c}
			es[1].Streams = nil
		}, "restart e0→e1", Durable},
		{"new epoch resurrected an unregistered endpoint", func(es []Epoch) {
			h := &es[1].History
			h.BaseState = append(h.BaseState, db2)
			h.Final = append(h.Final, db2)
			es[1].Streams = nil
		}, "restart e0→e1", Durable},
		{"new epoch has a stale value", func(es []Epoch) {
			h := &es[1].History
			h.BaseState = []*registryv1.ServiceEndpoint{web1, cache, web5, db6}
			h.Final = []*registryv1.ServiceEndpoint{web1, web5, db6, web3c}
			es[1].Streams = nil
		}, "restart e0→e1", Durable},
		{"late ack lost by the new epoch", func(es []Epoch) {
			// The old reference ends at 8; the unregister of db2 at 9 was
			// acknowledged but the new epoch still has db2.
			es[0].History.Events = es[0].History.Events[:7]
			es[0].History.Final, es[0].History.FinalVersion = nil, ""
			es[0].Streams = nil
			h := &es[1].History
			h.BaseState = append(h.BaseState, db2)
			h.Final = append(h.Final, db2)
			es[1].Streams = nil
		}, "restart e0→e1", Durable},
		{"late acks with a gap", func(es []Epoch) {
			es[0].History.Events = es[0].History.Events[:6]
			es[0].History.Final, es[0].History.FinalVersion, es[0].History.Batches = nil, "", nil
			es[0].Streams = nil
			es[1].Streams = nil
		}, "restart e0→e1", Reference},
		{"epoch reused", func(es []Epoch) {
			es[1] = Epoch{History: History{Epoch: epoch, Base: 9, BaseState: []*registryv1.ServiceEndpoint{web1b, cache, web5, db6}}}
		}, "incarnation 1", Faithful},
	} {
		t.Run(tc.name, func(t *testing.T) {
			es := cleanEpochs()
			tc.mut(es)
			expect(t, CheckEpochs(es...), tc.stream, tc.want)
		})
	}
}
