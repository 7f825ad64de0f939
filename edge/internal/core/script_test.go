package core

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
)

// The core's behaviour as scripts (testdata/*.txt): each directive is one
// request as the edge shell would make it, the output below it is what the
// core answered and, for a write, the change it made. Run with -rewrite to
// regenerate the outputs after a deliberate change, then read the diff.
//
// Directives:
//
//	put k=K v=V [lease=ID] [prev] [ignore-value] [ignore-lease]
//	               (or the value, verbatim, as the input: for JSON)
//	get k=K [end=E] [rev=R] [limit=N] [sort=(TARGET,ORDER)] [keys-only] [count-only]
//	    [min-mod=R] [max-mod=R] [min-create=R] [max-create=R]
//	del k=K [end=E] [prev]
//	txn            input: "if TARGET(K[,END]) OP VALUE" lines, then "then|else put K V",
//	               "then|else get K [END]", "then|else del K [END]" lines
//	compact rev=R
//	grant [id=ID] ttl=S | revoke id=ID | renew id=ID | ttl id=ID | tick D | expire
//	events from=R k=K [end=E]
//	hashkv [rev=R]
//	state          revision, index, compaction, heads
//	replay         replays every change so far into a fresh state: "same" or the difference
//	on id=N [skew=D]   later directives act on replica N (created empty), its clock D off
//	sync from=A to=B   B merges the changes of A it lacks (part 2's Merge)
//	winner k=K     the (stamp, replica) that decided K, per the conflict rule
//	value-merge json | value-merge prefix=P   JSON merge (merge_json.go) for every key or
//	               keys under P, on every replica (existing and created later)
//	doc k=K        K's JSON document: each entry's register and value
//	vector         Vector(), Collected(), Tombstones(), Forgotten()
//	collect rN=C...    Collect with replica N's stable count C (the sync
//	               layer computes stable vectors; here they are given)
//
// Keys, values and ends are Go string literals without the quotes ("\x00").
// Times start at t=0 and move on by tick.
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		h := &scriptHarness{s: New(1), now: scriptT0, reps: map[ReplicaID]*scriptReplica{}}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return h.run(t, d)
		})
	})
}

var scriptT0 = time.Unix(1_800_000_000, 0)

// scriptHarness is one script's world: the current replica (s, its log of
// applied changes, its clock skew), the others, and the shared time.
type scriptHarness struct {
	s    *State
	log  []*Applied
	skew time.Duration
	now  time.Time
	reps map[ReplicaID]*scriptReplica
	vm   ValueMerge
}

type scriptReplica struct {
	s    *State
	log  []*Applied
	skew time.Duration
}

// local is the current replica's wall clock.
func (h *scriptHarness) local() time.Time { return h.now.Add(h.skew) }

// replica returns replica id's state and log, the current one included.
func (h *scriptHarness) replica(id ReplicaID) *scriptReplica {
	if id == h.s.Replica() {
		return &scriptReplica{s: h.s, log: h.log, skew: h.skew}
	}
	r := h.reps[id]
	if r == nil {
		r = &scriptReplica{s: New(id)}
		r.s.SetValueMerge(h.vm)
		h.reps[id] = r
	}
	return r
}

func (h *scriptHarness) save(r *scriptReplica) {
	if r.s == h.s {
		h.log = r.log
		return
	}
	h.reps[r.s.Replica()] = r
}

func unq(t *testing.T, d *datadriven.TestData, s string) []byte {
	v, err := strconv.Unquote(`"` + s + `"`)
	if err != nil {
		d.Fatalf(t, "bad literal %q: %v", s, err)
	}
	return []byte(v)
}

func (h *scriptHarness) arg(t *testing.T, d *datadriven.TestData, key string) []byte {
	if !d.HasArg(key) {
		return nil
	}
	var s string
	d.ScanArgs(t, key, &s)
	return unq(t, d, s)
}

