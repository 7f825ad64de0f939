package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/edge/internal/core"
	"github.com/aethermesh/aether/internal/faultproxy"
	"github.com/aethermesh/aether/internal/testutil/watchcheck"
	"github.com/aethermesh/aether/registry"
)

// The partition and convergence tests' shared parts: a mesh of replicas
// whose every directed sync link runs through its own fault proxy, pinned
// clients recording what they did, watch recorders, and the checkers
// (porcupine per replica, watchcheck per watch stream, the reference merge).

// jsonPrefix is the key prefix the mesh tests configure for JSON merge.
const jsonPrefix = "/j/"

var meshVM = core.ValueMerge{Prefixes: [][]byte{[]byte(jsonPrefix)}}

// mesh is a test cluster with a fault proxy on each directed link: link
// (a, b) carries a's Push stream to b (a's changes to b, b's acks back).
type mesh struct {
	t     *testing.T
	c     *testCluster
	links map[[2]string]*faultproxy.Proxy
}

func newMesh(t *testing.T, names []string) *mesh {
	t.Helper()
	return newMeshWith(t, names, 11, func(_ string, cfg *Config) {
		cfg.ValueMergePrefixes = []string{jsonPrefix}
	})
}

// newMeshWith is a mesh whose peer URLs are on 127.0.0.<host>,
// <host>+1, ..., each replica's config changed by mod before it starts.
func newMeshWith(t *testing.T, names []string, host int, mod func(name string, cfg *Config)) *mesh {
	t.Helper()
	m := &mesh{t: t, c: newTestCluster(t, names, nil), links: map[[2]string]*faultproxy.Proxy{}}
	// Each replica's peer port is reserved (listened on, then closed)
	// before any replica starts, and the many connections of the mesh
	// (proxies dialling, clients) take ephemeral ports from 127.0.0.1: one
	// of them can land on a reserved port and make the replica's listen
	// fail. Peer URLs on addresses of their own (127.0.0.11, ...) are out of
	// their way: a connection to loopback leaves from 127.0.0.1.
	for i, n := range names {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:0", host+i))
		if err != nil {
			t.Fatal(err)
		}
		m.c.peer[n] = url.URL{Scheme: "http", Host: l.Addr().String()}
		_ = l.Close()
	}
	for _, a := range names {
		for _, b := range names {
			if a == b {
				continue
			}
			p, err := faultproxy.Start(m.c.peer[b].Host)
			if err != nil {
				t.Fatal(err)
			}
			m.links[[2]string{a, b}] = p
		}
	}
	// Proxies close after the replicas (cleanups run last-in first-out):
	// a replica's close must not wait on a proxy that is gone.
	t.Cleanup(func() {
		for _, p := range m.links {
			_ = p.Close()
		}
	})
	m.c.mod = func(name string, cfg *Config) {
		cfg.peerDial = map[string]string{}
		for _, b := range names {
			if b != name {
				cfg.peerDial[b] = m.links[[2]string{name, b}].Addr()
			}
		}
		mod(name, cfg)
	}
	for _, n := range names {
		m.c.start(n)
	}
	return m
}

// partition blackholes every link between replicas of different groups
// (both directions) and heals the others: a silent network split, as a
// router failure makes it.
func (m *mesh) partition(groups ...[]string) {
	group := map[string]int{}
	for i, g := range groups {
		for _, n := range g {
			group[n] = i
		}
	}
	for l, p := range m.links {
		ga, oka := group[l[0]]
		gb, okb := group[l[1]]
		if oka && okb && ga != gb {
			p.Blackhole()
		} else {
			p.Heal()
		}
	}
}

// cut resets every link between a and b (both directions) and refuses new
// connections until heal: a peer that looks restarted.
func (m *mesh) cut(a, b string) {
	m.links[[2]string{a, b}].Cut()
	m.links[[2]string{b, a}].Cut()
}

func (m *mesh) heal() {
	for _, p := range m.links {
		p.Heal()
	}
}

// ---- pinned clients ----

// opKind is a client operation porcupine's model knows.
type opKind int

const (
	opGet opKind = iota
	opPut
	opDelete
	opTxn    // put if absent, else delete
	opRemote // a change merged from a peer, as this replica applied it
)

type kvInput struct {
	kind  opKind
	key   string
	value string // put, txn; remote: the value put ("" with del)
	del   bool   // remote: a delete
}

