package backendtest

import (
	"errors"
	"fmt"
	"time"

	"github.com/aethermesh/aether/backend"
)

// RunMembers checks peer-watch's membership (backend.Members): records
// listed per (region, cluster) in epoch order, gone with their lease,
// refused under a lease that is gone, and invisible to the registry's
// listing.
func RunMembers(t T, f Factory) {
	s := f.New(t)
	ms, ok := s.(backend.Members)
	ls, lok := s.(backend.Leases)
	if !ok || !lok {
		t.Fatalf("the store under test offers no Members and Leases; RunMembers does not apply to it")
	}
	ctx := testCtx(t)
	// A region of its own: a store shared between runs keeps no record of
	// another's here.
	region := fmt.Sprintf("members-%d", time.Now().UnixNano())
	lease, err := ls.GrantLease(ctx, 30*time.Second)
	if err != nil {
		t.Fatalf("GrantLease: %v", err)
	}
	other, err := ls.GrantLease(ctx, 30*time.Second)
	if err != nil {
		t.Fatalf("GrantLease: %v", err)
	}
	for _, p := range []struct {
		cluster string
		m       backend.Member
		lease   int64
	}{
		{"c1", backend.Member{Epoch: "e2", Addr: "b:1"}, lease},
		{"c1", backend.Member{Epoch: "e1", Addr: "a:1"}, other},
		{"c2", backend.Member{Epoch: "e3", Addr: "c:1"}, lease},
	} {
		if err := ms.PutMember(ctx, region, p.cluster, p.m, p.lease); err != nil {
			t.Fatalf("PutMember %v: %v", p.m, err)
		}
	}
	got, err := ms.ListMembers(ctx, region, "c1")
	if err != nil || len(got) != 2 || got[0] != (backend.Member{Epoch: "e1", Addr: "a:1"}) || got[1] != (backend.Member{Epoch: "e2", Addr: "b:1"}) {
		t.Fatalf("ListMembers(c1) = %v, %v; want e1 then e2", got, err)
	}
	if l := list(t, s); len(l.Endpoints) != 0 || len(l.Nodes) != 0 {
		t.Fatalf("member records show in the registry's listing: %s", describeListing(l))
	}
	if _, err := ls.RevokeLease(ctx, lease); err != nil {
		t.Fatalf("RevokeLease: %v", err)
	}
	if got, err := ms.ListMembers(ctx, region, "c1"); err != nil || len(got) != 1 || got[0].Epoch != "e1" {
		t.Fatalf("ListMembers(c1) after revoking e2's lease = %v, %v; want e1 alone", got, err)
	}
	if got, err := ms.ListMembers(ctx, region, "c2"); err != nil || len(got) != 0 {
		t.Fatalf("ListMembers(c2) after revoking e3's lease = %v, %v; want none", got, err)
	}
	if err := ms.PutMember(ctx, region, "c1", backend.Member{Epoch: "e2", Addr: "b:1"}, lease); !errors.Is(err, backend.ErrLeaseNotFound) {
		t.Fatalf("PutMember under a revoked lease: %v, want ErrLeaseNotFound", err)
	}
}
