package client

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// settleTimeout bounds how long an acknowledged write stays in the overlay
// when the stream cannot show that it caught up with it (the write went to
// another registrar, or the registrar lost it in a crash). After that the
// stream's word is final.
const settleTimeout = 10 * time.Second

type endpoints = map[registry.EndpointID]*registryv1.ServiceEndpoint

// state is the client's mutable model; Client.mu guards all of it. It does
// no I/O. Every mutation records the services whose view changed (dirty) and
// the changes OnChange must see; Client.commitLocked publishes both.
//
// The view of a cached service is auth overlaid with writes: eff is that
// overlay, materialized, so a mutation can tell what actually changed.
type state struct {
	all     bool                // watching all services
	haveAll bool                // all: auth is the registrar's state as of version
	wanted  map[string]struct{} // !all: services the caller subscribed to
	held    map[string]struct{} // !all: services auth is authoritative for as of version; a subset of wanted

	auth map[string]endpoints // by service: the registrar's state, cached services only
	eff  map[string]endpoints // by service: auth overlaid with writes, cached services only

	writes   map[registry.EndpointID]*write
	queue    []registry.EndpointID // writes in state writeQueued, in send order
	writeSeq uint64                // numbers intents, for Flush

	// Re-assertion (reassert.go): the client's own acknowledged
	// registrations, the ones waiting out a backoff, the acknowledged
	// writes a snapshot covered, and what was re-asserted since the last
	// commit.
	owned         map[registry.EndpointID]*ownership
	due           map[registry.EndpointID]time.Time
	resend        map[registry.EndpointID]struct{}
	reasserted    []registry.EndpointID
	dueChanged    bool                            // a re-assertion was scheduled: the writer's timer must be recomputed
	node          string                          // Config.Node: the owner named in unregisters
	reassertDelay func(attempt int) time.Duration // backoff of repeated re-assertions of one endpoint
	reassertQuiet time.Duration                   // without re-assertion this long, an endpoint's backoff starts over

	// version is the last resume token the stream delivered, passed back
	// as it came; at is its position, taken from the messages' epoch and
	// sequence fields, never from the token, which the API calls opaque.
	// The two are kept together, so a stream that resumes from version
	// starts in at's epoch.
	version string
	at      registry.Position

	trackChanges  bool // OnChange is set
	changes       []Change
	dirty         map[string]struct{}
	wantedChanged bool
}

func newState(services []string, trackChanges bool) *state {
	s := &state{
		all:           len(services) == 0,
		wanted:        map[string]struct{}{},
		held:          map[string]struct{}{},
		auth:          map[string]endpoints{},
		eff:           map[string]endpoints{},
		writes:        map[registry.EndpointID]*write{},
		owned:         map[registry.EndpointID]*ownership{},
		due:           map[registry.EndpointID]time.Time{},
		resend:        map[registry.EndpointID]struct{}{},
		reassertDelay: func(int) time.Duration { return 0 },
		trackChanges:  trackChanges,
		dirty:         map[string]struct{}{},
	}
	for _, svc := range services {
		s.wanted[svc] = struct{}{}
	}
	return s
}

// cached reports whether the cache holds a service authoritatively.
func (s *state) cached(svc string) bool {
	if s.all {
		return s.haveAll
	}
	_, ok := s.held[svc]
	return ok
}

func (s *state) setAuth(id registry.EndpointID, ep *registryv1.ServiceEndpoint) {
	m := s.auth[id.Service]
	if ep == nil {
		delete(m, id)
		if len(m) == 0 {
			delete(s.auth, id.Service)
		}
		return
	}
	if m == nil {
		m = endpoints{}
		s.auth[id.Service] = m
	}
	m[id] = ep
}

