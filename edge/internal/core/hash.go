package core

import "crypto/sha256"

func hashOf(enc []byte) Hash { return sha256.Sum256(enc) }
