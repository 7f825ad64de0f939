package core

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"google.golang.org/protobuf/types/known/timestamppb"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// The core's rules as scenario scripts (testdata/*.txt), in the style of
// raft's: each directive drives the State as the registrar's shell would
// (a client's write, a flush's outcome, a watch batch, a listing, a
// backstop, a subscription) or asks a planner for its decision, and the
// output below it is what the core answered. Run with -rewrite to
// regenerate the outputs after a deliberate change, then read the diff:
// the goldens are the specification.
//
// Endpoints are written "service/ip" in region r, cluster c, followed by
// attributes: node=N, state=draining|serving, weight=N, region=R, cluster=C,
// mod=REV (the revision a backend holds it at), as=NAME (a name for the
// write, for persisted). Times are offsets from the
// script's start (t=0s), moved on by tick.

func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := newHarness()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return h.run(t, d)
		})
	})
}

var scriptT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// harness is one script's world: the State, the time, and what the
// flusher would know (its last flush, the batch it has in flight).
type harness struct {
	s         *State
	cfg       Config
	now       time.Time
	interval  time.Duration // --write-batch-interval
	lastFlush time.Time
	inflight  []backend.Mutation
	// writes are the acknowledged writes a script named (as=NAME): their
	// keys and stamps, for persisted.
	writes map[string]namedWrite
}

type namedWrite struct {
	id    registry.EndpointID
	stamp *registryv1.WriteStamp
}

func newHarness() *harness {
	h := &harness{now: scriptT0, interval: 50 * time.Millisecond, writes: map[string]namedWrite{}}
	h.cfg = Config{Epoch: "e1", HistorySize: 100, QueueLimit: 100, FlushAtBatch: 100}
	h.s = New(h.cfg)
	return h
}

