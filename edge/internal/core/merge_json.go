package core

// Structured values (issue 16, "--value-merge json"): a key configured for
// JSON merge keeps, besides its MVCC versions, a document in which every
// path (the key's root, each object field, recursively) is merged on its
// own, last writer wins, so two replicas editing different fields of one
// object both keep their edit.
//
// # The document
//
// A node (one path) holds
//
//   - kind: the largest assignment made at the path, a register
//     (stamp, replica, op: the change that made it and the op's place in
//     it) with what it assigned: absent (a delete: of the key at the root,
//     of a field below), a scalar (anything that is not a JSON object:
//     at the root the request's bytes exactly, so such a value is
//     whole-value last writer wins; inside an object a string, number,
//     bool, null or array in canonical form: arrays are not merged
//     element-wise) or an object;
//   - clear: the largest register of an absent or scalar assignment at the
//     path: such an assignment replaces whatever was below the path, so
//     it hides every assignment below made before it (a tombstone for the
//     whole subtree, ordered like any write);
//   - fields: a node per field name.
//
// What a node shows, inside ancestors whose clears are C (the largest):
// its kind, unless made before C; its fields, each inside max(C, its own
// clear). It is an object if some field shows or its kind is an object;
// else the scalar, if its kind is one; else nothing (the field, or the key,
// is absent). So per path the later write wins, a delete included: a field
// deleted at one site and edited later at another shows the edit; a key
// deleted at one site while another, later, edits a field of it comes back
// as an object of the later edits only (the fields written before the
// delete stay deleted); two sites creating one key, or one nested object,
// at once both keep their fields.
//
// Joining two documents takes, per path, the larger kind and the larger
// clear, and joins the fields: a product of maximum registers and a union,
// hence commutative, associative and idempotent. A replica's document is
// the join of the patches of every change applied to the key, so replicas
// that applied the same changes, in any causal order, hold the same
// document and serve the same bytes. (Registers are totally ordered; the
// same register met with different contents, which only a corrupted
// history can produce, is ordered by kind then bytes, so even then join
// stays deterministic.)
//
// # What a change carries
//
// A put op of a JSON key carries a patch, not the client's bytes: the
// assignments the put made relative to the document its author held (new
// or changed fields, removed ones as absent, an object assignment where
// the path did not show an object), on the paths of the objects around
// them. Assignments carry no stamp: they take the change's (stamp,
// replica) and the op's index. A delete op carries nothing new: it assigns
// absent to the root. A put whose value is not a JSON object assigns that
// scalar to the root and carries the value as it is (encoded as a patch
// only if it starts with the magic bytes).
//
// Patch encoding (after the magic bytes 0xf5 'j' 0x01), one node:
//
//	byte     0 no assignment here, 1 absent, 2 scalar, 3 object
//	scalar:  uvarint len, bytes
//	uvarint  number of fields (0 for absent and scalar), then per field
//	         uvarint len, name; node; names sorted and distinct
//
// A put op whose value does not decode as a patch (written before the key
// was configured for JSON, or a scalar) is taken as a scalar at the root.
//
// # What clients see
//
// The document rendered: a scalar root's bytes, or the object in canonical
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

// jkind is what an assignment assigns.
type jkind uint8

const (
	jAbsent jkind = 1
	jScalar jkind = 2
	jObject jkind = 3
)

// jreg is a register: the assignment that set a path. The zero jreg is
// before every real one.
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

