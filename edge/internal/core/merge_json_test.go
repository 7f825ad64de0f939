package core

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// jsonKeys are the keys the property test writes: two under the JSON
// prefix, one plain (whole-value last writer wins alongside).
var jsonKeys = []string{"/j/a", "/j/b", "plain"}

var testVM = ValueMerge{Prefixes: [][]byte{[]byte("/j/")}}

// jsonWorld is a few replicas making random concurrent edits and
// exchanging changes in random (causal) orders.
type jsonWorld struct {
	t    *testing.T
	r    *rand.Rand
	reps []*State
	logs [][][]byte // per replica: the encodings it applied, in index order
	all  map[Hash][]byte
	now  time.Time
	vm   ValueMerge
}

func newJSONWorld(t *testing.T, seed uint64, n int, vm ValueMerge) *jsonWorld {
	w := &jsonWorld{t: t, r: rand.New(rand.NewPCG(seed, 77)), all: map[Hash][]byte{}, now: time.Unix(1_800_000_000, 0), vm: vm}
	for i := range n {
		s := New(ReplicaID(i + 1))
		s.SetValueMerge(vm)
		w.reps = append(w.reps, s)
		w.logs = append(w.logs, nil)
	}
	return w
}

func (w *jsonWorld) note(i int, a *Applied) {
	if a == nil {
		return
	}
	w.logs[i] = append(w.logs[i], a.Encoded)
	w.all[a.ID] = a.Encoded
}

func (w *jsonWorld) scalar() any {
	vals := []any{1, 2, "s", "<&>", true, nil, []any{1, "x"}}
	return vals[w.r.IntN(len(vals))]
}

// object is a random object over a small field universe, so edits collide.
func (w *jsonWorld) object(depth int) map[string]any {
	m := map[string]any{}
	for _, f := range []string{"a", "b", "c", "n"} {
		if w.r.IntN(3) == 0 {
			continue
		}
		if f == "n" && depth < 2 {
			m[f] = w.object(depth + 1)
			continue
		}
		m[f] = w.scalar()
	}
	return m
}

// edit is what a client does most: read the value, change one field
// (maybe nested), write it back.
func (w *jsonWorld) edit(cur []byte) []byte {
	var m map[string]any
	if json.Unmarshal(cur, &m) != nil || m == nil {
		m = map[string]any{}
	}
	target := m
	if n, ok := m["n"].(map[string]any); ok && w.r.IntN(2) == 0 {
		target = n
	}
	f := []string{"a", "b", "c", "x"}[w.r.IntN(4)]
	if w.r.IntN(4) == 0 {
		delete(target, f)
	} else {
		target[f] = w.scalar()
	}
	b, _ := json.Marshal(m)
	return b
}

func (w *jsonWorld) get(s *State, key string) []byte {
	resp, err := s.Range(&pb.RangeRequest{Key: []byte(key)})
	if err != nil {
		w.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	return resp.Kvs[0].Value
}

func (w *jsonWorld) local(i int) {
	s := w.reps[i]
	w.now = w.now.Add(time.Duration(w.r.IntN(3)) * time.Millisecond)
	// Clocks are skewed per replica, so stamps interleave across sites.
	now := w.now.Add(time.Duration(i-1) * 2 * time.Millisecond)
	key := jsonKeys[w.r.IntN(len(jsonKeys))]
	var value []byte
	switch r := w.r.IntN(10); {
	case r < 6:
		value = w.edit(w.get(s, key))
	case r < 8:
		value, _ = json.Marshal(w.object(0))
	case r < 9:
		value = []byte(fmt.Sprintf("raw-%d", w.r.IntN(3)))
	default:
		_, a, err := s.DeleteRange(now, &pb.DeleteRangeRequest{Key: []byte(key)})
		if err != nil {
			w.t.Fatal(err)
		}
		w.note(i, a)
		return
	}
	if w.r.IntN(8) == 0 {
		// A Txn with two writes of the key in one change: one stamp, the
		// op index orders them.
		first := &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: []byte(key), RangeEnd: []byte{0}}}}
		// etcd refuses two writes of one key at one level; a delete of
		// every key from it on, then a nested Txn's put, is how a client writes a key
		// twice in one change.
		_, a, err := s.Txn(now, &pb.TxnRequest{Success: []*pb.RequestOp{first,
			{Request: &pb.RequestOp_RequestTxn{RequestTxn: &pb.TxnRequest{Success: []*pb.RequestOp{
				{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte(key), Value: value}}}}}}}}})
		if err != nil {
			w.t.Fatal(err)
		}
		w.note(i, a)
	} else {
		_, a, err := s.Put(now, &pb.PutRequest{Key: []byte(key), Value: value})
		if err != nil {
			w.t.Fatal(err)
		}
		w.note(i, a)
	}
	// Read-your-writes: a local put reads back as its canonical form.
	if got, want := w.get(s, key), canonicalOrRaw(key, value, w.vm); !bytes.Equal(got, want) {
		w.t.Fatalf("replica %d: put %s=%s reads back %s, want %s", i+1, key, value, got, want)
	}
}

