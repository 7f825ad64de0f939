package registrar

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/aethermesh/aether/registrar/internal/core"
	"github.com/aethermesh/aether/registrar/replica"
	"github.com/aethermesh/aether/registry"
)

// version is a position in this registrar's event sequence; its token is
// "<epoch>:<sequence>" (registry.Position, whose ParsePosition is the one
// parser of tokens). The sequence numbers this registrar's events; the
// epoch names one incarnation of one registrar, so a token from another
// replica, or from before a restart, can never be mistaken for a position
// in this one's history: it is simply not resumable here and the client
// gets a fresh snapshot.
type version struct {
	epoch string
	seq   uint64
}

func newEpoch() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("registrar: reading random epoch: %v", err)) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}

func (v version) String() string { return registry.Position{Epoch: v.epoch, Seq: v.seq}.String() }

// versionOf is a core position as a token.
func versionOf(v core.Version) version { return version{epoch: v.Epoch, seq: v.Seq} }

// parseVersion parses a token. The empty token is valid and means "no
// position" (fresh stream); a malformed one is replica.ErrBadVersion.
func parseVersion(s string) (version, error) {
	v, err := replica.ParseVersion(s)
	if err != nil {
		return version{}, err
	}
	return version{epoch: v.Epoch, seq: v.Seq}, nil
}
