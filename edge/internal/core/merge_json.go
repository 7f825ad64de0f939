package core

// Structured values (issue 16, "--value-merge json"): a key configured for
// JSON merge keeps, besides its MVCC versions, a document whose every
// object field is a last-writer-wins register, so two replicas editing
// different fields of one object both keep their edit.
//
// # The document
//
// A key's document is one entry, the root. An entry is a register
// (stamp, replica, op: the change that assigned it and the op's place in
// that change) holding one of
//
//   - absent: the key (or field) was deleted;
//   - a scalar: any other value, kept as bytes (at the root the request's
//     bytes exactly, so a value that is not a JSON object is whole-value
//     last writer wins; inside an object a string, number, bool, null or
//     array in canonical form: arrays are not merged element-wise);
//   - an object: a map from field name to entry, each merged on its own.
//
// Registers are totally ordered by (stamp, replica, op). Joining two
// entries: the one with the larger register wins whole; with equal
// registers (the same assignment, seen by two routes) two objects join
// field by field, recursively. An assignment identifies the object it made:
// edits inside an object are made under its register, so when a field is
// concurrently reassigned (to a scalar, a new object, or deleted, the key
// included) the later assignment wins and edits made inside the object it
// replaced are discarded, whatever their stamps (Automerge's rule for
// nested objects). Deleted fields stay as absent entries (tombstones), so an
// older concurrent assignment arriving later cannot resurrect them.
//
// Join is a semilattice operation (commutative, associative, idempotent:
// a lexicographic maximum over trees), and a replica's document is the join
// of the patches of every change applied to the key, so replicas that
// applied the same changes, in any causal order, hold the same document
// and serve the same bytes.
//
// # What a change carries
//
// A put op of a JSON key carries a patch, not the client's bytes: the
// entries the put changed relative to the document its author held, under
// the registers of the unchanged objects above them (so the receiver knows
// which object an edit was made in). Entries the put assigned carry no
// stamp: they take the change's (stamp, replica) and the op's index. A
// delete op carries nothing new: it assigns absent to the root. A put whose
// value is not a JSON object assigns that scalar to the root, and carries
// the value as it is (encoded as a patch only if it starts with the magic
// bytes).
//
// Encoding (after the magic bytes 0xf5 'j' 0x01):
//
//	entry    register, kind byte (0 absent, 1 scalar, 2 object), then
//	         scalar: uvarint len, bytes; object: uvarint n, then n times
//	         (uvarint len, name; entry), names sorted and distinct
//	register 0: this op, or 1: int64 wall, uint32 logical, uint64 replica,
//	         uvarint op
//
// A put op whose value does not decode as a patch (written before the key
// was configured for JSON, or by a replica configured otherwise) is taken as
// a scalar at the root: whole-value last writer wins, as without JSON merge.
//
// # What clients see
//
// The rendered document: a scalar root's bytes, or the object in canonical
// JSON (fields sorted by name, no insignificant white space, strings
// re-encoded without HTML escaping, numbers as written). A local put of an
// object reads back as its canonical form; a merged change gets a revision
// and events only if it changed the rendered value, the key's liveness or
// its lease (the lease is a register of its own, set by every put op).
//
// Every replica must be configured alike: the shell refuses a peer whose
// value-merge configuration differs at the sync handshake.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
)

// ValueMerge says which keys merge as JSON documents: all of them (JSON),
// or those under one of Prefixes. The zero value merges every key as bytes.
type ValueMerge struct {
	JSON     bool
	Prefixes [][]byte
}