// canonicalOrRaw is what a local put must read back as.
func canonicalOrRaw(key string, v []byte, vm ValueMerge) []byte {
	if !vm.IsJSON([]byte(key)) {
		return v
	}
	var m map[string]any
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	if dec.Decode(&m) != nil || m == nil {
		return v
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(m)
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}

// deliver lets replica to merge a random prefix of what from applied.
func (w *jsonWorld) deliver(from, to int) {
	log := w.logs[from]
	n := w.r.IntN(len(log) + 1)
	for _, enc := range log[:n] {
		a, err := w.reps[to].Merge(w.now, enc)
		if err != nil {
			w.t.Fatalf("replica %d merging from %d: %v", to+1, from+1, err)
		}
		w.note(to, a)
	}
}

// run makes steps random steps, then lets everyone catch up.
func (w *jsonWorld) run(steps int) {
	for range steps {
		i := w.r.IntN(len(w.reps))
		if w.r.IntN(3) == 0 {
			j := w.r.IntN(len(w.reps))
			if j != i {
				w.deliver(j, i)
			}
			continue
		}
		w.local(i)
	}
	for round := 0; round < len(w.reps); round++ {
		for _, to := range w.r.Perm(len(w.reps)) {
			for _, from := range w.r.Perm(len(w.reps)) {
				if from == to {
					continue
				}
				for _, enc := range w.logs[from] {
					a, err := w.reps[to].Merge(w.now, enc)
					if err != nil {
						w.t.Fatal(err)
					}
					w.note(to, a)
				}
			}
		}
	}
}

// topoOrder is every change in a random causal order.
func (w *jsonWorld) topoOrder() [][]byte {
	type node struct {
		enc     []byte
		parents []Hash
	}
	pending := map[Hash]node{}
	for id, enc := range w.all {
		c, err := DecodeChange(enc)
		if err != nil {
			w.t.Fatal(err)
		}
		pending[id] = node{enc, c.Parents}
	}
	done := map[Hash]bool{}
	var out [][]byte
	for len(pending) > 0 {
		var ready []Hash
		for id, n := range pending {
			ok := true
			for _, p := range n.parents {
				if !done[p] {
					ok = false
				}
			}
			if ok {
				ready = append(ready, id)
			}
		}
		slices.SortFunc(ready, func(a, b Hash) int { return bytes.Compare(a[:], b[:]) })
		id := ready[w.r.IntN(len(ready))]
		out = append(out, pending[id].enc)
		done[id] = true
		delete(pending, id)
	}
	return out
}

// values is every key's value at s.
func (w *jsonWorld) values(s *State) map[string]string {
	out := map[string]string{}
	for _, k := range jsonKeys {
		if v := w.get(s, k); v != nil {
			out[k] = string(v)
		}
	}
	return out
}

// jsonModel is the reference merge, computed without join: a JSON key's
// value is found from the flat set of assignments every change made
// (JSONAssignments), by the rule as the package doc states it: per path
// the largest assignment, hidden when made before a larger absent or
// scalar assignment at the path or above it. A plain key is whole-value
// last writer wins by (stamp, replica).
func jsonModel(t *testing.T, encs [][]byte, vm ValueMerge) map[string]string {
	type plain struct {
		reg  JSONReg
		live bool
		v    []byte
	}
	plains := map[string]*plain{}
	assigns := map[string][]JSONAssign{}
	for _, enc := range encs {
		c, err := DecodeChange(enc)
		if err != nil {
			t.Fatal(err)
		}
		for i, op := range c.Ops {
			if op.Kind != OpPut && op.Kind != OpDelete {
				continue
			}
			k := string(op.Key)
			if vm.IsJSON(op.Key) {
				assigns[k] = append(assigns[k], JSONAssignments(c, i)...)
				continue
			}
			r := JSONReg{Stamp: c.Stamp, Replica: c.Replica, Op: uint32(i)}
			if p := plains[k]; p == nil || regLess(p.reg, r) {
				plains[k] = &plain{reg: r, live: op.Kind == OpPut, v: op.Value}
			}
		}
	}
	out := map[string]string{}
	for k, p := range plains {
		if p.live {
			out[k] = string(p.v)
		}
	}
	for k, as := range assigns {
		v := modelValue(as, nil, JSONReg{})
		switch v.kind {
		case "scalar":
			out[k] = string(v.scalar)
		case "object":
			var b bytes.Buffer
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false)
			if err := enc.Encode(v.obj()); err != nil {
				t.Fatal(err)
			}
			out[k] = string(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
		}
	}
	return out
}

func regLess(a, b JSONReg) bool {
	if c := a.Stamp.Compare(b.Stamp); c != 0 {
		return c < 0
	}
	if a.Replica != b.Replica {
		return a.Replica < b.Replica
	}
	return a.Op < b.Op
}

type modelVal struct {
	kind   string // "absent", "scalar", "object"
	scalar []byte
	fields map[string]*modelVal
}

func (v *modelVal) obj() any {
	if v.kind == "scalar" {
		return json.RawMessage(v.scalar)
	}
	m := map[string]any{}
	for n, f := range v.fields {
		m[n] = f.obj()
	}
	return m
}

// modelValue is what path shows when its ancestors' largest absent or
// scalar assignment is clear: its largest assignment unless older than
// clear; its fields (every name some assignment below path goes through)
// shown under the larger of clear and path's own largest absent or scalar
// assignment; an object if a field shows or it was assigned an object.
func modelValue(as []JSONAssign, path []string, clear JSONReg) *modelVal {
	var win *JSONAssign
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
		if win == nil || regLess(win.Reg, a.Reg) || (win.Reg == a.Reg && assignLess(win, a)) {
			win = a
		}
		if a.Kind != "object" && regLess(inner, a.Reg) {
			inner = a.Reg
		}
	}
	if win != nil && regLess(win.Reg, clear) {
		win = nil
	}
	v := &modelVal{kind: "absent"}
	fields := map[string]*modelVal{}
	for n := range names {
		if f := modelValue(as, append(slices.Clone(path), n), inner); f.kind != "absent" {
			fields[n] = f
		}
	}
	switch {
	case len(fields) > 0 || (win != nil && win.Kind == "object"):
		v = &modelVal{kind: "object", fields: fields}
	case win != nil && win.Kind == "scalar":
		v = &modelVal{kind: "scalar", scalar: win.Scalar}
	}
	return v
}

