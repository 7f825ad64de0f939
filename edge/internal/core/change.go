package core

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ReplicaID names a replica. It is part of every change and of every lease
// id the replica grants.
type ReplicaID uint64

// Hash is a change id: the SHA-256 of its canonical encoding.
type Hash [32]byte

// String is the hash in lower-case hex, as the extension API shows it.
func (h Hash) String() string { return fmt.Sprintf("%x", h[:]) }

// HLC is a hybrid logical clock stamp: the wall clock in unix nanoseconds
// where it moves forward, a logical counter where it does not.
type HLC struct {
	Wall    int64 // unix nanoseconds
	Logical uint32
}

// Compare orders stamps: -1, 0 or +1 as h is before, equal to or after o.
func (h HLC) Compare(o HLC) int {
	switch {
	case h.Wall < o.Wall:
		return -1
	case h.Wall > o.Wall:
		return 1
	case h.Logical < o.Logical:
		return -1
	case h.Logical > o.Logical:
		return 1
	}
	return 0
}

// Next is the stamp of a local event at wall time now (unix nanos) after
// stamp h: max(h, now), with the logical counter breaking the tie, so
// successive stamps strictly increase even when the wall clock steps back.
func (h HLC) Next(now int64) HLC {
	if now > h.Wall {
		return HLC{Wall: now}
	}
	return h.bump()
}

// Recv is the stamp after receiving a remote stamp r at wall time now
// (part 2's merge): strictly after both h and r, and at least now.
func (h HLC) Recv(now int64, r HLC) HLC {
	m := h
	if r.Compare(m) > 0 {
		m = r
	}
	if now > m.Wall {
		return HLC{Wall: now}
	}
	return m.bump()
}

func (h HLC) bump() HLC {
	if h.Logical == math.MaxUint32 {
		// 4 billion events in one nanosecond cannot happen from real
		// requests; moving the wall on keeps the order strict anyway.
		return HLC{Wall: h.Wall + 1}
	}
	return HLC{Wall: h.Wall, Logical: h.Logical + 1}
}

// OpKind says what an Op does.
type OpKind uint8

// The resolved operations a change carries. Their numbers are part of the
// encoding: never renumber them.
const (
	OpPut         OpKind = 1 // Key, Value, Lease (0: none)
	OpDelete      OpKind = 2 // Key (the key existed when the change was made)
	OpLeaseGrant  OpKind = 3 // Lease (the id), TTL (seconds, already raised to the minimum)
	OpLeaseRevoke OpKind = 4 // Lease (the id); the attached keys' deletes precede it in the change
)

func (k OpKind) String() string {
	switch k {
	case OpPut:
		return "put"
	case OpDelete:
		return "delete"
	case OpLeaseGrant:
		return "grant"
	case OpLeaseRevoke:
		return "revoke"
	}
	return fmt.Sprintf("op(%d)", uint8(k))
}

// Op is one resolved operation: replaying it needs no evaluation (a Txn's
// compares, a DeleteRange's range and a Put's ignore_value were decided when
// the change was made).
type Op struct {
	Kind  OpKind
	Key   []byte
	Value []byte
	Lease int64 // put: the attached lease (0: none); grant, revoke: the lease id
	TTL   int64 // grant: seconds
}

// Change is one node of the hash DAG: one mutating request.
type Change struct {
	Parents []Hash // the replica's heads when the change was made, sorted
	Replica ReplicaID
	Stamp   HLC
	Ops     []Op
}

// EncodingVersion is the first byte of every encoded change.
const EncodingVersion = 1

