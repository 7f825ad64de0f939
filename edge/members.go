package edge

import (
	"crypto/sha1" //nolint:gosec // etcd's member and cluster ids are SHA-1 derived; we must produce the same ids.
	"encoding/binary"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"
)

// member is one entry of the configured cluster.
type member struct {
	id       uint64
	name     string
	peerURLs []string
}

// clusterMembers builds the member list from the initial cluster exactly as
// etcd does (membership.NewClusterFromURLsMap): a member's id is the first 8
// bytes, big endian, of SHA-1 over its sorted peer URLs joined with no
// separator followed by the cluster token.
func clusterMembers(cfg Config) ([]member, error) {
	ic := cfg.InitialCluster
	if len(ic) == 0 {
		peers := cfg.AdvertisePeerURLs
		if len(peers) == 0 {
			// etcd's --initial-advertise-peer-urls default.
			peers = []url.URL{{Scheme: "http", Host: "localhost:2380"}}
		}
		name := cfg.Name
		if name == "" {
			name = "default"
		}
		ic = map[string][]url.URL{name: peers}
	}
	token := cfg.InitialClusterToken
	if token == "" {
		token = "etcd-cluster" // etcd's --initial-cluster-token default
	}
	var ms []member
	seen := map[uint64]string{}
	for name, urls := range ic {
		if len(urls) == 0 {
			return nil, fmt.Errorf("edge: member %q of the initial cluster has no peer URLs", name)
		}
		m := member{name: name, peerURLs: urlStrings(urls)}
		m.id = memberID(m.peerURLs, token)
		if m.id == 0 {
			return nil, errors.New("edge: cannot use 0 as member id")
		}
		if other, ok := seen[m.id]; ok {
			return nil, fmt.Errorf("edge: members %q and %q have identical ids %x", other, name, m.id)
		}
		seen[m.id] = name
		ms = append(ms, m)
	}
	slices.SortFunc(ms, func(a, b member) int {
		switch {
		case a.id < b.id:
			return -1
		case a.id > b.id:
			return 1
		}
		return 0
	})
	return ms, nil
}

func urlStrings(urls []url.URL) []string {
	out := make([]string, len(urls))
	for i := range urls {
		out[i] = urls[i].String()
	}
	// types.NewURLs sorts; etcd reports peer URLs in that order.
	sort.Strings(out)
	return out
}

// memberID is etcd's computeMemberID with no time component (members of the
// initial cluster).
func memberID(peerURLs []string, token string) uint64 {
	s := slices.Clone(peerURLs)
	sort.Strings(s)
	b := []byte(strings.Join(s, ""))
	b = append(b, token...)
	h := sha1.Sum(b) //nolint:gosec // see import
	return binary.BigEndian.Uint64(h[:8])
}

// clusterID is etcd's RaftCluster.genID: SHA-1 over the member ids in
// ascending order, each 8 bytes big endian.
func clusterID(ms []member) uint64 {
	ids := make([]uint64, len(ms))
	for i, m := range ms {
		ids[i] = m.id
	}
	slices.Sort(ids)
	b := make([]byte, 8*len(ids))
	for i, id := range ids {
		binary.BigEndian.PutUint64(b[8*i:], id)
	}
	h := sha1.Sum(b) //nolint:gosec // see import
	return binary.BigEndian.Uint64(h[:8])
}

func findMember(ms []member, name string) (member, bool) {
	if name == "" {
		name = "default"
	}
	for _, m := range ms {
		if m.name == name {
			return m, true
		}
	}
	return member{}, false
}

// reqIDGen reproduces etcd's request id generator (pkg/idutil): the low 16
// bits of the member id in the top 16 bits, then a millisecond timestamp and
// a counter. The ids only size the request for the max-request-bytes check,
// which etcd applies to the marshalled internal raft request including this
// id; generating the same kind of id keeps the limit byte-exact.
type reqIDGen struct {
	prefix uint64
	suffix atomic.Uint64
}

func newReqIDGen(memberID uint64, now time.Time) *reqIDGen {
	const tsLen, cntLen = 5 * 8, 8
	g := &reqIDGen{prefix: (memberID & 0xffff) << (tsLen + cntLen)}
	ms := uint64(now.UnixNano()/int64(time.Millisecond)) & (1<<tsLen - 1)
	g.suffix.Store(ms << cntLen)
	return g
}

func (g *reqIDGen) next() uint64 {
	const suffixLen = 5*8 + 8
	return g.prefix | (g.suffix.Add(1) & (1<<suffixLen - 1))
}