// assignLess orders two assignments with one register (only a corrupt
// history has them) as the core does: kind (absent < scalar < object),
// then bytes.
func assignLess(a, b *JSONAssign) bool {
	rank := map[string]int{"absent": 1, "scalar": 2, "object": 3}
	if rank[a.Kind] != rank[b.Kind] {
		return rank[a.Kind] < rank[b.Kind]
	}
	return bytes.Compare(a.Scalar, b.Scalar) < 0
}

// TestJSONMergeConverges: replicas editing JSON documents concurrently and
// merging in random orders all end with the same bytes, the reference
// model's; a fresh replica merging every change in another random causal
// order agrees; each replica's replay of its own log rebuilds it exactly.
func TestJSONMergeConverges(t *testing.T) {
	for seed := range uint64(300) {
		w := newJSONWorld(t, seed, 3, testVM)
		w.run(60)
		checkJSONWorld(t, w, seed)
		if t.Failed() {
			return
		}
	}
}

func checkJSONWorld(t *testing.T, w *jsonWorld, seed uint64) {
	t.Helper()
	want := jsonModel(t, w.topoOrder(), w.vm)
	fresh := New(99)
	fresh.SetValueMerge(w.vm)
	for _, enc := range w.topoOrder() {
		if _, err := fresh.Merge(w.now, enc); err != nil {
			t.Fatal(err)
		}
	}
	states := append(slices.Clone(w.reps), fresh)
	h0, _, _ := states[0].HashKV(0)
	for i, s := range states {
		if got := w.values(s); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("seed %d: replica %d has\n%v\nthe reference model\n%v", seed, s.Replica(), got, want)
			return
		}
		if h, _, _ := s.HashKV(0); h != h0 {
			t.Errorf("seed %d: replica %d HashKV %x, replica 1 %x", seed, i+1, h, h0)
		}
	}
	// Replay (recovery) rebuilds each replica exactly, merged JSON
	// changes re-decided the same way.
	for i, s := range w.reps {
		r := New(s.Replica())
		r.SetValueMerge(w.vm)
		for j, enc := range w.logs[i] {
			id := hashOf(enc)
			at := s.known[id]
			if err := r.Replay(enc, uint64(j+1), at.rev); err != nil {
				t.Fatalf("seed %d: replica %d replay %d: %v", seed, i+1, j+1, err)
			}
		}
		if a, b := dump(t, s), dump(t, r); a != b {
			t.Fatalf("seed %d: replica %d replays to\n%s\nwas\n%s", seed, i+1, b, a)
		}
		if !docsEqual(s, r) {
			t.Fatalf("seed %d: replica %d's replayed documents differ", seed, i+1)
		}
	}
}

