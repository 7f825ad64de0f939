package kubernetes

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Object names. A record's object name is a pure function of its registry
// key, so every replica finds the same object for the same key without
// asking, and a create by two replicas at once collides (AlreadyExists)
// instead of making two objects. The name is a readable prefix (the kind
// and the record's own name, folded into DNS-1123) and a hash of the full
// key: names are case-folded and truncated, so the prefix alone would
// alias "Web" and "web", and only the hash keeps keys apart. The full key
// is stored in the object too (spec.key), and a reader that finds another
// key under the name it derived refuses the object rather than trusting
// the hash.

// hashLen is how many hex digits of the key's SHA-256 a name carries: 80
// bits, so that among a million keys the chance of any two sharing a name
// is about 4e-13.
const hashLen = 20

// readableLen bounds the readable part, keeping names short enough to read
// in kubectl's output and within 63 characters, a DNS label (the limit
// for a custom resource name is 253).
const readableLen = 36

// Labels the backend sets on its objects.
const (
	// LabelManagedBy marks every object the backend writes.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	managedBy      = "aether"
	// LabelKeyHash carries the name's hash, so a read of many given keys
	// is one label-selector list (hash in (...)) rather than one GET each.
	LabelKeyHash = "aether.dev/key-hash"
	// LabelTombstone is "true" on a tombstone, which garbage collection
	// lists by it.
	LabelTombstone = "aether.dev/tombstone"
	// LabelFence is set on a watch fence object (watch.go), valued with
	// the writing store's id.
	LabelFence = "aether.dev/fence"
)

// keyHash is the hash part of a key's object name.
func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])[:hashLen]
}

// EndpointObjectName is the AetherEndpoint name of an endpoint key:
// "ep-<service>-<hash>".
func EndpointObjectName(key, service string) string {
	return objectName("ep", service, key)
}

// NodeObjectName is the AetherNode name of a node record key:
// "node-<name>-<hash>".
func NodeObjectName(key, name string) string {
	return objectName("node", name, key)
}

func objectName(kind, readable, key string) string {
	r := dns1123(readable)
	if len(r) > readableLen {
		r = strings.TrimRight(r[:readableLen], "-.")
	}
	if r == "" {
		return kind + "-" + keyHash(key)
	}
	return kind + "-" + r + "-" + keyHash(key)
}

// dns1123 folds s into the characters of a DNS-1123 label: lower-case
// letters, digits and '-', without a leading or trailing '-'. Runs of other
// characters become one '-'.
func dns1123(s string) string {
	var b strings.Builder
	dash := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z' || c >= '0' && c <= '9':
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		default:
			dash = b.Len() > 0
			continue
		}
		if dash {
			b.WriteByte('-')
			dash = false
		}
		b.WriteByte(c)
	}
	return b.String()
}
