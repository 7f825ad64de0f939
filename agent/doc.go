// Package agent is the node agent behind "aether agent": one long-running
// process per node or appliance that announces the node, keeps its record
// alive, and keeps its endpoints registered.
//
// Invariants:
//
//   - The node is announced before any of its endpoints is registered, so a
//     registrar's ghost sweep never sees an endpoint of a node it does not
//     know.
//   - Liveness is the node's etcd lease, renewed by heartbeats through any
//     registrar in the list. A heartbeat answered NOT_FOUND means the lease
//     lapsed (the node was partitioned longer than the TTL and its endpoints
//     were swept): the agent announces again and re-registers everything.
//   - Everything the agent says to the registrars goes through one
//     client (package client): node calls, endpoint writes and the
//     watch of its own services share one connection per registrar, one
//     choice of registrar and one rule for which failures are retried.
//   - Endpoints leave in two phases: DRAINING first, so proxies stop sending
//     new requests, then removal after --drain-period. That holds for an
//     endpoint dropped from the endpoints file and for all of them on
//     SIGTERM, after which the node leaves and the agent exits 0.
//   - The agent owns its endpoints: its client re-asserts every one the
//     registrar's state lacks or has changed (a registrar that crashed
//     before persisting it, a removal the agent did not ask for), respecting
//     an operator's drain, and never one the agent removed itself (see
//     package client). Its own removals name its node (owner_node), the
//     only caller a registrar lets remove a live node's endpoint; the
//     node's health summary is its claim, and a registrar reports next to
//     it what it actually holds.
//   - With XDSAddr the agent's xDS serves its client cache and nothing
//     else (OnChange into the feed, see xds.go), so its proxies keep their
//     configuration while every registrar is down. Its watched set is its
//     own services plus those a connected xDS client names; a named
//     service leaves XDSLinger after the last client stops naming it, and
//     not while the cache could not fetch it back (no registrar reachable).
package agent