func (h *harness) run(t *testing.T, d *datadriven.TestData) string {
	var out strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }
	switch d.Cmd {
	case "init":
		h.cfg = Config{Epoch: "e1", HistorySize: intArg(t, d, "history", 100), QueueLimit: intArg(t, d, "queue", 100),
			MaxPerNode: intArg(t, d, "max-per-node", 0), FlushAtBatch: intArg(t, d, "batch", 100),
			PeerGrace: durArg(t, d, "peer-grace", 0)}
		if d.HasArg("epoch") {
			d.ScanArgs(t, "epoch", &h.cfg.Epoch)
		}
		h.interval = durArg(t, d, "interval", 50*time.Millisecond)
		h.s, h.now, h.lastFlush, h.inflight = New(h.cfg), scriptT0, time.Time{}, nil
		p("ok")
	case "tick":
		h.now = h.now.Add(durArg(t, d, "by", 0))
		p("t=%v", h.now.Sub(scriptT0))
	case "register":
		for _, line := range lines(d.Input) {
			ep := parseEP(t, d, line)
			stored, eff, err := h.s.Register(ep, h.now)
			h.result(p, "register "+epName(registry.IDOf(ep)), eff, err)
			if name := asOf(line); name != "" && err == nil {
				h.writes[name] = namedWrite{registry.IDOf(ep), stored.GetStamp()}
			}
		}
	case "drain", "unregister":
		for _, line := range lines(d.Input) {
			id := registry.IDOf(parseEP(t, d, line))
			var eff Effects
			var err error
			var stamp *registryv1.WriteStamp
			if d.Cmd == "drain" {
				var stored *registryv1.ServiceEndpoint
				stored, eff, err = h.s.Drain(id, h.now)
				stamp = stored.GetStamp()
			} else {
				stamp, eff, err = h.s.Unregister(id, h.now)
			}
			h.result(p, d.Cmd+" "+epName(id), eff, err)
			if name := asOf(line); name != "" && err == nil {
				h.writes[name] = namedWrite{id, stamp}
			}
		}
	case "take":
		// The flusher starts a flush: the batch goes in flight.
		if h.inflight != nil {
			d.Fatalf(t, "a batch is in flight already")
		}
		h.lastFlush = h.now
		h.inflight = append([]backend.Mutation{}, h.s.TakeBatch(intArg(t, d, "max", 1024), h.now)...)
		p("batch: %s", mutations(h.inflight))
	case "settle":
		// The flush's outcome: ok (landed at rev), failed (no outcomes:
		// the backend did not answer) or refused (permanently); input
		// lines "service/ip OUTCOME [rev=N] [attrs]" set one key's outcome
		// (ok, refused, unsettled, superseded by the value given).
		h.settle(t, d, p)
	case "flush":
		// take and settle in one.
		h.lastFlush = h.now
		h.inflight = append([]backend.Mutation{}, h.s.TakeBatch(intArg(t, d, "max", 1024), h.now)...)
		p("batch: %s", mutations(h.inflight))
		h.settle(t, d, p)
	case "watch":
		rev := int64(intArg(t, d, "rev", 0))
		b := backend.WatchBatch{Revision: rev}
		for _, line := range lines(d.Input) {
			op, rest, _ := strings.Cut(line, " ")
			switch op {
			case "put", "delete":
				ep := parseEP(t, d, rest)
				at := modOf(t, d, rest, rev)
				e := backend.Event{ID: registry.IDOf(ep), Revision: at}
				if op == "put" {
					e.Endpoint = ep
				}
				b.Events = append(b.Events, e)
			case "node-put", "node-delete":
				id := registry.NodeID{Region: "r", Cluster: "c", Name: strings.Fields(rest)[0]}
				e := backend.NodeEvent{ID: id, Revision: modOf(t, d, rest, rev)}
				if op == "node-put" {
					e.Node = &registryv1.Node{Name: id.Name, Region: id.Region, Cluster: id.Cluster}
				}
				b.Nodes = append(b.Nodes, e)
			default:
				d.Fatalf(t, "watch: unknown change %q", op)
			}
		}
		h.effects(p, h.s.ApplyWatch(b))
	case "listing":
		// A full listing of the backend at rev: read with the watch
		// stopped (start-up, a lost watch, poll mode), or in the
		// background after track; started=DUR is when its read began
		// (peer-watch's grace counts from it).
		if !d.HasArg("started") {
			h.effects(p, h.s.ApplyListing(h.listing(t, d)))
			break
		}
		a := NewListingApply(h.listing(t, d))
		a.Started = scriptT0.Add(durArg(t, d, "started", 0))
		if !h.s.BeginListing(a) {
			p("  ignored")
			break
		}
		eff, _ := h.s.StepListing(a, math.MaxInt)
		h.effects(p, eff)
	case "peer":
		// Writes a peer replica streamed: "put service/ip stamp=HLC:WRITER
		// [attrs]" or "delete service/ip stamp=HLC:WRITER".
		var ws []PeerWrite
		for _, line := range lines(d.Input) {
			op, rest, _ := strings.Cut(line, " ")
			ep := parseEP(t, d, rest)
			switch op {
			case "put":
				ws = append(ws, PeerWrite{Endpoint: ep, Stamp: ep.Stamp})
			case "delete":
				ws = append(ws, PeerWrite{Endpoint: ep, Deleted: true, Stamp: ep.Stamp})
			default:
				d.Fatalf(t, "peer: unknown write %q", op)
			}
		}
		eff := h.s.ApplyPeer(ws, h.now)
		h.effects(p, eff)
		p("  applied %d, provisional %d", eff.PeerApplied, h.s.Provisional())
	case "track":
		// A background listing is about to be read: note the watch's
		// changes from now on (untrack: the listing failed).
		h.s.TrackForListing()
		p("tracking")
	case "untrack":
		h.s.Untrack()
		p("not tracking")
	case "backstop":
		// The backstop against a backend holding the input at rev: a
		// keys-only listing, compared with the snapshot; then the values
		// it lacks fetched (or everything listed), and the result applied.
		h.backstop(t, d, p)
	case "announce":
		for _, name := range lines(d.Input) {
			n := &registryv1.Node{Name: name, Region: "r", Cluster: "c"}
			n.Stamp = h.s.NodeStamp(h.s.Node(registry.NodeIDOf(n)), h.now)
			h.s.NodePut(n, int64(intArg(t, d, "rev", 0)))
			p("node %s recorded", name)
		}
	case "leave":
		for _, name := range lines(d.Input) {
			h.effects(p, h.s.NodeGone(registry.NodeID{Region: "r", Cluster: "c", Name: name}, int64(intArg(t, d, "rev", 0))))
		}
	case "sweep":
		h.sweep(t, d, p)
	case "subscribe":
		h.subscribe(t, d, p)
	case "persisted":
		// What a wait for the persistence of a named write hears now.
		for _, name := range lines(d.Input) {
			w, ok := h.writes[name]
			if !ok {
				d.Fatalf(t, "no write named %q", name)
			}
			switch reason, refused := h.s.Refused(w.id, w.stamp); {
			case refused:
				p("%s: refused (%s)", name, reason)
			case h.s.Unsettled(w.id, w.stamp):
				p("%s: not yet persisted", name)
			default:
				p("%s: persisted", name)
			}
		}
	case "plan-flush":
		plan := PlanFlush(FlushInput{Now: h.now, LastFlush: h.lastFlush, Pending: h.s.Pending(), RetryAt: h.s.NextRetry(),
			Interval: h.interval, BatchSize: h.cfg.FlushAtBatch})
		switch {
		case plan.Flush:
			p("flush now (%d pending, %d unpersisted)", h.s.Pending(), h.s.Depth())
		case plan.Timer:
			p("wait %v, or a kick", plan.Wait)
		default:
			p("sleep until kicked")
		}
	case "plan-backstop":
		needs, total := intArg(t, d, "needs", 0), intArg(t, d, "total", 0)
		if BackstopListsAll(needs, total) {
			p("list everything")
		} else {
			p("fetch the %d changed values", needs)
		}
	case "plan-pause":
		var mode string
		d.ScanArgs(t, "mode", &mode)
		p("pause %v", BackstopPause(mode == "poll", durArg(t, d, "interval", 0), intArg(t, d, "steps", 0)))
	case "plan-relist":
		last := scriptT0.Add(durArg(t, d, "last", 0))
		if d.HasArg("never") {
			last = time.Time{}
		}
		p("wait %v", RelistWait(h.now, last, durArg(t, d, "debounce", 0)))
	case "plan-sweep":
		p("sweep every %v", SweepEvery(durArg(t, d, "ttl", 0)))
	case "print":
		h.print(p)
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	return out.String()
}