func docsEqual(a, b *State) bool {
	for k, ka := range a.keys {
		kb := b.keys[k]
		if kb == nil || !nodeEqual(docRoot(ka.doc), docRoot(kb.doc)) {
			return false
		}
	}
	return len(a.keys) == len(b.keys)
}

func docRoot(d *jdoc) *jnode {
	if d == nil {
		return nil
	}
	return d.root
}

func nodeEqual(a, b *jnode) bool {
	if a == nil || b == nil {
		return a == b
	}
	if (a.kind == nil) != (b.kind == nil) || (a.kind != nil && compareAssign(a.kind, b.kind) != 0) ||
		a.clear != b.clear || len(a.fields) != len(b.fields) {
		return false
	}
	for n, f := range a.fields {
		if !nodeEqual(f, b.fields[n]) {
			return false
		}
	}
	return true
}

// TestJSONMergeChecksCatchBreakage proves the property test can fail: a
// replica merging the same changes without JSON merge (misconfigured)
// disagrees with the model, and so does a replica that misses one change.
func TestJSONMergeChecksCatchBreakage(t *testing.T) {
	caught := 0
	for seed := range uint64(20) {
		w := newJSONWorld(t, seed, 3, testVM)
		w.run(60)
		order := w.topoOrder()
		plain := New(97)
		for _, enc := range order {
			if _, err := plain.Merge(w.now, enc); err != nil {
				t.Fatal(err)
			}
		}
		if fmt.Sprint(w.values(plain)) != fmt.Sprint(jsonModel(t, order, testVM)) {
			caught++
		}
	}
	if caught == 0 {
		t.Fatal("a replica merging as bytes agreed with the JSON model on every seed: the model checks nothing")
	}
	w := newJSONWorld(t, 1, 3, testVM)
	w.run(60)
	order := w.topoOrder()
	// Drop the last change that put a JSON key (nothing depends on it, so
	// the rest still merges).
	for i := len(order) - 1; i >= 0; i-- {
		c, _ := DecodeChange(order[i])
		if len(c.Ops) > 0 && c.Ops[0].Kind == OpPut && testVM.IsJSON(c.Ops[0].Key) {
			lossy := New(98)
			lossy.SetValueMerge(testVM)
			for j, enc := range order {
				if j == i {
					continue
				}
				if _, err := lossy.Merge(w.now, enc); err != nil {
					t.Skipf("the dropped change had dependants: %v", err)
				}
			}
			if fmt.Sprint(w.values(lossy)) == fmt.Sprint(jsonModel(t, order, testVM)) {
				t.Fatal("a replica missing a change agrees with the model")
			}
			return
		}
	}
	t.Fatal("no JSON put to drop")
}

// TestJSONJoinLaws checks the join's algebra directly on random states:
// commutative, associative, idempotent.
func TestJSONJoinLaws(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	reg := func() jreg { return jreg{wall: int64(r.IntN(3)), repl: ReplicaID(r.IntN(2)), op: uint32(r.IntN(2))} }
	var gen func(depth int) *jnode
	gen = func(depth int) *jnode {
		n := &jnode{}
		switch k := r.IntN(4); {
		case k == 0:
		case k == 1:
			n.kind = &jassign{reg: reg(), kind: jAbsent}
		case k == 2:
			n.kind = &jassign{reg: reg(), kind: jScalar, scalar: []byte{byte('a' + r.IntN(3))}}
		default:
			n.kind = &jassign{reg: reg(), kind: jObject}
		}
		if r.IntN(2) == 0 {
			n.clear = reg()
		}
		if depth < 3 {
			for _, f := range []string{"x", "y", "z"} {
				if r.IntN(3) == 0 {
					if n.fields == nil {
						n.fields = map[string]*jnode{}
					}
					n.fields[f] = gen(depth + 1)
				}
			}
		}
		return n
	}
	for range 5000 {
		a, b, c := gen(0), gen(0), gen(0)
		if !nodeEqual(join(a, b), join(b, a)) {
			t.Fatal("join is not commutative")
		}
		if !nodeEqual(join(join(a, b), c), join(a, join(b, c))) {
			t.Fatal("join is not associative")
		}
		if !nodeEqual(join(a, a), a) {
			t.Fatal("join is not idempotent")
		}
	}
}

