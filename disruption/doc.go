// Package disruption is the disruption battery, which measures what a
// stale replica costs the callers who resolve through it: two registrar
// replicas on one etcd, writes through replica A, agent clients watching
// through replica B, continuous resolvers checking every resolution against
// ground truth while endpoints roll (surge, then two-phase drain),
// registrars restart, clients reconnect and services churn.
//
// Run runs one battery as Config describes and reports what the resolvers
// saw in a Result: resolutions and drops, per phase and per roll window.
// The package's test runs a short form in CI (0 drops with watch sync, and
// drops with poll-only sync, which proves the battery can fail);
// `aether bench --scenario disruption` runs it full length with both and
// writes the comparison to docs/benchmarks.md.
//
// Rolls are driven by the clock, as a Deployment's are: a new pod registers
// and becomes ready, an old one is drained, stays alive for the drain
// period, deregisters and dies. The harness never waits for a change to
// reach the clients before its next step, so a replica that learns of A's
// writes later than the drain period hands out dead endpoints.
//
// Files: truth.go is the ground truth (pods and their lives), writer.go the
// writes through A, cluster.go the etcd and the two registrars, resolver.go
// the resolvers and their drop accounting, battery.go the phases and rolls,
// result.go what a battery reports.
package disruption
