package xds

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
)

// State is where one resource type of one xDS stream stands, in the
// words of istioctl proxy-status.
type State string

const (
	// Synced: the client ACKed the last response sent for the type.
	Synced State = "SYNCED"
	// Stale: a response was sent and neither ACKed nor NACKed yet.
	Stale State = "STALE"
	// NACKed: the client rejected the last response sent; it keeps
	// running on the version it last accepted (AckedVersion).
	NACKed State = "NACKED"
	// NotSent: the client asked for the type and was sent nothing yet
	// (its watch waits for the feed's first start, or for the names it asks
	// for to exist).
	NotSent State = "NOT_SENT"
)

// ClientStatus is one open xDS stream: a proxyless gRPC client over ADS
// has one, a client of the per-type services one per type.
type ClientStatus struct {
	Stream   int64         `json:"stream"` // go-control-plane's stream id, unique per server
	Node     string        `json:"node"`
	Locality *NodeLocality `json:"locality,omitempty"` // as the node sends it; none: served as the server's own
	// Variant is "sotw" (state of the world) or "delta" (incremental).
	Variant string `json:"variant"`
	// Service is "ads" or the per-type service ("cds", "eds", "lds", "rds").
	Service     string    `json:"service"`
	ConnectedAt time.Time `json:"connected_at"`
	// Types is by type URL.
	Types map[string]TypeStatus `json:"types"`
}

// NodeLocality is the locality of an xDS Node.
type NodeLocality struct {
	Region  string `json:"region,omitempty"`
	Zone    string `json:"zone,omitempty"`
	SubZone string `json:"sub_zone,omitempty"`
}

// TypeStatus is one resource type of a stream.
type TypeStatus struct {
	State State `json:"state"`
	// SentVersion is the version of the last response sent (version_info
	// for state of the world, system_version_info for delta), with its
	// nonce.
	SentVersion string     `json:"sent_version,omitempty"`
	SentNonce   string     `json:"sent_nonce,omitempty"`
	SentAt      *time.Time `json:"sent_at,omitempty"`
	// AckedVersion is the last version the client accepted: what it runs
	// on. For state of the world it is the request's version_info, which
	// a NACK carries too (the version it keeps).
	AckedVersion string     `json:"acked_version,omitempty"`
	AckedAt      *time.Time `json:"acked_at,omitempty"`
	// LastNACK is the last rejection on the stream, kept once the type is
	// SYNCED again, for the record.
	LastNACK *NACK `json:"last_nack,omitempty"`
}

// NACK is a rejected response.
type NACK struct {
	Version string    `json:"version"` // the version rejected
	Nonce   string    `json:"nonce"`
	Detail  string    `json:"error_detail"`
	At      time.Time `json:"at"`
}

// StatusDocument is what StatusHandler serves.
type StatusDocument struct {
	Clients []ClientStatus `json:"clients"`
}

// tracker keeps the status of every open stream from the server's
// callbacks. go-control-plane calls a stream's callbacks from the
// stream's own goroutine, so per stream they arrive in order; the mutex
// is for Status and for the streams between them.
type tracker struct {
	mu      sync.Mutex
	streams map[int64]*streamState
}

type streamState struct {
	id               int64
	variant, service string
	node             string
	locality         *NodeLocality
	opened           time.Time
	// types is by type URL: a stream asks for a few (the four the feed
	// serves, or fewer), and a scan comparing strings (the same string
	// each time, which compares at once) is cheaper than a map's hashing
	// on every request and response.
	types []*typeState
}

type typeState struct {
	url string
	TypeStatus
	// requested is when the last request of the type arrived: a response
	// sent after a feed change that came later was pushed to a waiting
	// watch, which is what the push latency measures.
	requested time.Time
	// sentAt and ackedAt are TypeStatus's SentAt and AckedAt, kept as
	// values (status makes the pointers): no allocation per response and
	// ACK.
	sentAt, ackedAt time.Time
	// loggedNACK is the last version whose NACK was logged: grpc-go NACKs
	// again whenever it asks again, and one line per version says it.
	loggedNACK string
}

func newTracker() *tracker { return &tracker{streams: map[int64]*streamState{}} }

func (t *tracker) open(id int64, variant, typeURL string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.streams[id] = &streamState{id: id, variant: variant, service: serviceLabel(typeURL), opened: time.Now()}
}

func (t *tracker) close(id int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.streams, id)
}

// typeLocked is the state of one type of a stream, made on first use;
// nil for a stream not open (a callback racing its close).
func (t *tracker) typeLocked(id int64, node *corev3.Node, typeURL string) (*streamState, *typeState) {
	st := t.streams[id]
	if st == nil {
		return nil, nil
	}
	st.setNode(node)
	for _, ts := range st.types {
		if ts.url == typeURL {
			return st, ts
		}
	}
	ts := &typeState{url: typeURL, TypeStatus: TypeStatus{State: NotSent}}
	st.types = append(st.types, ts)
	return st, ts
}

// nackEvent is a NACK the server logs (when first) and counts.
type nackEvent struct {
	node, version, accepted, nonce, detail string
	first                                  bool // first NACK of this version on this stream and type
}

