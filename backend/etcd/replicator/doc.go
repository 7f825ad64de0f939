// Package replicator mirrors a region's authoritative registry subtree,
// /aether/v1/regions/<self>/, verbatim into every peer region's etcd (seed
// 002, Phase 2). It runs inside the registrar, leader-elected among the
// region's registrar replicas on the local etcd, so one instance per region
// writes to the peers at a time.
//
// # How it works
//
// Run campaigns in an etcd election on the local etcd (a concurrency.Session
// with a short TTL, SessionTTL). While it leads, it runs one independent loop
// per peer, so a slow or cut peer never stalls the others. A peer loop runs
// "peer sessions", each of which:
//
//  1. checks that the peer is not the local etcd (HomeKey) and claims the
//     peer for this leadership by writing FenceKey(self) on the peer;
//  2. makes sure it holds a live lease on the peer (the origin-heartbeat
//     lease: granted on the peer with LeaseTTL, kept alive every TTL/3 by a
//     keepalive loop that outlives peer sessions);
//  3. full-syncs: a merge-join of the local subtree (paged, pinned at one
//     local revision R) against the peer's copy (paged, pinned at one peer
//     revision) that puts every key that is missing, has another value or is
//     attached to another lease, and deletes every key the origin no longer
//     has, in fenced Txns of at most MaxTxnOps operations;
//  4. watches the local subtree from R+1 and applies each watch response
//     (plus whatever further responses are already queued) as fenced Txns of
//     at most MaxTxnOps operations: Put→Put with the peer lease attached,
//     Delete→Delete.
//
// # Wiring
//
// The registrar builds a Replicator only when its backend is etcd and
// --peer-etcd was given: Peers from ParsePeers(--region, --peer-etcd
// values), Local the registrar's own clientv3 client, LeaseTTL from
// --replication-lease-ttl, Identity its advertised address, Registerer its
// metrics registry; then it runs Run in the background for its lifetime.
// Status is in-process and cheap (no I/O): `aether replication status`
// needs it served by the registrar. Only the leader reports mirror state;
// other replicas report who the leader is.
//
// Bookkeeping keys, all outside registry.Root: the election under
// DefaultElectionPrefix(region) and HomeKey(region) in the local etcd, and
// FenceKey(region) in each peer (a few bytes, never deleted).
//
// # Invariants
//
//   - Only the local region's own subtree is ever read for mirroring, and only
//     that same subtree is ever written on a peer (plus the one FenceKey).
//     Another region's subtree is never watched, so mirrored-in keys can never
//     be mirrored on: there are no loops by construction.
//   - Every mirrored Put carries the peer's current origin lease, and every
//     full sync compares the lease as well as the value, so after a sync every
//     key of our subtree on the peer is attached to exactly our live lease. If
//     this region stops heartbeating (all replicas down, or the link cut for
//     longer than the TTL), every one of its keys expires on that peer at the
//     same time.
//   - Peer leases are never revoked: not on shutdown, not on losing
//     leadership. A successor re-attaches the keys under its own lease in its
//     initial sync, which must finish within the predecessor's remaining TTL
//     (at least 2/3 of LeaseTTL after its last keepalive; see SessionTTL).
//   - Every write to a peer is a Txn guarded by
//     ModRevision(FenceKey(self)) == the revision at which this peer session
//     claimed the fence. A new peer session (of this or any replica) re-claims
//     the fence, so a write from a deposed leader, or a stale write of an
//     earlier session of our own that a partition delayed, fails instead of
//     re-attaching a key to a lease nobody keeps alive or regressing a value.
//     Claims are ordered by leadership epoch (the creation revision of the
//     leader's election key); a loop that finds a newer epoch on a peer steps
//     the whole replica down, unless the local election says it still leads
//     (a restored or rebuilt local etcd rewinds revisions), in which case it
//     takes the fence over.
//   - Resume versus resync: after any failure on the peer side (an RPC error,
//     a fenced Txn, a lost lease) the next peer session runs a full sync; it
//     is a diff, so it rewrites only what differs, and it is the only way to
//     be sure of the peer's state after an outage of unknown extent (expired
//     lease, a restored peer, an unknown-outcome Txn). A failure on the local
//     side only (the local watch ended while the peer stayed healthy) resumes
//     the watch from the last mirrored revision + 1: nobody but this peer
//     session (fenced) wrote the peer meanwhile and the lease is alive (the
//     keepalive loop aborts the session otherwise), so the peer still equals
//     the local subtree at that revision. If that revision has been
//     compacted, the session ends and the next one full-syncs.
//   - LastMirroredRevision only advances after every Txn of a batch
//     committed, so a retry replays from a point the peer is known to have
//     reached; all writes are unconditional puts and deletes of whole keys,
//     so replaying is harmless. A batch split across Txns is not atomic on
//     the peer: peers are eventually consistent, not snapshot-consistent.
//   - A Txn never touches a key twice (etcd refuses that): a batch keeps only
//     the last event per key.
package replicator
