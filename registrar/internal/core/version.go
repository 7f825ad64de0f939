package core

import "github.com/aethermesh/aether/registry"

// Version is a position in one registrar incarnation's event sequence,
// written "<epoch>:<sequence>" (registry.Position: one format and one parser
// for every side of the wire). The epoch names the incarnation, so a token
// from another replica, or from before a restart, can never be mistaken
// for a position in this one's history: it is simply not resumable here.
type Version = registry.Position
