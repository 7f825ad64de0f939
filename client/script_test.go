package client

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/registry"
)

// TestScripts drives the client's cache, write and settle rules through
// testdata/*.txt: a state value fed with stream messages, write answers and
// a clock, with no registrar, network or wall clock. The Client's loops only
// carry these between the network and the same state methods (applyStream,
// enqueue, nextReq, finish, tick), so a script exercises the rules the
// Client runs. Rewrite the golden output with -rewrite, then read it.
//
// Commands (positional words, then key=value):
//
//	new [services=a,b] [node=n1] [backoff=1s] [quiet=1m]
//	    a fresh state; no services means all. A repeated re-assertion of
//	    one endpoint waits backoff*(attempt+1) (the Client's is jittered).
//	start
//	    open a stream: prints the start request (resume token, services,
//	    the update that adds services not held) from startRequest.
//	forget
//	    the registrar refused the start: drop the resume token.
//	subscribe|unsubscribe <service>...
//	    the caller changes the watched services.
//	full epoch=E seq=N [continues] [old]
//	services svc=a,b epoch=E seq=N [continues] [old]
//	    a FULL_SNAPSHOT or SERVICES_SNAPSHOT chunk; the endpoints are the
//	    input lines. old: from a registrar that predates the epoch field
//	    (the token still names E).
//	added|updated|removed seq=N
//	    a change event; the endpoint is the input line. Its token is in the
//	    epoch of the stream's last snapshot or bookmark.
//	progress epoch=E seq=N [old]
//	    a bookmark.
//	register|drain|unregister <endpoint>
//	    the caller's intent (register takes the endpoint's attributes).
//	send
//	    the writer takes the head of the queue.
//	ack [epoch=E seq=N] [stored]
//	    the in-flight write is acknowledged at that position (none: a
//	    registrar that names none); stored: the answer carries the
//	    registrar's copy, with a creation time.
//	fail code=C
//	    the in-flight write fails with gRPC code C.
//	tick [+D]
//	    the clock moves on by D and the writer's timer fires.
//	print
//	    the whole state.
//
// An endpoint is "<service> <ip> [grpc|tcp|http2] [draining] [node=N]
// [weight=W] [port=P]", in region r1, cluster c1, node n1 and port 80 unless
// given. Every command prints what OnChange would hear and what was
// re-asserted.
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		if !strings.HasSuffix(path, ".txt") {
			return
		}
		h := &scriptHarness{}
		datadriven.RunTest(t, path, h.run)
	})
}

var scriptT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type scriptHarness struct {
	s        *state
	view     *view
	sess     *session
	now      time.Time
	inflight *writeReq
	// streamEpoch is the epoch the registrar's tokens name: that of the last
	// snapshot or bookmark, which is what a change event's token carries.
	streamEpoch string
}

