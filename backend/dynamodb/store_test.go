package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/internal/testutil/dynalite"
	"github.com/aethermesh/aether/registry"
)

// clock is real time plus an offset a test moves forward, so the poll's
// window and the leases' expiry pass without waiting, while the
// deadlines derived from it still lie in the real future.
type clock struct{ off atomic.Int64 }

func (c *clock) Now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *clock) Advance(d time.Duration) { c.off.Add(int64(d)) }

func ep(service string, i int, node string, hlc uint64) *registryv1.ServiceEndpoint {
	return &registryv1.ServiceEndpoint{
		Service: service, Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
		Ip: fmt.Sprintf("10.1.%d.%d", i>>8&0xff, i&0xff), Ports: []*registryv1.Port{{Name: "http", Port: 80}},
		Node: node, Cluster: "c1", Region: "r1", State: registryv1.State_STATE_SERVING, Weight: 1,
		Stamp: &registryv1.WriteStamp{Hlc: hlc, Writer: "w1"},
	}
}

func put(e *registryv1.ServiceEndpoint) backend.Mutation {
	return backend.Mutation{ID: registry.IDOf(e), Endpoint: e}
}

// applyAll writes muts as the registrar's write-behind does: what did not
// settle is sent again, until everything has, or the deadline.
func applyAll(t *testing.T, s *Store, muts []backend.Mutation) []backend.Outcome {
	t.Helper()
	final := make([]backend.Outcome, len(muts))
	idx := make([]int, len(muts))
	for i := range idx {
		idx[i] = i
	}
	deadline := time.Now().Add(60 * time.Second)
	for attempt := 1; len(idx) > 0; attempt++ {
		batch := make([]backend.Mutation, len(idx))
		for j, i := range idx {
			batch[j] = muts[i]
		}
		outs, err := s.ApplyOrdered(ctxFor(t), batch)
		if err != nil && !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("ApplyOrdered attempt %d: a permanent failure: %v", attempt, err)
		}
		var left []int
		for j, i := range idx {
			if j < len(outs) && outs[j].Settled() {
				final[i] = outs[j]
			} else {
				left = append(left, i)
			}
		}
		idx = left
		if len(idx) > 0 && time.Now().After(deadline) {
			t.Fatalf("%d mutations still unsettled after %d attempts: %v", len(idx), attempt, err)
		}
	}
	return final
}

func batchOf(service string, n int, node string, hlc uint64) []backend.Mutation {
	muts := make([]backend.Mutation, n)
	for i := range muts {
		muts[i] = put(ep(service, i, node, hlc))
	}
	return muts
}

