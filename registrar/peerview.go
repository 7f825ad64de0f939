package registrar

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aethermesh/aether/backend"
)

// PeerStatus is one other replica of this cluster as peer-watch knows it:
// found through its member record, and whether its stream to this replica
// is open. Read by the operator console.
type PeerStatus struct {
	Epoch string
	Addr  string
	// Connected: its PeerWatch stream is open (its first message arrived).
	Connected bool
	// Since is when Connected last changed, or when the member was found.
	Since time.Time
	// Writes is how many of its writes this replica has received from it.
	Writes uint64
}

// peerView is what discovery and the receiving streams know of the other
// replicas, kept apart from the state lock: the console reads it while the
// replica works.
type peerView struct {
	mu    sync.Mutex
	peers map[string]*PeerStatus // by epoch
}

func (v *peerView) found(m backend.Member, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.peers == nil {
		v.peers = map[string]*PeerStatus{}
	}
	if _, ok := v.peers[m.Epoch]; !ok {
		v.peers[m.Epoch] = &PeerStatus{Epoch: m.Epoch, Addr: m.Addr, Since: now}
	}
}

func (v *peerView) gone(m backend.Member) {
	v.mu.Lock()
	defer v.mu.Unlock()
	delete(v.peers, m.Epoch)
}

func (v *peerView) connected(m backend.Member, on bool, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p := v.peers[m.Epoch]; p != nil && p.Connected != on {
		p.Connected, p.Since = on, now
	}
}

func (v *peerView) received(m backend.Member, n int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if p := v.peers[m.Epoch]; p != nil {
		p.Writes += uint64(n)
	}
}

// Peers returns the other replicas of this cluster that peer-watch has
// found, sorted by address; empty without --peer-watch.
func (r *Registrar) Peers() []PeerStatus {
	r.peerView.mu.Lock()
	defer r.peerView.mu.Unlock()
	out := make([]PeerStatus, 0, len(r.peerView.peers))
	for _, p := range r.peerView.peers {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b PeerStatus) int {
		if c := strings.Compare(a.Addr, b.Addr); c != 0 {
			return c
		}
		return strings.Compare(a.Epoch, b.Epoch)
	})
	return out
}
