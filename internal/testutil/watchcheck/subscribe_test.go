package watchcheck

import (
	"testing"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func svcSnap(seq uint64, services []string, eps ...*registryv1.ServiceEndpoint) *registrarv1.EndpointEvent {
	return &registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_SERVICES_SNAPSHOT, Sequence: seq, Version: ver(seq), Services: services, Endpoints: eps}
}

// sub builds a Subscribe recording: msgs, with updates recorded as sent
// after the given numbers of messages.
func sub(name string, services []string, last string, msgs []*registrarv1.EndpointEvent, updates ...Update) *Recorder {
	r := rec(name, services, last)
	next := 0
	for i := 0; i <= len(msgs); i++ {
		for next < len(updates) && updates[next].After == i {
			r.RecordUpdate(updates[next].Add, updates[next].Remove)
			next++
		}
		if i < len(msgs) {
			r.Record(msgs[i])
		}
	}
	return r
}

var (
	web = []string{"web"}
	db  = []string{"db"}
)

// Three Subscribe streams against history():
//   - grow-shrink starts with web, adds db (a services snapshot at 4), then
//     removes web with no marker: it took effect once web's last event (8)
//     was delivered;
//   - swap starts with db and swaps it for web in one update: the services
//     snapshot at 5 pins both, so db's event at 7 is not delivered;
//   - resume resumes web from 3 and adds db: the services snapshot comes
//     after the resume's bookmark.
func growShrink() ([]*registrarv1.EndpointEvent, []Update) {
	return []*registrarv1.EndpointEvent{
			snap(3, web1, web3),
			change(updated, 4, web1b),
			svcSnap(4, db, db2),
			change(added, 6, web5),
			change(added, 7, db6),
			change(removed, 8, web3),
			change(removed, 9, db2),
			progress(9),
		}, []Update{
			{Add: db, After: 1},
			{Remove: web, After: 4},
		}
}

func swap() ([]*registrarv1.EndpointEvent, []Update) {
	return []*registrarv1.EndpointEvent{
		snap(5, db2),
		svcSnap(5, web, web1b, web3),
		change(added, 6, web5),
		change(removed, 8, web3),
		progress(9),
	}, []Update{{Add: web, Remove: db, After: 1}}
}

func resume() ([]*registrarv1.EndpointEvent, []Update) {
	return []*registrarv1.EndpointEvent{
		change(updated, 4, web1b),
		change(added, 6, web5),
		change(removed, 8, web3),
		progress(9),
		svcSnap(9, db, db6),
	}, []Update{{Add: db, After: 0}}
}

// lateWeb starts with db at 2 and adds web at 4.
func lateWeb() ([]*registrarv1.EndpointEvent, []Update) {
	return []*registrarv1.EndpointEvent{
		snap(2, db2),
		svcSnap(4, web, web1b, web3),
		change(added, 6, web5),
		change(added, 7, db6),
		change(removed, 8, web3),
		change(removed, 9, db2),
		progress(9),
	}, []Update{{Add: web, After: 1}}
}

func cleanSubs() []*Recorder {
	gm, gu := growShrink()
	sm, su := swap()
	rm, ru := resume()
	lm, lu := lateWeb()
	r := sub("resume", web, ver(3), rm, ru...)
	r.ExpectResume = true
	return []*Recorder{sub("grow-shrink", web, "", gm, gu...), sub("swap", db, "", sm, su...), r, sub("late-web", db, "", lm, lu...)}
}

func TestCleanSubscribePasses(t *testing.T) {
	if vs := Check(history(), cleanSubs()...); len(vs) != 0 {
		t.Fatalf("clean Subscribe streams have violations:\n%s", Summary(vs))
	}
}

func TestSubscribeCorruptionsAreCaught(t *testing.T) {
	gm, gu := growShrink()
	sm, su := swap()
	rm, ru := resume()
	lm, lu := lateWeb()
	for _, tc := range []struct {
		name   string
		stream *Recorder
		want   Property
	}{
		{"services snapshot missing an endpoint", sub("grow-shrink", web, "", insert(without(gm, 2), 2, svcSnap(4, db)), gu...), Filtered},
		{"services snapshot of a stale value", sub("swap", db, "", insert(without(sm, 1), 1, svcSnap(5, web, web1, web3)), su...), Filtered},
		{"services snapshot of the wrong services", sub("grow-shrink", web, "", insert(without(gm, 2), 2, svcSnap(4, []string{"cache"})), gu...), Faithful},
		{"services snapshot nobody asked for", sub("grow-shrink", web, "", gm, gu[1:]...), Faithful},
		{"services snapshot before the update was sent", sub("grow-shrink", web, "", gm, Update{Add: db, After: 3}, gu[1]), Faithful},
		{"services snapshot older than what came before", sub("grow-shrink", web, "", insert(without(gm, 2), 2, svcSnap(3, db, db2)), gu...), Ordered},
		{"event the services snapshot reflected", sub("late-web", db, "", insert(lm, 2, change(updated, 4, web1b)), lu...), Unique},
		{"added service's event dropped", sub("grow-shrink", web, "", without(gm, 4), gu...), Reliable},
		{"event of a service removed with a marker", sub("swap", db, "", insert(sm, 3, change(added, 7, db6)), su...), Filtered},
		{"event of a service never watched", sub("grow-shrink", web, "", insert(gm, 2, change(added, 5, cache)), gu...), Filtered},
		{"removed service's event dropped before its last one", sub("grow-shrink", web, "", without(gm, 3), Update{Add: db, After: 1}, Update{Remove: web, After: 3}), Reliable},
		{"services snapshot inside a resume", sub("resume", web, ver(3), insert(rm[:4], 2, svcSnap(6, db, db2)), ru...), Resumable},
		{"services snapshot splits a batch", sub("swap", db, "", []*registrarv1.EndpointEvent{snap(5, db2), change(added, 7, db6), svcSnap(7, web, web1b, web3, web5), change(removed, 8, web3), change(removed, 9, db2)}, Update{Add: web, After: 1}), Atomic},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := cleanSubs()
			for i, s := range out {
				if s.Name == tc.stream.Name {
					tc.stream.ExpectResume = s.ExpectResume
					out[i] = tc.stream
				}
			}
			expect(t, Check(history(), out...), tc.stream.Name, tc.want)
		})
	}
	// Without carries the updates along.
	r := sub("grow-shrink", web, "", gm, gu...).Without(3)
	if vs := Check(history(), r); len(vs) == 0 {
		t.Fatal("dropping web's event at 6 went unnoticed")
	}
}