func listOf(t *testing.T, s *Store) backend.Listing {
	t.Helper()
	l, err := s.List(ctxFor(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return l
}

// TestRestartSeesEverything: a new Store on the same table (a registrar
// restarted, or another replica) lists every endpoint, at the revisions
// they were written, without the deleted ones, and a stale write cannot
// undo a delete it missed.
func TestRestartSeesEverything(t *testing.T) {
	cli := startDynalite(t)
	table := newTable(t, cli, 4)
	a := open(t, cli, table, Options{})
	outs := applyAll(t, a, batchOf("restart", 40, "n1", 100))
	var dels []backend.Mutation
	for i := 0; i < 40; i += 4 {
		dels = append(dels, backend.Mutation{ID: registry.IDOf(ep("restart", i, "", 0)), Stamp: &registryv1.WriteStamp{Hlc: 200, Writer: "w1"}})
	}
	applyAll(t, a, dels)
	before := listOf(t, a)

	b := open(t, cli, table, Options{})
	after := listOf(t, b)
	if len(after.Endpoints) != 30 || !sameEndpoints(before, after) || after.Revision != before.Revision {
		t.Fatalf("after restart: %d endpoints at %d, want the %d at %d the first store listed", len(after.Endpoints), after.Revision, len(before.Endpoints), before.Revision)
	}
	for i, e := range after.Endpoints {
		var n int
		fmt.Sscanf(strings.TrimPrefix(e.GetIp(), "10.1.0."), "%d", &n)
		if n%4 == 0 {
			t.Fatalf("deleted endpoint %s listed", e.GetIp())
		}
		if after.EndpointRevs[i] != outs[n].Revision {
			t.Fatalf("%s listed at %d, written at %d", e.GetIp(), after.EndpointRevs[i], outs[n].Revision)
		}
	}
	// A write stamped before the delete, from a replica that never saw it.
	o := applyAll(t, b, []backend.Mutation{put(ep("restart", 0, "n-stale", 150))})[0]
	if !o.Superseded || o.Current != nil || o.CurrentStamp.GetHlc() != 200 {
		t.Fatalf("stale write after a restart: %+v, want superseded by the delete", o)
	}
}

func sameEndpoints(a, b backend.Listing) bool {
	if len(a.Endpoints) != len(b.Endpoints) {
		return false
	}
	for i := range a.Endpoints {
		if !proto.Equal(a.Endpoints[i], b.Endpoints[i]) || a.EndpointRevs[i] != b.EndpointRevs[i] {
			return false
		}
	}
	return true
}

// throttler is an HTTP fault proxy in front of dynalite: it answers every
// third data-plane request (not table management) with DynamoDB's
// throttling error, alternating its two codes, and forwards the rest.
type throttler struct {
	proxy     *httputil.ReverseProxy
	n         atomic.Int64
	throttled atomic.Int64
	on        atomic.Bool
}

func (p *throttler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	target := r.Header.Get("X-Amz-Target")
	if p.on.Load() && !strings.Contains(target, "Table") {
		if n := p.n.Add(1); n%3 == 0 {
			io.Copy(io.Discard, r.Body)
			code := "ThrottlingException"
			if n%2 == 0 {
				code = "ProvisionedThroughputExceededException"
			}
			p.throttled.Add(1)
			w.Header().Set("Content-Type", "application/x-amz-json-1.0")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"__type":"com.amazonaws.dynamodb.v20120810#%s","message":"injected by the test's fault proxy"}`, code)
			return
		}
	}
	p.proxy.ServeHTTP(w, r)
}

// TestThrottlingLosesNothing: with a third of all requests throttled,
// every write of a stream of batches (retried, as the write-behind does,
// until settled) is in the table afterwards, with its newest value.
func TestThrottlingLosesNothing(t *testing.T) {
	srv := dynalite.Start(t)
	u, _ := url.Parse(srv.Endpoint)
	th := &throttler{proxy: httputil.NewSingleHostReverseProxy(u)}
	front := httptest.NewServer(th)
	t.Cleanup(front.Close)
	direct := client(srv.Endpoint)
	table := newTable(t, direct, 4)

	s := open(t, client(front.URL), table, Options{})
	th.on.Store(true)
	const n, rounds = 40, 2
	for r := 1; r <= rounds; r++ {
		for lo := 0; lo < n; lo += 20 {
			var muts []backend.Mutation
			for i := lo; i < lo+20; i++ {
				muts = append(muts, put(ep("throttle", i, fmt.Sprintf("gen-%d", r), uint64(100*r))))
			}
			for i, o := range applyAll(t, s, muts) {
				if !o.Landed && !(o.Superseded && registry.CompareStamps(o.CurrentStamp, muts[i].StampOf()) == 0) {
					t.Fatalf("round %d, write %d: %+v, want landed (or its own value, a lost answer)", r, lo+i, o)
				}
			}
		}
	}
	l, err := s.List(ctxFor(t)) // a listing through the throttling too
	for err != nil {
		if !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("List through throttling: %v", err)
		}
		l, err = s.List(ctxFor(t))
	}
	th.on.Store(false)
	if th.throttled.Load() < 20 {
		t.Fatalf("only %d requests throttled: the proxy did not bite", th.throttled.Load())
	}
	fresh := listOf(t, open(t, direct, table, Options{}))
	for _, got := range []backend.Listing{l, fresh} {
		if len(got.Endpoints) != n {
			t.Fatalf("%d endpoints listed, want %d", len(got.Endpoints), n)
		}
		for _, e := range got.Endpoints {
			if e.GetNode() != fmt.Sprintf("gen-%d", rounds) {
				t.Fatalf("%s holds %s, want the last round's write", e.GetIp(), e.GetNode())
			}
		}
	}
	t.Logf("%d of %d requests throttled; nothing lost", th.throttled.Load(), th.n.Load())
}

// TestIncrementalPollReadsOnlyChanges: once the startup scans are done, an
// idle poll reads no item at all (one counter read and one Query per
// shard), and a poll after k changes reads those k (the overlap window
// re-reads them until it has passed), not the table.
func TestIncrementalPollReadsOnlyChanges(t *testing.T) {
	cli := startDynalite(t)
	const shards, n = 4, 300
	table := newTable(t, cli, shards)
	var c clock
	w := open(t, cli, table, Options{})
	applyAll(t, w, batchOf("poll", n, "n1", 100))

	s := open(t, cli, table, Options{Window: 10 * time.Second, Now: c.Now})
	check := func(what string, wantFull bool, wantItems int) PollStats {
		t.Helper()
		l := listOf(t, s)
		st, _ := s.LastPoll()
		if st.Full != wantFull || (wantItems >= 0 && st.Items != wantItems) || len(l.Endpoints) != n {
			t.Fatalf("%s: %+v with %d endpoints listed, want full %v, %d items read, %d endpoints", what, st, len(l.Endpoints), wantFull, wantItems, n)
		}
		return st
	}
	first := check("first listing", true, -1)
	if first.Items < n {
		t.Fatalf("first listing read %d items, want the whole table (%d and more)", first.Items, n)
	}
	c.Advance(20 * time.Second)
	check("the rescan a window after the first", true, -1)
	c.Advance(20 * time.Second)
	idle := check("idle poll", false, 0)
	if idle.Requests != 1+shards {
		t.Fatalf("idle poll made %d requests, want the counter read and %d Queries", idle.Requests, shards)
	}

	var changes []backend.Mutation
	for i := 0; i < 10; i++ {
		changes = append(changes, put(ep("poll", i*7, "n2", 200)))
	}
	applyAll(t, w, changes)
	busy := check("poll after 10 changes", false, 10)
	l := listOf(t, s) // within the window: the same 10 again, not more
	if st, _ := s.LastPoll(); st.Items != 10 {
		t.Fatalf("second poll within the window read %d items, want the same 10", st.Items)
	}
	changed := 0
	for _, e := range l.Endpoints {
		if e.GetNode() == "n2" {
			changed++
		}
	}
	if changed != 10 {
		t.Fatalf("listing shows %d of the 10 changes", changed)
	}
	// The cursor is a reading a window older than the previous poll, so
	// the first poll after the window still re-reads the 10 (they were
	// written after the reading the previous poll judged by), the next one
	// nothing.
	c.Advance(20 * time.Second)
	check("the first poll once the window has passed", false, 10)
	c.Advance(20 * time.Second)
	check("the next poll", false, 0)

	s.ForceFullScan()
	full := check("a forced full scan", true, -1)
	t.Logf("read capacity per List: full scan of %d items %.1f units; idle poll %.1f; poll after 10 changes %.1f (dynalite reports consumed capacity: %v)",
		n, full.Capacity, idle.Capacity, busy.Capacity, full.Capacity > 0)
	if full.Capacity > 0 && busy.Capacity >= full.Capacity {
		t.Fatalf("a poll of 10 changes cost %.1f units, a full scan %.1f: not incremental", busy.Capacity, full.Capacity)
	}
}

// TestNodeExpiry: a node whose lease expiry has passed is gone for every
// replica by the same rule, though its record is still in the table; a
// reaper that judged the lease expired on a stale view loses to the
// heartbeat that landed since (its delete is conditional on the expiry it
// saw), and wins once the heartbeats stop.
func TestNodeExpiry(t *testing.T) {
	cli := startDynalite(t)
	table := newTable(t, cli, 4)
	var ca, cb clock
	a := open(t, cli, table, Options{Now: ca.Now})
	b := open(t, cli, table, Options{Now: cb.Now})
	ctx := ctxFor(t)

	lease, err := a.GrantLease(ctx, 10*time.Second)
	if err != nil {
		t.Fatalf("GrantLease: %v", err)
	}
	n := &registryv1.Node{Name: "n1", Region: "r1", Cluster: "c1", Zone: "z1"}
	if _, err := a.PutNode(ctx, n, lease); err != nil {
		t.Fatalf("PutNode: %v", err)
	}
	if l := listOf(t, b); len(l.Nodes) != 1 {
		t.Fatalf("replica b lists %d nodes, want the one put", len(l.Nodes))
	}
	key, _ := registry.NodeIDOf(n).Key()
	recordHeld := func() bool {
		out, err := cli.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String(table), Key: keyOf(key), ConsistentRead: aws.Bool(true)})
		if err != nil || out.Item == nil {
			t.Fatalf("reading the node item: %v", err)
		}
		_, live := out.Item[attrValue]
		return live
	}

	// 9 s on, a heartbeat lands (expiry now 19 s); b has not polled since
	// and, its clock 2 s ahead, judges the lease expired on the expiry it
	// saw (10 s). Its reap's conditional delete loses to the heartbeat.
	ca.Advance(9 * time.Second)
	cb.Advance(11 * time.Second)
	if _, err := a.KeepAliveOnce(ctx, lease); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	if ended, err := b.Reap(ctx); err != nil || ended != 0 {
		t.Fatalf("reap racing a heartbeat ended %d leases (%v), want 0: the heartbeat wins", ended, err)
	}
	if l := listOf(t, b); len(l.Nodes) != 1 {
		t.Fatalf("after the heartbeat b lists %d nodes, want the node", len(l.Nodes))
	}

	// The heartbeats stop; past the expiry both replicas drop the node by
	// the same rule while its record is still in the table, and the reap
	// then ends it.
	ca.Advance(11 * time.Second)
	cb.Advance(9 * time.Second)
	for name, s := range map[string]*Store{"a": a, "b": b} {
		if l := listOf(t, s); len(l.Nodes) != 0 {
			t.Fatalf("replica %s still lists the node after its lease ran out", name)
		}
	}
	if !recordHeld() {
		t.Fatalf("the node's record is gone before any reap")
	}
	if ended, err := b.Reap(ctx); err != nil || ended != 1 {
		t.Fatalf("reap of the lapsed lease ended %d (%v), want 1", ended, err)
	}
	if _, err := a.KeepAliveOnce(ctx, lease); !errors.Is(err, backend.ErrLeaseNotFound) {
		t.Fatalf("heartbeat after the reap: %v, want ErrLeaseNotFound", err)
	}
	if recordHeld() {
		t.Fatalf("the reaped node's record still holds a value")
	}
}

// TestOversizedRefusedAlone: an endpoint too large for an item (with its
// previous version) is refused in its own outcome, permanently, and the
// rest of its batch lands.
func TestOversizedRefusedAlone(t *testing.T) {
	cli := startDynalite(t)
	s := open(t, cli, newTable(t, cli, 4), Options{})
	big := ep("big", 1, "n1", 100)
	big.Metadata = map[string]string{"blob": strings.Repeat("x", MaxValueBytes)}
	muts := []backend.Mutation{put(ep("big", 0, "n1", 100)), put(big), put(ep("big", 2, "n1", 100))}
	outs, err := s.ApplyOrdered(ctxFor(t), muts)
	if err != nil {
		t.Fatalf("ApplyOrdered: %v", err)
	}
	if !outs[0].Landed || !outs[2].Landed || outs[1].Err == nil || !errors.Is(outs[1].Err, backend.ErrInvalidMutation) || !outs[1].Settled() {
		t.Fatalf("outcomes %+v: want the small ones landed and the big one refused alone", outs)
	}
	// A value that fits is written, even at the limit's edge once its
	// previous version is large too.
	edge := ep("big", 3, "n1", 100)
	edge.Metadata = map[string]string{"blob": strings.Repeat("y", MaxValueBytes-200)}
	for _, hlc := range []uint64{100, 200} {
		edge.Stamp.Hlc = hlc
		if o := applyAll(t, s, []backend.Mutation{put(edge)})[0]; !o.Landed {
			t.Fatalf("a value at the limit (stamp %d): %+v", hlc, o)
		}
	}
}

// TestMissingOrMisshapedTable: Open names the fix.
func TestMissingOrMisshapedTable(t *testing.T) {
	cli := startDynalite(t)
	ctx := ctxFor(t)
	_, err := Open(ctx, cli, "no-such-table", Options{})
	if !errors.Is(err, ErrTable) || !strings.Contains(err.Error(), "aether dynamodb create-table --dynamodb-table no-such-table") {
		t.Fatalf("Open of a missing table: %v, want ErrTable naming create-table", err)
	}
	_, err = cli.CreateTable(ctx, &ddb.CreateTableInput{
		TableName:            aws.String("other"),
		BillingMode:          types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
	})
	if err != nil {
		t.Fatalf("create a foreign table: %v", err)
	}
	_, err = Open(ctx, cli, "other", Options{})
	if !errors.Is(err, ErrTable) || !strings.Contains(err.Error(), "key schema") || !strings.Contains(err.Error(), "create-table") {
		t.Fatalf("Open of a foreign table: %v, want ErrTable about its key schema", err)
	}
	// create-table on an existing table of ours is a no-op that keeps the
	// revision counter.
	table := newTable(t, cli, 4)
	s := open(t, cli, table, Options{})
	o := applyAll(t, s, batchOf("keep", 1, "n1", 100))[0]
	if err := CreateTable(ctx, cli, table, 4); err != nil {
		t.Fatalf("create-table again: %v", err)
	}
	if o2 := applyAll(t, s, batchOf("keep", 1, "n1", 200))[0]; o2.Revision <= o.Revision {
		t.Fatalf("revision went from %d to %d across a second create-table", o.Revision, o2.Revision)
	}
}

// TestConcurrentWritersNewestWins: two replicas writing the same keys at
// once, each with its own stamps: the table ends with the newest stamp of
// every key, whatever order their writes landed in.
func TestConcurrentWritersNewestWins(t *testing.T) {
	cli := startDynalite(t)
	table := newTable(t, cli, 4)
	a, b := open(t, cli, table, Options{}), open(t, cli, table, Options{})
	const n = 30
	var wg sync.WaitGroup
	for wi, s := range []*Store{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 1; r <= 5; r++ {
				var muts []backend.Mutation
				for i := range n {
					e := ep("race", i, fmt.Sprintf("w%d-r%d", wi, r), uint64(10*r+wi*(i%2)))
					e.Stamp.Writer = fmt.Sprintf("w%d", wi)
					muts = append(muts, put(e))
				}
				if _, err := s.ApplyOrdered(context.Background(), muts); err != nil {
					t.Errorf("writer %d round %d: %v", wi, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	l := listOf(t, open(t, cli, table, Options{}))
	for _, e := range l.Endpoints {
		var i int
		fmt.Sscanf(strings.TrimPrefix(e.GetIp(), "10.1.0."), "%d", &i)
		// Round 5 wins: stamp 50 (+1 for writer 1 on odd keys); on even
		// keys the tie at 50 goes to the later writer name, w1.
		if want := "w1-r5"; e.GetNode() != want {
			t.Errorf("key %d holds %s, want %s", i, e.GetNode(), want)
		}
	}
	if len(l.Endpoints) != n {
		t.Fatalf("%d endpoints, want %d", len(l.Endpoints), n)
	}
}

// TestLargeBatchInChunks: a batch larger than MaxPerRevision goes out
// under several revisions, each mutation landing, in order of the chunks.
func TestLargeBatchInChunks(t *testing.T) {
	cli := startDynalite(t)
	s := open(t, cli, newTable(t, cli, 4), Options{MaxPerRevision: 3})
	outs := applyAll(t, s, batchOf("chunks", 10, "n1", 100))
	revs := map[int64]int{}
	for i, o := range outs {
		if !o.Landed {
			t.Fatalf("mutation %d: %+v", i, o)
		}
		revs[o.Revision]++
		if i > 0 && o.Revision < outs[i-1].Revision {
			t.Fatalf("mutation %d at %d after %d at %d", i, o.Revision, i-1, outs[i-1].Revision)
		}
	}
	if len(revs) != 4 {
		t.Fatalf("10 mutations at 3 a revision took revisions %v, want 4", revs)
	}
	if l := listOf(t, s); len(l.Endpoints) != 10 {
		t.Fatalf("listed %d, want 10", len(l.Endpoints))
	}
}

// TestListingCutBelowOwnWritesInFlight: while a write of this Store is in
// flight, its listings are cut below that write's revision, even when
// another replica's later write has landed: the listing then shows
// neither, consistently, rather than the later write with this one
// seemingly undone (which the registrar, having flushed it, would take
// for a revert).
func TestListingCutBelowOwnWritesInFlight(t *testing.T) {
	cli := startDynalite(t)
	table := newTable(t, cli, 4)
	s := open(t, cli, table, Options{})
	other := open(t, cli, table, Options{})
	k1 := ep("flight", 1, "v1", 100)
	r1 := applyAll(t, s, []backend.Mutation{put(k1)})[0].Revision

	held, release := make(chan int64, 1), make(chan struct{})
	s.beforeWrite = func(key string, rev int64) {
		held <- rev
		<-release
	}
	done := make(chan backend.Outcome, 1)
	go func() {
		outs, err := s.ApplyOrdered(context.Background(), []backend.Mutation{put(ep("flight", 1, "v2", 200))})
		if err != nil {
			t.Errorf("the held write: %v", err)
		}
		done <- outs[0]
	}()
	r2 := <-held
	r3 := applyAll(t, other, []backend.Mutation{put(ep("flight", 2, "other", 100))})[0].Revision
	if r3 <= r2 {
		t.Fatalf("the other replica's write at %d, not after the held one at %d", r3, r2)
	}
	l := listOf(t, s)
	if l.Revision >= r2 || len(l.Endpoints) != 1 || l.Endpoints[0].GetNode() != "v1" || l.EndpointRevs[0] != r1 {
		t.Fatalf("listing with a write held at %d (another at %d landed): at %d, %v; want below %d, only the first write", r2, r3, l.Revision, l.Endpoints, r2)
	}
	close(release)
	if o := <-done; !o.Landed || o.Revision != r2 {
		t.Fatalf("held write: %+v", o)
	}
	s.beforeWrite = nil
	l = listOf(t, s)
	if l.Revision < r3 || len(l.Endpoints) != 2 {
		t.Fatalf("after the write landed: %d endpoints at %d, want both at %d or later", len(l.Endpoints), l.Revision, r3)
	}
}

// TestServerRefusalIsPerItem: an item the server refuses (here dynalite
// told to allow 8 KB items, as a stand-in for any size rule the backend's
// own check does not foresee) is refused permanently in its own outcome,
// and its neighbours land.
func TestServerRefusalIsPerItem(t *testing.T) {
	cli := client(dynalite.Start(t, "--maxItemSizeKb", "8").Endpoint)
	s := open(t, cli, newTable(t, cli, 4), Options{})
	big := ep("refused", 1, "n1", 100)
	big.Metadata = map[string]string{"blob": strings.Repeat("x", 10<<10)}
	muts := []backend.Mutation{put(ep("refused", 0, "n1", 100)), put(big), put(ep("refused", 2, "n1", 100))}
	outs, err := s.ApplyOrdered(ctxFor(t), muts)
	if err != nil {
		t.Fatalf("ApplyOrdered: %v", err)
	}
	if !outs[0].Landed || !outs[2].Landed || !errors.Is(outs[1].Err, backend.ErrInvalidMutation) {
		t.Fatalf("outcomes %+v: want the neighbours landed and the big one refused alone", outs)
	}
	t.Logf("refused: %v", outs[1].Err)
}

// TestPollLongerThanTheWindowMissesNothing: with polls further apart than
// the settle window (the registrar's default 5 s poll against a 4 s
// window), a write allocated just before one poll's counter read and
// landing just after that poll read the index is picked up by the next
// poll: the cursor is a reading a window older than the previous poll,
// not merely a window older than now (which the previous poll's own
// reading is, and whose counter covers the late write's revision).
func TestPollLongerThanTheWindowMissesNothing(t *testing.T) {
	cli := startDynalite(t)
	table := newTable(t, cli, 4)
	var c clock
	const window = 4 * time.Second
	w := open(t, cli, table, Options{Window: window, Now: c.Now})
	p := open(t, cli, table, Options{Window: window, Now: c.Now})
	applyAll(t, w, []backend.Mutation{put(ep("late", 1, "n1", 100))})
	for range 3 { // the first scan, the rescan a window later, then the incremental poll
		listOf(t, p)
		c.Advance(5 * time.Second)
	}
	if last, _ := p.LastPoll(); last.Full {
		t.Fatalf("the poll is still a full scan: %+v", last)
	}

	held, release := make(chan int64, 1), make(chan struct{})
	w.beforeWrite = func(key string, rev int64) {
		held <- rev
		<-release
	}
	done := make(chan error, 1)
	go func() {
		_, err := w.ApplyOrdered(context.Background(), []backend.Mutation{put(ep("late", 2, "n1", 100))})
		done <- err
	}()
	rev := <-held
	if l := listOf(t, p); len(l.Endpoints) != 1 {
		t.Fatalf("the poll while the write at %d is in flight lists %d endpoints, want the first alone", rev, len(l.Endpoints))
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("the held write: %v", err)
	}
	w.beforeWrite = nil
	c.Advance(5 * time.Second) // the next poll, more than a window later
	l := listOf(t, p)
	if last, _ := p.LastPoll(); last.Full {
		t.Fatalf("the poll after the late write was a full scan, which proves nothing: %+v", last)
	}
	if len(l.Endpoints) != 2 {
		last, _ := p.LastPoll()
		t.Fatalf("the poll after the late write (revision %d) lists %d endpoints, want both; it read above %d", rev, len(l.Endpoints), last.Cursor)
	}
}