// Encode returns the canonical encoding (see the package doc). Equal
// changes have equal encodings, and DecodeChange accepts only encodings
// Encode produces, so a change's id is a function of its content.
func (c *Change) Encode() []byte {
	n := 1 + binary.MaxVarintLen64 + 32*len(c.Parents) + 8 + 8 + 4 + binary.MaxVarintLen64
	for i := range c.Ops {
		n += 1 + 2*binary.MaxVarintLen64 + len(c.Ops[i].Key) + len(c.Ops[i].Value) + 16
	}
	b := make([]byte, 0, n)
	b = append(b, EncodingVersion)
	b = binary.AppendUvarint(b, uint64(len(c.Parents)))
	for _, p := range c.Parents {
		b = append(b, p[:]...)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(c.Replica))
	b = binary.BigEndian.AppendUint64(b, uint64(c.Stamp.Wall))
	b = binary.BigEndian.AppendUint32(b, c.Stamp.Logical)
	b = binary.AppendUvarint(b, uint64(len(c.Ops)))
	for i := range c.Ops {
		op := &c.Ops[i]
		b = append(b, byte(op.Kind))
		switch op.Kind {
		case OpPut:
			b = appendBytes(b, op.Key)
			b = appendBytes(b, op.Value)
			b = binary.BigEndian.AppendUint64(b, uint64(op.Lease))
		case OpDelete:
			b = appendBytes(b, op.Key)
		case OpLeaseGrant:
			b = binary.BigEndian.AppendUint64(b, uint64(op.Lease))
			b = binary.BigEndian.AppendUint64(b, uint64(op.TTL))
		case OpLeaseRevoke:
			b = binary.BigEndian.AppendUint64(b, uint64(op.Lease))
		}
	}
	return b
}

func appendBytes(b, v []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(v)))
	return append(b, v...)
}

// ID is the SHA-256 of the canonical encoding.
func (c *Change) ID() Hash { return sha256.Sum256(c.Encode()) }

var errShort = errors.New("truncated")

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) next(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b) {
		d.err = errShort
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u64() uint64 {
	if v := d.next(8); v != nil {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.err = errShort
		return nil
	}
	v := d.next(int(n))
	if len(v) == 0 {
		return nil
	}
	return v
}

// DecodeChange parses an encoding made by Encode. It refuses anything
// Encode would not have produced (another version, unknown op kinds,
// unsorted or repeated parents, non-minimal varints, trailing bytes), so a
// decoded change re-encodes to the same bytes and keeps its id. The
// change's byte slices alias b.
func DecodeChange(b []byte) (*Change, error) {
	if len(b) == 0 {
		return nil, errors.New("core: decode change: empty")
	}
	if b[0] != EncodingVersion {
		return nil, fmt.Errorf("core: decode change: encoding version %d, want %d", b[0], EncodingVersion)
	}
	d := &decoder{b: b[1:]}
	c := &Change{}
	np := d.uvarint()
	if np > uint64(len(d.b)/32) {
		return nil, fmt.Errorf("core: decode change: %d parents: %w", np, errShort)
	}
	if np > 0 {
		c.Parents = make([]Hash, np)
	}
	for i := range c.Parents {
		copy(c.Parents[i][:], d.next(32))
		if i > 0 && bytes.Compare(c.Parents[i-1][:], c.Parents[i][:]) >= 0 {
			return nil, errors.New("core: decode change: parents not sorted and distinct")
		}
	}
	c.Replica = ReplicaID(d.u64())
	c.Stamp.Wall = int64(d.u64())
	if v := d.next(4); v != nil {
		c.Stamp.Logical = binary.BigEndian.Uint32(v)
	}
	nops := d.uvarint()
	if d.err == nil && nops > uint64(len(d.b)) {
		return nil, fmt.Errorf("core: decode change: %d ops: %w", nops, errShort)
	}
	if nops > 0 {
		c.Ops = make([]Op, nops)
	}
	for i := range c.Ops {
		if d.err != nil {
			break
		}
		op := &c.Ops[i]
		k := d.next(1)
		if k == nil {
			break
		}
		op.Kind = OpKind(k[0])
		switch op.Kind {
		case OpPut:
			op.Key = d.bytes()
			op.Value = d.bytes()
			op.Lease = int64(d.u64())
		case OpDelete:
			op.Key = d.bytes()
		case OpLeaseGrant:
			op.Lease = int64(d.u64())
			op.TTL = int64(d.u64())
		case OpLeaseRevoke:
			op.Lease = int64(d.u64())
		default:
			return nil, fmt.Errorf("core: decode change: op %d: unknown kind %d", i, k[0])
		}
	}
	if d.err != nil {
		return nil, fmt.Errorf("core: decode change: %w", d.err)
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("core: decode change: %d trailing bytes", len(d.b))
	}
	// Varints have several encodings of one value; only the minimal one is
	// canonical. Re-encoding is the simplest exact check.
	if !bytes.Equal(c.Encode(), b) {
		return nil, errors.New("core: decode change: not in canonical form")
	}
	return c, nil
}