// result prints a client write's outcome.
func (h *harness) result(p func(string, ...any), what string, eff Effects, err error) {
	if err != nil {
		p("%s: error: %v", what, err)
		return
	}
	p("%s: ok at %s", what, h.s.Version())
	h.effects(p, eff)
}

// effects prints what the shell is asked to do: the events (by key: their
// order within one operation follows map iteration where it walks one),
// then the wake-ups.
func (h *harness) effects(p func(string, ...any), eff Effects) {
	evs := append([]*registrarv1.EndpointEvent(nil), eff.Events...)
	sort.SliceStable(evs, func(i, j int) bool {
		return epKey(registry.IDOf(evs[i].Endpoint)) < epKey(registry.IDOf(evs[j].Endpoint))
	})
	for _, ev := range evs {
		p("  event %s %s", strings.TrimPrefix(ev.Type.String(), "ENDPOINT_"), describeEP(ev.Endpoint))
	}
	if eff.Flush {
		p("  wake the flusher")
	}
	if eff.Sweep {
		p("  wake the sweep")
	}
	if eff.Echoes > 0 {
		p("  echoes %d", eff.Echoes)
	}
	if len(evs) == 0 && !eff.Flush && !eff.Sweep {
		p("  no change")
	}
}

func (h *harness) settle(t *testing.T, d *datadriven.TestData, p func(string, ...any)) {
	if h.inflight == nil {
		d.Fatalf(t, "no batch in flight")
	}
	b := h.inflight
	h.inflight = nil
	var how string
	if len(d.CmdArgs) > 0 {
		how = d.CmdArgs[0].Key
	}
	if how == "failed" {
		h.s.BatchFailed(b)
		// The flusher retries as soon as its backoff is over.
		h.lastFlush = time.Time{}
		p("returned to the queue")
		return
	}
	rev := int64(intArg(t, d, "rev", 0))
	outs := make([]backend.Outcome, len(b))
	for i, m := range b {
		switch how {
		case "ok":
			outs[i] = backend.Outcome{Landed: true, Revision: rev}
			if m.Endpoint != nil {
				outs[i].KeyRev = rev
			} else {
				outs[i].TombRev = rev
			}
		case "refused":
			outs[i] = backend.Outcome{Err: fmt.Errorf("refused by the script")}
		default:
			// Each key's outcome is named in the input.
		}
	}
	for _, line := range lines(d.Input) {
		f := strings.Fields(line)
		if len(f) < 2 {
			d.Fatalf(t, "settle: want \"service/ip outcome\", got %q", line)
		}
		i := indexOf(b, f[0])
		if i < 0 {
			d.Fatalf(t, "settle: %s is not in the batch", f[0])
		}
		at := modOf(t, d, line, rev)
		switch f[1] {
		case "ok":
			outs[i] = backend.Outcome{Landed: true, Revision: at, KeyRev: at}
		case "refused":
			outs[i] = backend.Outcome{Err: fmt.Errorf("refused by the script")}
		case "unsettled":
			outs[i] = backend.Outcome{}
		case "superseded":
			cur := parseEP(t, d, f[0]+" "+strings.Join(f[2:], " "))
			outs[i] = backend.Outcome{Superseded: true, Current: cur, KeyRev: at}
		default:
			d.Fatalf(t, "settle: unknown outcome %q", f[1])
		}
	}
	h.effects(p, h.s.BatchSettled(b, outs, h.now))
}