// request records a request: an ACK or NACK when it carries the nonce of
// the last response of its type (go-control-plane ignores a request with
// an older nonce, and so does the status), else a (re)subscription. It
// returns the NACK, if it is one, and the version the client holds a
// NACK against ("" if none), which the server's hold uses.
func (t *tracker) request(id int64, node *corev3.Node, typeURL, version, nonce string, errDetail string, isNACK bool) (nack *nackEvent, rejected string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, ts := t.typeLocked(id, node, typeURL)
	if ts == nil {
		if isNACK {
			// Still counted and logged: a stream the status lost is no
			// reason to lose a NACK.
			return &nackEvent{node: node.GetId(), accepted: version, nonce: nonce, detail: errDetail, first: true}, ""
		}
		return nil, ""
	}
	now := time.Now()
	ts.requested = now
	switch {
	case nonce == "" || nonce != ts.SentNonce:
		// A first request, a change of names, or a late one: no answer
		// to the last response. A resuming client names what it runs.
		if ts.SentNonce == "" && version != "" {
			ts.AckedVersion = version
		}
	case isNACK:
		ts.State = NACKed
		ts.AckedVersion = version
		ts.LastNACK = &NACK{Version: ts.SentVersion, Nonce: nonce, Detail: errDetail, At: now}
		first := ts.loggedNACK != ts.SentVersion
		ts.loggedNACK = ts.SentVersion
		nack = &nackEvent{node: st.node, version: ts.SentVersion, accepted: version, nonce: nonce, detail: errDetail, first: first}
	case version == ts.SentVersion || st.variant == "delta":
		// A delta ACK carries no version: its nonce is the ACK.
		ts.State = Synced
		ts.AckedVersion = ts.SentVersion
		ts.ackedAt = now
	}
	if ts.State == NACKed {
		return nack, ts.SentVersion
	}
	return nack, ""
}

// sent records a response sent at now; it returns when the type's last
// request arrived (for the push latency).
func (t *tracker) sent(id int64, typeURL, version, nonce string, now time.Time) (requested time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ts := t.typeLocked(id, nil, typeURL)
	if ts == nil {
		return time.Time{}
	}
	ts.State, ts.SentVersion, ts.SentNonce, ts.sentAt = Stale, version, nonce, now
	return ts.requested
}

// node records a delta stream's node, which only its first request
// carries, and returns the one known.
func (t *tracker) node(id int64, n *corev3.Node) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.streams[id]
	if st == nil {
		return n.GetId()
	}
	st.setNode(n)
	return st.node
}

// setNode takes the node of a stream's first request that has one; the
// later ones repeat it or (delta) carry none.
func (st *streamState) setNode(n *corev3.Node) {
	if n == nil || st.node != "" || st.locality != nil {
		return
	}
	st.node = n.GetId()
	if l := n.GetLocality(); l.GetRegion() != "" || l.GetZone() != "" || l.GetSubZone() != "" {
		st.locality = &NodeLocality{Region: l.GetRegion(), Zone: l.GetZone(), SubZone: l.GetSubZone()}
	}
}

func (t *tracker) status() []ClientStatus {
	t.mu.Lock()
	out := make([]ClientStatus, 0, len(t.streams))
	for _, st := range t.streams {
		c := ClientStatus{Stream: st.id, Node: st.node, Variant: st.variant, Service: st.service, ConnectedAt: st.opened,
			Types: make(map[string]TypeStatus, len(st.types))}
		if st.locality != nil {
			l := *st.locality
			c.Locality = &l
		}
		for _, ts := range st.types {
			url := ts.url
			s := ts.TypeStatus
			if !ts.sentAt.IsZero() {
				at := ts.sentAt
				s.SentAt = &at
			}
			if !ts.ackedAt.IsZero() {
				at := ts.ackedAt
				s.AckedAt = &at
			}
			if s.LastNACK != nil {
				n := *s.LastNACK
				s.LastNACK = &n
			}
			c.Types[url] = s
		}
		out = append(out, c)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b ClientStatus) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Stream, b.Stream))
	})
	return out
}

// Status is every open xDS stream, sorted by node id, then stream.
func (s *Server) Status() []ClientStatus { return s.status.status() }

// StatusHandler serves Status as JSON (a StatusDocument) to GET: the
// registrar mounts it at /xds/status, what `aether xds status` reads.
func (s *Server) StatusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(StatusDocument{Clients: s.Status()})
	})
}

// holdRejected is how a NACKed version stops being pushed again. The
// sotw server records what it sent as the client's, NACKed or not, so
// the feed's caches wake the watch again only when a resource it
// names changes; but a request whose version_info is empty (a client
// that has accepted nothing yet NACKs with "") or lacks the cache's
// prefix is answered at once (linear.go CreateWatch: replyEvenIfEmpty;
// edsCache.CreateWatch alike),
// which for a Listener or Cluster is the rejected full state again,
// NACKed again, as fast as the round trip (grpc-go does not back off),
// and for EDS or RDS an empty response the client ACKs, which the status
// would take for SYNCED. go-control-plane's sotw server passes the
// request it gave OnStreamRequest to CreateWatch, so setting its
// version_info here to the rejected version (the cache's own, with its
// prefix) makes the cache see a client that is up to date: it opens a
// watch, which fires when a resource named changes, or at once if the
// request names resources not yet sent. The client runs on its last
// accepted version meanwhile, as grpc-go does after a NACK.
//
// Delta needs no hold: the delta server records what it sent, NACKed or
// not, as the client's resource versions, and sends only what changes.
func holdRejected(req *discoverygrpc.DiscoveryRequest, rejected string) {
	if rejected != "" {
		req.VersionInfo = rejected
	}
}
