package replica

import "github.com/aethermesh/aether/registry"

// ParseVersion parses a version token with the one parser of tokens
// (registry.ParsePosition), marking its refusal ErrBadVersion so callers
// can tell a malformed token from the other errors of a call. The empty
// token is the zero position: no position, a fresh snapshot.
func ParseVersion(s string) (registry.Position, error) {
	p, err := registry.ParsePosition(s)
	if err != nil {
		return registry.Position{}, &versionError{err}
	}
	return p, nil
}

// versionError keeps the parser's message, which names last_version and
// the form expected, and adds the sentinel.
type versionError struct{ err error }

func (e *versionError) Error() string        { return e.err.Error() }
func (e *versionError) Unwrap() error        { return e.err }
func (e *versionError) Is(target error) bool { return target == ErrBadVersion }
