package server

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/aethermesh/aether/registrar"
)

// Readiness (/readyz) answers one question for a load balancer or an
// orchestrator: should new clients be sent to this replica? It fails while
// the snapshot is not loaded (the registrar has nothing to answer with),
// and while persistence is stuck: the oldest acknowledged write has waited
// for the backend longer than stuckAfter. A replica that cannot persist
// keeps acknowledging writes that a crash would lose, so new writers are
// better sent to a replica that can; with every replica stuck (etcd down),
// none is ready, as a Kubernetes apiserver is not ready without its etcd.
// Failing readiness stops nothing: this replica keeps serving reads,
// streams and writes to whoever is connected, and keeps retrying the
// backend. Writes the backend refused permanently (isolated) do not fail
// it: they are one bad write each, no other replica would take them
// either, and failing readiness for them would let one client take every
// replica out of rotation. /readyz?verbose lists them; the metric
// registrar_persistence_isolated_writes is for alerting on them (see
// docs/operations.md).
//
// The format is Kubernetes' (as kube-apiserver's /readyz): "ok" when ready;
// with ?verbose, or when not ready, one "[+]name ok" or "[-]name failed:
// reason" line per check; ?exclude=name leaves a check out.

// readyChecks are the names of the checks, in the order they are shown.
var readyChecks = []string{"snapshot", "persistence"}

// stuckAfter is how long the oldest unpersisted write may wait before
// readiness fails: ten flush intervals, so that a backend that answers
// slowly (a flush retried a few times) does not flap readiness, and at
// least 10s, about an etcd leader election and a client failover.
func (c Config) stuckAfter() time.Duration {
	return max(10*c.WriteBatchInterval, 10*time.Second)
}

// check runs one readiness check: ok, and what to say about it.
func (s *Server) check(name string) (bool, string) {
	switch name {
	case "snapshot":
		if !s.startup.isReady.Load() {
			return false, s.startup.reason()
		}
		return true, ""
	case "persistence":
		if !s.startup.isReady.Load() {
			return true, "no writes before the snapshot is loaded"
		}
		ps := s.reg.PersistenceStatus()
		var b strings.Builder
		limit := s.opts.stuckAfter()
		stuck := ps.Pending > 0 && ps.Oldest > limit
		if ps.Pending == 0 {
			b.WriteString("every acknowledged write is persisted")
		} else {
			fmt.Fprintf(&b, "oldest unpersisted write %s old (limit %s), %d pending", ps.Oldest.Round(time.Millisecond), limit, ps.Pending)
		}
		if ps.LastFlushError != "" && !ps.LastFlushErrorAt.Before(ps.LastFlushAt) {
			fmt.Fprintf(&b, ", last flush error %s ago: %s", s.reg.Now().Sub(ps.LastFlushErrorAt).Round(time.Millisecond), ps.LastFlushError)
		}
		return !stuck, b.String()
	}
	return false, "unknown check"
}

func (s *Server) readyz(w http.ResponseWriter, req *http.Request) {
	q := req.URL.Query()
	_, verbose := q["verbose"]
	excluded := map[string]bool{}
	for _, e := range q["exclude"] {
		for _, name := range strings.Split(e, ",") {
			if !contains(readyChecks, name) {
				http.Error(w, fmt.Sprintf("exclude=%s: no such check; the checks are %s", name, strings.Join(readyChecks, ", ")), http.StatusBadRequest)
				return
			}
			excluded[name] = true
		}
	}
	var out strings.Builder
	ok := true
	for _, name := range readyChecks {
		if excluded[name] {
			fmt.Fprintf(&out, "[+]%s excluded: ok\n", name)
			continue
		}
		passed, detail := s.check(name)
		switch {
		case !passed:
			ok = false
			fmt.Fprintf(&out, "[-]%s failed: %s\n", name, detail)
		case detail != "":
			fmt.Fprintf(&out, "[+]%s ok: %s\n", name, detail)
		default:
			fmt.Fprintf(&out, "[+]%s ok\n", name)
		}
	}
	if s.startup.isReady.Load() {
		writeIsolated(&out, s.reg.PersistenceStatus().Isolated, s.reg.Now())
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, out.String()+"readyz check failed\n")
		return
	}
	if !verbose {
		fmt.Fprintln(w, "ok")
		return
	}
	fmt.Fprint(w, out.String()+"readyz check passed\n")
}

// maxIsolatedShown bounds the isolated writes /readyz lists; the metric
// has the count.
const maxIsolatedShown = 20

func writeIsolated(b *strings.Builder, iso []registrar.IsolatedWrite, now time.Time) {
	if len(iso) == 0 {
		return
	}
	sort.Slice(iso, func(i, j int) bool { return iso[i].Since.Before(iso[j].Since) })
	fmt.Fprintf(b, "isolated writes: %d acknowledged writes the backend refused (they do not fail readiness; a newer write of the endpoint replaces one)\n", len(iso))
	for i, w := range iso {
		if i == maxIsolatedShown {
			fmt.Fprintf(b, "  ... and %d more\n", len(iso)-maxIsolatedShown)
			break
		}
		fmt.Fprintf(b, "  %s: %s (for %s)\n", w.Key, w.Reason, now.Sub(w.Since).Round(time.Second))
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