func (h *scriptHarness) run(t *testing.T, d *datadriven.TestData) string {
	pos, kv := scriptArgs(d)
	var out strings.Builder
	if d.Cmd != "new" && h.s == nil {
		t.Fatalf("%s: run new first", d.Pos)
	}
	switch d.Cmd {
	case "new":
		var services []string
		if v := kv["services"]; v != "" {
			services = strings.Split(v, ",")
		}
		h.s = newState(services, true)
		h.s.node = "n1"
		if v, ok := kv["node"]; ok {
			h.s.node = v
		}
		backoff := time.Second
		if v, ok := kv["backoff"]; ok {
			backoff = scriptDuration(t, d, v)
		}
		h.s.reassertDelay = func(n int) time.Duration { return time.Duration(n+1) * backoff }
		h.s.reassertQuiet = time.Minute
		if v, ok := kv["quiet"]; ok {
			h.s.reassertQuiet = scriptDuration(t, d, v)
		}
		h.view = &view{all: h.s.all, services: map[string][]*registryv1.ServiceEndpoint{}, wanted: services}
		h.now, h.sess, h.inflight, h.streamEpoch = scriptT0, nil, nil, ""
		return "ok"
	case "start":
		req, add, covered, sent := h.s.startRequest(&Config{Cluster: "c1", Node: h.s.node})
		h.sess = &session{covered: covered, sent: sent}
		fmt.Fprintf(&out, "start last_version=%q services=%v", req.GetLastVersion(), req.GetServices())
		if len(add) > 0 {
			fmt.Fprintf(&out, " then add=%v", add)
		}
		out.WriteString("\n")
		if req.GetLastVersion() != "" {
			// A resumed stream's tokens are in the resumed position's epoch.
			h.streamEpoch = h.s.at.Epoch
		}
	case "forget":
		h.s.forgetVersion()
	case "subscribe":
		h.s.subscribe(pos)
	case "unsubscribe":
		h.s.unsubscribe(pos)
	case "full", "services", "progress":
		ev := &registrarv1.EndpointEvent{Sequence: scriptUint(t, d, kv["seq"])}
		epoch := kv["epoch"]
		ev.Version = registry.Position{Epoch: epoch, Seq: ev.Sequence}.String()
		if _, old := kv["old"]; !old {
			ev.Epoch = epoch
		}
		switch d.Cmd {
		case "full":
			ev.Type = registrarv1.EndpointEvent_FULL_SNAPSHOT
		case "services":
			ev.Type = registrarv1.EndpointEvent_SERVICES_SNAPSHOT
			ev.Services = strings.Split(kv["svc"], ",")
		case "progress":
			ev.Type = registrarv1.EndpointEvent_PROGRESS
		}
		if d.Cmd != "progress" {
			for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
				if line = strings.TrimSpace(line); line != "" {
					ev.Endpoints = append(ev.Endpoints, scriptEndpoint(t, d, strings.Fields(line)))
				}
			}
			_, ev.SnapshotContinues = kv["continues"]
		}
		if !ev.GetSnapshotContinues() {
			h.streamEpoch = epoch
		}
		h.stream(t, d, ev, &out)
	case "added", "updated", "removed":
		seq := scriptUint(t, d, kv["seq"])
		ev := &registrarv1.EndpointEvent{
			Type:     map[string]registrarv1.EndpointEvent_EventType{"added": registrarv1.EndpointEvent_ENDPOINT_ADDED, "updated": registrarv1.EndpointEvent_ENDPOINT_UPDATED, "removed": registrarv1.EndpointEvent_ENDPOINT_REMOVED}[d.Cmd],
			Endpoint: scriptEndpoint(t, d, strings.Fields(strings.TrimSpace(d.Input))),
			Sequence: seq,
			Version:  registry.Position{Epoch: h.streamEpoch, Seq: seq}.String(),
		}
		h.stream(t, d, ev, &out)
	case "register":
		ep := scriptEndpoint(t, d, scriptWords(d))
		h.s.enqueue(registry.IDOf(ep), opRegister, ep)
	case "drain", "unregister":
		id := registry.IDOf(scriptEndpoint(t, d, scriptWords(d)))
		op := map[string]opKind{"drain": opDrain, "unregister": opUnregister}[d.Cmd]
		h.s.enqueue(id, op, nil)
	case "send":
		if h.inflight != nil {
			t.Fatalf("%s: a write is in flight already (the writer sends one at a time)", d.Pos)
		}
		req, ok := h.s.nextReq()
		if !ok {
			out.WriteString("nothing queued\n")
			break
		}
		h.inflight = &req
		fmt.Fprintf(&out, "send %s %s gen=%d", req.op, scriptID(req.id), req.gen)
		if req.ep != nil {
			fmt.Fprintf(&out, " (%s)", scriptAttrs(req.ep))
		}
		if req.owner != "" {
			fmt.Fprintf(&out, " owner=%s", req.owner)
		}
		out.WriteString("\n")
	case "ack", "fail":
		req := h.inflight
		if req == nil {
			t.Fatalf("%s: nothing in flight (send first)", d.Pos)
		}
		h.inflight = nil
		var at registry.Position
		var stored *registryv1.ServiceEndpoint
		var err error
		if d.Cmd == "ack" {
			if _, ok := kv["seq"]; ok {
				at = registry.Position{Epoch: kv["epoch"], Seq: scriptUint(t, d, kv["seq"])}
			}
			if _, ok := kv["stored"]; ok && req.ep != nil {
				stored = scriptStored(req.ep, h.now)
			}
		} else {
			err = status.Error(scriptCode(t, d, kv["code"]), "scripted failure")
		}
		fmt.Fprintf(&out, "%s\n", h.s.finish(*req, at, stored, err, h.now))
	case "tick":
		if len(pos) > 0 {
			h.now = h.now.Add(scriptDuration(t, d, pos[0]))
		}
		h.s.tick(h.now)
	case "print":
		h.print(&out)
		return out.String()
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	h.commit(&out)
	if out.Len() == 0 {
		return "ok"
	}
	return out.String()
}

// stream applies one message as a batch of its own, as the Client does
// with a message that arrives alone.
func (h *scriptHarness) stream(t *testing.T, d *datadriven.TestData, ev *registrarv1.EndpointEvent, out *strings.Builder) {
	if h.sess == nil {
		t.Fatalf("%s: no stream (start first)", d.Pos)
	}
	r := h.s.applyStream(h.sess, []*registrarv1.EndpointEvent{ev}, h.now)
	if r.becameSynced {
		how := "by snapshot"
		if r.resumed {
			how = "by resume"
		}
		fmt.Fprintf(out, "synced %s\n", how)
	}
	for _, x := range r.discarded {
		fmt.Fprintf(out, "discarded partial %v (a %v chunk arrived)\n", x[0], x[1])
	}
}