// recompute brings eff up to date for one endpoint and records the change.
// Pointer equality is the cheap test; attribute equality decides whether a
// new pointer is a change the caller hears about (a registrar echo of an
// optimistic write only adds timestamps).
func (s *state) recompute(id registry.EndpointID) {
	svc := id.Service
	if !s.cached(svc) {
		return
	}
	a := s.auth[svc][id]
	cur := a
	if w := s.writes[id]; w != nil {
		// A write that asks for what the registrar already has shows the
		// registrar's copy, timestamps included.
		if cur = w.apply(a); cur != nil && a != nil && cur != a && registry.SameAttributes(cur, a) {
			cur = a
		}
	} else if _, waiting := s.due[id]; waiting {
		// A re-assertion waiting out its backoff is the client's intent
		// as much as a queued write is (reassert.go).
		cur = s.owned[id].target(a)
	}
	m := s.eff[svc]
	old := m[id]
	if old == cur {
		return
	}
	switch {
	case old == nil:
		if m == nil {
			m = endpoints{}
			s.eff[svc] = m
		}
		m[id] = cur
		s.change(ChangeAdded, cur, nil)
	case cur == nil:
		delete(m, id)
		if len(m) == 0 {
			delete(s.eff, svc)
		}
		s.change(ChangeRemoved, old, nil)
	default:
		m[id] = cur
		if !registry.SameAttributes(old, cur) {
			s.change(ChangeUpdated, cur, old)
		}
	}
	s.dirty[svc] = struct{}{}
}

func (s *state) change(t ChangeType, ep, prev *registryv1.ServiceEndpoint) {
	if s.trackChanges {
		s.changes = append(s.changes, Change{Type: t, Endpoint: ep, Previous: prev})
	}
}

// applyEvent folds one ADDED/UPDATED/REMOVED event in, at now. Events of
// services the cache does not hold are ignored: they are in flight from
// before an Unsubscribe took effect on the registrar.
func (s *state) applyEvent(ev *registrarv1.EndpointEvent, now time.Time) {
	ep := ev.GetEndpoint()
	if ep == nil {
		return
	}
	id := registry.IDOf(ep)
	if !s.cached(id.Service) {
		return
	}
	if ev.GetType() == registrarv1.EndpointEvent_ENDPOINT_REMOVED {
		s.setAuth(id, nil)
	} else {
		s.setAuth(id, ep)
	}
	s.reconcile(id, now, false)
	s.recompute(id)
}

// replace makes eps the registrar's complete state of some services: all of
// them (all == true, a FULL_SNAPSHOT of an all-services stream) or those of
// services that are still wanted. Diffing through recompute is what turns a
// snapshot after a reconnect into exactly the changes the client missed.
func (s *state) replace(eps []*registryv1.ServiceEndpoint, services []string, all bool, now time.Time) {
	ids := map[registry.EndpointID]struct{}{}
	var scope map[string]struct{}
	if all {
		for _, m := range s.auth {
			for id := range m {
				ids[id] = struct{}{}
			}
		}
		for _, m := range s.eff {
			for id := range m {
				ids[id] = struct{}{}
			}
		}
		clear(s.auth)
		s.haveAll = true
	} else {
		scope = map[string]struct{}{}
		for _, svc := range services {
			if _, ok := s.wanted[svc]; !ok {
				continue // unsubscribed since the registrar took this snapshot
			}
			scope[svc] = struct{}{}
			for id := range s.auth[svc] {
				ids[id] = struct{}{}
			}
			for id := range s.eff[svc] {
				ids[id] = struct{}{}
			}
			delete(s.auth, svc)
			s.held[svc] = struct{}{}
			s.dirty[svc] = struct{}{} // listed from now on, even if empty
		}
	}
	for _, ep := range eps {
		id := registry.IDOf(ep)
		if _, ok := scope[id.Service]; !all && !ok {
			continue
		}
		s.setAuth(id, ep)
		ids[id] = struct{}{}
	}
	for id, w := range s.writes {
		if _, ok := scope[id.Service]; all || ok {
			ids[id] = struct{}{}
			if w.state == writeAcked {
				s.resend[id] = struct{}{}
			}
		}
	}
	// A snapshot is the registrar's complete word on its services: every
	// registration of the client's own in them is compared with it, present
	// or not.
	for id := range s.owned {
		if _, ok := scope[id.Service]; all || ok {
			ids[id] = struct{}{}
		}
	}
	for _, id := range sortedIDs(ids) {
		s.reconcile(id, now, false)
		s.recompute(id)
	}
}

