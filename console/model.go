package console

import (
	"cmp"
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/xds"
)

// The JSON models of the console. Overview is what /ui/api/overview serves
// and what `aether status` prints; the field names are the contract with
// that command (internal/cli/status.go decodes this type).

// Overview is the whole plane as this replica sees it.
type Overview struct {
	Replica     Replica     `json:"replica"`
	Checks      []Check     `json:"checks"`
	Backend     Backend     `json:"backend"`
	Totals      Totals      `json:"totals"`
	Regions     []Region    `json:"regions"`
	Replication Replication `json:"replication"`
	// Replicas are the other registrars of this cluster, as peer-watch
	// finds them through the backend (empty without --peer-watch).
	Replicas Replicas      `json:"replicas"`
	XDS      XDSSummary    `json:"xds"`
	Events   EventsSummary `json:"events"`
	// Propagation is measured only while a page is open (the console
	// then follows the replica's event stream; see Console).
	Propagation PropagationSummary `json:"propagation"`
}

// Replica is this registrar.
type Replica struct {
	Region   string `json:"region"`
	Cluster  string `json:"cluster"`
	Zone     string `json:"zone,omitempty"`
	GRPCAddr string `json:"grpc_addr,omitempty"`
	HTTPAddr string `json:"http_addr,omitempty"`
	XDSAddr  string `json:"xds_addr,omitempty"`
	// Version is the snapshot's version (epoch.sequence), "" while loading.
	Version      string    `json:"version,omitempty"`
	Ready        bool      `json:"ready"`
	ShuttingDown bool      `json:"shutting_down"`
	Now          time.Time `json:"now"`
}

// Check is one readiness check, as /readyz reports it.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}

// Backend is the store the replica persists to, and how far behind it is.
type Backend struct {
	Kind      string   `json:"kind"`
	Endpoints []string `json:"endpoints,omitempty"`
	// Healthy: the last flush attempt succeeded (or none failed yet).
	Healthy bool `json:"healthy"`
	// Pending counts endpoints with acknowledged, unpersisted writes;
	// OldestUnpersistedSeconds is the age of the oldest (the persistence
	// lag). Stuck: that age is over StuckAfterSeconds, which fails
	// readiness.
	Pending                  int        `json:"pending"`
	OldestUnpersistedSeconds float64    `json:"oldest_unpersisted_seconds"`
	StuckAfterSeconds        float64    `json:"stuck_after_seconds"`
	Stuck                    bool       `json:"stuck"`
	Isolated                 int        `json:"isolated_writes"`
	LastFlushAt              *time.Time `json:"last_flush_at,omitempty"`
	LastFlushError           string     `json:"last_flush_error,omitempty"`
	LastFlushErrorAt         *time.Time `json:"last_flush_error_at,omitempty"`
}

// Totals are counts over every region.
type Totals struct {
	Services  int `json:"services"`
	Endpoints int `json:"endpoints"`
	Serving   int `json:"serving"`
	Draining  int `json:"draining"`
	Nodes     int `json:"nodes"`
}

// Region is one region's clusters.
type Region struct {
	Name     string    `json:"name"`
	Clusters []Cluster `json:"clusters"`
}

// Cluster is one cluster's counts.
type Cluster struct {
	Name      string `json:"name"`
	Endpoints int    `json:"endpoints"`
	Serving   int    `json:"serving"`
	Draining  int    `json:"draining"`
	Nodes     int    `json:"nodes"`
}

// Replicas is this cluster's other registrars (peer-watch's members).
type Replicas struct {
	PeerWatch bool          `json:"peer_watch"`
	Peers     []ReplicaPeer `json:"peers,omitempty"`
}

// ReplicaPeer is one other registrar of the cluster.
type ReplicaPeer struct {
	Addr      string    `json:"addr"`
	Epoch     string    `json:"epoch"`
	Connected bool      `json:"connected"`
	Since     time.Time `json:"since"`
	Writes    uint64    `json:"writes_received"`
}

// Replication is the multi-region replicator's view of its peers.
type Replication struct {
	Enabled bool   `json:"enabled"`
	Peers   []Peer `json:"peers,omitempty"`
}

// Peer is one peer region.
type Peer struct {
	Region                   string  `json:"region"`
	Reachable                bool    `json:"reachable"`
	Synced                   bool    `json:"synced"`
	IsLeader                 bool    `json:"is_leader"`
	Leader                   string  `json:"leader,omitempty"`
	LagSeconds               float64 `json:"lag_seconds"`
	LeaseTTLRemainingSeconds float64 `json:"lease_ttl_remaining_seconds"`
	KeysMirrored             int64   `json:"keys_mirrored"`
	LastError                string  `json:"last_error,omitempty"`
}