func indexOf(b []backend.Mutation, name string) int {
	for i, m := range b {
		if epName(m.ID) == name {
			return i
		}
	}
	return -1
}

// listing is the input as a backend listing at rev.
func (h *harness) listing(t *testing.T, d *datadriven.TestData) backend.Listing {
	l := backend.Listing{Revision: int64(intArg(t, d, "rev", 0))}
	for _, line := range lines(d.Input) {
		if name, ok := strings.CutPrefix(line, "node "); ok {
			f := strings.Fields(name)
			n := &registryv1.Node{Name: f[0], Region: "r", Cluster: "c"}
			for _, kv := range f[1:] {
				if z, ok := strings.CutPrefix(kv, "zone="); ok {
					n.Zone = z
				}
			}
			l.Nodes = append(l.Nodes, n)
			l.NodeRevs = append(l.NodeRevs, modOf(t, d, name, 0))
			continue
		}
		l.Endpoints = append(l.Endpoints, parseEP(t, d, line))
		l.EndpointRevs = append(l.EndpointRevs, modOf(t, d, line, 0))
	}
	return l
}

func (h *harness) backstop(t *testing.T, d *datadriven.TestData, p func(string, ...any)) {
	held := h.listing(t, d)
	kr := backend.KeyRevisions{Revision: held.Revision}
	for i, ep := range held.Endpoints {
		kr.Endpoints = append(kr.Endpoints, backend.EndpointRevision{ID: registry.IDOf(ep), ModRevision: held.EndpointRevs[i]})
	}
	for i, n := range held.Nodes {
		kr.Nodes = append(kr.Nodes, backend.NodeRevision{ID: registry.NodeIDOf(n), ModRevision: held.NodeRevs[i]})
	}
	h.s.TrackForListing()
	plan := NewDigestPlan(kr)
	steps := 1
	for !h.s.CompareDigest(plan, intArg(t, d, "step", math.MaxInt)) {
		steps++
	}
	var have []string
	for i, ep := range plan.have.Endpoints {
		if h.s.Get(registry.IDOf(ep)) != ep {
			d.Fatalf(t, "have %s is not the snapshot's value", epName(registry.IDOf(ep)))
		}
		have = append(have, fmt.Sprintf("%s@%d", epName(registry.IDOf(ep)), plan.have.EndpointRevs[i]))
	}
	for i, n := range plan.have.Nodes {
		have = append(have, fmt.Sprintf("node %s@%d", n.Name, plan.have.NodeRevs[i]))
	}
	sort.Strings(have)
	var need []string
	for _, id := range plan.NeedEndpoints {
		need = append(need, epName(id))
	}
	for _, id := range plan.NeedNodes {
		need = append(need, "node "+id.Name)
	}
	sort.Strings(need)
	unit := "steps"
	if steps == 1 {
		unit = "step"
	}
	p("compare: %d keys in %d %s", len(kr.Endpoints)+len(kr.Nodes), steps, unit)
	p("  have %d: %s", len(have), listOrNone(have))
	p("  need %d: %s", plan.Needs(), listOrNone(need))
	var l backend.Listing
	var scope Scope
	if BackstopListsAll(plan.Needs(), len(kr.Endpoints)+len(kr.Nodes)) {
		p("read: a full listing")
		l = held
	} else {
		p("read: the %d changed values; reconcile %s", plan.Needs(), listOrNone(sortedScope(plan.Dirty)))
		l, scope = plan.Merge(fetch(held, plan)), plan.Dirty
	}
	a := NewListingApply(l)
	a.Scope = scope
	if !h.s.BeginListing(a) {
		h.s.Untrack()
		p("ignored: older than the snapshot")
		return
	}
	eff, _ := h.s.StepListing(a, math.MaxInt)
	h.effects(p, eff)
}

