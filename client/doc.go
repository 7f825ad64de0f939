// Package client is the library an agent uses to talk to registrars: it
// keeps a local, always-readable cache of the endpoints the agent watches and
// a durable-until-acknowledged queue of the agent's own writes.
//
// # Reads
//
// The cache is fed by one bidirectional Subscribe stream. It is published as
// an immutable snapshot behind an atomic pointer, copied on write per
// service, so a read of a cached service is an atomic load and a map lookup
// and never takes a lock. Slices and endpoints handed out are shared with
// every other reader: callers must not modify them.
//
// Until the stream has delivered its first snapshot, and for services the
// client does not subscribe to, reads fall back to the ListAllEndpoints RPC
// (trying each registrar in turn). While every registrar is unreachable the
// cache keeps serving what it last knew; CacheAge says for how long.
//
// # Writes
//
// Register, Unregister and Drain validate locally, apply the change to the
// cache at once (the agent reads its own writes immediately and OnChange
// fires) and return. One writer goroutine sends queued writes in order,
// coalescing per endpoint (the latest intent wins), and retries with
// backoff until a registrar acknowledges. Permanent rejections (see
// Permanent, and NotFound for Drain) drop the write, log and count it, and the cache reverts
// to what the registrar reported; NotFound for Unregister is success. An
// Unregister names the node it removes the endpoint for (owner_node): the
// node the endpoint was registered for, by default Config.Node. A registrar
// refuses to remove an endpoint of a live node for anyone else.
//
// # Node calls
//
// AnnounceNode, Heartbeat and LeaveNode keep the client's node
// (Config.Node) alive on the same connections as the stream and the
// writes: each call goes to the registrar the stream uses and, while that
// one cannot be reached, to each other one, so an agent holds one
// connection per registrar and follows one failover cursor. They are not
// retried beyond that; Permanent, the rule the writer uses, says whether
// retrying could help.
//
// # Re-assertion: the owner restores what it owns
//
// An acknowledgement means the write is in the registrar's snapshot, not
// yet persisted: a registrar that crashes before its write-behind flush
// comes back without it. So the client keeps its own registrations as
// acknowledged, and whenever the registrar's state it sees (a snapshot
// after a reconnect or a registrar restart, a SERVICES_SNAPSHOT, an event
// it did not ask for) lacks one or differs from it, it registers it again,
// through the writer (with its retries and backoff), and counts it
// (agent_registrar_reasserted_total, Reasserted). The rule:
//
//   - Presence and attributes (registry.SameAttributes: timestamps and
//     write stamps aside) are re-asserted while the client's intent
//     stands.
//   - A DRAINING set by someone else (an operator's drain) while the
//     client's intent is SERVING is respected: it holds until the client
//     registers the endpoint again on its own (for an agent, a changed
//     endpoints file or a restart). An intent of DRAINING (the client's
//     own Drain) is re-asserted as DRAINING.
//   - The client's Unregister ends the intent: nothing is re-asserted
//     after it. A write the registrar rejects for good ends it too.
//   - Only endpoints of the services the client watches are compared.
//
// An operator removes an agent's endpoint by changing the agent's
// configuration (the agent drains and removes it) or by stopping the
// agent; the registrar refuses a removal of a live node's endpoint from
// anyone but that node, so it cannot be undone behind the operator's back.
//
// # Invariants
//
//   - The cache is always the registrar's state (as of the last version the
//     stream delivered) overlaid with the agent's own writes that are not yet
//     settled. A write stays in the overlay until acknowledged and then until
//     the stream has caught up with it (the stream passed the write's
//     version, or shows the written state, or settleTimeout passed), so
//     neither a snapshot nor the gap between an acknowledgement and its
//     event ever reverts the agent's own write.
//   - OnChange is called from one goroutine, in order, with exactly the
//     changes of the cache (the watched services, the agent's own writes
//     included): a consumer that applies every Change holds what
//     AllEndpoints returns once synced. Subscribing reports the new
//     service's endpoints as added, unsubscribing reports them removed, and
//     a write the registrar rejects is reported reverted. In particular a
//     FULL_SNAPSHOT after a reconnect is diffed against the cache, so a
//     consumer sees the changes it missed and nothing else, even when the
//     registrar restarted (new epoch) and could not resume the stream.
//   - Changes whose only difference is the registrar's timestamps are not
//     changes (registry.SameAttributes).
//   - The stream resumes from the last version it delivered (an event's or
//     a PROGRESS bookmark's), and only for the services the cache holds as of
//     that version; services subscribed since are added on the new stream and
//     arrive as SERVICES_SNAPSHOTs. So a resumed stream can never leave a
//     service half-filled.
//   - A client watches either all services (Config.Services empty) or a
//     non-empty set of services; the set can change at run time, on the live
//     stream, but never to "all" or to nothing, because an empty service
//     list means "all" on the wire. With Config.OnlySubscribed the set may
//     be empty: the client then holds no stream at all until a service is
//     subscribed, and ends its stream when the last one is unsubscribed.
//
// Nothing here is global: metrics go to the Config's Registerer, logs to its
// Logger, and several clients can live in one process.
package client
