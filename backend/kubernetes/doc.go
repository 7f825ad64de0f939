// Package kubernetes is the Kubernetes objects backend of the registry: it
// keeps the registry in a cluster's own API server as custom resources, so
// that a registrar inside Kubernetes needs nothing else to run.
//
// (Design notes in full follow with the store; see store.go, endpoints.go,
// watch.go.)
package kubernetes