type kvOutput struct {
	exists bool   // get
	value  string // get
	n      int64  // delete: deleted; txn: 1 if it put
}

// site is one client pinned to one replica: it writes and reads only
// there, and checks read-your-writes and monotonic reads as it goes.
type site struct {
	name string
	s    *Server
	cli  *clientv3.Client
	rng  *rand.Rand

	mu     sync.Mutex
	ops    []porcupine.Operation
	acked  []string // "key=value" of every acknowledged put
	jsonOK []string // "field=value" this site's JSON edits acknowledged
	errs   []string // availability and session-guarantee failures

	lastRev int64            // highest header revision seen (monotonic reads)
	wrote   map[string]int64 // key -> revision of this client's last write
	seenMod map[string]int64 // key -> highest mod revision read
	n       int
}

func newSite(t *testing.T, name string, s *Server, seed uint64) *site {
	return &site{name: name, s: s, cli: newClient(t, s), rng: rand.New(rand.NewPCG(seed, 3)),
		wrote: map[string]int64{}, seenMod: map[string]int64{}}
}

var plainKeys = []string{"p0", "p1", "p2", "p3", "p4", "p5"}

// jsonDoc is the JSON key every site edits: each its own field, and one
// common field.
const jsonDoc = jsonPrefix + "doc"

