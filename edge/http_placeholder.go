package edge

import (
	"encoding/json"
	"net/http"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// PLACEHOLDER until h-estore's edge/http.go lands (it owns the /metrics and
// /health handlers): mountHTTP is the one hook serve.go calls. Delete this
// file when merging theirs and have mountHTTP call their handlers.
func (s *Server) mountHTTP(mux *http.ServeMux) {
	mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		// etcd's /health body.
		body := map[string]string{"health": "true", "reason": ""}
		code := http.StatusOK
		if !s.Ready() {
			body = map[string]string{"health": "false", "reason": "edge: server not ready"}
			code = http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	})
}
