package disruption

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Tally counts drops by kind. A drop is a resolution that went wrong:
//
//   - DeadPicks: it picked a SERVING endpoint whose pod is dead (drained,
//     deregistered and gone): the request would hit a dead host;
//   - NoneFound: it found no SERVING endpoint of the service although a
//     registered, live pod of it existed;
//   - WrongPicks: it picked an endpoint that never existed, or with other
//     ports than its pod's. Neither sync mode should ever produce one.
type Tally struct {
	Drops      int64 `json:"drops"`
	DeadPicks  int64 `json:"dead_picks"`
	NoneFound  int64 `json:"none_found"`
	WrongPicks int64 `json:"wrong_picks"`
}

func (t *Tally) add(o Tally) {
	t.Drops += o.Drops
	t.DeadPicks += o.DeadPicks
	t.NoneFound += o.NoneFound
	t.WrongPicks += o.WrongPicks
}

func (t Tally) String() string {
	return fmt.Sprintf("%d drops (dead picks %d, none found %d, wrong picks %d)", t.Drops, t.DeadPicks, t.NoneFound, t.WrongPicks)
}

// PhaseResult is what the resolvers saw while a phase ran.
type PhaseResult struct {
	Name        string        `json:"name"`
	Duration    time.Duration `json:"duration_ns"`
	Resolutions int64         `json:"resolutions"`
	Tally
}

// Window is where drops happened: the roll window of one service in one
// phase. A dead pick belongs to the phase in which the picked pod was
// drained (a stale cache may hand it out after that phase has ended); a
// none-found drop to the phase it happened in.
type Window struct {
	Phase   string `json:"phase"`
	Service string `json:"service"`
	Tally
	// DeadEndpoints is how many distinct dead endpoints were picked.
	DeadEndpoints int `json:"dead_endpoints"`
	// First and Last are the first and last drop, since the resolvers
	// started.
	First time.Duration `json:"first_ns"`
	Last  time.Duration `json:"last_ns"`
}

// Propagation summarises how long writes took to reach every client.
type Propagation struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

func summarize(ds []time.Duration) Propagation {
	if len(ds) == 0 {
		return Propagation{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return Propagation{N: len(s), P50: q(0.50), P99: q(0.99), Max: s[len(s)-1]}
}

func (p Propagation) String() string {
	if p.N == 0 {
		return "none observed"
	}
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("p50 %v, p99 %v, max %v (n=%d)", r(p.P50), r(p.P99), r(p.Max), p.N)
}

// Result is what one battery measured.
type Result struct {
	// Config is the battery's effective configuration.
	Config Config `json:"config"`

	Resolutions int64 `json:"resolutions"`
	Tally
	Phases  []PhaseResult `json:"phases"`
	Windows []Window      `json:"windows"` // in order of their first drop
	// Samples describe the first drop of each of the first few windows.
	Samples []string `json:"samples,omitempty"`

	// RegisterPropagation: from a registration's acknowledgement until
	// every client shows the endpoint. DrainPropagation: from a drain being
	// sent until no client shows the endpoint SERVING; a drain slower than
	// Config.DrainPeriod leaves clients holding a dead endpoint.
	RegisterPropagation Propagation `json:"register_propagation"`
	DrainPropagation    Propagation `json:"drain_propagation"`

	// Duration is the whole battery's, setup and settling included.
	Duration time.Duration `json:"duration_ns"`
}

// Where renders the windows drops happened in, e.g.
// "roll svc-1/svc-4/svc-5: svc-1 (12 drops, 1 dead endpoint)".
func (r Result) Where() string {
	if len(r.Windows) == 0 {
		return ""
	}
	byPhase := map[string][]Window{}
	var order []string
	for _, w := range r.Windows {
		if _, ok := byPhase[w.Phase]; !ok {
			order = append(order, w.Phase)
		}
		byPhase[w.Phase] = append(byPhase[w.Phase], w)
	}
	// Phases in battery order, services in name order.
	idx := func(name string) int {
		return slices.IndexFunc(r.Phases, func(p PhaseResult) bool { return p.Name == name })
	}
	slices.SortFunc(order, func(a, b string) int { return cmp.Compare(idx(a), idx(b)) })
	var parts []string
	for _, ph := range order {
		ws := byPhase[ph]
		slices.SortFunc(ws, func(a, b Window) int { return cmp.Compare(a.Service, b.Service) })
		var svcs []string
		for _, w := range ws {
			s := fmt.Sprintf("%s (%d", w.Service, w.Drops)
			if w.DeadEndpoints > 0 {
				s += fmt.Sprintf(", %d dead endpoint%s", w.DeadEndpoints, plural(w.DeadEndpoints))
			}
			if w.NoneFound > 0 {
				s += fmt.Sprintf(", %d none found", w.NoneFound)
			}
			if w.WrongPicks > 0 {
				s += fmt.Sprintf(", %d wrong picks", w.WrongPicks)
			}
			svcs = append(svcs, s+")")
		}
		parts = append(parts, ph+": "+strings.Join(svcs, ", "))
	}
	return strings.Join(parts, "; ")
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// Summary is a few lines for logs: per phase, the totals and the windows.
func (r Result) Summary() string {
	var b strings.Builder
	for _, p := range r.Phases {
		fmt.Fprintf(&b, "phase %-26s %8v  resolutions %9d  %s\n", p.Name, p.Duration.Round(time.Millisecond), p.Resolutions, p.Tally)
	}
	fmt.Fprintf(&b, "%s (--sync-interval %v, drain period %v): %d resolutions, %s; battery %v\n",
		r.Config.Mode(), r.Config.SyncInterval, r.Config.DrainPeriod, r.Resolutions, r.Tally, r.Duration.Round(time.Millisecond))
	fmt.Fprintf(&b, "register reached every client: %s\ndrain reached every client:    %s\n", r.RegisterPropagation, r.DrainPropagation)
	if w := r.Where(); w != "" {
		fmt.Fprintf(&b, "drops in: %s\n", w)
	}
	for _, s := range r.Samples {
		fmt.Fprintf(&b, "  e.g. %s\n", s)
	}
	return b.String()
}
