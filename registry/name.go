package registry

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxNameLen bounds every name that becomes a key segment (region, cluster,
// service, node, zone). etcd keys stay well under its 1.5 MiB request limit
// and operators can still read them.
const MaxNameLen = 128

// ValidateName checks a name that becomes (or may become) a key segment.
// Names are 1..MaxNameLen characters of [A-Za-z0-9._-], starting and ending
// with a letter or digit. That excludes "/", NUL, whitespace, "." and "..",
// and anything else that could escape or alias a subtree.
func ValidateName(what, name string) error {
	if name == "" {
		return fmt.Errorf("%s must not be empty", what)
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("%s is %d bytes long; the limit is %d", what, len(name), MaxNameLen)
	}
	// By rune, not byte: a multi-byte character is reported as itself
	// ('é'), not as the first byte of its UTF-8 encoding read as Latin-1.
	last := len(name) - 1
	for i, c := range name {
		switch {
		case c == '/':
			return fmt.Errorf("%s %q must not contain '/'", what, name)
		case c == 0:
			return fmt.Errorf("%s %q must not contain a NUL byte", what, name)
		case c < utf8.RuneSelf && isAlnum(byte(c)):
		case c == '.' || c == '_' || c == '-':
			if i == 0 || i == last {
				return fmt.Errorf("%s %q must start and end with a letter or digit", what, name)
			}
		case c == utf8.RuneError && invalidByte(name[i:]):
			return fmt.Errorf("%s %q is not valid UTF-8 (byte %#02x at offset %d); allowed are ASCII letters and digits, '.', '_' and '-'", what, name, name[i], i)
		default:
			return fmt.Errorf("%s %q contains %q; allowed are ASCII letters and digits, '.', '_' and '-'", what, name, string(c))
		}
	}
	if strings.Contains(name, "..") {
		return fmt.Errorf("%s %q must not contain \"..\"", what, name)
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// invalidByte reports whether s starts with a byte that is not valid UTF-8
// (range yields utf8.RuneError for it, as it does for a real U+FFFD).
func invalidByte(s string) bool {
	_, size := utf8.DecodeRuneInString(s)
	return size == 1
}