func (w *site) fail(format string, args ...any) {
	w.mu.Lock()
	w.errs = append(w.errs, fmt.Sprintf("%s: ", w.name)+fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

func (w *site) record(in kvInput, out kvOutput, call, ret time.Time) {
	w.mu.Lock()
	w.ops = append(w.ops, porcupine.Operation{ClientId: 0, Input: in, Output: out, Call: call.UnixNano(), Return: ret.UnixNano()})
	w.mu.Unlock()
}

// observe checks one response's header and value against what this client
// already saw and wrote.
func (w *site) observe(key string, rev int64, kv *mvccpb.KeyValue) {
	if rev < w.lastRev {
		w.fail("monotonic reads: revision %d after %d", rev, w.lastRev)
	}
	w.lastRev = max(w.lastRev, rev)
	if rev < w.wrote[key] {
		w.fail("read-your-writes: read of %s at revision %d, it was written at %d", key, rev, w.wrote[key])
	}
	if kv == nil {
		return
	}
	if kv.ModRevision < w.wrote[key] {
		w.fail("read-your-writes: %s read at mod revision %d, written at %d", key, kv.ModRevision, w.wrote[key])
	}
	if kv.ModRevision < w.seenMod[key] {
		w.fail("monotonic reads: %s at mod revision %d after %d", key, kv.ModRevision, w.seenMod[key])
	}
	w.seenMod[key] = max(w.seenMod[key], kv.ModRevision)
}

// step does one random operation; a request that fails is an availability
// failure (the replica must serve whatever the network does).
func (w *site) step(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	w.n++
	key := plainKeys[w.rng.IntN(len(plainKeys))]
	val := fmt.Sprintf("%s/%d", w.name, w.n)
	call := time.Now()
	switch r := w.rng.IntN(12); {
	case r < 4:
		resp, err := w.cli.Get(ctx, key)
		if err != nil {
			w.fail("get %s: %v", key, err)
			return
		}
		out := kvOutput{}
		var kv *mvccpb.KeyValue
		if len(resp.Kvs) == 1 {
			kv = resp.Kvs[0]
			out = kvOutput{exists: true, value: string(kv.Value)}
		}
		w.record(kvInput{kind: opGet, key: key}, out, call, time.Now())
		w.observe(key, resp.Header.Revision, kv)
	case r < 8:
		resp, err := w.cli.Put(ctx, key, val)
		if err != nil {
			w.fail("put %s: %v", key, err)
			return
		}
		w.record(kvInput{kind: opPut, key: key, value: val}, kvOutput{}, call, time.Now())
		w.mu.Lock()
		w.acked = append(w.acked, key+"="+val)
		w.mu.Unlock()
		w.observe(key, resp.Header.Revision, nil)
		w.wrote[key] = resp.Header.Revision
	case r < 9:
		resp, err := w.cli.Delete(ctx, key)
		if err != nil {
			w.fail("delete %s: %v", key, err)
			return
		}
		w.record(kvInput{kind: opDelete, key: key}, kvOutput{n: resp.Deleted}, call, time.Now())
		w.observe(key, resp.Header.Revision, nil)
		if resp.Deleted > 0 {
			w.wrote[key] = resp.Header.Revision
		}
	case r < 10:
		resp, err := w.cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", 0)).
			Then(clientv3.OpPut(key, val)).Else(clientv3.OpDelete(key)).Commit()
		if err != nil {
			w.fail("txn %s: %v", key, err)
			return
		}
		out := kvOutput{}
		if resp.Succeeded {
			out.n = 1
			w.mu.Lock()
			w.acked = append(w.acked, key+"="+val)
			w.mu.Unlock()
		}
		w.record(kvInput{kind: opTxn, key: key, value: val}, out, call, time.Now())
		w.observe(key, resp.Header.Revision, nil)
		w.wrote[key] = resp.Header.Revision
	default:
		w.editJSON(ctx, w.name, fmt.Sprint(w.n))
	}
}

// editJSON reads the shared document, sets one field and writes the whole
// object back if nothing changed it meanwhile (a compare on its mod
// revision, as a controller updates a resource at its resourceVersion),
// else tries again: local writers are serialised by the compare, remote
// ones are merged field by field. Concurrent edits of other fields at
// other sites must all survive.
func (w *site) editJSON(ctx context.Context, field, value string) {
	for attempt := 0; ; attempt++ {
		if attempt == 100 {
			w.fail("%s: 100 compare failures in a row", jsonDoc)
			return
		}
		if attempt > 0 {
			// Contention (a catch-up merging changes of the document):
			// back off a little, as a controller's retry would.
			time.Sleep(time.Duration(attempt) * time.Millisecond)
		}
		resp, err := w.cli.Get(ctx, jsonDoc)
		if err != nil {
			w.fail("get %s: %v", jsonDoc, err)
			return
		}
		m := map[string]any{}
		var kv *mvccpb.KeyValue
		mod := int64(0)
		if len(resp.Kvs) == 1 {
			kv = resp.Kvs[0]
			mod = kv.ModRevision
			if err := json.Unmarshal(kv.Value, &m); err != nil {
				w.fail("%s is not JSON: %q", jsonDoc, kv.Value)
				return
			}
		}
		w.observe(jsonDoc, resp.Header.Revision, kv)
		m[field] = value
		b, _ := json.Marshal(m)
		tresp, err := w.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(jsonDoc), "=", mod)).
			Then(clientv3.OpPut(jsonDoc, string(b))).Commit()
		if err != nil {
			w.fail("put %s: %v", jsonDoc, err)
			return
		}
		if !tresp.Succeeded {
			continue
		}
		w.wrote[jsonDoc] = tresp.Header.Revision
		break
	}
	w.mu.Lock()
	w.jsonOK = append(w.jsonOK, field+"="+value)
	w.mu.Unlock()
	// Read-your-writes, value included: the replica serves the edit at
	// once, in canonical form.
	g, err := w.cli.Get(ctx, jsonDoc)
	if err != nil {
		w.fail("get %s: %v", jsonDoc, err)
		return
	}
	if len(g.Kvs) != 1 || !strings.Contains(string(g.Kvs[0].Value), fmt.Sprintf("%q:%q", field, value)) {
		w.fail("read-your-writes: %s after setting %s=%s is %v", jsonDoc, field, value, g.Kvs)
	}
}

// loop runs steps until stop is closed; a step runs under pause's read
// lock, so the test can hold every client still (pause.Lock) between two
// steps.
func (w *site) loop(ctx context.Context, stop <-chan struct{}, pause *sync.RWMutex, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			pause.RLock()
			w.step(ctx)
			pause.RUnlock()
		}
	}()
}

// ---- watch recording ----

// watchRec records one etcd watch stream: each response's events (or a
// progress notification) with when it arrived.
type watchRec struct {
	name   string
	prefix string // "" = every key
	from   int64
	mu     sync.Mutex
	msgs   []watchMsg
	err    error
}

type watchMsg struct {
	at       time.Time
	progress int64 // header revision of a progress notification (0: events)
	events   []*mvccpb.Event
}