func (h *scriptHarness) num(t *testing.T, d *datadriven.TestData, key string) int64 {
	if !d.HasArg(key) {
		return 0
	}
	var n int64
	d.ScanArgs(t, key, &n)
	return n
}

func (h *scriptHarness) run(t *testing.T, d *datadriven.TestData) string {
	s := h.s
	var b strings.Builder
	applied := func(a *Applied, err error) {
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", errDesc(err))
			return
		}
		if a != nil {
			h.log = append(h.log, a)
			fmt.Fprintf(&b, "change index=%d rev=%d ops=%s\n", a.Index, a.Rev, opsString(a.Change.Ops))
			for _, ev := range a.Events {
				fmt.Fprintf(&b, "  event %s\n", eventString(ev))
			}
		}
	}
	switch d.Cmd {
	case "put":
		req := &pb.PutRequest{Key: h.arg(t, d, "k"), Value: h.arg(t, d, "v"), Lease: h.num(t, d, "lease"),
			PrevKv: d.HasArg("prev"), IgnoreValue: d.HasArg("ignore-value"), IgnoreLease: d.HasArg("ignore-lease")}
		if !d.HasArg("v") && d.Input != "" {
			req.Value = []byte(d.Input) // a JSON value, verbatim
		}
		resp, a, err := s.Put(h.local(), req)
		if err == nil {
			fmt.Fprintf(&b, "rev=%d", resp.Header.Revision)
			if resp.PrevKv != nil {
				fmt.Fprintf(&b, " prev: %s", kvString(resp.PrevKv))
			}
			b.WriteString("\n")
		}
		applied(a, err)
	case "get":
		resp, err := s.Range(h.rangeReq(t, d))
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", errDesc(err))
			break
		}
		b.WriteString(rangeString(resp))
	case "del":
		resp, a, err := s.DeleteRange(h.local(), &pb.DeleteRangeRequest{Key: h.arg(t, d, "k"), RangeEnd: h.arg(t, d, "end"), PrevKv: d.HasArg("prev")})
		if err == nil {
			fmt.Fprintf(&b, "rev=%d deleted=%d\n", resp.Header.Revision, resp.Deleted)
			for _, kv := range resp.PrevKvs {
				fmt.Fprintf(&b, "  prev: %s\n", kvString(kv))
			}
		}
		applied(a, err)
	case "txn":
		resp, a, err := s.Txn(h.local(), h.txnReq(t, d))
		if err == nil {
			fmt.Fprintf(&b, "succeeded=%v rev=%d\n", resp.Succeeded, resp.Header.Revision)
			for _, r := range resp.Responses {
				switch r := r.Response.(type) {
				case *pb.ResponseOp_ResponsePut:
					fmt.Fprintf(&b, "  put rev=%d\n", r.ResponsePut.Header.Revision)
				case *pb.ResponseOp_ResponseDeleteRange:
					fmt.Fprintf(&b, "  del rev=%d deleted=%d\n", r.ResponseDeleteRange.Header.Revision, r.ResponseDeleteRange.Deleted)
				case *pb.ResponseOp_ResponseRange:
					for i, l := range strings.Split(strings.TrimRight(rangeString(r.ResponseRange), "\n"), "\n") {
						if i == 0 {
							l = "get " + l
						}
						fmt.Fprintf(&b, "  %s\n", l)
					}
				}
			}
		}
		if err == nil && a == nil {
			b.WriteString("no change (read-only)\n")
		}
		applied(a, err)
	case "compact":
		if err := s.Compact(h.num(t, d, "rev")); err != nil {
			fmt.Fprintf(&b, "error: %v\n", errDesc(err))
		} else {
			fmt.Fprintf(&b, "compacted at %d\n", s.CompactRev())
		}
	case "grant":
		resp, a, err := s.LeaseGrant(h.local(), &pb.LeaseGrantRequest{ID: h.num(t, d, "id"), TTL: h.num(t, d, "ttl")})
		if err == nil {
			fmt.Fprintf(&b, "lease %d ttl=%d\n", resp.ID, resp.TTL)
		}
		applied(a, err)
	case "revoke":
		_, a, err := s.LeaseRevoke(h.local(), h.num(t, d, "id"))
		applied(a, err)
	case "renew":
		ttl, err := s.LeaseRenew(h.local(), h.num(t, d, "id"))
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", errDesc(err))
		} else {
			fmt.Fprintf(&b, "ttl=%d\n", ttl)
		}
	case "ttl":
		resp, _ := s.LeaseTimeToLive(h.local(), &pb.LeaseTimeToLiveRequest{ID: h.num(t, d, "id"), Keys: true})
		fmt.Fprintf(&b, "ttl=%d granted=%d keys=%q\n", resp.TTL, resp.GrantedTTL, resp.Keys)
	case "tick":
		var dur string
		d.ScanArgs(t, "d", &dur)
		dd, err := time.ParseDuration(dur)
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		h.now = h.now.Add(dd)
		if next, ok := s.NextLeaseExpiry(); ok {
			fmt.Fprintf(&b, "next expiry in %v\n", next.Sub(h.local()))
		} else {
			b.WriteString("no lease to expire\n")
		}
	case "expire":
		as := s.ExpireLeases(h.local())
		if len(as) == 0 {
			b.WriteString("nothing expired\n")
		}
		for _, a := range as {
			applied(a, nil)
		}
	case "events":
		evs, err := s.Events(h.num(t, d, "from"), h.arg(t, d, "k"), h.arg(t, d, "end"))
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", errDesc(err))
		}
		for _, ev := range evs {
			fmt.Fprintf(&b, "%s\n", eventString(ev))
		}
		if err == nil && len(evs) == 0 {
			b.WriteString("no events\n")
		}
	case "hashkv":
		hash, rev, err := s.HashKV(h.num(t, d, "rev"))
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", errDesc(err))
		} else {
			fmt.Fprintf(&b, "hash=%08x rev=%d\n", hash, rev)
		}
	case "on":
		// on id=N [skew=D]: later directives act on replica N, whose wall
		// clock runs D off the shared time.
		id := ReplicaID(h.num(t, d, "id"))
		cur := &scriptReplica{s: h.s, log: h.log, skew: h.skew}
		h.reps[cur.s.Replica()] = cur
		r := h.replica(id)
		if d.HasArg("skew") {
			var sk string
			d.ScanArgs(t, "skew", &sk)
			dd, err := time.ParseDuration(sk)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			r.skew = dd
		}
		delete(h.reps, id)
		h.s, h.log, h.skew = r.s, r.log, r.skew
		fmt.Fprintf(&b, "replica %d, clock %v\n", id, r.skew)
	case "sync":
		// sync from=A to=B: B merges every change of A's log it lacks.
		from, to := h.replica(ReplicaID(h.num(t, d, "from"))), h.replica(ReplicaID(h.num(t, d, "to")))
		n := 0
		for _, ap := range from.log {
			got, err := to.s.Merge(h.now.Add(to.skew), ap.Encoded)
			if err != nil {
				fmt.Fprintf(&b, "error: %v\n", err)
				break
			}
			if got == nil {
				continue
			}
			n++
			to.log = append(to.log, got)
			fmt.Fprintf(&b, "merged index=%d rev=%d ops=%s from replica %d at %s\n", got.Index, got.Rev, opsString(got.Change.Ops), got.Change.Replica, stampString(got.Change.Stamp))
			for _, ev := range got.Events {
				fmt.Fprintf(&b, "  event %s\n", eventString(ev))
			}
		}
		h.save(to)
		if n == 0 {
			b.WriteString("nothing new\n")
		}
	case "value-merge":
		if d.HasArg("prefix") {
			h.vm.Prefixes = append(h.vm.Prefixes, h.arg(t, d, "prefix"))
		} else {
			h.vm.JSON = true
		}
		h.s.SetValueMerge(h.vm)
		for _, r := range h.reps {
			r.s.SetValueMerge(h.vm)
		}
		fmt.Fprintf(&b, "value merge %s\n", h.vm)
	case "doc":
		k := s.keys[string(h.arg(t, d, "k"))]
		if k == nil || k.doc == nil {
			b.WriteString("no document\n")
			break
		}
		docString(&b, k.doc.root, "", 0)
		fmt.Fprintf(&b, "lease %d by %s\n", k.doc.lease, regString(k.doc.leaseReg))
	case "winner":
		st, r, ok := s.Winner(h.arg(t, d, "k"))
		if !ok {
			b.WriteString("no such key\n")
		} else {
			fmt.Fprintf(&b, "replica %d at %s\n", r, stampString(st))
		}
	case "state":
		hash, _, _ := s.HashKV(0)
		fmt.Fprintf(&b, "rev=%d index=%d compact=%d heads=%d hashkv=%08x\n", s.Rev(), s.Index(), s.CompactRev(), len(s.Heads()), hash)
	case "vector":
		fmt.Fprintf(&b, "vector %s collected %s tombstones=%d forgotten=%d\n", vecString(s.Vector()), vecString(s.Collected()), s.Tombstones(), s.Forgotten())
	case "collect":
		// collect rN=C...: Collect with stable count C for replica N.
		stable := map[ReplicaID]uint64{}
		for _, a := range d.CmdArgs {
			n, err1 := strconv.ParseUint(strings.TrimPrefix(a.Key, "r"), 10, 64)
			var c uint64
			var err2 error = fmt.Errorf("one value")
			if len(a.Vals) == 1 {
				c, err2 = strconv.ParseUint(a.Vals[0], 10, 64)
			}
			if !strings.HasPrefix(a.Key, "r") || err1 != nil || err2 != nil {
				d.Fatalf(t, "collect: argument %s, want rN=COUNT", a)
			}
			stable[ReplicaID(n)] = c
		}
		st, err := s.Collect(stable)
		if err != nil {
			fmt.Fprintf(&b, "error: %v\n", err)
			break
		}
		fmt.Fprintf(&b, "collected hashes=%d keys=%d fields=%d; tombstones=%d forgotten=%d\n", st.Hashes, st.Keys, st.Fields, s.Tombstones(), s.Forgotten())
	case "replay":
		r := New(s.Replica())
		r.SetValueMerge(h.vm)
		for _, a := range h.log {
			if err := r.Replay(a.Encoded, a.Index, a.Rev); err != nil {
				d.Fatalf(t, "replay: %v", err)
			}
		}
		if s.CompactRev() >= 0 {
			_ = r.Compact(s.CompactRev())
		}
		if _, err := r.Collect(s.Collected()); err != nil {
			d.Fatalf(t, "replay: %v", err)
		}
		r.PromoteLeases(h.local())
		s.PromoteLeases(h.local()) // both from the same instant: comparable
		if da, db := dump(t, s), dump(t, r); da != db {
			fmt.Fprintf(&b, "differs:\n%s\n---\n%s\n", da, db)
		} else {
			b.WriteString("same\n")
		}
	default:
		d.Fatalf(t, "unknown directive %q", d.Cmd)
	}
	return b.String()
}

