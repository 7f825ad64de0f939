package registry

import (
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// Write stamps order acknowledged writes of one key across replicas and
// restarts. Two registrars write-behind independently, so the order in
// which their flushes reach the backend says nothing about the order in
// which they acknowledged; the stamp does. It is a hybrid logical clock
// reading (Kulkarni et al.): wall-clock milliseconds in the high bits, a
// counter in the low 16, so it follows real time across machines (within
// their clock skew) and still grows strictly when the clock stalls or steps
// back, and it is pulled forward by every stamp a registrar observes, so a
// write acknowledged after a replica saw another's write is ordered after
// it whatever the clocks say.

// TombstoneRoot is where a deleted endpoint's stamp is kept for a while.
// It is outside Root, so nothing that lists or watches the registry, nor
// the region replicator, ever sees a tombstone.
const TombstoneRoot = "/aether/v1-tombstones/"

// hlcLogicalBits is the width of the counter below the milliseconds.
const hlcLogicalBits = 16

// HLC is a hybrid logical clock. It reads no clock itself: the caller
// passes the wall time, as the registrar's pure core requires. The zero
// value is ready.
type HLC struct{ last uint64 }

// Next returns a reading strictly greater than every reading returned or
// observed before, and no less than the wall time.
func (c *HLC) Next(wall time.Time) uint64 {
	phys := uint64(max(wall.UnixMilli(), 0)) << hlcLogicalBits
	if phys > c.last {
		c.last = phys
	} else {
		c.last++
	}
	return c.last
}

// Observe pulls the clock forward past a reading seen elsewhere (another
// replica's stamp), so that the next reading orders after it.
func (c *HLC) Observe(hlc uint64) {
	if hlc > c.last {
		c.last = hlc
	}
}

// Last is the latest reading returned or observed.
func (c *HLC) Last() uint64 { return c.last }

// HLCTime is the wall time a reading was taken at (to the millisecond).
func HLCTime(hlc uint64) time.Time {
	return time.UnixMilli(int64(hlc >> hlcLogicalBits)).UTC()
}

// CompareStamps orders two stamps: by clock reading, then by writer. A nil
// stamp (a value written before stamps existed, or by a tool that bypassed
// the registrar) is older than any stamp.
func CompareStamps(a, b *registryv1.WriteStamp) int {
	switch {
	case a == nil && b == nil:
		return 0
	case a == nil:
		return -1
	case b == nil:
		return 1
	case a.GetHlc() != b.GetHlc():
		if a.GetHlc() < b.GetHlc() {
			return -1
		}
		return 1
	}
	return strings.Compare(a.GetWriter(), b.GetWriter())
}

// FormatStamp renders a stamp for logs and messages.
func FormatStamp(s *registryv1.WriteStamp) string {
	if s == nil {
		return "unstamped"
	}
	return fmt.Sprintf("%s+%d@%s", HLCTime(s.GetHlc()).Format(time.RFC3339Nano), s.GetHlc()&(1<<hlcLogicalBits-1), s.GetWriter())
}

// TombstoneKey is where the tombstone of an endpoint's key lives: the
// key's path below Root, under TombstoneRoot.
func TombstoneKey(id EndpointID) (string, error) {
	k, err := id.Key()
	if err != nil {
		return "", err
	}
	return TombstoneRoot + strings.TrimPrefix(k, Root), nil
}

// EncodeTombstone is the value of a tombstone.
func EncodeTombstone(s *registryv1.WriteStamp) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(&registryv1.Tombstone{Stamp: s})
}

// DecodeTombstone parses a tombstone's value.
func DecodeTombstone(value []byte) (*registryv1.WriteStamp, error) {
	var t registryv1.Tombstone
	if err := proto.Unmarshal(value, &t); err != nil {
		return nil, fmt.Errorf("tombstone: %w", err)
	}
	return t.GetStamp(), nil
}