// commit does what Client.commitLocked does with the state, printing the
// changes OnChange would hear and the re-assertions counted.
func (h *scriptHarness) commit(out *strings.Builder) {
	h.view = h.s.nextView(h.view)
	for _, ch := range h.s.takeChanges() {
		fmt.Fprintf(out, "change %s %s (%s)", ch.Type, scriptID(registry.IDOf(ch.Endpoint)), scriptAttrs(ch.Endpoint))
		if ch.Previous != nil {
			fmt.Fprintf(out, " was (%s)", scriptAttrs(ch.Previous))
		}
		out.WriteString("\n")
	}
	h.s.dueChanged = false
	for _, id := range h.s.takeReasserted() {
		fmt.Fprintf(out, "reasserted %s\n", scriptID(id))
	}
}

func (h *scriptHarness) print(out *strings.Builder) {
	s := h.s
	fmt.Fprintf(out, "clock +%s\n", h.now.Sub(scriptT0))
	fmt.Fprintf(out, "version %q at %s\n", s.version, scriptPos(s.at))
	if s.all {
		fmt.Fprintf(out, "watching all (synced=%v)\n", h.view.synced)
	} else {
		fmt.Fprintf(out, "watching %v held %v\n", sortedKeys(s.wanted), sortedKeys(s.held))
	}
	out.WriteString("cache:\n")
	for _, svc := range slices.Sorted(maps.Keys(h.view.services)) {
		fmt.Fprintf(out, "  %s:", svc)
		if len(h.view.services[svc]) == 0 {
			out.WriteString(" (none)")
		}
		out.WriteString("\n")
		for _, ep := range h.view.services[svc] {
			auth := s.auth[svc][registry.IDOf(ep)]
			note := ""
			switch {
			case auth == nil:
				note = "  [registrar: absent]"
			case auth != ep && !registry.SameAttributes(auth, ep):
				note = fmt.Sprintf("  [registrar: %s]", scriptAttrs(auth))
			}
			fmt.Fprintf(out, "    %s %s%s\n", scriptID(registry.IDOf(ep)), scriptAttrs(ep), note)
		}
	}
	// What the registrar holds that the cache hides (an overlay removing it).
	for _, svc := range slices.Sorted(maps.Keys(s.auth)) {
		for _, id := range sortedIDs(scriptIDSet(s.auth[svc])) {
			if s.eff[svc][id] == nil {
				fmt.Fprintf(out, "  hidden: %s %s\n", scriptID(id), scriptAttrs(s.auth[svc][id]))
			}
		}
	}
	if len(s.writes) > 0 {
		out.WriteString("writes:\n")
		for _, id := range sortedIDs(scriptIDSet(s.writes)) {
			w := s.writes[id]
			fmt.Fprintf(out, "  %s %s gen=%d %s", scriptID(id), w.op, w.gen, map[writeState]string{writeQueued: "queued", writeInflight: "inflight", writeAcked: "acked"}[w.state])
			if w.state == writeAcked {
				fmt.Fprintf(out, " at %s +%s", scriptPos(w.ackAt), w.ackedAt.Sub(scriptT0))
			}
			if w.reassert {
				out.WriteString(" reassert")
			}
			out.WriteString("\n")
		}
	}
	if len(s.queue) > 0 {
		out.WriteString("queue:")
		for _, id := range s.queue {
			fmt.Fprintf(out, " %s", scriptID(id))
		}
		out.WriteString("\n")
	}
	if len(s.owned) > 0 {
		out.WriteString("owned:\n")
		for _, id := range sortedIDs(scriptIDSet(s.owned)) {
			o := s.owned[id]
			fmt.Fprintf(out, "  %s %s tries=%d", scriptID(id), scriptAttrs(o.ep), o.tries)
			if o.heldDrain {
				out.WriteString(" held-drain")
			}
			if _, ok := s.due[id]; ok {
				fmt.Fprintf(out, " due=+%s", s.due[id].Sub(scriptT0))
			}
			out.WriteString("\n")
		}
	}
	if t := s.nextSettle(); !t.IsZero() {
		fmt.Fprintf(out, "next settle timeout +%s\n", t.Sub(scriptT0))
	}
}

func scriptIDSet[V any](m map[registry.EndpointID]V) map[registry.EndpointID]struct{} {
	out := make(map[registry.EndpointID]struct{}, len(m))
	for id := range m {
		out[id] = struct{}{}
	}
	return out
}