func (h *scriptHarness) rangeReq(t *testing.T, d *datadriven.TestData) *pb.RangeRequest {
	r := &pb.RangeRequest{Key: h.arg(t, d, "k"), RangeEnd: h.arg(t, d, "end"), Revision: h.num(t, d, "rev"), Limit: h.num(t, d, "limit"),
		KeysOnly: d.HasArg("keys-only"), CountOnly: d.HasArg("count-only"),
		MinModRevision: h.num(t, d, "min-mod"), MaxModRevision: h.num(t, d, "max-mod"),
		MinCreateRevision: h.num(t, d, "min-create"), MaxCreateRevision: h.num(t, d, "max-create")}
	if d.HasArg("sort") {
		var target, order string
		d.ScanArgs(t, "sort", &target, &order)
		r.SortTarget = pb.RangeRequest_SortTarget(pb.RangeRequest_SortTarget_value[strings.ToUpper(target)])
		r.SortOrder = pb.RangeRequest_SortOrder(pb.RangeRequest_SortOrder_value[strings.ToUpper(order)])
	}
	return r
}

func (h *scriptHarness) txnReq(t *testing.T, d *datadriven.TestData) *pb.TxnRequest {
	req := &pb.TxnRequest{}
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "if":
			if len(f) != 4 {
				d.Fatalf(t, "compare %q: want if TARGET(K[,END]) OP VALUE", line)
			}
			target, rest, _ := strings.Cut(f[1], "(")
			keys := strings.Split(strings.TrimSuffix(rest, ")"), ",")
			c := &pb.Compare{Key: unq(t, d, keys[0])}
			if len(keys) > 1 {
				c.RangeEnd = unq(t, d, keys[1])
			}
			c.Result = map[string]pb.Compare_CompareResult{"=": pb.Compare_EQUAL, "!=": pb.Compare_NOT_EQUAL, ">": pb.Compare_GREATER, "<": pb.Compare_LESS}[f[2]]
			n, _ := strconv.ParseInt(f[3], 10, 64)
			switch target {
			case "version":
				c.Target, c.TargetUnion = pb.Compare_VERSION, &pb.Compare_Version{Version: n}
			case "create":
				c.Target, c.TargetUnion = pb.Compare_CREATE, &pb.Compare_CreateRevision{CreateRevision: n}
			case "mod":
				c.Target, c.TargetUnion = pb.Compare_MOD, &pb.Compare_ModRevision{ModRevision: n}
			case "lease":
				c.Target, c.TargetUnion = pb.Compare_LEASE, &pb.Compare_Lease{Lease: n}
			case "value":
				c.Target, c.TargetUnion = pb.Compare_VALUE, &pb.Compare_Value{Value: unq(t, d, f[3])}
			default:
				d.Fatalf(t, "compare target %q", target)
			}
			req.Compare = append(req.Compare, c)
		case "then", "else":
			var op *pb.RequestOp
			arg := func(i int) []byte {
				if i < len(f) {
					return unq(t, d, f[i])
				}
				return nil
			}
			switch f[1] {
			case "put":
				op = &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: arg(2), Value: arg(3)}}}
			case "get":
				op = &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: arg(2), RangeEnd: arg(3)}}}
			case "del":
				op = &pb.RequestOp{Request: &pb.RequestOp_RequestDeleteRange{RequestDeleteRange: &pb.DeleteRangeRequest{Key: arg(2), RangeEnd: arg(3)}}}
			default:
				d.Fatalf(t, "op %q", line)
			}
			if f[0] == "then" {
				req.Success = append(req.Success, op)
			} else {
				req.Failure = append(req.Failure, op)
			}
		default:
			d.Fatalf(t, "txn line %q", line)
		}
	}
	return req
}