// fetch is what GetAt returns: the plan's needed values as held.
func fetch(held backend.Listing, plan *DigestPlan) backend.Listing {
	var f backend.Listing
	want := map[registry.EndpointID]bool{}
	for _, id := range plan.NeedEndpoints {
		want[id] = true
	}
	for i, ep := range held.Endpoints {
		if want[registry.IDOf(ep)] {
			f.Endpoints = append(f.Endpoints, ep)
			f.EndpointRevs = append(f.EndpointRevs, held.EndpointRevs[i])
		}
	}
	wantN := map[registry.NodeID]bool{}
	for _, id := range plan.NeedNodes {
		wantN[id] = true
	}
	for i, n := range held.Nodes {
		if wantN[registry.NodeIDOf(n)] {
			f.Nodes = append(f.Nodes, n)
			f.NodeRevs = append(f.NodeRevs, held.NodeRevs[i])
		}
	}
	return f
}

// sweep runs one ghost sweep as the shell does: chunks of about budget
// endpoints, one SweepStep each.
func (h *harness) sweep(t *testing.T, d *datadriven.TestData, p func(string, ...any)) {
	services := h.s.Services()
	sort.Strings(services)
	budget := intArg(t, d, "budget", 2048)
	grace := durArg(t, d, "grace", 30*time.Second)
	for len(services) > 0 {
		n := SweepChunk(services, h.s.ServiceSize, budget)
		p("chunk %s:", strings.Join(services[:n], ","))
		eff, swept, deferred, err := h.s.SweepStep(services[:n], "r", "c", h.now, grace)
		services = services[n:]
		h.effects(p, eff)
		p("  swept %d", len(swept))
		if err != nil {
			p("  deferred at %s: %v", epName(deferred), err)
			return
		}
	}
}