// unsubscribe drops services from the cache; their endpoints are reported
// removed, so an OnChange consumer keeps mirroring the cache.
func (s *state) unsubscribe(services []string) {
	for _, svc := range services {
		if _, ok := s.wanted[svc]; !ok {
			continue
		}
		delete(s.wanted, svc)
		s.wantedChanged = true
		if _, ok := s.held[svc]; !ok {
			continue
		}
		for _, ep := range sortedValues(s.eff[svc]) {
			s.change(ChangeRemoved, ep, nil)
		}
		delete(s.held, svc)
		delete(s.auth, svc)
		delete(s.eff, svc)
		s.dirty[svc] = struct{}{}
	}
}

// subscribe adds services to the wanted set; they are cached once their
// SERVICES_SNAPSHOT arrives.
func (s *state) subscribe(services []string) {
	for _, svc := range services {
		if _, ok := s.wanted[svc]; !ok {
			s.wanted[svc] = struct{}{}
			s.wantedChanged = true
		}
	}
}

// setVersion records the resume token and position of a message the client
// applied. Snapshots and bookmarks name their epoch; a change event does not,
// as a registrar never changes epoch within a stream: its epoch is the
// stream's, already in s.at from the stream's first snapshot or stored with
// the token the stream resumed from. A registrar that predates the epoch
// field sends none, and its positions then compare with nothing (see
// sameIncarnation).
func (s *state) setVersion(ev *registrarv1.EndpointEvent) {
	if ev.GetVersion() == "" {
		return
	}
	s.version = ev.GetVersion()
	switch ev.GetType() {
	case registrarv1.EndpointEvent_FULL_SNAPSHOT, registrarv1.EndpointEvent_SERVICES_SNAPSHOT, registrarv1.EndpointEvent_PROGRESS:
		s.at.Epoch = ev.GetEpoch()
	}
	s.at.Seq = ev.GetSequence()
}

// forgetVersion drops the resume token: the next stream starts with a
// snapshot.
func (s *state) forgetVersion() { s.version, s.at = "", registry.Position{} }

// sameIncarnation reports whether an acknowledged write and the stream are
// positions in one registrar incarnation's history, so that the stream's
// sequence says whether it has delivered the write. An ack without an epoch
// (an older registrar) compares with nothing.
func (s *state) sameIncarnation(w *write) bool {
	return w.ackAt.Epoch != "" && w.ackAt.Epoch == s.at.Epoch
}

// startRequest builds the first message of a new stream. It resumes from the
// last version only for the services held as of that version; services
// wanted but not held are added by an update right after the start, so they
// arrive as SERVICES_SNAPSHOTs instead of as a partial event history.
// covered is what a FULL_SNAPSHOT on this stream stands for; sent is the
// stream's service set once the add has been sent.
func (s *state) startRequest(cfg *Config) (req *registrarv1.WatchEndpointsRequest, add []string, covered, sent []string) {
	req = &registrarv1.WatchEndpointsRequest{ClusterName: cfg.Cluster, NodeName: cfg.Node}
	if s.all {
		if s.haveAll {
			req.LastVersion = s.version
		}
		return req, nil, nil, nil
	}
	sent = sortedKeys(s.wanted)
	if len(s.held) > 0 && s.version != "" {
		req.LastVersion = s.version
		req.Services = sortedKeys(s.held)
		for _, svc := range sent {
			if _, ok := s.held[svc]; !ok {
				add = append(add, svc)
			}
		}
	} else {
		req.Services = sent
	}
	return req, add, req.Services, sent
}