// recordWatch opens a watch on s from revision from (prefix "" = all
// keys) and asks for progress every interval, as a client checking its
// position would; stopped by t.Cleanup.
func recordWatch(t *testing.T, s *Server, name, prefix string, from int64) *watchRec {
	t.Helper()
	r := &watchRec{name: name, prefix: prefix, from: from}
	cli := newClient(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	opts := []clientv3.OpOption{clientv3.WithRev(from), clientv3.WithPrevKV()}
	key := prefix
	if prefix == "" {
		key = "\x00"
		opts = append(opts, clientv3.WithFromKey())
	} else {
		opts = append(opts, clientv3.WithPrefix())
	}
	wch := cli.Watch(ctx, key, opts...)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		for resp := range wch {
			r.mu.Lock()
			switch {
			case resp.Err() != nil:
				r.err = resp.Err()
			case resp.IsProgressNotify():
				r.msgs = append(r.msgs, watchMsg{at: time.Now(), progress: resp.Header.Revision})
			default:
				r.msgs = append(r.msgs, watchMsg{at: time.Now(), events: resp.Events})
			}
			r.mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = cli.RequestProgress(ctx)
			}
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
	return r
}

// lastRev is the highest revision the stream delivered (events or
// progress).
func (r *watchRec) lastRev() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last int64
	for _, m := range r.msgs {
		last = max(last, m.progress)
		for _, ev := range m.events {
			last = max(last, ev.Kv.ModRevision)
		}
	}
	return last
}

// ---- a replica's own history ----

// revChange is one revision of a replica: the change that made it and its
// events, as the replica's core recorded them (not as a watch saw them).
type revChange struct {
	rev    int64
	change *core.Change
	events []*mvccpb.Event
}

func replicaHistory(t *testing.T, s *Server) []revChange {
	t.Helper()
	s.mu.RLock()
	defer s.mu.RUnlock()
	evs, err := s.st.Events(2, []byte{0}, []byte{0})
	if err != nil {
		t.Fatal(err)
	}
	byRev := map[int64][]*mvccpb.Event{}
	for _, ev := range evs {
		byRev[ev.Kv.ModRevision] = append(byRev[ev.Kv.ModRevision], ev)
	}
	var out []revChange
	for r := int64(2); r <= s.st.Rev(); r++ {
		h, ok := s.st.HashOfRevision(r)
		if !ok {
			t.Fatalf("revision %d has no change", r)
		}
		i, _ := s.st.IndexOf(h)
		c, err := core.DecodeChange(encodingAt(t, s, i))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, revChange{rev: r, change: c, events: byRev[r]})
	}
	return out
}

// ---- watchcheck, for etcd watches ----

// watchHistory maps a replica's history onto watchcheck's: every event is
// one sequence number (1, 2, ... in revision order, a revision's events in
// their order), every revision one batch; a key is a "service" with one
// endpoint whose metadata is the value and revisions. An etcd watch then
// is a resumed registrar stream: from revision r it must deliver exactly
// the events after sequence(r-1), then its progress notifications are
// bookmarks.
type watchHistory struct {
	h      watchcheck.History
	seqOf  map[string]uint64 // "rev/key" -> sequence
	revSeq []uint64          // revSeq[r] = last sequence at or below revision r
	keys   []string
}

func endpointOf(ev *mvccpb.Event) *registryv1.ServiceEndpoint {
	e := &registryv1.ServiceEndpoint{Service: string(ev.Kv.Key), Region: "edge", Cluster: "c", Ip: "10.0.0.1"}
	if ev.Type == mvccpb.PUT {
		e.Metadata = map[string]string{"value": string(ev.Kv.Value), "mod": fmt.Sprint(ev.Kv.ModRevision), "ver": fmt.Sprint(ev.Kv.Version)}
	}
	return e
}

func eventType(ev *mvccpb.Event) registrarv1.EndpointEvent_EventType {
	switch {
	case ev.Type == mvccpb.DELETE:
		return registrarv1.EndpointEvent_ENDPOINT_REMOVED
	case ev.Kv.Version == 1:
		return registrarv1.EndpointEvent_ENDPOINT_ADDED
	}
	return registrarv1.EndpointEvent_ENDPOINT_UPDATED
}

func newWatchHistory(epoch string, hist []revChange) *watchHistory {
	wh := &watchHistory{seqOf: map[string]uint64{}, revSeq: []uint64{0, 0}}
	wh.h.Epoch = epoch
	keys := map[string]bool{}
	var seq uint64
	for _, rc := range hist {
		lo := seq + 1
		for _, ev := range rc.events {
			seq++
			wh.seqOf[fmt.Sprintf("%d/%s", rc.rev, ev.Kv.Key)] = seq
			keys[string(ev.Kv.Key)] = true
			wh.h.Events = append(wh.h.Events, &registrarv1.EndpointEvent{Type: eventType(ev), Endpoint: endpointOf(ev),
				Sequence: seq, Version: registry.Position{Epoch: epoch, Seq: seq}.String()})
		}
		if seq >= lo {
			wh.h.Batches = append(wh.h.Batches, [2]uint64{lo, seq})
		}
		wh.revSeq = append(wh.revSeq, seq)
	}
	for k := range keys {
		wh.keys = append(wh.keys, k)
	}
	sort.Strings(wh.keys)
	return wh
}