func (h *harness) subscribe(t *testing.T, d *datadriven.TestData, p func(string, ...any)) {
	var from string
	d.ScanArgs(t, "from", &from)
	var f Filter
	if d.HasArg("services") {
		var arg datadriven.CmdArg
		for _, a := range d.CmdArgs {
			if a.Key == "services" {
				arg = a
			}
		}
		var err error
		if f, err = NewFilter(arg.Vals); err != nil {
			d.Fatalf(t, "%v", err)
		}
	}
	epoch, seqS, _ := strings.Cut(from, ":")
	seq, _ := strconv.ParseUint(seqS, 10, 64)
	p("at %s", h.s.Version())
	if epoch == h.s.Epoch() {
		if evs, ok := h.s.Since(seq, f); ok {
			p("resumed: %d missed", len(evs))
			for _, ev := range evs {
				p("  %d %s %s", ev.Sequence, strings.TrimPrefix(ev.Type.String(), "ENDPOINT_"), describeEP(ev.Endpoint))
			}
			return
		}
		p("not resumable here (outside the window)")
	} else {
		p("not resumable here (another incarnation)")
	}
	eps, _ := h.s.Snapshot(f)
	sort.Slice(eps, func(i, j int) bool { return epKey(registry.IDOf(eps[i])) < epKey(registry.IDOf(eps[j])) })
	p("snapshot: %d endpoints", len(eps))
	for _, ep := range eps {
		p("  %s", describeEP(ep))
	}
}

// print shows the snapshot with each endpoint's queue state and known
// backend revision, then the node records and the counters.
func (h *harness) print(p func(string, ...any)) {
	s := h.s
	var ids []registry.EndpointID
	for _, m := range s.endpoints {
		for id := range m {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return epKey(ids[i]) < epKey(ids[j]) })
	p("version %s, backend at %d", s.Version(), s.backendRv)
	for _, id := range ids {
		line := describeEP(s.Get(id))
		if q := h.queueState(id); q != "" {
			line += " [" + q + "]"
		}
		if r, ok := s.epRev[id]; ok {
			line += fmt.Sprintf(" rev=%d", r)
		}
		if r, ok := s.flushed[id]; ok {
			line += fmt.Sprintf(" guarded-until=%d", r)
		}
		ep := s.Get(id)
		if ep.GetUpdatedAt() != nil { // written through this registrar
			line += fmt.Sprintf(" created=%v updated=%v", ep.GetCreatedAt().AsTime().Sub(scriptT0), ep.GetUpdatedAt().AsTime().Sub(scriptT0))
		}
		p("  %s", line)
	}
	// Writes of keys the snapshot no longer holds: removals.
	var gone []string
	for _, m := range []map[registry.EndpointID]queued{s.queue.pending, s.queue.inflight} {
		for id := range m {
			if s.Get(id) == nil {
				gone = append(gone, epName(id)+" removal ["+h.queueState(id)+"]")
			}
		}
	}
	for id, r := range s.flushed {
		if s.Get(id) == nil {
			gone = append(gone, fmt.Sprintf("%s removal guarded-until=%d", epName(id), r))
		}
	}
	for id := range s.queue.isolated {
		if s.Get(id) == nil {
			gone = append(gone, epName(id)+" removal ["+h.queueState(id)+"]")
		}
	}
	sort.Strings(gone)
	gone = dedup(gone)
	for _, g := range gone {
		p("  %s", g)
	}
	var nodes []string
	for id, n := range s.nodes {
		desc := id.Name
		if n.Zone != "" {
			desc += " zone=" + n.Zone
		}
		if r, ok := s.nodeRev[id]; ok {
			desc += fmt.Sprintf(" rev=%d", r)
		}
		nodes = append(nodes, desc)
	}
	sort.Strings(nodes)
	if len(nodes) > 0 {
		p("nodes: %s", strings.Join(nodes, ", "))
	}
	p("queue: %d unpersisted, %d pending", s.Depth(), s.Pending())
	if s.track != nil {
		p("tracking watch changes for a listing")
	}
}

func (h *harness) queueState(id registry.EndpointID) string {
	var st []string
	if _, ok := h.s.queue.pending[id]; ok {
		st = append(st, "pending")
	}
	if _, ok := h.s.queue.inflight[id]; ok {
		st = append(st, "in flight")
	}
	if _, ok := h.s.queue.isolated[id]; ok {
		st = append(st, "isolated")
	}
	return strings.Join(st, ", ")
}

