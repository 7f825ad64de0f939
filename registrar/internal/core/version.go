package core

import "strconv"

// Version is a position in one registrar incarnation's event sequence,
// written "<epoch>:<sequence>". The epoch names the incarnation, so a token
// from another replica, or from before a restart, can never be mistaken
// for a position in this one's history: it is simply not resumable here.
type Version struct {
	Epoch string
	Seq   uint64
}

func (v Version) String() string { return v.Epoch + ":" + strconv.FormatUint(v.Seq, 10) }
