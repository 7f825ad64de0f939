package console

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"time"

	"github.com/aethermesh/aether/authz"
	"github.com/aethermesh/aether/xds"
)

//go:embed assets
var assets embed.FS

// Paths the console serves under.
const (
	// Path is the page; everything else is under Path + "/".
	Path = "/ui"
	// OverviewPath is the overview's JSON: what `aether status` reads.
	OverviewPath = Path + "/api/overview"
)

// Handler serves the page, its assets, its JSON API and its event stream
// under Path. Mount it at Path and Path + "/".
func (c *Console) Handler() http.Handler {
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Path+"/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET "+Path+"/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, static, "index.html")
	})
	mux.Handle("GET "+Path+"/static/", http.StripPrefix(Path+"/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET "+OverviewPath, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, c.overview())
	})
	mux.HandleFunc("GET "+Path+"/api/services", func(w http.ResponseWriter, r *http.Request) {
		eps, version, err := c.cfg.Registrar.List(nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		writeJSON(w, struct {
			Version  string           `json:"version"`
			Services []ServiceSummary `json:"services"`
		}{version, services(eps, r.URL.Query().Get("q"))})
	})
	mux.HandleFunc("GET "+Path+"/api/services/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		eps, version, err := c.cfg.Registrar.List([]string{name})
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest) // a malformed service name
			return
		}
		sum := ServiceSummary{Name: name, Localities: []Locality{}}
		if s := services(eps, ""); len(s) == 1 {
			sum = s[0]
		}
		writeJSON(w, struct {
			Version   string         `json:"version"`
			Service   ServiceSummary `json:"service"`
			Endpoints []Endpoint     `json:"endpoints"`
		}{version, sum, endpoints(eps, c.cfg.Registrar.Now())})
	})
	mux.HandleFunc("GET "+Path+"/api/nodes", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, struct {
			Nodes []Node `json:"nodes"`
		}{c.nodes(r.Context())})
	})
	mux.HandleFunc("GET "+Path+"/api/xds", func(w http.ResponseWriter, r *http.Request) {
		doc := struct {
			Enabled bool               `json:"enabled"`
			Clients []xds.ClientStatus `json:"clients"`
		}{Clients: []xds.ClientStatus{}}
		if c.cfg.XDS != nil {
			doc.Enabled, doc.Clients = true, append(doc.Clients, c.cfg.XDS()...)
		}
		writeJSON(w, doc)
	})
	mux.HandleFunc("GET "+Path+"/api/events", c.events)
	return c.guard(mux)
}

// guard makes the console read-only and, with authorization on, an
// operator's: the HTTP port verifies a client certificate when one is
// given (and asks for none otherwise, for probes and scrapers), so the
// console checks here that one was given and names an operator.
func (c *Console) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			http.Error(w, "the console is read-only: GET and HEAD only", http.StatusMethodNotAllowed)
			return
		}
		if a := c.cfg.Authz; a != nil {
			if code, msg := operatorOnly(r, a); code != 0 {
				http.Error(w, msg, code)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// operatorOnly admits a request whose TLS connection carries a client
// certificate the handshake verified, naming an operator; otherwise it
// returns the status and message of the refusal.
func operatorOnly(r *http.Request, a *Authz) (int, string) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
		return http.StatusUnauthorized, fmt.Sprintf("401 unauthenticated: the console needs a client certificate of an operator of trust domain %q (aether certs issue --operator NAME); none was presented", a.TrustDomain)
	}
	id, err := authz.ParseIdentity(r.TLS.VerifiedChains[0][0], a.TrustDomain, a.OperatorPrefix)
	if err != nil {
		return http.StatusUnauthorized, "401 unauthenticated: client certificate rejected: " + err.Error()
	}
	if id.Kind != authz.Operator {
		return http.StatusForbidden, fmt.Sprintf("403 forbidden: the console is for operators; %s is not one", id)
	}
	return 0, ""
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// rates is what a "rate" event carries: the events per second and the
// propagation latencies.
func (c *Console) rates() any {
	now := c.cfg.Registrar.Now()
	return struct {
		EventsSummary
		Propagation PropagationSummary `json:"propagation"`
	}{c.rate.summary(now), c.lat.summary(now)}
}

// rateEvery is how often an event stream sends the events per second.
const rateEvery = time.Second

// changeGap is the least time between two change notices to one page.
const changeGap = 250 * time.Millisecond

// events is the page's live feed (server-sent events): "change" whenever
// the replica's event stream delivered something (the page then re-reads
// what it shows), and "rate" every second with the events per second of
// the last RateWindow seconds. While any is open the console holds its
// subscription to the replica (see Console).
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	ch := c.hub.add()
	defer c.hub.remove(ch)
	c.join()
	defer c.leave()
	tick := time.NewTicker(rateEvery)
	defer tick.Stop()
	send := func(event string, v any) bool {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return false
		}
		fl.Flush()
		return true
	}
	// The browser reconnects by itself after 1s when the stream drops.
	fmt.Fprint(w, "retry: 1000\n\n")
	if !send("change", struct{}{}) ||
		!send("rate", c.rates()) {
		return
	}
	// Each change notice makes the page re-read its view, which lists the
	// snapshot: under churn they are spaced by changeGap, the last change
	// always followed by a notice.
	var hold <-chan time.Time
	pending := false
	for {
		select {
		case <-r.Context().Done():
			return
		case <-c.done:
			return
		case <-ch:
			if hold != nil {
				pending = true
				continue
			}
			if !send("change", struct{}{}) {
				return
			}
			hold = time.After(changeGap)
		case <-hold:
			hold = nil
			if pending {
				pending = false
				if !send("change", struct{}{}) {
					return
				}
				hold = time.After(changeGap)
			}
		case <-tick.C:
			if !send("rate", c.rates()) {
				return
			}
		}
	}
}