func dedup(s []string) []string {
	out := s[:0]
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func describeEP(ep *registryv1.ServiceEndpoint) string {
	id := registry.IDOf(ep)
	s := epName(id)
	if id.Region != "r" {
		s += "@" + id.Region + "/" + id.Cluster
	} else if id.Cluster != "c" {
		s += "@" + id.Cluster
	}
	s += " " + strings.TrimPrefix(ep.GetState().String(), "STATE_")
	if ep.GetWeight() != 1 {
		s += fmt.Sprintf(" weight=%d", ep.GetWeight())
	}
	if ep.GetNode() != "" {
		s += " node=" + ep.GetNode()
	}
	return s
}

func mutations(b []backend.Mutation) string {
	var names []string
	for _, m := range b {
		n := epName(m.ID)
		if m.Endpoint == nil {
			n += " (delete)"
		}
		names = append(names, n)
	}
	sort.Strings(names)
	return listOrNone(names)
}

func listOrNone(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ", ")
}

func sortedScope(sc Scope) []string {
	var out []string
	for svc := range sc {
		out = append(out, svc)
	}
	sort.Strings(out)
	return out
}

// parseEP reads "service/ip attr=value ..." into a normalized endpoint.
func parseEP(t *testing.T, d *datadriven.TestData, line string) *registryv1.ServiceEndpoint {
	f := strings.Fields(line)
	if len(f) == 0 {
		d.Fatalf(t, "empty endpoint")
	}
	svc, ip, ok := strings.Cut(f[0], "/")
	if !ok {
		d.Fatalf(t, "endpoint %q: want service/ip", f[0])
	}
	ep := &registryv1.ServiceEndpoint{Service: svc, Protocol: registryv1.Protocol_PROTOCOL_HTTP1, Ip: ip,
		Ports: []*registryv1.Port{{Port: 80}}, Region: "r", Cluster: "c"}
	var stamp *registryv1.WriteStamp // normalization drops a stamp: set after
	for _, kv := range f[1:] {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "node":
			ep.Node = v
		case "state":
			if v == "draining" {
				ep.State = registryv1.State_STATE_DRAINING
			}
		case "weight":
			w, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				d.Fatalf(t, "weight %q: %v", v, err)
			}
			ep.Weight = uint32(w)
		case "cluster":
			ep.Cluster = v
		case "region":
			ep.Region = v
		case "stamp":
			hlc, writer, _ := strings.Cut(v, ":")
			n, err := strconv.ParseUint(hlc, 10, 64)
			if err != nil {
				d.Fatalf(t, "stamp %q: %v", v, err)
			}
			stamp = &registryv1.WriteStamp{Hlc: n, Writer: writer}
		case "mod", "at", "rev", "as":
		default:
			d.Fatalf(t, "endpoint %q: unknown attribute %q", f[0], k)
		}
	}
	n, err := registry.NormalizeEndpoint(ep, registry.DefaultLimits)
	if err != nil {
		d.Fatalf(t, "endpoint %q: %v", line, err)
	}
	if n.CreatedAt == nil {
		n.CreatedAt = timestamppb.New(scriptT0)
	}
	if stamp != nil {
		n.Stamp = stamp
	}
	return n
}

// asOf is a line's as= attribute: the name a script gives the write.
func asOf(line string) string {
	for _, kv := range strings.Fields(line) {
		if v, ok := strings.CutPrefix(kv, "as="); ok {
			return v
		}
	}
	return ""
}

// modOf is a line's mod=/at=/rev= attribute, or def.
func modOf(t *testing.T, d *datadriven.TestData, line string, def int64) int64 {
	for _, kv := range strings.Fields(line) {
		k, v, ok := strings.Cut(kv, "=")
		if ok && (k == "mod" || k == "at" || k == "rev") {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				d.Fatalf(t, "%s: %v", kv, err)
			}
			return n
		}
	}
	return def
}

func lines(s string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

func intArg(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var n int
	d.ScanArgs(t, key, &n)
	return n
}

func durArg(t *testing.T, d *datadriven.TestData, key string, def time.Duration) time.Duration {
	if !d.HasArg(key) {
		return def
	}
	var s string
	d.ScanArgs(t, key, &s)
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%s=%s: %v", key, s, err)
	}
	return v
}
