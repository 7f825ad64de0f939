package replica

import (
	"strconv"
	"strings"
)

// Version is a position in one replica's event sequence, sent as the
// token "<epoch>:<sequence>". The sequence numbers the replica's events;
// the epoch names one incarnation of one replica, so a token from another
// replica, or from before a restart, can never be mistaken for a position
// in this one's history: it is simply not resumable there, and the
// subscriber gets a fresh snapshot.
type Version struct {
	Epoch    string
	Sequence uint64
}

// String is the token.
func (v Version) String() string { return v.Epoch + ":" + strconv.FormatUint(v.Sequence, 10) }

// ParseVersion parses a token. The empty token is valid and means "no
// position" (a fresh snapshot). Anything else not of the form a replica
// issues is ErrBadVersion, with a message naming the request field
// last_version, which is where callers of every front end put it.
func ParseVersion(s string) (Version, error) {
	if s == "" {
		return Version{}, nil
	}
	epoch, seq, ok := strings.Cut(s, ":")
	if !ok || epoch == "" || len(epoch) > 64 {
		return Version{}, &versionError{"last_version " + strconv.Quote(truncate(s, 80)) + " is not a version token (expected <epoch>:<sequence> as sent by the registrar; leave it empty for a fresh snapshot)"}
	}
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return Version{}, &versionError{"last_version " + strconv.Quote(truncate(s, 80)) + " has a bad sequence number (expected <epoch>:<sequence> as sent by the registrar; leave it empty for a fresh snapshot)"}
	}
	return Version{Epoch: epoch, Sequence: n}, nil
}

type versionError struct{ msg string }

func (e *versionError) Error() string        { return e.msg }
func (e *versionError) Is(target error) bool { return target == ErrBadVersion }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
