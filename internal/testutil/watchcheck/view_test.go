package watchcheck

import (
	"slices"
	"testing"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

func vc(typ registrarv1.EndpointEvent_EventType, e *registryv1.ServiceEndpoint) ViewChange {
	return ViewChange{Type: typ, Endpoint: e}
}

// webView is a cache of web that followed both incarnations: its first
// snapshot at 3, the update at 4, a reconnect to the restarted registrar
// whose snapshot it diffed (web3 gone, web5 new), then e1's event at 5.
func webView() View {
	return View{
		Name:     "web-cache",
		Services: []string{"web"},
		Changes: []ViewChange{
			vc(added, web1), vc(added, web3),
			{Type: updated, Endpoint: web1b, Previous: web1},
			vc(removed, web3), vc(added, web5),
			vc(added, web3c),
		},
		Final: []*registryv1.ServiceEndpoint{web1b, web5, web3c},
	}
}

func histories() []History { return []History{history(), history1()} }

func TestCleanViewPasses(t *testing.T) {
	if vs := CheckView(histories(), webView()); len(vs) != 0 {
		t.Fatalf("clean view has violations:\n%s", Summary(vs))
	}
	// A view of everything that followed only e0, from its start.
	all := View{Name: "all", Final: []*registryv1.ServiceEndpoint{web1b, cache, web5, db6}}
	for _, ev := range allStream()[1:] {
		if isChange(ev) {
			all.Changes = append(all.Changes, ViewChange{Type: ev.GetType(), Endpoint: ev.GetEndpoint()})
		}
	}
	all.Changes = append([]ViewChange{vc(added, web1)}, all.Changes...)
	if vs := CheckView([]History{history()}, all); len(vs) != 0 {
		t.Fatalf("clean view of all has violations:\n%s", Summary(vs))
	}
}

func TestViewCorruptionsAreCaught(t *testing.T) {
	web3stale := mkep("web", "10.0.0.3", "")
	invented := mkep("web", "10.0.0.5", "zzz")
	for _, tc := range []struct {
		name string
		mut  func(v *View)
		want Property
	}{
		{"duplicate add", func(v *View) { v.Changes = slices.Insert(v.Changes, 2, vc(added, web3)) }, Consistent},
		{"remove of an unknown endpoint", func(v *View) { v.Changes = slices.Insert(v.Changes, 0, vc(removed, web5)) }, Consistent},
		{"update of an unknown endpoint", func(v *View) { v.Changes = slices.Insert(v.Changes, 0, vc(updated, web5)) }, Consistent},
		{"update to the same value", func(v *View) { v.Changes = slices.Insert(v.Changes, 3, vc(updated, web1b)) }, Consistent},
		{"update from a value not held", func(v *View) { v.Changes[2].Previous = web3 }, Consistent},
		{"remove with a value not held", func(v *View) { v.Changes[3] = vc(removed, web3c) }, Consistent},
		{"stale value after a newer one", func(v *View) {
			v.Changes = append(v.Changes, ViewChange{Type: updated, Endpoint: web3stale})
			v.Final = []*registryv1.ServiceEndpoint{web1b, web5, web3stale}
		}, Monotonic},
		{"flap: removed and re-added", func(v *View) {
			v.Changes = slices.Insert(v.Changes, 5, vc(removed, web5), vc(added, web5))
		}, Monotonic},
		{"invented value", func(v *View) {
			v.Changes = append(v.Changes, ViewChange{Type: updated, Endpoint: invented})
		}, Monotonic},
		{"went back to an older value", func(v *View) {
			v.Changes = append(v.Changes, ViewChange{Type: updated, Endpoint: web1})
		}, Monotonic},
		{"missed the last change", func(v *View) {
			v.Changes = v.Changes[:5]
			v.Final = []*registryv1.ServiceEndpoint{web1b, web5}
		}, Converged},
		{"listing differs from the changes", func(v *View) { v.Final = v.Final[1:] }, Converged},
		{"change outside the services", func(v *View) { v.Changes = append(v.Changes, vc(added, db6)) }, Filtered},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := webView()
			v.Changes = slices.Clone(v.Changes)
			tc.mut(&v)
			expect(t, CheckView(histories(), v), v.Name, tc.want)
		})
	}
}
