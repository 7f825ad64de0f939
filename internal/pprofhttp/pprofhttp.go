// Package pprofhttp mounts Go's runtime profiles on a mux, for the
// servers' --enable-pprof (the registrar's and aether edge's, as etcd's).
package pprofhttp

import (
	"net/http"
	"net/http/pprof"
)

// Mount serves /debug/pprof/ on mux. The handlers are mounted one by one:
// importing net/http/pprof for its side effect registers them on
// http.DefaultServeMux, which no server here serves.
func Mount(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}