// overlay applies the agent's writes to a registrar listing of services
// (all when empty), for reads that bypass the cache.
func (s *state) overlay(eps []*registryv1.ServiceEndpoint, services []string) []*registryv1.ServiceEndpoint {
	out := make([]*registryv1.ServiceEndpoint, 0, len(eps))
	seen := make(map[registry.EndpointID]struct{}, len(eps))
	for _, ep := range eps {
		id := registry.IDOf(ep)
		seen[id] = struct{}{}
		if w := s.writes[id]; w != nil {
			ep = w.apply(ep)
		}
		if ep != nil {
			out = append(out, ep)
		}
	}
	for id, w := range s.writes {
		if _, ok := seen[id]; ok || (len(services) > 0 && !slices.Contains(services, id.Service)) {
			continue
		}
		if ep := w.apply(nil); ep != nil {
			out = append(out, ep)
		}
	}
	slices.SortFunc(out, compareEndpoints)
	return out
}

// view is an immutable snapshot of the cache, published through an atomic
// pointer. Nothing in it is modified after publication.
type view struct {
	all    bool
	synced bool // all: the first snapshot is applied
	// services maps each cached service to its endpoints in
	// compareEndpoints order. With !all, presence means cached, even with no
	// endpoints; with all, absent services have none.
	services map[string][]*registryv1.ServiceEndpoint
	wanted   []string // !all: the subscribed services, sorted
}

// nextView derives the view after a mutation from the previous one,
// rebuilding only the dirty services.
func (s *state) nextView(old *view) *view {
	if len(s.dirty) == 0 && !s.wantedChanged && old.synced == s.haveAll {
		return old
	}
	nv := &view{all: s.all, synced: s.haveAll, services: maps.Clone(old.services), wanted: old.wanted}
	for svc := range s.dirty {
		m := s.eff[svc]
		if !s.cached(svc) || (s.all && len(m) == 0) {
			delete(nv.services, svc)
			continue
		}
		nv.services[svc] = sortedValues(m)
	}
	clear(s.dirty)
	if s.wantedChanged {
		nv.wanted = sortedKeys(s.wanted)
		s.wantedChanged = false
	}
	return nv
}

// takeChanges hands over the changes recorded since the last call.
func (s *state) takeChanges() []Change {
	c := s.changes
	s.changes = nil
	return c
}

// compareEndpoints orders endpoints by service and then identity, so reads
// are deterministic (stable hashing rings, readable diffs).
func compareEndpoints(a, b *registryv1.ServiceEndpoint) int {
	if c := strings.Compare(a.GetService(), b.GetService()); c != 0 {
		return c
	}
	if c := strings.Compare(a.GetRegion(), b.GetRegion()); c != 0 {
		return c
	}
	if c := strings.Compare(a.GetCluster(), b.GetCluster()); c != 0 {
		return c
	}
	if c := cmp.Compare(a.GetProtocol(), b.GetProtocol()); c != 0 {
		return c
	}
	return strings.Compare(a.GetIp(), b.GetIp())
}

func compareIDs(a, b registry.EndpointID) int {
	return cmp.Or(strings.Compare(a.Service, b.Service), strings.Compare(a.Region, b.Region),
		strings.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Protocol, b.Protocol), strings.Compare(a.IP, b.IP))
}

func sortedValues(m endpoints) []*registryv1.ServiceEndpoint {
	if len(m) == 0 {
		return nil
	}
	out := make([]*registryv1.ServiceEndpoint, 0, len(m))
	for _, ep := range m {
		out = append(out, ep)
	}
	slices.SortFunc(out, compareEndpoints)
	return out
}

func sortedIDs(m map[registry.EndpointID]struct{}) []registry.EndpointID {
	out := make([]registry.EndpointID, 0, len(m))
	for id := range m {
		out = append(out, id)
	}
	slices.SortFunc(out, compareIDs)
	return out
}

func sortedKeys(m map[string]struct{}) []string {
	return slices.Sorted(maps.Keys(m))
}

// drained returns a DRAINING copy of ep (ep itself if it already is).
func drained(ep *registryv1.ServiceEndpoint) *registryv1.ServiceEndpoint {
	if ep.GetState() == registryv1.State_STATE_DRAINING {
		return ep
	}
	c := proto.Clone(ep).(*registryv1.ServiceEndpoint)
	c.State = registryv1.State_STATE_DRAINING
	return c
}