// scriptArgs splits a directive into its positional words and key=value
// arguments (a list value is joined with commas).
func scriptArgs(d *datadriven.TestData) (pos []string, kv map[string]string) {
	kv = map[string]string{}
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 {
			switch a.Key {
			case "continues", "old", "stored":
				kv[a.Key] = ""
			default:
				pos = append(pos, a.Key)
			}
			continue
		}
		kv[a.Key] = strings.Join(a.Vals, ",")
	}
	return pos, kv
}

// scriptWords is the directive's arguments as words, in order, for the
// commands whose arguments are an endpoint.
func scriptWords(d *datadriven.TestData) []string {
	var words []string
	for _, a := range d.CmdArgs {
		if len(a.Vals) == 0 {
			words = append(words, a.Key)
		} else {
			words = append(words, a.Key+"="+strings.Join(a.Vals, ","))
		}
	}
	return words
}

// scriptEndpoint builds an endpoint from its words and normalizes it as the
// client and the registrar both do, so that an intent and the registrar's
// copy of it compare equal.
func scriptEndpoint(t *testing.T, d *datadriven.TestData, words []string) *registryv1.ServiceEndpoint {
	if len(words) < 2 {
		t.Fatalf("%s: an endpoint is <service> <ip> [...], got %q", d.Pos, words)
	}
	ep := &registryv1.ServiceEndpoint{
		Region: "r1", Cluster: "c1", Service: words[0], Ip: words[1], Node: "n1",
		Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
		Ports:    []*registryv1.Port{{Name: "http", Port: 80}},
	}
	for _, w := range words[2:] {
		k, v, _ := strings.Cut(w, "=")
		switch k {
		case "grpc", "tcp", "http2":
			p, err := registry.ParseProtocol(k)
			if err != nil {
				t.Fatalf("%s: %v", d.Pos, err)
			}
			ep.Protocol = p
		case "draining":
			ep.State = registryv1.State_STATE_DRAINING
		case "node":
			ep.Node = v
		case "weight":
			ep.Weight = uint32(scriptUint(t, d, v))
		case "port":
			ep.Ports[0].Port = uint32(scriptUint(t, d, v))
		default:
			t.Fatalf("%s: unknown endpoint word %q", d.Pos, w)
		}
	}
	norm, err := registry.NormalizeEndpoint(ep, registry.DefaultLimits)
	if err != nil {
		t.Fatalf("%s: %v", d.Pos, err)
	}
	return norm
}

// scriptStored is the registrar's copy of a registered endpoint: the same
// attributes, plus what only the registrar sets.
func scriptStored(ep *registryv1.ServiceEndpoint, now time.Time) *registryv1.ServiceEndpoint {
	c := proto.Clone(ep).(*registryv1.ServiceEndpoint)
	c.CreatedAt = timestamppb.New(now)
	return c
}

func scriptID(id registry.EndpointID) string {
	s := id.Service + " " + id.IP
	if id.Protocol != registryv1.Protocol_PROTOCOL_HTTP1 {
		s += " " + registry.ProtocolName(id.Protocol)
	}
	if id.Region != "r1" || id.Cluster != "c1" {
		s += " @" + id.Region + "/" + id.Cluster
	}
	return s
}

func scriptAttrs(ep *registryv1.ServiceEndpoint) string {
	s := strings.ToLower(strings.TrimPrefix(ep.GetState().String(), "STATE_"))
	if ep.GetNode() != "n1" {
		s += " node=" + ep.GetNode()
	}
	if ep.GetWeight() != 1 {
		s += " weight=" + strconv.Itoa(int(ep.GetWeight()))
	}
	if p := ep.GetPorts(); len(p) == 1 && p[0].GetPort() != 80 {
		s += " port=" + strconv.Itoa(int(p[0].GetPort()))
	}
	if ep.GetCreatedAt() != nil {
		s += " stored"
	}
	return s
}

func scriptPos(p registry.Position) string {
	if p.Epoch == "" {
		return fmt.Sprintf("(no epoch):%d", p.Seq)
	}
	return p.String()
}

func scriptUint(t *testing.T, d *datadriven.TestData, v string) uint64 {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s: %q is not a number", d.Pos, v)
	}
	return n
}

func scriptDuration(t *testing.T, d *datadriven.TestData, v string) time.Duration {
	dur, err := time.ParseDuration(strings.TrimPrefix(v, "+"))
	if err != nil {
		t.Fatalf("%s: %v", d.Pos, err)
	}
	return dur
}

func scriptCode(t *testing.T, d *datadriven.TestData, name string) codes.Code {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c
		}
	}
	t.Fatalf("%s: unknown gRPC code %q", d.Pos, name)
	return codes.Unknown
}
