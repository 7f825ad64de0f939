package registry

import (
	"fmt"
	"strings"
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
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '/':
			return fmt.Errorf("%s %q must not contain '/'", what, name)
		case c == 0:
			return fmt.Errorf("%s %q must not contain a NUL byte", what, name)
		case isAlnum(c):
		case c == '.' || c == '_' || c == '-':
			if i == 0 || i == len(name)-1 {
				return fmt.Errorf("%s %q must start and end with a letter or digit", what, name)
			}
		default:
			return fmt.Errorf("%s %q contains %q; allowed are letters, digits, '.', '_' and '-'", what, name, string(rune(c)))
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