func maxReg(a, b jreg) jreg {
	if a.compare(b) >= 0 {
		return a
	}
	return b
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

// jassign is one assignment: its register and what it assigned.
type jassign struct {
	reg    jreg
	kind   jkind
	scalar []byte
}

// compareAssign is the total order a path keeps the largest of.
func compareAssign(a, b *jassign) int {
	if c := a.reg.compare(b.reg); c != 0 {
		return c
	}
	if a.kind != b.kind {
		return cmpInt(uint32(a.kind), uint32(b.kind))
	}
	return bytes.Compare(a.scalar, b.scalar)
}

// jnode is one path's merge state (package doc). Nodes are immutable once
// built: join copies along the paths it changes and shares the rest, so a
// document can be joined speculatively (mergeRev) at no risk. In a patch,
// kind is the op's own assignment (its reg unset) and clear is unused.
type jnode struct {
	kind   *jassign
	clear  jreg
	fields map[string]*jnode
}

// jdoc is a JSON key's merge state: the root and the lease register.
type jdoc struct {
	root     *jnode
	lease    int64
	leaseReg jreg
}

// resolve turns a patch into the state it assigns under reg.
func resolve(p *jnode, reg jreg) *jnode {
	out := &jnode{}
	if p.kind != nil {
		out.kind = &jassign{reg: reg, kind: p.kind.kind, scalar: p.kind.scalar}
		if p.kind.kind != jObject {
			out.clear = reg
		}
	}
	if len(p.fields) > 0 {
		out.fields = make(map[string]*jnode, len(p.fields))
		for n, f := range p.fields {
			out.fields[n] = resolve(f, reg)
		}
	}
	return out
}

// join is the semilattice join of two states (either may be nil). It never
// modifies its arguments, and returns a itself when b adds nothing.
func join(a, b *jnode) *jnode {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	out := *a
	changed := false
	if b.kind != nil && (a.kind == nil || compareAssign(b.kind, a.kind) > 0) {
		out.kind, changed = b.kind, true
	}
	if b.clear.compare(a.clear) > 0 {
		out.clear, changed = b.clear, true
	}
	copied := false
	for n, bf := range b.fields {
		af := a.fields[n]
		j := join(af, bf)
		if j == af {
			continue
		}
		if !copied {
			out.fields = make(map[string]*jnode, len(a.fields)+len(b.fields))
			for k, v := range a.fields {
				out.fields[k] = v
			}
			copied = true
		}
		out.fields[n] = j
		changed = true
	}
	if !changed {
		return a
	}
	return &out
}

// view is what a node shows: nothing, a scalar, or an object of views.
type view struct {
	kind     jkind // jAbsent, jScalar, jObject
	scalar   []byte
	fields   map[string]*view
	assigned bool // an object by an object assignment, not only by fields shown
}

// viewOf is what n shows inside ancestors whose largest clear is c.
func viewOf(n *jnode, c jreg) *view {
	if n == nil {
		return &view{kind: jAbsent}
	}
	k := n.kind
	if k != nil && k.reg.compare(c) < 0 {
		k = nil // replaced, with everything below, by an ancestor's later assignment
	}
	inner := maxReg(c, n.clear)
	var fields map[string]*view
	for name, f := range n.fields {
		if fv := viewOf(f, inner); fv.kind != jAbsent {
			if fields == nil {
				fields = map[string]*view{}
			}
			fields[name] = fv
		}
	}
	switch {
	case len(fields) > 0 || (k != nil && k.kind == jObject):
		return &view{kind: jObject, fields: fields, assigned: k != nil && k.kind == jObject}
	case k != nil && k.kind == jScalar:
		return &view{kind: jScalar, scalar: k.scalar}
	}
	return &view{kind: jAbsent}
}

func (d *jdoc) view() *view {
	if d == nil {
		return &view{kind: jAbsent}
	}
	return viewOf(d.root, jreg{})
}

// live reports whether the document shows a value.
func (d *jdoc) live() bool { return d.view().kind != jAbsent }

// render is what clients see of a live document.
func (d *jdoc) render() []byte {
	v := d.view()
	if v.kind == jScalar {
		return v.scalar
	}
	var b bytes.Buffer
	renderObject(&b, v)
	return b.Bytes()
}

func renderObject(b *bytes.Buffer, v *view) {
	names := make([]string, 0, len(v.fields))
	for n := range v.fields {
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
		f := v.fields[n]
		if f.kind == jObject {
			renderObject(b, f)
		} else {
			b.Write(f.scalar)
		}
	}
	b.WriteByte('}')
}

// applyPatch joins an op's patch into the document under reg (the op's
// assignments), with the op's lease, and returns the new document.
func (d *jdoc) applyPatch(patch *jnode, lease int64, reg jreg) *jdoc {
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

// deletePatch is what a delete op assigns.
var deletePatch = &jnode{kind: &jassign{kind: jAbsent}}

// deleted is the document after a delete op assigned under reg.
func (d *jdoc) deleted(reg jreg) *jdoc { return d.applyPatch(deletePatch, 0, reg) }

// ----- the author's side: a put's patch -----

// localPatch is the patch of a local put of value on a key whose document
// is d (nil: never assigned here): the assignments that make it show
// value's canonical form (or value itself when it is not a JSON object),
// its assignments being later than everything in d.
func localPatch(d *jdoc, value []byte) *jnode {
	obj, ok := parseObject(value)
	if !ok {
		return &jnode{kind: &jassign{kind: jScalar, scalar: value}}
	}
	return diffObject(d.view(), obj)
}

// diffObject is the patch turning what a path shows (cur) into the object
// obj: an object assignment unless cur already is one, then the fields
// obj adds or changes (recursively for objects on both sides) and absent
// for those it drops. (An object shown only because of fields, its kind
// being older, gets an object assignment too, so it stays one when every
// field goes.) nil when nothing changes.
func diffObject(cur *view, obj *view) *jnode {
	p := &jnode{}
	if cur.kind != jObject || !cur.assigned {
		p.kind = &jassign{kind: jObject}
	}
	if cur.kind != jObject {
		cur = &view{kind: jObject}
	}
	for n, nf := range obj.fields {
		cf := cur.fields[n]
		if cf == nil {
			cf = &view{kind: jAbsent}
		}
		var sub *jnode
		switch {
		case nf.kind == jObject:
			sub = diffObject(cf, nf)
		case cf.kind == jScalar && bytes.Equal(cf.scalar, nf.scalar):
		default:
			sub = &jnode{kind: &jassign{kind: jScalar, scalar: nf.scalar}}
		}
		if sub != nil {
			if p.fields == nil {
				p.fields = map[string]*jnode{}
			}
			p.fields[n] = sub
		}
	}
	for n := range cur.fields {
		if _, ok := obj.fields[n]; !ok {
			if p.fields == nil {
				p.fields = map[string]*jnode{}
			}
			p.fields[n] = &jnode{kind: &jassign{kind: jAbsent}}
		}
	}
	if p.kind == nil && len(p.fields) == 0 {
		return nil
	}
	return p
}

// parseObject parses a JSON object into a view, scalars in canonical form;
// false when value is not exactly one JSON object.
func parseObject(value []byte) (*view, bool) {
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
	if !ok || objectDepth(m) > maxPatchDepth {
		// Deeper than a patch may be (receivers would not decode it):
		// merged as a whole value instead, at the author too.
		return nil, false
	}
	return objectView(m), true
}

// objectDepth is how deep objects nest in m (1: no object inside).
func objectDepth(m map[string]any) int {
	d := 0
	for _, x := range m {
		if sub, ok := x.(map[string]any); ok {
			d = max(d, objectDepth(sub))
		}
	}
	return d + 1
}

func objectView(m map[string]any) *view {
	v := &view{kind: jObject, fields: make(map[string]*view, len(m))}
	for n, x := range m {
		if sub, ok := x.(map[string]any); ok {
			v.fields[n] = objectView(sub)
			continue
		}
		var b bytes.Buffer
		writeCanonical(&b, x)
		v.fields[n] = &view{kind: jScalar, scalar: b.Bytes()}
	}
	return v
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
func encodePatch(p *jnode) []byte {
	b := append([]byte(nil), patchMagic...)
	return appendNode(b, p)
}

func appendNode(b []byte, p *jnode) []byte {
	if p.kind == nil {
		b = append(b, 0)
	} else {
		b = append(b, byte(p.kind.kind))
		if p.kind.kind == jScalar {
			b = appendBytes(b, p.kind.scalar)
		}
	}
	names := make([]string, 0, len(p.fields))
	for n := range p.fields {
		names = append(names, n)
	}
	sort.Strings(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, n := range names {
		b = appendBytes(b, []byte(n))
		b = appendNode(b, p.fields[n])
	}
	return b
}

// decodePatch parses an op value made by encodePatch; false for anything
// else (the op is then a whole-value assignment of the root).
func decodePatch(v []byte) (*jnode, bool) {
	if !bytes.HasPrefix(v, patchMagic) {
		return nil, false
	}
	d := &decoder{b: v[len(patchMagic):]}
	p := decodeNode(d, 0)
	if d.err != nil || p == nil || len(d.b) != 0 {
		return nil, false
	}
	// Only encodePatch's output is accepted, so a patch's meaning is a
	// function of its bytes.
	if !bytes.Equal(encodePatch(p), v) {
		return nil, false
	}
	return p, true
}

// maxPatchDepth bounds recursion on hostile input; JSON documents this deep
// are not configuration.
const maxPatchDepth = 512

func decodeNode(d *decoder, depth int) *jnode {
	if depth > maxPatchDepth {
		d.err = errors.New("patch too deep")
		return nil
	}
	k := d.next(1)
	if k == nil {
		return nil
	}
	p := &jnode{}
	switch jkind(k[0]) {
	case 0:
	case jAbsent, jObject:
		p.kind = &jassign{kind: jkind(k[0])}
	case jScalar:
		p.kind = &jassign{kind: jScalar, scalar: d.bytes()}
		if p.kind.scalar == nil {
			p.kind.scalar = []byte{}
		}
	default:
		d.err = errors.New("bad assignment kind")
		return nil
	}
	n := d.uvarint()
	if n > uint64(len(d.b)) || (n > 0 && p.kind != nil && p.kind.kind != jObject) {
		d.err = errors.New("bad field count")
		return nil
	}
	if n > 0 {
		p.fields = make(map[string]*jnode, n)
	}
	prev := ""
	for i := uint64(0); i < n && d.err == nil; i++ {
		name := string(d.bytes())
		if (i > 0 && name <= prev) || !utf8.ValidString(name) {
			d.err = errors.New("field names not sorted, distinct UTF-8")
			return nil
		}
		prev = name
		f := decodeNode(d, depth+1)
		if f == nil {
			return nil
		}
		p.fields[name] = f
	}
	if d.err != nil {
		return nil
	}
	return p
}

// patchOf is the patch a stored put op carries: its decoded patch, or its
// value as a root scalar.
func patchOf(value []byte) *jnode {
	if p, ok := decodePatch(value); ok {
		return p
	}
	return &jnode{kind: &jassign{kind: jScalar, scalar: value}}
}

// ----- hooks in the write paths -----

// regOf is the register of op i of c.
func regOf(c *Change, i int) jreg {
	return jreg{wall: c.Stamp.Wall, logical: c.Stamp.Logical, repl: c.Replica, op: uint32(i)}
}

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
	if patch == nil {
		patch = &jnode{} // the same object again: nothing to assign (the lease may change)
	}
	reg := jreg{wall: sentinelWall, repl: s.id, op: uint32(len(w.ops))}
	nd := d.applyPatch(patch, lease, reg)
	opValue := value
	if patch.kind == nil || patch.kind.kind != jScalar || bytes.HasPrefix(value, patchMagic) {
		// A scalar root travels as itself (patchOf reads it back so),
		// unless it would read as a patch.
		opValue = encodePatch(patch)
	}
	w.putOp(key, nd.render(), opValue, nd.lease)
	s.keys[string(key)].doc = nd
	s.markGC(s.keys[string(key)])
	w.unstamped = true
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
	w.s.markGC(k)
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
	s.markGC(k)
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
	live := nd.live()
	switch {
	case cur == nil:
		return nd, live
	case !live:
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
		d.root = stampNode(d.root, c.Stamp)
		d.leaseReg = stampReg(d.leaseReg, c.Stamp)
		k.doc = &d
	}
}

func stampReg(r jreg, st HLC) jreg {
	if r.wall == sentinelWall {
		r.wall, r.logical = st.Wall, st.Logical
	}
	return r
}

// stampNode copies n with sentinel registers stamped (sharing the
// subtrees that hold none).
func stampNode(n *jnode, st HLC) *jnode {
	if n == nil {
		return nil
	}
	out := *n
	changed := false
	if n.kind != nil && n.kind.reg.wall == sentinelWall {
		k := *n.kind
		k.reg = stampReg(k.reg, st)
		out.kind, changed = &k, true
	}
	if n.clear.wall == sentinelWall {
		out.clear, changed = stampReg(n.clear, st), true
	}
	copied := false
	for name, f := range n.fields {
		nf := stampNode(f, st)
		if nf == f {
			continue
		}
		if !copied {
			out.fields = make(map[string]*jnode, len(n.fields))
			for k, v := range n.fields {
				out.fields[k] = v
			}
			copied = true
		}
		out.fields[name] = nf
		changed = true
	}
	if !changed {
		return n
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
// Path (nil: the root), the value Kind ("absent", "scalar" or "object")
// with Scalar's bytes.
type JSONAssign struct {
	Path   []string
	Reg    JSONReg
	Kind   string
	Scalar []byte
}

// JSONAssignments flattens op i of c (a put or delete of a JSON key) into
// the assignments it makes: what a reference model of the merge needs,
// without the join.
func JSONAssignments(c *Change, i int) []JSONAssign {
	op := c.Ops[i]
	root := deletePatch
	if op.Kind == OpPut {
		root = patchOf(op.Value)
	}
	reg := JSONReg{Stamp: c.Stamp, Replica: c.Replica, Op: uint32(i)}
	var out []JSONAssign
	var walk func(p *jnode, path []string)
	walk = func(p *jnode, path []string) {
		if p.kind != nil {
			out = append(out, JSONAssign{Path: slices.Clone(path), Reg: reg,
				Kind: map[jkind]string{jAbsent: "absent", jScalar: "scalar", jObject: "object"}[p.kind.kind], Scalar: p.kind.scalar})
		}
		names := make([]string, 0, len(p.fields))
		for n := range p.fields {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			walk(p.fields[n], append(slices.Clone(path), n))
		}
	}
	walk(root, nil)
	return out
}
