package registry

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxEpochLen bounds the epoch of a version token. A registrar's epochs are
// 12 hex digits; the bound only keeps a hostile token from being carried
// around (logged, compared, stored) at any size.
const MaxEpochLen = 64

// Position is a place in one registrar's event history: the epoch names an
// incarnation of one registrar, the sequence numbers its events. Positions of
// different epochs are not comparable: a restart or another replica starts a
// history of its own, so only the epoch says whether two sequences count the
// same events. The zero Position is "no position" (a fresh stream).
//
// On the wire a position travels twice: as the opaque version token
// ("<epoch>:<sequence>") that a watcher hands back as last_version, and as
// the epoch and sequence fields of events and write responses, which is what
// a client compares. Only the registrar needs to read a token, so
// ParsePosition is the one parser of them.
type Position struct {
	Epoch string
	Seq   uint64
}

// String is the version token of p: "<epoch>:<sequence>", or "" for the zero
// Position (and any position without an epoch, which names nothing), so that
// ParsePosition(p.String()) gives p back for every position it can return.
func (p Position) String() string {
	if p.Epoch == "" {
		return ""
	}
	return p.Epoch + ":" + strconv.FormatUint(p.Seq, 10)
}

// IsZero reports whether p is "no position".
func (p Position) IsZero() bool { return p.Epoch == "" }

// ParsePosition parses a version token as a registrar sends it and a watcher
// returns it in last_version. The empty token is valid and is the zero
// Position (a fresh stream). The messages name last_version because that is
// the only field a token comes back in.
func ParsePosition(s string) (Position, error) {
	if s == "" {
		return Position{}, nil
	}
	epoch, seq, ok := strings.Cut(s, ":")
	if !ok || epoch == "" || len(epoch) > MaxEpochLen {
		return Position{}, fmt.Errorf("last_version %q is not a version token (expected <epoch>:<sequence> as sent by the registrar; leave it empty for a fresh snapshot)", truncateToken(s, 80))
	}
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return Position{}, fmt.Errorf("last_version %q has a bad sequence number (expected <epoch>:<sequence> as sent by the registrar; leave it empty for a fresh snapshot)", truncateToken(s, 80))
	}
	return Position{Epoch: epoch, Seq: n}, nil
}

// truncateToken keeps an error about a hostile token readable: the first n
// bytes say enough about what was sent.
func truncateToken(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