// XDSSummary counts the xDS streams by their worst type state.
type XDSSummary struct {
	Enabled bool `json:"enabled"`
	Clients int  `json:"clients"`
	Synced  int  `json:"synced"`
	Stale   int  `json:"stale"`
	NACKed  int  `json:"nacked"`
}

// EventsSummary is the replica's event stream as the console consumes it.
type EventsSummary struct {
	// Version is the replica's version at the console's last sample
	// (every second): equal to Replica.Version once every event so far
	// is counted.
	Version string `json:"version"`
	Total   uint64 `json:"total"`
	// PerSecond are the events of each of the last RateWindow seconds,
	// oldest first, the current (incomplete) second last.
	PerSecond []int `json:"per_second"`
}

// PropagationSummary is the cross-replica propagation latency: from a
// write's acknowledgement by another replica to its event here.
type PropagationSummary struct {
	// Samples counts the writes measured so far.
	Samples uint64 `json:"samples"`
	// MaxMillis is the largest latency of each of the last RateWindow
	// seconds in milliseconds (0: none measured), oldest first.
	MaxMillis []float64 `json:"max_millis"`
}

// ServiceSummary is one row of the services list.
type ServiceSummary struct {
	Name        string     `json:"name"`
	Endpoints   int        `json:"endpoints"`
	Serving     int        `json:"serving"`
	Draining    int        `json:"draining"`
	Localities  []Locality `json:"localities"`
	NodesBehind int        `json:"nodes"`
}

// Locality is one region/zone of a service.
type Locality struct {
	Region   string `json:"region"`
	Zone     string `json:"zone"`
	Serving  int    `json:"serving"`
	Draining int    `json:"draining"`
}

// Endpoint is one endpoint of a service.
type Endpoint struct {
	Service    string   `json:"service"`
	Protocol   string   `json:"protocol"`
	IP         string   `json:"ip"`
	Ports      []string `json:"ports"`
	State      string   `json:"state"`
	Node       string   `json:"node"`
	Region     string   `json:"region"`
	Cluster    string   `json:"cluster"`
	Zone       string   `json:"zone"`
	Weight     uint32   `json:"weight"`
	AgeSeconds float64  `json:"age_seconds"`
}

// Node is one node record with its lease state.
type Node struct {
	Name                 string   `json:"name"`
	Region               string   `json:"region"`
	Cluster              string   `json:"cluster"`
	Site                 string   `json:"site"`
	Address              string   `json:"address"`
	Services             []string `json:"services"`
	EndpointsHeld        uint32   `json:"endpoints_held"`
	EndpointsHeldServing uint32   `json:"endpoints_held_serving"`
	Healthy              bool     `json:"healthy"`
	Health               string   `json:"health"`
	// -1: the backend could not be asked.
	HeartbeatAgeSeconds   float64 `json:"heartbeat_age_seconds"`
	LeaseRemainingSeconds float64 `json:"lease_remaining_seconds"`
}

// State names, as the page and the CLI show them.
func stateName(s registryv1.State) string {
	switch s {
	case registryv1.State_STATE_SERVING:
		return "SERVING"
	case registryv1.State_STATE_DRAINING:
		return "DRAINING"
	}
	return "UNSPECIFIED"
}

