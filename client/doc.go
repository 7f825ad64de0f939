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
// backoff until a registrar acknowledges. Permanent rejections
// (InvalidArgument, PermissionDenied, FailedPrecondition, Unimplemented, and
// NotFound for Drain) drop the write, log and count it, and the cache reverts
// to what the registrar reported; NotFound for Unregister is success.
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
//     list means "all" on the wire.
//
// Nothing here is global: metrics go to the Config's Registerer, logs to its
// Logger, and several clients can live in one process.
package client
