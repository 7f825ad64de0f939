package core

import (
	"bytes"
	"sort"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The MVCC index follows etcd's keyIndex (server/storage/mvcc/key_index.go):
// per key a list of generations, each from a creation to its tombstone,
// each holding the key's versions in revision order. Unlike etcd the values
// live here too (the core is the whole in-memory state; the storage package
// keeps only the change log).

// val is a key's value at one revision, with etcd's metadata. Stored by
// value (no pointer per version) to keep the heap light for the collector.
type val struct {
	value  []byte
	create int64
	mod    int64
	ver    int64
	lease  int64
}

// kv is the value as etcd's KeyValue, a fresh one.
func (v *val) kv(key []byte) *mvccpb.KeyValue {
	return &mvccpb.KeyValue{Key: key, Value: v.value, CreateRevision: v.create, ModRevision: v.mod, Version: v.ver, Lease: v.lease}
}

// version is one revision of one key: a stored value, or a tombstone.
type version struct {
	main int64
	sub  int64
	tomb bool
	v    val
}

type generation struct {
	ver     int64 // versions ever put in this generation (kept through compaction)
	created int64
	revs    []version
}

func (g *generation) isEmpty() bool { return g == nil || len(g.revs) == 0 }

// keyRec is one key's history and its conflict-rule state.
type keyRec struct {
	key  []byte
	gens []generation
	// win is the (stamp, replica) of the write that decided the key's
	// current value or tombstone: part 2's merge compares a remote write to
	// it (package doc, "Conflict rule").
	win     HLC
	winRepl ReplicaID
	dirty   bool // listed in State.dirty
	gc      bool // listed in State.gcKeys
	// doc is a JSON key's merge state (merge_json.go); nil for other keys.
	doc *jdoc
}

func (k *keyRec) isEmpty() bool {
	return len(k.gens) == 0 || (len(k.gens) == 1 && k.gens[0].isEmpty())
}

// live is the key's current value, nil when it does not exist now. The
// pointer is into the index: valid until the key's next write.
func (k *keyRec) live() *val {
	if len(k.gens) == 0 {
		return nil
	}
	g := &k.gens[len(k.gens)-1]
	if len(g.revs) == 0 {
		return nil
	}
	return &g.revs[len(g.revs)-1].v
}

func (k *keyRec) put(main, sub int64, v val, tomb bool) {
	if len(k.gens) == 0 {
		k.gens = append(k.gens, generation{})
	}
	g := &k.gens[len(k.gens)-1]
	if len(g.revs) == 0 {
		g.created = main
	}
	g.revs = append(g.revs, version{main: main, sub: sub, v: v, tomb: tomb})
	g.ver++
}

func (k *keyRec) tombstone(main, sub int64) {
	k.put(main, sub, val{}, true)
	k.gens = append(k.gens, generation{})
}

// at returns the key's value at revision rev, nil if it did not exist then
// (etcd's keyIndex.get with findGeneration). The pointer is into the
// index: valid until the key's next write or compaction.
func (k *keyRec) at(rev int64) *val {
	last := len(k.gens) - 1
	for cg := last; cg >= 0; cg-- {
		g := &k.gens[cg]
		if len(g.revs) == 0 {
			continue
		}
		if cg != last && g.revs[len(g.revs)-1].main <= rev {
			return nil // tombstoned at or before rev
		}
		if g.revs[0].main <= rev {
			for i := len(g.revs) - 1; i >= 0; i-- {
				if g.revs[i].main <= rev {
					if g.revs[i].tomb {
						return nil
					}
					return &g.revs[i].v
				}
			}
			return nil
		}
	}
	return nil
}

// compact drops the versions a read at or after atRev can no longer see,
// as etcd's keyIndex.compact: in the generation holding atRev it keeps the
// largest version <= atRev; older generations go.
func (k *keyRec) compact(atRev int64) {
	if k.isEmpty() {
		return
	}
	gi := 0
	for gi < len(k.gens)-1 {
		g := &k.gens[gi]
		if g.revs[len(g.revs)-1].main >= atRev {
			break
		}
		gi++
	}
	g := &k.gens[gi]
	if !g.isEmpty() {
		for i := len(g.revs) - 1; i > 0; i-- {
			if g.revs[i].main <= atRev {
				// In place: compaction runs over every key and should not
				// allocate for each; clearing the tail lets the dropped
				// values be collected.
				n := copy(g.revs, g.revs[i:])
				clear(g.revs[n:])
				g.revs = g.revs[:n]
				break
			}
		}
	}
	if gi > 0 {
		n := copy(k.gens, k.gens[gi:])
		clear(k.gens[n:])
		k.gens = k.gens[:n]
	}
}

// ordered keeps the key records in key order for ranges: a list of sorted
// chunks, so an insert moves at most one chunk and ranges walk in order.
type ordered struct {
	chunks [][]*keyRec
	n      int
}

const chunkMax = 512

// find returns the chunk and position of the first record with key >= key.
func (o *ordered) find(key []byte) (int, int) {
	ci := sort.Search(len(o.chunks), func(i int) bool {
		c := o.chunks[i]
		return bytes.Compare(c[len(c)-1].key, key) >= 0
	})
	if ci == len(o.chunks) {
		return ci, 0
	}
	c := o.chunks[ci]
	return ci, sort.Search(len(c), func(i int) bool { return bytes.Compare(c[i].key, key) >= 0 })
}

func (o *ordered) insert(k *keyRec) {
	o.n++
	if len(o.chunks) == 0 {
		o.chunks = append(o.chunks, []*keyRec{k})
		return
	}
	ci, i := o.find(k.key)
	if ci == len(o.chunks) {
		ci = len(o.chunks) - 1
		i = len(o.chunks[ci])
	}
	c := append(o.chunks[ci], nil)
	copy(c[i+1:], c[i:])
	c[i] = k
	if len(c) <= chunkMax {
		o.chunks[ci] = c
		return
	}
	h := len(c) / 2
	left := append([]*keyRec(nil), c[:h]...)
	right := append(make([]*keyRec, 0, chunkMax+1), c[h:]...)
	o.chunks = append(o.chunks, nil)
	copy(o.chunks[ci+2:], o.chunks[ci+1:])
	o.chunks[ci] = left
	o.chunks[ci+1] = right
}

func (o *ordered) remove(key []byte) {
	ci, i := o.find(key)
	if ci == len(o.chunks) || !bytes.Equal(o.chunks[ci][i].key, key) {
		return
	}
	o.n--
	c := o.chunks[ci]
	copy(c[i:], c[i+1:])
	c[len(c)-1] = nil
	c = c[:len(c)-1]
	if len(c) == 0 {
		o.chunks = append(o.chunks[:ci], o.chunks[ci+1:]...)
		return
	}
	o.chunks[ci] = c
}

// ascend calls f for the records with from <= key < end in key order (end
// empty: no upper bound) until f returns false.
func (o *ordered) ascend(from, end []byte, f func(*keyRec) bool) {
	ci, i := o.find(from)
	for ; ci < len(o.chunks); ci, i = ci+1, 0 {
		c := o.chunks[ci]
		for ; i < len(c); i++ {
			if len(end) > 0 && bytes.Compare(c[i].key, end) >= 0 {
				return
			}
			if !f(c[i]) {
				return
			}
		}
	}
}