// vecString shows a vector in replica order.
func vecString(v map[ReplicaID]uint64) string {
	rs := make([]ReplicaID, 0, len(v))
	for r := range v {
		rs = append(rs, r)
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i] < rs[j] })
	var parts []string
	for _, r := range rs {
		parts = append(parts, fmt.Sprintf("%d:%d", r, v[r]))
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// stampString shows a stamp as its offset from the script's start.
func stampString(h HLC) string {
	return fmt.Sprintf("t=%v+%d", time.Unix(0, h.Wall).Sub(scriptT0), h.Logical)
}

func errDesc(err error) string {
	s := err.Error()
	if i := strings.Index(s, "desc = "); i >= 0 {
		return s[i+len("desc = "):]
	}
	return s
}

func q(b []byte) string {
	s := strconv.Quote(string(b))
	return s[1 : len(s)-1]
}

func kvString(kv *mvccpb.KeyValue) string {
	s := fmt.Sprintf("%s=%s create=%d mod=%d ver=%d", q(kv.Key), q(kv.Value), kv.CreateRevision, kv.ModRevision, kv.Version)
	if kv.Lease != 0 {
		s += fmt.Sprintf(" lease=%d", kv.Lease)
	}
	return s
}

func rangeString(r *pb.RangeResponse) string {
	var b strings.Builder
	fmt.Fprintf(&b, "rev=%d count=%d more=%v\n", r.Header.Revision, r.Count, r.More)
	for _, kv := range r.Kvs {
		fmt.Fprintf(&b, "  %s\n", kvString(kv))
	}
	return b.String()
}

func eventString(ev *mvccpb.Event) string {
	s := fmt.Sprintf("%s %s", strings.ToLower(ev.Type.String()), kvString(ev.Kv))
	if ev.Type == mvccpb.Event_DELETE {
		s = fmt.Sprintf("delete %s mod=%d", q(ev.Kv.Key), ev.Kv.ModRevision)
	}
	if ev.PrevKv != nil {
		s += " (prev " + kvString(ev.PrevKv) + ")"
	}
	return s
}

func opsString(ops []Op) string {
	var parts []string
	for _, op := range ops {
		switch op.Kind {
		case OpPut:
			p := fmt.Sprintf("put %s=%s", q(op.Key), q(op.Value))
			if pt, ok := decodePatch(op.Value); ok {
				p = fmt.Sprintf("put %s patch%s", q(op.Key), patchString(pt))
			}
			if op.Lease != 0 {
				p += fmt.Sprintf(" lease=%d", op.Lease)
			}
			parts = append(parts, p)
		case OpDelete:
			parts = append(parts, "delete "+q(op.Key))
		case OpLeaseGrant:
			parts = append(parts, fmt.Sprintf("grant %d ttl=%d", op.Lease, op.TTL))
		case OpLeaseRevoke:
			parts = append(parts, fmt.Sprintf("revoke %d", op.Lease))
		}
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func regString(r jreg) string {
	return fmt.Sprintf("r%d@%s/%d", r.repl, stampString(HLC{Wall: r.wall, Logical: r.logical}), r.op)
}

// docString prints a document one path a line, fields indented: the
// path's largest assignment and its largest clear (absent or scalar).
func docString(b *strings.Builder, n *jnode, name string, depth int) {
	ind := strings.Repeat("  ", depth)
	if name == "" {
		name = "(root)"
	}
	fmt.Fprintf(b, "%s%s", ind, name)
	if n.kind != nil {
		switch n.kind.kind {
		case jAbsent:
			b.WriteString(" absent")
		case jScalar:
			fmt.Fprintf(b, " = %s", q(n.kind.scalar))
		case jObject:
			b.WriteString(" {}")
		}
		fmt.Fprintf(b, " by %s", regString(n.kind.reg))
	}
	if n.clear != (jreg{}) {
		fmt.Fprintf(b, ", cleared by %s", regString(n.clear))
	}
	b.WriteString("\n")
	names := make([]string, 0, len(n.fields))
	for f := range n.fields {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		docString(b, n.fields[f], f, depth+1)
	}
}

// patchString shows a JSON patch: "=V" assigns a scalar, "-" absent,
// ":=" an object; "{...}" lists the fields below (without an assignment
// of its own the path is only the way to them).
func patchString(p *jnode) string {
	var b strings.Builder
	if p.kind != nil {
		switch p.kind.kind {
		case jScalar:
			b.WriteString("=" + q(p.kind.scalar))
		case jAbsent:
			b.WriteString("-")
		case jObject:
			b.WriteString(":=")
		}
	}
	if len(p.fields) > 0 || (p.kind != nil && p.kind.kind == jObject) || p.kind == nil {
		names := make([]string, 0, len(p.fields))
		for n := range p.fields {
			names = append(names, n)
		}
		sort.Strings(names)
		b.WriteString("{")
		for i, n := range names {
			if i > 0 {
				b.WriteString(" ")
			}
			b.WriteString(n + patchString(p.fields[n]))
		}
		b.WriteString("}")
	}
	return b.String()
}
