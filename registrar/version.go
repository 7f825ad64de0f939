package registrar

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/aethermesh/aether/registrar/internal/core"
)

// A version token is "<epoch>:<sequence>". The sequence numbers this
// registrar's events; the epoch names one incarnation of one registrar, so a
// token from another replica, or from before a restart, can never be mistaken
// for a position in this one's history: it is simply not resumable here and
// the client gets a fresh snapshot.
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

// String is the token's one format, core.Version's.
func (v version) String() string { return core.Version{Epoch: v.epoch, Seq: v.seq}.String() }

// versionOf is a core position as a token.
func versionOf(v core.Version) version { return version{epoch: v.Epoch, seq: v.Seq} }

// parseVersion parses a token. The empty token is valid and means "no
// position" (fresh stream).
func parseVersion(s string) (version, error) {
	if s == "" {
		return version{}, nil
	}
	epoch, seq, ok := strings.Cut(s, ":")
	if !ok || epoch == "" || len(epoch) > 64 {
		return version{}, fmt.Errorf("last_version %q is not a version token (expected <epoch>:<sequence> as sent by the registrar; leave it empty for a fresh snapshot)", truncate(s, 80))
	}
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return version{}, fmt.Errorf("last_version %q has a bad sequence number (expected <epoch>:<sequence> as sent by the registrar; leave it empty for a fresh snapshot)", truncate(s, 80))
	}
	return version{epoch: epoch, seq: n}, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
