// Package grafana holds the Grafana dashboard of the discovery plane
// (aether.json) and, in its test, the check that every PromQL expression of
// the dashboard and of docs/alerts.yml names only metrics the aether binary
// exports. It has no code of its own.
package grafana