// seqAt is the last sequence at or below revision r.
func (wh *watchHistory) seqAt(r int64) uint64 {
	if r < 0 {
		return 0
	}
	if int(r) >= len(wh.revSeq) {
		return wh.revSeq[len(wh.revSeq)-1]
	}
	return wh.revSeq[r]
}

// recorder turns an etcd watch recording into watchcheck's. An event the
// history lacks gets a sequence past its end (a faithfulness violation).
func (wh *watchHistory) recorder(r *watchRec) *watchcheck.Recorder {
	var svcs []string
	if r.prefix != "" {
		for _, k := range wh.keys {
			if strings.HasPrefix(k, r.prefix) {
				svcs = append(svcs, k)
			}
		}
		if len(svcs) == 0 {
			svcs = []string{r.prefix + "\x00none"} // a filter that matches nothing
		}
	}
	rec := &watchcheck.Recorder{Name: r.name, Services: svcs, ExpectResume: true,
		LastVersion: registry.Position{Epoch: wh.h.Epoch, Seq: wh.seqAt(r.from - 1)}.String()}
	r.mu.Lock()
	defer r.mu.Unlock()
	bogus := uint64(1 << 40)
	for _, m := range r.msgs {
		if m.progress > 0 {
			seq := wh.seqAt(m.progress)
			rec.Record(&registrarv1.EndpointEvent{Type: registrarv1.EndpointEvent_PROGRESS, Sequence: seq,
				Version: registry.Position{Epoch: wh.h.Epoch, Seq: seq}.String()})
			continue
		}
		for _, ev := range m.events {
			seq, ok := wh.seqOf[fmt.Sprintf("%d/%s", ev.Kv.ModRevision, ev.Kv.Key)]
			if !ok {
				bogus++
				seq = bogus
			}
			rec.Record(&registrarv1.EndpointEvent{Type: eventType(ev), Endpoint: endpointOf(ev), Sequence: seq,
				Version: registry.Position{Epoch: wh.h.Epoch, Seq: seq}.String()})
		}
	}
	return rec
}

// checkWatches runs watchcheck on a replica's recorded streams against its
// history, after each has caught up with the replica's revision, and
// proves on the first stream that a lost event is caught.
func checkWatches(t *testing.T, s *Server, name string, recs ...*watchRec) {
	t.Helper()
	hist := replicaHistory(t, s)
	rev := int64(1)
	if len(hist) > 0 {
		rev = hist[len(hist)-1].rev
	}
	for _, r := range recs {
		eventually(t, 15*time.Second, r.name+" to reach revision "+fmt.Sprint(rev), func() bool { return r.lastRev() >= rev })
		r.mu.Lock()
		err := r.err
		r.mu.Unlock()
		if err != nil {
			t.Fatalf("%s: watch error %v", r.name, err)
		}
	}
	wh := newWatchHistory("edge-"+name, hist)
	var rs []*watchcheck.Recorder
	for _, r := range recs {
		rs = append(rs, wh.recorder(r))
	}
	if vs := watchcheck.Check(wh.h, rs...); len(vs) > 0 {
		t.Fatalf("%s: watch guarantees broken:\n%s", name, watchcheck.Summary(vs))
	}
	// The checker can fail: drop the first change event of the first stream.
	for i, m := range rs[0].Messages() {
		if m.GetType() != registrarv1.EndpointEvent_PROGRESS {
			if vs := watchcheck.Check(wh.h, rs[0].Without(i)); len(vs) == 0 {
				t.Fatalf("%s: a stream missing event %d passes watchcheck", name, i)
			}
			break
		}
	}
}

// ---- porcupine, per replica ----

