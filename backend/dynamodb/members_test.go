package dynamodb

import (
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/aethermesh/aether/backend"
)

// A member whose lease lapses (no renewal within its TTL) drops out of
// every lister's view by the expiry rule, before anything is deleted;
// once Reap has ended the lease, the next listing removes the record, and
// a record written again under a new lease is not removed with the old
// one.
func TestMemberLapsesByItsExpiry(t *testing.T) {
	cli := startDynalite(t)
	table := newTable(t, cli, 2)
	var c clock
	a := open(t, cli, table, Options{Now: c.Now})
	b := open(t, cli, table, Options{Now: c.Now}) // another replica's store
	ctx := ctxFor(t)
	mine, err := a.GrantLease(ctx, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := a.GrantLease(ctx, 5*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	me, other := backend.Member{Epoch: "e1", Addr: "a:1"}, backend.Member{Epoch: "e2", Addr: "b:1"}
	if err := a.PutMember(ctx, "r1", "c1", me, mine); err != nil {
		t.Fatal(err)
	}
	if err := a.PutMember(ctx, "r1", "c1", other, theirs); err != nil {
		t.Fatal(err)
	}
	if got, err := b.ListMembers(ctx, "r1", "c1"); err != nil || len(got) != 2 {
		t.Fatalf("ListMembers = %v, %v; want both", got, err)
	}

	c.Advance(11 * time.Second) // e1's lease lapses, e2's does not
	if got, err := b.ListMembers(ctx, "r1", "c1"); err != nil || len(got) != 1 || got[0] != other {
		t.Fatalf("ListMembers after e1's lease lapsed = %v, %v; want e2 alone", got, err)
	}
	if _, err := a.KeepAliveOnce(ctx, mine); !errors.Is(err, backend.ErrLeaseNotFound) {
		t.Fatalf("renewing the lapsed lease: %v, want ErrLeaseNotFound", err)
	}
	if err := a.PutMember(ctx, "r1", "c1", me, mine); !errors.Is(err, backend.ErrLeaseNotFound) {
		t.Fatalf("PutMember under the lapsed lease: %v, want ErrLeaseNotFound", err)
	}
	// Lapsed, not ended: the record stays in the item (a renewer whose
	// clock runs behind may still hold the lease live).
	if !hasMemberAttr(t, cli, table, "e1") {
		t.Fatal("the lapsed member's record was removed before its lease was ended")
	}

	// B's poll sees the lapse and reaps the lease; a listing then tidies.
	if _, err := b.List(ctx); err != nil {
		t.Fatal(err)
	}
	c.Advance(2 * testWindow) // the poll's window, so the cursor passes the lease's writes
	if _, err := b.List(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := b.Reap(ctx); err != nil || n != 1 {
		t.Fatalf("Reap = %d, %v; want the one lapsed lease ended", n, err)
	}
	if _, err := b.ListMembers(ctx, "r1", "c1"); err != nil {
		t.Fatal(err)
	}
	if hasMemberAttr(t, cli, table, "e1") {
		t.Fatal("the record of an ended lease is still in the members item")
	}

	// e2 restarts its membership under a new lease (as after a pause
	// that lapsed it), and the end of its old one does not remove it.
	renewed, err := a.GrantLease(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.PutMember(ctx, "r1", "c1", other, renewed); err != nil {
		t.Fatal(err)
	}
	if _, err := a.RevokeLease(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	if got, err := b.ListMembers(ctx, "r1", "c1"); err != nil || len(got) != 1 || got[0] != other {
		t.Fatalf("ListMembers after e2 rejoined = %v, %v; want e2", got, err)
	}
	if !hasMemberAttr(t, cli, table, "e2") {
		t.Fatal("the rejoined member's record was removed with its old lease")
	}
	// The members item is not the registry's: no listing shows it.
	if l, err := b.List(ctx); err != nil || len(l.Endpoints)+len(l.Nodes) != 0 {
		t.Fatalf("List = %d endpoints, %d nodes, %v; want none", len(l.Endpoints), len(l.Nodes), err)
	}
}

func hasMemberAttr(t *testing.T, cli *ddb.Client, table, epoch string) bool {
	t.Helper()
	out, err := cli.GetItem(ctxFor(t), &ddb.GetItemInput{TableName: aws.String(table), Key: keyOf(membersKey("r1", "c1")), ConsistentRead: aws.Bool(true)})
	if err != nil {
		t.Fatal(err)
	}
	_, ok := out.Item[memberAttrPrefix+epoch]
	return ok
}