// IsJSON reports whether key merges as a JSON document.
func (m ValueMerge) IsJSON(key []byte) bool {
	if m.JSON {
		return true
	}
	for _, p := range m.Prefixes {
		if bytes.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// String is a canonical description, equal for equal configurations: the
// sync handshake compares it. "bytes", "json", or "json:" followed by the
// sorted, quoted prefixes.
func (m ValueMerge) String() string {
	if m.JSON {
		return "json"
	}
	if len(m.Prefixes) == 0 {
		return "bytes"
	}
	ps := make([]string, len(m.Prefixes))
	for i, p := range m.Prefixes {
		ps[i] = fmt.Sprintf("%q", p)
	}
	sort.Strings(ps)
	ps = slices.Compact(ps)
	return "json:" + strings.Join(ps, ",")
}

// SetValueMerge configures which keys merge as JSON documents. Call it
// before the first change is applied or replayed (the configuration decides
// how every change on those keys is read).
func (s *State) SetValueMerge(m ValueMerge) { s.vm = m }

// jkind is what an entry holds.
type jkind uint8

const (
	jAbsent jkind = 0
	jScalar jkind = 1
	jObject jkind = 2
)

// jreg is a register: the assignment that set an entry.
type jreg struct {
	wall    int64
	logical uint32
	repl    ReplicaID
	op      uint32
}

// sentinelWall marks registers of a local change not yet stamped: a local
// change's stamp is chosen at commit, after its ops are built. It is after
// every real stamp, as the local change's stamp will be (the HLC is past
// everything applied), so decisions inside the change come out the same;
// record replaces it with the stamp (fixStamps).
const sentinelWall = math.MaxInt64

func (r jreg) compare(o jreg) int {
	switch {
	case r.wall != o.wall:
		return cmpInt(r.wall, o.wall)
	case r.logical != o.logical:
		return cmpInt(r.logical, o.logical)
	case r.repl != o.repl:
		return cmpInt(r.repl, o.repl)
	}
	return cmpInt(r.op, o.op)
}

func cmpInt[T int64 | uint32 | uint64 | ReplicaID](a, b T) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// jentry is one register and what it holds. Entries are immutable once
// built: join copies along the paths it changes and shares the rest, so a
// document can be joined speculatively (mergeRev) at no risk.
type jentry struct {
	reg    jreg
	this   bool // in a patch: the op's own assignment (reg is filled in on join)
	kind   jkind
	scalar []byte
	fields map[string]*jentry
}

// jdoc is a JSON key's merge state: the root entry and the lease register.
type jdoc struct {
	root     *jentry
	lease    int64
	leaseReg jreg
}

// compareEntry is the total order join keeps the maximum of: register,
// then (for the same register met with different contents, which only a
// corrupted history can produce) kind and scalar bytes, so join stays
// deterministic whatever it is given.
func compareEntry(a, b *jentry) int {
	if c := a.reg.compare(b.reg); c != 0 {
		return c
	}
	if a.kind != b.kind {
		return cmpInt(uint32(a.kind), uint32(b.kind))
	}
	if a.kind == jScalar {
		return bytes.Compare(a.scalar, b.scalar)
	}
	return 0
}

// resolve returns src with its "this op" registers set to reg.
func resolve(src *jentry, reg jreg) *jentry {
	out := &jentry{reg: src.reg, kind: src.kind, scalar: src.scalar}
	if src.this {
		out.reg = reg
	}
	if src.kind == jObject {
		out.fields = make(map[string]*jentry, len(src.fields))
		for n, f := range src.fields {
			out.fields[n] = resolve(f, reg)
		}
	}
	return out
}

// join is the semilattice join of two resolved entries (either may be nil:
// never assigned). It never modifies its arguments.
func join(a, b *jentry) *jentry {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	c := compareEntry(a, b)
	switch {
	case c > 0:
		return a
	case c < 0:
		return b
	case a.kind != jObject:
		return a
	}
	var out *jentry
	for n, bf := range b.fields {
		af := a.fields[n]
		j := join(af, bf)
		if j == af {
			continue
		}
		if out == nil {
			out = &jentry{reg: a.reg, kind: jObject, fields: make(map[string]*jentry, len(a.fields)+len(b.fields))}
			for k, v := range a.fields {
				out.fields[k] = v
			}
		}
		out.fields[n] = j
	}
	if out == nil {
		return a
	}
	return out
}

// live reports whether the root holds a value.
func (d *jdoc) live() bool { return d != nil && d.root != nil && d.root.kind != jAbsent }

// render is what clients see of a live document.
func (d *jdoc) render() []byte {
	if d.root.kind == jScalar {
		return d.root.scalar
	}
	var b bytes.Buffer
	renderObject(&b, d.root)
	return b.Bytes()
}

func renderObject(b *bytes.Buffer, e *jentry) {
	names := make([]string, 0, len(e.fields))
	for n, f := range e.fields {
		if f.kind != jAbsent {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSONString(b, n)
		b.WriteByte(':')
		f := e.fields[n]
		if f.kind == jObject {
			renderObject(b, f)
		} else {
			b.Write(f.scalar)
		}
	}
	b.WriteByte('}')
}

// applyPatch joins an op's patch into the document under reg (the op's
// assignment), with the op's lease, and returns the new document.
func (d *jdoc) applyPatch(patch *jentry, lease int64, reg jreg) *jdoc {
	out := &jdoc{}
	if d != nil {
		*out = *d
	}
	out.root = join(out.root, resolve(patch, reg))
	if reg.compare(out.leaseReg) > 0 {
		out.lease, out.leaseReg = lease, reg
	}
	return out
}

// deleted is the document after a delete op assigned under reg.
func (d *jdoc) deleted(reg jreg) *jdoc {
	return d.applyPatch(&jentry{this: true, kind: jAbsent}, 0, reg)
}

// ----- the author's side: a put's patch -----

// localPatch is the patch of a local put of value on a key whose document
// is d (nil: never assigned here): the entries value changes, so that
// joined into d it renders as value's canonical form (or value itself
// when it is not a JSON object).
func localPatch(d *jdoc, value []byte) *jentry {
	obj, ok := parseObject(value)
	if !ok {
		return &jentry{this: true, kind: jScalar, scalar: value}
	}
	if d.live() && d.root.kind == jObject {
		return &jentry{reg: d.root.reg, kind: jObject, fields: diffFields(d.root, obj)}
	}
	return obj
}

// diffFields is the patch of cur's fields that obj (all "this op" entries)
// changes: new or changed fields assigned, removed ones assigned absent,
// objects on both sides diffed under cur's register.
func diffFields(cur, obj *jentry) map[string]*jentry {
	out := map[string]*jentry{}
	for n, nf := range obj.fields {
		cf := cur.fields[n]
		switch {
		case cf == nil || cf.kind == jAbsent:
			out[n] = nf
		case cf.kind == jObject && nf.kind == jObject:
			if sub := diffFields(cf, nf); len(sub) > 0 {
				out[n] = &jentry{reg: cf.reg, kind: jObject, fields: sub}
			}
		case cf.kind == jScalar && nf.kind == jScalar && bytes.Equal(cf.scalar, nf.scalar):
		default:
			out[n] = nf
		}
	}
	for n, cf := range cur.fields {
		if _, ok := obj.fields[n]; !ok && cf.kind != jAbsent {
			out[n] = &jentry{this: true, kind: jAbsent}
		}
	}
	return out
}

// parseObject parses a JSON object into "this op" entries, scalars in
// canonical form; false when value is not exactly one JSON object.
func parseObject(value []byte) (*jentry, bool) {
	dec := json.NewDecoder(bytes.NewReader(value))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, false // trailing data
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, false
	}
	return objectEntry(m), true
}

func objectEntry(m map[string]any) *jentry {
	e := &jentry{this: true, kind: jObject, fields: make(map[string]*jentry, len(m))}
	for n, v := range m {
		if sub, ok := v.(map[string]any); ok {
			e.fields[n] = objectEntry(sub)
			continue
		}
		var b bytes.Buffer
		writeCanonical(&b, v)
		e.fields[n] = &jentry{this: true, kind: jScalar, scalar: b.Bytes()}
	}
	return e
}

// writeCanonical writes a decoded JSON value in canonical form.
func writeCanonical(b *bytes.Buffer, v any) {
	switch v := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if v {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case json.Number:
		b.WriteString(string(v))
	case string:
		writeJSONString(b, v)
	case []any:
		b.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonical(b, x)
		}
		b.WriteByte(']')
	case map[string]any:
		names := make([]string, 0, len(v))
		for n := range v {
			names = append(names, n)
		}
		sort.Strings(names)
		b.WriteByte('{')
		for i, n := range names {
			if i > 0 {
				b.WriteByte(',')
			}
			writeJSONString(b, n)
			b.WriteByte(':')
			writeCanonical(b, v[n])
		}
		b.WriteByte('}')
	}
}

// writeJSONString is encoding/json's string encoding without HTML
// escaping (so "<" stays "<"): the canonical form of a string.
func writeJSONString(b *bytes.Buffer, s string) {
	var tmp bytes.Buffer
	enc := json.NewEncoder(&tmp)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a Go string always encodes (invalid UTF-8 becomes U+FFFD)
	b.Write(bytes.TrimSuffix(tmp.Bytes(), []byte("\n")))
}

// ----- encoding -----

var patchMagic = []byte{0xf5, 'j', 0x01}

// encodePatch is the op value of a put carrying patch.
func encodePatch(patch *jentry) []byte {
	b := append([]byte(nil), patchMagic...)
	return appendEntry(b, patch)
}

func appendEntry(b []byte, e *jentry) []byte {
	if e.this {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = binary.BigEndian.AppendUint64(b, uint64(e.reg.wall))
		b = binary.BigEndian.AppendUint32(b, e.reg.logical)
		b = binary.BigEndian.AppendUint64(b, uint64(e.reg.repl))
		b = binary.AppendUvarint(b, uint64(e.reg.op))
	}
	b = append(b, byte(e.kind))
	switch e.kind {
	case jScalar:
		b = appendBytes(b, e.scalar)
	case jObject:
		names := make([]string, 0, len(e.fields))
		for n := range e.fields {
			names = append(names, n)
		}
		sort.Strings(names)
		b = binary.AppendUvarint(b, uint64(len(names)))
		for _, n := range names {
			b = appendBytes(b, []byte(n))
			b = appendEntry(b, e.fields[n])
		}
	}
	return b
}

// decodePatch parses an op value made by encodePatch; false for anything
// else (the op is then a whole-value assignment of the root).
func decodePatch(v []byte) (*jentry, bool) {
	if !bytes.HasPrefix(v, patchMagic) {
		return nil, false
	}
	d := &decoder{b: v[len(patchMagic):]}
	e := decodeEntry(d, 0)
	if d.err != nil || e == nil || len(d.b) != 0 {
		return nil, false
	}
	return e, true
}

// maxPatchDepth bounds recursion on hostile input; JSON documents this deep
// are not configuration.
const maxPatchDepth = 512

func decodeEntry(d *decoder, depth int) *jentry {
	if depth > maxPatchDepth {
		d.err = errors.New("patch too deep")
		return nil
	}
	tag := d.next(1)
	if tag == nil {
		return nil
	}
	e := &jentry{}
	switch tag[0] {
	case 0:
		e.this = true
	case 1:
		e.reg.wall = int64(d.u64())
		if v := d.next(4); v != nil {
			e.reg.logical = binary.BigEndian.Uint32(v)
		}
		e.reg.repl = ReplicaID(d.u64())
		op := d.uvarint()
		if op > math.MaxUint32 {
			d.err = errors.New("op index out of range")
			return nil
		}
		e.reg.op = uint32(op)
	default:
		d.err = errors.New("bad register tag")
		return nil
	}
	k := d.next(1)
	if k == nil {
		return nil
	}
	e.kind = jkind(k[0])
	switch e.kind {
	case jAbsent:
	case jScalar:
		e.scalar = d.bytes()
		if e.scalar == nil {
			e.scalar = []byte{}
		}
	case jObject:
		n := d.uvarint()
		if n > uint64(len(d.b)) {
			d.err = errShort
			return nil
		}
		e.fields = make(map[string]*jentry, n)
		prev := ""
		for i := uint64(0); i < n && d.err == nil; i++ {
			name := string(d.bytes())
			if i > 0 && name <= prev {
				d.err = errors.New("field names not sorted and distinct")
				return nil
			}
			if !utf8.ValidString(name) {
				d.err = errors.New("field name not UTF-8")
				return nil
			}
			prev = name
			f := decodeEntry(d, depth+1)
			if f == nil {
				return nil
			}
			e.fields[name] = f
		}
	default:
		d.err = errors.New("bad kind")
		return nil
	}
	if d.err != nil {
		return nil
	}
	return e
}

// patchOf is the patch a stored put op carries: its decoded patch, or its
// value as a root scalar.
func patchOf(value []byte) *jentry {
	if p, ok := decodePatch(value); ok {
		return p
	}
	return &jentry{this: true, kind: jScalar, scalar: value}
}

// ----- hooks in the write paths -----

// jsonLocalPut is a local put of value on JSON key: the patch against the
// key's document goes into the change, the rendered value into the index
// (its canonical form). Registers are the sentinel until record stamps
// the change.
func (w *writer) jsonLocalPut(key, value []byte, lease int64) {
	s := w.s
	k := s.keys[string(key)]
	var d *jdoc
	if k != nil {
		d = k.doc
	}
	patch := localPatch(d, value)
	reg := jreg{wall: sentinelWall, repl: s.id, op: uint32(len(w.ops))}
	nd := d.applyPatch(patch, lease, reg)
	opValue := value
	if patch.kind != jScalar || !patch.this || bytes.HasPrefix(value, patchMagic) {
		// A scalar root travels as itself (patchOf reads it back so),
		// unless it would read as a patch.
		opValue = encodePatch(patch)
	}
	w.putOp(key, nd.render(), opValue, nd.lease)
	s.keys[string(key)].doc = nd
	w.unstamped = true
}

// regOf is the register of op i of c.
func regOf(c *Change, i int) jreg {
	return jreg{wall: c.Stamp.Wall, logical: c.Stamp.Logical, repl: c.Replica, op: uint32(i)}
}

// jsonLocalDelete records a delete of a JSON key in its document (w.del
// does the rest): a local one (sentinel register) or one of a change being
// replayed (w.src), whose ops w.ops follows one for one.
func (w *writer) jsonLocalDelete(k *keyRec) {
	reg := jreg{wall: sentinelWall, repl: w.s.id, op: uint32(len(w.ops))}
	if w.src != nil {
		reg = regOf(w.src, len(w.ops))
	} else {
		w.unstamped = true
	}
	k.doc = k.doc.deleted(reg)
}

// jsonMergeOp applies op i of c, a put or delete of a JSON key, to the
// key's document. force (replay of this replica's own change) applies it
// to the index even when the rendered value did not change, as the local
// put did; otherwise the index changes only when what clients see does.
func (s *State) jsonMergeOp(w *writer, c *Change, i int, force bool) {
	op := c.Ops[i]
	k := s.keys[string(op.Key)]
	var d *jdoc
	var cur *val
	if k != nil {
		d, cur = k.doc, k.live()
	}
	nd, change := jsonEffect(cur, d, op, regOf(c, i))
	if k == nil {
		k = &keyRec{key: op.Key}
		s.keys[string(op.Key)] = k
		s.order.insert(k)
	}
	if change || force {
		if nd.live() {
			w.putOp(op.Key, nd.render(), op.Value, nd.lease)
		} else if cur != nil {
			w.del(op.Key)
		}
	}
	k.doc = nd
}

// jsonEffect is the document after op (under reg) on a key whose document
// is d and whose current value is cur (either may be nil), and whether
// clients see a change: liveness, rendered value or lease.
func jsonEffect(cur *val, d *jdoc, op Op, reg jreg) (*jdoc, bool) {
	var nd *jdoc
	if op.Kind == OpPut {
		nd = d.applyPatch(patchOf(op.Value), op.Lease, reg)
	} else {
		nd = d.deleted(reg)
	}
	switch {
	case cur == nil:
		return nd, nd.live()
	case !nd.live():
		return nd, true
	}
	return nd, !bytes.Equal(cur.value, nd.render()) || cur.lease != nd.lease
}

// fixStamps replaces the sentinel registers a local change left in the
// documents it touched with the change's stamp.
func (s *State) fixStamps(c *Change) {
	seen := map[string]bool{}
	for _, op := range c.Ops {
		if (op.Kind != OpPut && op.Kind != OpDelete) || seen[string(op.Key)] {
			continue
		}
		seen[string(op.Key)] = true
		k := s.keys[string(op.Key)]
		if k == nil || k.doc == nil {
			continue
		}
		d := *k.doc
		d.root = stampEntry(d.root, c.Stamp)
		if d.leaseReg.wall == sentinelWall {
			d.leaseReg.wall, d.leaseReg.logical = c.Stamp.Wall, c.Stamp.Logical
		}
		k.doc = &d
	}
}

// stampEntry copies e with sentinel registers stamped (sharing the
// subtrees that hold none).
func stampEntry(e *jentry, st HLC) *jentry {
	if e == nil {
		return nil
	}
	out := *e
	changed := false
	if e.reg.wall == sentinelWall {
		out.reg.wall, out.reg.logical = st.Wall, st.Logical
		changed = true
	}
	copied := false
	for n, f := range e.fields {
		nf := stampEntry(f, st)
		if nf == f {
			continue
		}
		if !copied {
			out.fields = make(map[string]*jentry, len(e.fields))
			for k, v := range e.fields {
				out.fields[k] = v
			}
			copied = true
		}
		out.fields[n] = nf
		changed = true
	}
	if !changed {
		return e
	}
	return &out
}

// ----- for reference models (tests outside the package) -----

// JSONReg is a register as a reference model sees it: the assigning
// change's stamp and replica, and the op's index in it.
type JSONReg struct {
	Stamp   HLC
	Replica ReplicaID
	Op      uint32
}

// JSONAssign is one assignment a put or delete op of a JSON key makes: at
// Path (nil: the root), inside the objects whose registers are Under
// (outermost first, one per element of Path), the value Kind ("absent",
// "scalar" or "object") with Scalar's bytes.
type JSONAssign struct {
	Path   []string
	Under  []JSONReg
	Reg    JSONReg
	Kind   string
	Scalar []byte
}

// JSONAssignments flattens op i of c (a put or delete of a JSON key) into
// the assignments it makes: what a reference model of the merge needs,
// without the join.
func JSONAssignments(c *Change, i int) []JSONAssign {
	op := c.Ops[i]
	reg := regOf(c, i)
	var root *jentry
	if op.Kind == OpPut {
		root = patchOf(op.Value)
	} else {
		root = &jentry{this: true, kind: jAbsent}
	}
	var out []JSONAssign
	var walk func(e *jentry, path []string, under []JSONReg)
	walk = func(e *jentry, path []string, under []JSONReg) {
		r := e.reg
		if e.this {
			r = reg
		}
		jr := JSONReg{Stamp: HLC{Wall: r.wall, Logical: r.logical}, Replica: r.repl, Op: r.op}
		if e.this {
			out = append(out, JSONAssign{Path: slices.Clone(path), Under: slices.Clone(under), Reg: jr,
				Kind: [...]string{"absent", "scalar", "object"}[e.kind], Scalar: e.scalar})
		}
		names := make([]string, 0, len(e.fields))
		for n := range e.fields {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			walk(e.fields[n], append(path, n), append(under, jr))
		}
	}
	walk(root, nil, nil)
	return out
}