func (c *Console) overview() Overview {
	r := c.cfg.Registrar
	id := r.Identity()
	now := r.Now()
	ov := Overview{
		Replica: Replica{Region: id.Region, Cluster: id.Cluster, Zone: id.Zone,
			GRPCAddr: c.cfg.GRPCAddr, HTTPAddr: c.cfg.HTTPAddr, XDSAddr: c.cfg.XDSAddr,
			ShuttingDown: r.ShuttingDown(), Now: now},
		Regions: []Region{},
		Checks:  []Check{},
	}
	ov.Replica.Ready = true
	if c.cfg.Checks != nil {
		ov.Checks = c.cfg.Checks()
	}
	for _, ch := range ov.Checks {
		ov.Replica.Ready = ov.Replica.Ready && ch.OK
	}
	ov.Replica.Ready = ov.Replica.Ready && r.Ready()

	if c.cfg.Backend != nil {
		ov.Backend.Kind, ov.Backend.Endpoints = c.cfg.Backend()
	}
	ps := r.PersistenceStatus()
	b := &ov.Backend
	b.Pending, b.OldestUnpersistedSeconds, b.Isolated = ps.Pending, ps.Oldest.Seconds(), len(ps.Isolated)
	b.StuckAfterSeconds = c.cfg.StuckAfter.Seconds()
	b.Stuck = ps.Pending > 0 && ps.Oldest > c.cfg.StuckAfter
	b.Healthy = ps.LastFlushError == "" || ps.LastFlushErrorAt.Before(ps.LastFlushAt)
	if !ps.LastFlushAt.IsZero() {
		t := ps.LastFlushAt
		b.LastFlushAt = &t
	}
	if ps.LastFlushError != "" {
		t := ps.LastFlushErrorAt
		b.LastFlushError, b.LastFlushErrorAt = ps.LastFlushError, &t
	}

	if r.Ready() {
		eps, version, err := r.List(nil)
		if err == nil {
			ov.Replica.Version = version
		}
		ov.Regions, ov.Totals = countRegions(eps, r.Nodes())
	}

	if c.cfg.Replication != nil {
		peers, on := c.cfg.Replication()
		ov.Replication = replication(peers, on)
	}
	ov.Replicas.PeerWatch = r.Options().PeerWatch
	for _, p := range r.Peers() {
		ov.Replicas.Peers = append(ov.Replicas.Peers, ReplicaPeer{Addr: p.Addr, Epoch: p.Epoch, Connected: p.Connected, Since: p.Since, Writes: p.Writes})
	}
	if c.cfg.XDS != nil {
		ov.XDS = xdsSummary(c.cfg.XDS())
	}
	ov.Events = c.rate.summary(now)
	ov.Propagation = c.lat.summary(now)
	return ov
}

func countRegions(eps []*registryv1.ServiceEndpoint, nodes []*registryv1.Node) ([]Region, Totals) {
	type key struct{ region, cluster string }
	counts := map[key]*Cluster{}
	at := func(region, cluster string) *Cluster {
		k := key{region, cluster}
		if counts[k] == nil {
			counts[k] = &Cluster{Name: cluster}
		}
		return counts[k]
	}
	var t Totals
	services := map[string]bool{}
	for _, ep := range eps {
		c := at(ep.GetRegion(), ep.GetCluster())
		c.Endpoints++
		t.Endpoints++
		services[ep.GetService()] = true
		switch ep.GetState() {
		case registryv1.State_STATE_SERVING:
			c.Serving++
			t.Serving++
		case registryv1.State_STATE_DRAINING:
			c.Draining++
			t.Draining++
		}
	}
	for _, n := range nodes {
		at(n.GetRegion(), n.GetCluster()).Nodes++
		t.Nodes++
	}
	t.Services = len(services)
	byRegion := map[string]*Region{}
	for k, c := range counts {
		if byRegion[k.region] == nil {
			byRegion[k.region] = &Region{Name: k.region}
		}
		byRegion[k.region].Clusters = append(byRegion[k.region].Clusters, *c)
	}
	out := make([]Region, 0, len(byRegion))
	for _, reg := range byRegion {
		slices.SortFunc(reg.Clusters, func(a, b Cluster) int { return cmp.Compare(a.Name, b.Name) })
		out = append(out, *reg)
	}
	slices.SortFunc(out, func(a, b Region) int { return cmp.Compare(a.Name, b.Name) })
	return out, t
}

func replication(peers []*registrarv1.PeerReplicationStatus, on bool) Replication {
	out := Replication{Enabled: on}
	for _, p := range peers {
		out.Peers = append(out.Peers, Peer{Region: p.GetRegion(), Reachable: p.GetReachable(), Synced: p.GetSynced(),
			IsLeader: p.GetIsLeader(), Leader: p.GetLeader(), LagSeconds: p.GetLagSeconds(),
			LeaseTTLRemainingSeconds: p.GetLeaseTtlRemainingSeconds(), KeysMirrored: p.GetKeysMirrored(), LastError: p.GetLastError()})
	}
	return out
}

// xdsSummary counts each stream once, by its worst type: NACKED over
// STALE over SYNCED (a stream that was sent nothing yet counts as stale).
func xdsSummary(clients []xds.ClientStatus) XDSSummary {
	s := XDSSummary{Enabled: true, Clients: len(clients)}
	for _, c := range clients {
		worst := xds.Synced
		for _, ts := range c.Types {
			switch {
			case ts.State == xds.NACKed:
				worst = xds.NACKed
			case worst != xds.NACKed && ts.State != xds.Synced:
				worst = xds.Stale
			}
		}
		switch worst {
		case xds.NACKed:
			s.NACKed++
		case xds.Stale:
			s.Stale++
		default:
			s.Synced++
		}
	}
	return s
}

