package core

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
)

func sampleChange() *Change {
	var p1, p2 Hash
	p1[0], p2[0] = 1, 2
	return &Change{
		Parents: []Hash{p1, p2},
		Replica: 0x0102030405060708,
		Stamp:   HLC{Wall: 1_700_000_000_000_000_000, Logical: 3},
		Ops: []Op{
			{Kind: OpPut, Key: []byte("k"), Value: []byte("v"), Lease: 9},
			{Kind: OpDelete, Key: []byte("gone")},
			{Kind: OpLeaseGrant, Lease: 9, TTL: 60},
			{Kind: OpLeaseRevoke, Lease: 8},
		},
	}
}

// The encoding is a contract with every stored log and, in part 2, every
// peer: a change to it must be deliberate (a new version byte), so the
// exact bytes and id of one change are pinned here.
func TestEncodingIsPinned(t *testing.T) {
	c := sampleChange()
	want := "01" + "02" + "01" + strings.Repeat("00", 31) + "02" + strings.Repeat("00", 31) +
		"0102030405060708" + "17979cfe362a0000" + "00000003" + "04" +
		"01" + "01" + "6b" + "01" + "76" + "0000000000000009" +
		"02" + "04" + "676f6e65" +
		"03" + "0000000000000009" + "000000000000003c" +
		"04" + "0000000000000008"
	if got := hex.EncodeToString(c.Encode()); got != want {
		t.Fatalf("encoding changed:\n got %s\nwant %s", got, want)
	}
	if got, want := c.ID().String(), hashOf(c.Encode()).String(); got != want {
		t.Fatalf("ID %s is not the SHA-256 of the encoding %s", got, want)
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	for _, c := range []*Change{sampleChange(), {}, {Replica: 1, Ops: []Op{{Kind: OpPut, Key: []byte("x")}}}} {
		enc := c.Encode()
		d, err := DecodeChange(enc)
		if err != nil {
			t.Fatalf("decode %x: %v", enc, err)
		}
		if !bytes.Equal(d.Encode(), enc) || d.ID() != c.ID() {
			t.Fatalf("round trip changed the change: %+v -> %+v", c, d)
		}
	}
}

// DecodeChange accepts only what Encode produces: anything else could
// carry the same content under another id.
func TestDecodeRefusesNonCanonical(t *testing.T) {
	good := sampleChange().Encode()
	unsorted := sampleChange()
	unsorted.Parents[0], unsorted.Parents[1] = unsorted.Parents[1], unsorted.Parents[0]
	dup := sampleChange()
	dup.Parents[1] = dup.Parents[0]
	// A put of "k" whose key length is a two-byte varint (0x81 0x00 = 1).
	long := (&Change{Ops: []Op{{Kind: OpPut, Key: []byte("k")}}}).Encode()
	i := bytes.Index(long, []byte{0x01, 'k'})
	nonMinimal := append(append(append([]byte{}, long[:i]...), 0x81, 0x00), long[i+1:]...)
	badKind := (&Change{Ops: []Op{{Kind: OpPut, Key: []byte("k")}}}).Encode()
	badKind[1+1+8+8+4+1] = 9 // version, no parents, replica, stamp, op count: the first op's kind
	for name, b := range map[string][]byte{
		"empty":            nil,
		"version 2":        append([]byte{2}, good[1:]...),
		"truncated":        good[:len(good)-1],
		"trailing":         append(append([]byte{}, good...), 0),
		"unsorted parents": unsorted.Encode(),
		"repeated parent":  dup.Encode(),
		"non-minimal len":  nonMinimal,
		"unknown op kind":  badKind,
		"huge op count":    append(append([]byte{}, good[:1+1+64+20]...), 0xff, 0xff, 0xff, 0xff, 0x0f),
	} {
		if _, err := DecodeChange(b); err == nil {
			t.Errorf("%s: decoded %x", name, b)
		}
	}
	// Every strict prefix is refused too (no panic on any truncation).
	for n := range good {
		if _, err := DecodeChange(good[:n]); err == nil {
			t.Errorf("prefix of %d bytes decoded", n)
		}
	}
}

func FuzzDecodeChange(f *testing.F) {
	f.Add(sampleChange().Encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeChange(b)
		if err != nil {
			return
		}
		if !bytes.Equal(c.Encode(), b) {
			t.Fatalf("decoded %x re-encodes to %x", b, c.Encode())
		}
	})
}

func TestHLC(t *testing.T) {
	var h HLC
	steps := []struct {
		now  int64
		want HLC
	}{
		{100, HLC{100, 0}},
		{100, HLC{100, 1}}, // same wall: counter
		{90, HLC{100, 2}},  // wall stepped back: still after
		{150, HLC{150, 0}}, // wall moved on: counter resets
	}
	for i, s := range steps {
		n := h.Next(s.now)
		if n != s.want || n.Compare(h) <= 0 {
			t.Fatalf("step %d: Next(%d) after %v = %v, want %v (strictly after)", i, s.now, h, n, s.want)
		}
		h = n
	}
	if n := (HLC{Wall: 5, Logical: ^uint32(0)}).Next(1); n != (HLC{Wall: 6}) {
		t.Fatalf("counter overflow: %v", n)
	}
	// Receiving: after both the local and the remote stamp.
	for _, c := range []struct {
		local, remote HLC
		now           int64
		want          HLC
	}{
		{HLC{100, 2}, HLC{200, 5}, 150, HLC{200, 6}},
		{HLC{300, 1}, HLC{200, 5}, 150, HLC{300, 2}},
		{HLC{100, 2}, HLC{200, 5}, 250, HLC{250, 0}},
		{HLC{200, 7}, HLC{200, 5}, 100, HLC{200, 8}},
	} {
		got := c.local.Recv(c.now, c.remote)
		if got != c.want || got.Compare(c.local) <= 0 || got.Compare(c.remote) <= 0 {
			t.Errorf("%v.Recv(%d, %v) = %v, want %v", c.local, c.now, c.remote, got, c.want)
		}
	}
}
