package registrar

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// newEpoch names one incarnation of one registrar. A position in its event
// sequence is registry.Position ("<epoch>:<sequence>", parsed only by
// registry.ParsePosition): the epoch makes a token from another replica, or
// from before a restart, never mistaken for a position in this one's
// history, so it is simply not resumable here and the client gets a fresh
// snapshot.
func newEpoch() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("registrar: reading random epoch: %v", err)) // crypto/rand does not fail on Linux
	}
	return hex.EncodeToString(b[:])
}