// kvModel is etcd's KV at one replica, one key per partition: a key is
// absent or holds a value. Merged changes from peers are operations too
// (opRemote), placed between their author's stamp and the moment this
// replica's watch delivered them: the replica applied them in that window.
var kvModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(kvInput).key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return kvState{} },
	Step: func(st, in, out any) (bool, any) {
		s, i, o := st.(kvState), in.(kvInput), out.(kvOutput)
		switch i.kind {
		case opGet:
			return o.exists == s.exists && (!s.exists || o.value == s.value), s
		case opPut:
			return true, kvState{exists: true, value: i.value}
		case opDelete:
			return o.n == map[bool]int64{true: 1, false: 0}[s.exists], kvState{}
		case opTxn:
			if s.exists {
				return o.n == 0, kvState{}
			}
			return o.n == 1, kvState{exists: true, value: i.value}
		case opRemote:
			if i.del {
				return s.exists, kvState{} // a delete event is only made for a live key
			}
			return true, kvState{exists: true, value: i.value}
		}
		return false, s
	},
	DescribeOperation: func(in, out any) string {
		i, o := in.(kvInput), out.(kvOutput)
		return fmt.Sprintf("%v %s %q -> %+v", i.kind, i.key, i.value, o)
	},
}

type kvState struct {
	exists bool
	value  string
}

// checkLinearizable checks one replica's history of plain keys under
// porcupine: its client's operations, and the merged changes it applied
// (from its own history, timed by its all-keys watch w). Then it proves
// the check can fail: a read altered to a value never written is caught.
func checkLinearizable(t *testing.T, w *site, watch *watchRec) {
	t.Helper()
	delivered := map[string]time.Time{}
	watch.mu.Lock()
	for _, m := range watch.msgs {
		for _, ev := range m.events {
			delivered[fmt.Sprintf("%d/%s", ev.Kv.ModRevision, ev.Kv.Key)] = m.at
		}
	}
	watch.mu.Unlock()
	w.mu.Lock()
	ops := slices.Clone(w.ops)
	w.mu.Unlock()
	self := core.ReplicaID(w.s.MemberID())
	remote := 0
	for _, rc := range replicaHistory(t, w.s) {
		if rc.change.Replica == self {
			continue // the site's own operations are in ops already
		}
		for _, ev := range rc.events {
			if strings.HasPrefix(string(ev.Kv.Key), jsonPrefix) {
				continue
			}
			at, ok := delivered[fmt.Sprintf("%d/%s", rc.rev, ev.Kv.Key)]
			if !ok {
				t.Fatalf("%s: revision %d was never delivered to the watch", w.name, rc.rev)
			}
			in := kvInput{kind: opRemote, key: string(ev.Kv.Key), value: string(ev.Kv.Value), del: ev.Type == mvccpb.DELETE}
			ops = append(ops, porcupine.Operation{ClientId: 1, Input: in, Output: kvOutput{}, Call: rc.change.Stamp.Wall, Return: at.UnixNano()})
			remote++
		}
	}
	res := porcupine.CheckOperationsTimeout(kvModel, ops, 60*time.Second)
	if res != porcupine.Ok {
		t.Fatalf("%s: its history (%d operations, %d merged) is %s under porcupine", w.name, len(ops), remote, res)
	}
	if remote == 0 {
		t.Fatalf("%s: no merged change in its history: the check saw no replication", w.name)
	}
	for i, op := range ops {
		if in := op.Input.(kvInput); in.kind == opGet && op.Output.(kvOutput).exists {
			bad := slices.Clone(ops)
			bad[i].Output = kvOutput{exists: true, value: "never-written"}
			if porcupine.CheckOperationsTimeout(kvModel, bad, 60*time.Second) == porcupine.Ok {
				t.Fatalf("%s: a read of a value never written passes porcupine", w.name)
			}
			return
		}
	}
	t.Fatalf("%s: no read found a value: the linearizability check is vacuous", w.name)
}

// ---- the reference merge ----

// referenceMerge is the state every replica must converge to: from every
// change held, plain keys by whole-value last writer wins on (stamp,
// replica, op index), JSON keys by the field rule as merge_json.go states
// it, computed from the flat assignments (core.JSONAssignments) without
// the core's join. Hashed as HashKV hashes.
func referenceMerge(t *testing.T, changes []*core.Change, vm core.ValueMerge) (uint32, map[string]string) {
	t.Helper()
	type plain struct {
		reg  core.JSONReg
		live bool
		v    []byte
	}
	plains := map[string]*plain{}
	assigns := map[string][]core.JSONAssign{}
	for _, c := range changes {
		for i, op := range c.Ops {
			if op.Kind != core.OpPut && op.Kind != core.OpDelete {
				continue
			}
			k := string(op.Key)
			if vm.IsJSON(op.Key) {
				assigns[k] = append(assigns[k], core.JSONAssignments(c, i)...)
				continue
			}
			r := core.JSONReg{Stamp: c.Stamp, Replica: c.Replica, Op: uint32(i)}
			if p := plains[k]; p == nil || regBefore(p.reg, r) {
				plains[k] = &plain{reg: r, live: op.Kind == core.OpPut, v: op.Value}
			}
		}
	}
	final := map[string]string{}
	for k, p := range plains {
		if p.live {
			final[k] = string(p.v)
		}
	}
	for k, as := range assigns {
		v := refValue(as, nil, core.JSONReg{})
		switch {
		case v.kind == "scalar":
			final[k] = string(v.scalar)
		case v.kind == "object":
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(v.tree()); err != nil {
				t.Fatal(err)
			}
			final[k] = strings.TrimSuffix(b.String(), "\n")
		}
	}
	names := make([]string, 0, len(final))
	for k := range final {
		names = append(names, k)
	}
	sort.Strings(names)
	h := crc32.New(crc32.MakeTable(crc32.Castagnoli))
	for _, k := range names {
		h.Write(appendLen(nil, len(k)))
		h.Write([]byte(k))
		h.Write(appendLen(nil, len(final[k])))
		h.Write([]byte(final[k]))
	}
	return h.Sum32(), final
}

func regBefore(a, b core.JSONReg) bool {
	if c := a.Stamp.Compare(b.Stamp); c != 0 {
		return c < 0
	}
	if a.Replica != b.Replica {
		return a.Replica < b.Replica
	}
	return a.Op < b.Op
}

type refVal struct {
	kind   string // "absent", "scalar", "object"
	scalar []byte
	fields map[string]*refVal
}

func (v *refVal) tree() any {
	if v.kind == "scalar" {
		return json.RawMessage(v.scalar)
	}
	m := map[string]any{}
	for n, f := range v.fields {
		m[n] = f.tree()
	}
	return m
}

// refValue is what path shows when the largest absent or scalar
// assignment at or above its parent is clear: per path the largest
// assignment wins unless older than clear; a field shows under the larger
// of clear and its parent's own largest absent or scalar assignment; a
// path is an object if a field shows or an object was assigned there.
func refValue(as []core.JSONAssign, path []string, clear core.JSONReg) *refVal {
	var win *core.JSONAssign
	inner := clear
	names := map[string]bool{}
	for i := range as {
		a := &as[i]
		if len(a.Path) > len(path) && slices.Equal(a.Path[:len(path)], path) {
			names[a.Path[len(path)]] = true
		}
		if !slices.Equal(a.Path, path) {
			continue
		}
		if win == nil || regBefore(win.Reg, a.Reg) {
			win = a
		}
		if a.Kind != "object" && regBefore(inner, a.Reg) {
			inner = a.Reg
		}
	}
	if win != nil && regBefore(win.Reg, clear) {
		win = nil
	}
	fields := map[string]*refVal{}
	for n := range names {
		if f := refValue(as, append(slices.Clone(path), n), inner); f.kind != "absent" {
			fields[n] = f
		}
	}
	switch {
	case len(fields) > 0 || (win != nil && win.Kind == "object"):
		return &refVal{kind: "object", fields: fields}
	case win != nil && win.Kind == "scalar":
		return &refVal{kind: "scalar", scalar: win.Scalar}
	}
	return &refVal{kind: "absent"}
}

// checkReference: the converged hash is the reference merge's of the
// changes held, and every acknowledged put is in one of them.
func checkReference(t *testing.T, s *Server, hash uint32, acked []string) map[string]string {
	t.Helper()
	changes := logChanges(t, s)
	want, final := referenceMerge(t, changes, meshVM)
	if want != hash {
		t.Fatalf("replicas agree on HashKV %x, the reference merge gives %x", hash, want)
	}
	puts := map[string]bool{}
	for _, c := range changes {
		for _, op := range c.Ops {
			if op.Kind == core.OpPut {
				puts[string(op.Key)+"="+string(op.Value)] = true
			}
		}
	}
	if len(acked) == 0 {
		t.Fatal("no acknowledged puts: the load did nothing")
	}
	for _, a := range acked {
		if !puts[a] {
			t.Fatalf("acknowledged put %s is in no change: lost", a)
		}
	}
	return final
}