// TestJSONPatchEncoding: patches round-trip, and anything that is not one
// (including every prefix of one) is read as a root scalar.
func TestJSONPatchEncoding(t *testing.T) {
	d := (*jdoc)(nil).applyPatch(localPatch(nil, []byte(`{"a":1,"n":{"x":"<"}}`)), 0, jreg{wall: 5, repl: 1})
	p := localPatch(d, []byte(`{"a":2,"n":{"x":"<","y":[1, 2]}}`))
	enc := encodePatch(p)
	got, ok := decodePatch(enc)
	if !ok || !bytes.Equal(encodePatch(got), enc) {
		t.Fatalf("patch does not round-trip: %x", enc)
	}
	if r := d.applyPatch(got, 0, jreg{wall: 6, repl: 1}).render(); string(r) != `{"a":2,"n":{"x":"<","y":[1,2]}}` {
		t.Fatalf("rendered %s", r)
	}
	for i := range len(enc) {
		if _, ok := decodePatch(enc[:i]); ok {
			t.Fatalf("prefix %d of a patch decodes", i)
		}
	}
	for _, v := range []string{`{"a":1}`, `[1]`, `"s"`, ``, "\xf5j\x01\x00\x09", "\xf5j\x01\x02\x01x\x01\x00\x00"} {
		if _, ok := decodePatch([]byte(v)); ok {
			t.Fatalf("%q decodes as a patch", v)
		}
	}
	names := []string{}
	for n := range p.fields {
		names = append(names, n)
	}
	sort.Strings(names)
	if fmt.Sprint(names) != "[a n]" || p.kind != nil || p.fields["n"].kind != nil || len(p.fields["n"].fields) != 1 {
		t.Fatalf("patch of an edit of a and n.y: %s", enc)
	}
}

// TestJSONPatchIsAnEdit: what a change carries for an edit of one field
// of a large document is the edit, not the document (sync bytes scale
// with the edit).
func TestJSONPatchIsAnEdit(t *testing.T) {
	s := New(1)
	s.SetValueMerge(ValueMerge{JSON: true})
	doc := map[string]any{}
	for i := range 100 {
		doc[fmt.Sprintf("field-%03d", i)] = fmt.Sprintf("value %d of some length", i)
	}
	full, _ := json.Marshal(doc)
	now := time.Unix(1_800_000_000, 0)
	if _, _, err := s.Put(now, &pb.PutRequest{Key: []byte("d"), Value: full}); err != nil {
		t.Fatal(err)
	}
	doc["field-042"] = "changed"
	edited, _ := json.Marshal(doc)
	_, a, err := s.Put(now.Add(time.Second), &pb.PutRequest{Key: []byte("d"), Value: edited})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(a.Change.Ops[0].Value); n > 32 {
		t.Fatalf("a one-field edit of a %d-byte document carries %d bytes", len(full), n)
	}
	t.Logf("document %d bytes; the edit's op value %d bytes, its change %d", len(full), len(a.Change.Ops[0].Value), len(a.Encoded))
}

// TestJSONTooDeepIsAWholeValue: an object nested deeper than a patch may
// be is merged as a whole value, at its author too, so a replay and every
// receiver read the same bytes.
func TestJSONTooDeepIsAWholeValue(t *testing.T) {
	deep := strings.Repeat(`{"a":`, maxPatchDepth+1) + "1" + strings.Repeat("}", maxPatchDepth+1)
	ok := strings.Repeat(`{"a":`, maxPatchDepth) + "1" + strings.Repeat("}", maxPatchDepth)
	for _, tc := range []struct {
		v     string
		patch bool
	}{{deep, false}, {ok, true}} {
		s := New(1)
		s.SetValueMerge(ValueMerge{JSON: true})
		_, a, err := s.Put(time.Unix(1_800_000_000, 0), &pb.PutRequest{Key: []byte("d"), Value: []byte(tc.v)})
		if err != nil {
			t.Fatal(err)
		}
		if _, isPatch := decodePatch(a.Change.Ops[0].Value); isPatch != tc.patch {
			t.Fatalf("depth %d: carried as a patch %v, want %v", strings.Count(tc.v, "{"), isPatch, tc.patch)
		}
		r := New(2)
		r.SetValueMerge(ValueMerge{JSON: true})
		if _, err := r.Merge(time.Unix(1_800_000_000, 0), a.Encoded); err != nil {
			t.Fatal(err)
		}
		h1, _, _ := s.HashKV(0)
		h2, _, _ := r.HashKV(0)
		if h1 != h2 {
			t.Fatalf("depth %d: author and receiver differ", strings.Count(tc.v, "{"))
		}
	}
}