// services summarizes the services whose name contains q (all for "").
func services(eps []*registryv1.ServiceEndpoint, q string) []ServiceSummary {
	q = strings.ToLower(q)
	type lkey struct{ region, zone string }
	type acc struct {
		s     ServiceSummary
		loc   map[lkey]*Locality
		nodes map[string]bool
	}
	by := map[string]*acc{}
	for _, ep := range eps {
		name := ep.GetService()
		if q != "" && !strings.Contains(strings.ToLower(name), q) {
			continue
		}
		a := by[name]
		if a == nil {
			a = &acc{s: ServiceSummary{Name: name}, loc: map[lkey]*Locality{}, nodes: map[string]bool{}}
			by[name] = a
		}
		k := lkey{ep.GetRegion(), ep.GetZone()}
		l := a.loc[k]
		if l == nil {
			l = &Locality{Region: k.region, Zone: k.zone}
			a.loc[k] = l
		}
		a.s.Endpoints++
		a.nodes[ep.GetNode()] = true
		switch ep.GetState() {
		case registryv1.State_STATE_SERVING:
			a.s.Serving++
			l.Serving++
		case registryv1.State_STATE_DRAINING:
			a.s.Draining++
			l.Draining++
		}
	}
	out := make([]ServiceSummary, 0, len(by))
	for _, a := range by {
		for _, l := range a.loc {
			a.s.Localities = append(a.s.Localities, *l)
		}
		slices.SortFunc(a.s.Localities, func(x, y Locality) int {
			return cmp.Or(cmp.Compare(x.Region, y.Region), cmp.Compare(x.Zone, y.Zone))
		})
		a.s.NodesBehind = len(a.nodes)
		out = append(out, a.s)
	}
	slices.SortFunc(out, func(a, b ServiceSummary) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

func endpoints(eps []*registryv1.ServiceEndpoint, now time.Time) []Endpoint {
	out := make([]Endpoint, 0, len(eps))
	for _, ep := range eps {
		e := Endpoint{Service: ep.GetService(), Protocol: strings.TrimPrefix(ep.GetProtocol().String(), "PROTOCOL_"),
			IP: ep.GetIp(), State: stateName(ep.GetState()), Node: ep.GetNode(), Region: ep.GetRegion(),
			Cluster: ep.GetCluster(), Zone: ep.GetZone(), Weight: max(ep.GetWeight(), 1), Ports: []string{}}
		for _, p := range ep.GetPorts() {
			if p.GetName() != "" {
				e.Ports = append(e.Ports, p.GetName()+":"+itoa(p.GetPort()))
			} else {
				e.Ports = append(e.Ports, itoa(p.GetPort()))
			}
		}
		if ts := ep.GetCreatedAt(); ts != nil {
			e.AgeSeconds = max(now.Sub(ts.AsTime()).Seconds(), 0)
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Endpoint) int {
		return cmp.Or(cmp.Compare(a.Region, b.Region), cmp.Compare(a.Zone, b.Zone), cmp.Compare(a.IP, b.IP), cmp.Compare(a.Protocol, b.Protocol))
	})
	return out
}

func (c *Console) nodes(ctx context.Context) []Node {
	// ListNodes asks the backend for each node's lease; bounded, so the
	// page answers (with -1 ages) while the backend does not.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list := c.cfg.Registrar.ListNodes(ctx)
	out := make([]Node, 0, len(list))
	for _, st := range list {
		n := st.GetNode()
		h := n.GetHealth()
		out = append(out, Node{Name: n.GetName(), Region: n.GetRegion(), Cluster: n.GetCluster(), Site: n.GetZone(),
			Address: n.GetAddress(), Services: append([]string{}, n.GetServices()...),
			EndpointsHeld: h.GetEndpointsHeld(), EndpointsHeldServing: h.GetEndpointsHeldServing(),
			Healthy: nodeHealthy(h), Health: healthText(h),
			HeartbeatAgeSeconds: st.GetLastHeartbeatAgeSeconds(), LeaseRemainingSeconds: st.GetLeaseRemainingSeconds()})
	}
	slices.SortFunc(out, func(a, b Node) int {
		return cmp.Or(cmp.Compare(a.Region, b.Region), cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Name, b.Name))
	})
	return out
}

func nodeHealthy(h *registryv1.HealthSummary) bool {
	return h.GetStatus() == registryv1.Health_HEALTH_HEALTHY
}

// healthText is the node's own summary: its status and message.
func healthText(h *registryv1.HealthSummary) string {
	s := strings.TrimPrefix(h.GetStatus().String(), "HEALTH_")
	if m := h.GetMessage(); m != "" {
		s += ": " + m
	}
	return s
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }
