// Package core is the pure core of the edge store (issue 15): the change
// model, the MVCC key space with etcd's request semantics, and the
// leases. It does no I/O, reads no clock (the time is an argument) and
// starts no goroutines; the edge package serialises calls into it and the
// storage package persists what it returns.
//
// # Changes
//
// Every mutating request (Put, DeleteRange, a Txn that may write, a lease
// grant, revoke or expiry) becomes exactly one Change: the replica's heads
// as parents, the replica id, a hybrid logical clock stamp and the resolved
// ops. Ops are resolved so replay never evaluates anything: a Txn's change
// carries the ops of the branch it took, a DeleteRange one delete per key
// that existed, a Put with ignore_value the value it kept, a revoke the
// deletes of the lease's keys (in key order) before the revoke op.
//
// A change's id is the SHA-256 of its canonical encoding (version 1):
//
//	byte     version (1)
//	uvarint  number of parents, then each parent's 32 bytes, sorted, distinct
//	uint64   replica id            (all fixed-width integers big-endian)
//	int64    stamp wall (unix ns)
//	uint32   stamp logical
//	uvarint  number of ops, then per op a kind byte and:
//	  1 put     uvarint len, key; uvarint len, value; int64 lease
//	  2 delete  uvarint len, key
//	  3 grant   int64 lease id; int64 ttl seconds
//	  4 revoke  int64 lease id
//
// Varints are minimal; DecodeChange refuses any other form, so decode then
// encode is the identity and ids cannot be forged by re-encoding.
//
// # Index and revision
//
// Each applied change gets the replica's next index (1, 2, ...). A change
// that touches keys also gets the next revision; one that does not (a
// lease grant, the revoke of a keyless lease, a Txn whose branch wrote
// nothing, a DeleteRange that matched nothing) gets none, as etcd does not
// bump its revision for them. As in etcd, revision 1 is the empty store,
// so the first write is revision 2, and CompactRev is -1 before the first
// compaction. Revisions are per replica: a change merged in from a peer
// (part 2) gets this replica's next revision, never one in the past.
// Revision <-> hash and index <-> hash are kept for every change since the
// last compaction (from the change that made the compaction revision on):
// like the values, the bookkeeping of history is bounded by compaction,
// and the hashes compaction keeps as applied by Collect.
//
// # Clock
//
// A local change's stamp is HLC.Next(now): the wall clock when it moved
// past the last stamp, else the last stamp with the logical counter
// bumped, so stamps strictly increase even when the wall clock steps back.
// A merged change advances the clock with HLC.Recv, so the next local
// stamp is after everything the replica has seen.
//
// # Conflict rule (part 2)
//
// Per key, the last writer wins, ordered by (stamp, replica id): a write w
// replaces the key's state iff (w.stamp, w.replica) > the key's winner
// (Winner). A delete is a tombstone ordered the same way: a delete wins
// over an older put, and an older put arriving later does not resurrect
// the key. Invariants:
//
//   - Every replica that applied the same set of changes, in any causal
//     order, has the same winner, hence the same value or absence, for
//     every key: the order is total (replica ids are distinct) and does
//     not depend on arrival order. HashKV, over keys and values only,
//     agrees across such replicas.
//   - Local writes always win locally: a replica's stamps increase, and
//     after Recv they exceed every stamp it has seen, so a change is never
//     shadowed by something its author had already seen (causality is
//     respected: a later write in happens-before order has a larger stamp).
//   - A merged change gets the next index and its place in the DAG
//     whatever happens; it gets a revision, and events, only if one of its
//     ops won. A losing write alters nothing a client sees.
//   - The ops of one change on one key share a stamp and are decided
//     together against the winner before the change.
//
// Merge implements the rule (and Replay re-decides merged changes the same
// way, in the same order, so recovery is exact). Open: a revoke merged in
// deletes the keys its granter saw attached, not keys attached here
// concurrently.
//
// # Chains
//
// A replica's changes form a chain: each is causally after the one before
// (its author had that one applied, so its heads descend from it), hence
// every replica applies them in chain order and with strictly increasing
// stamps. The state counts, per replica, the changes of its chain applied
// (Vector: the sync log's seq numbering, the k-th change of a replica has
// seq k), keeps the stamp of the last (a change at or before it is a
// duplicate, whether or not its hash is still kept) and the stamps of the
// changes not yet collected (StampOf), which turn a stable vector into
// stamp bounds.
//
// # Causal stability
//
// A change c is causally stable at replica i when every change i will
// receive from now on is causally after c. Then nothing concurrent with c
// can still arrive: a tombstone or winner that c decided can no longer be
// beaten by a late write, and no later change names as a parent any change
// c descends from except through c's descendants. The sync layer computes
// the stable point and hands it to Collect: per member k, the newest
// durable vector V_k that k reported and that is usable at i (V_k[k] <=
// i's count of k: i holds every change k had authored when it reported,
// and every later change of k is authored after k held V_k, hence
// causally after all of V_k); stable_i = i's durable vector ∧ the
// elementwise min of the usable V_k over every member that holds GC (one
// never heard from counts as zero). Every change still to come is
// authored by some member k, either already applied at i or authored
// after V_k, so it is causally after everything in stable_i: the min is
// what makes that hold for every author at once. stable_i is a prefix per
// chain (causally closed) and never ahead of Vector.
//
// A member past --peer-retention stops holding GC back (the sync layer's
// choice, as Cassandra's gc_grace_seconds): writes it made while away,
// concurrent with a delete that was collected meanwhile, may resurrect the
// key when it returns.
//
// Collect(stable) drops what stability makes irrelevant; a winner or JSON
// register (stamp, r) is stable iff stamp <= the stamp of r's stable[r]-th
// change:
//
//   - the hashes compaction dropped from the revision and index maps but
//     kept as applied (forgotten, for Merge's parent check) of changes
//     (r, seq) with seq < stable[r]: each member held r's stable[r]-th
//     change, a descendant of them, so none of them was a head of any
//     author since, and no later change names them; the stable[r]-th
//     itself may still be a head and stays;
//   - key records with no version left (compaction keeps a bytes key
//     whose last version was a tombstone, so a put concurrent with the
//     delete arriving after the compaction loses to the kept winner)
//     whose winner is stable: every later write on the key is causally
//     after the winner, so it has a larger stamp and wins with the record
//     or without it;
//   - in JSON documents, the assignments that only hid, or would have
//     hidden, assignments that can no longer arrive (merge_json.go's
//     deleted fields, assignments replaced under a later clear, whole
//     deleted documents), when every register involved is stable: every
//     later assignment is after them, so what a document shows, now and
//     after any later join, is unchanged.
//
// What Collect decided also holds for what compaction drops afterwards, so
// compaction and collection commute: replaying the log, compacting at the
// stored compaction revision and collecting at Collected() rebuilds the
// state. (A JSON key's Winner is informational, the registers decide its
// merges: it is not kept for GC.) Tombstones and Forgotten are the metrics
// of what is still kept.
//
// # Structured values
//
// Keys configured for JSON merge (SetValueMerge) merge field by field
// instead: their put ops carry a patch rather than the client's bytes, and
// Merge, Replay and the local write path join it into the key's document.
// merge_json.go states the rule, the encoding and the hooks.
//
// # Leases
//
// Lease ids a replica chooses are LeaseTag(replica)<<40 | sequence:
// positive int64s, distinct between replicas with distinct tags; a
// client-chosen id is honoured (ErrGRPCLeaseExist if taken). A lease
// expires by the clock of the replica that granted it (ExpireLeases only
// revokes this replica's), and its expiry is one change.
//
// # Use from the shell
//
//   - Calls are serialised (State is not safe for concurrent use).
//   - A write returns its Applied; persist Applied.Encoded with its Index
//     and Rev before acknowledging, publish Applied.Events to watchers. A
//     refused request returns an error and changes nothing.
//   - Responses carry a header with only Revision set; the shell adds
//     cluster, member and raft term. LeaseTimeToLive answers TTL -1 for an
//     unknown lease with no error, as etcd's gRPC layer does.
//   - Watch catch-up: Events(from, key, end) for from in [CompactRev, Rev]
//     (etcd cancels a watch only for start < compaction revision), with
//     PrevKv filled as etcd's watch fills it; drop PrevKv for watchers that
//     did not ask for it.
//   - Restart: Restore the last stored Snapshot (or New when there is
//     none), Replay every stored change after its index in index order,
//     Compact at the stored compaction revision if one was stored and it
//     is past the snapshot's, then PromoteLeases(now). CompactRev is -1
//     until the first compaction. Collect is not a change and is not
//     logged: a restarted replica holds more until the sync layer's next
//     Collect (or the shell's, at a stable point it stored), which answers
//     exactly the same; a Snapshot taken after a Collect keeps only what
//     was left.
//   - Snapshot transfer: MergeSnapshot of a peer's TransferSnapshot is a
//     state change with no change behind it (Applied has no Encoded and
//     Index 0): store a Snapshot of the result before anything else is
//     applied, or a crash loses the merge (the shell checkpoints under its
//     state lock).
//   - History is kept in memory until compacted (etcd keeps it on disk):
//     the shell should compact (etcd's --auto-compaction-*), or memory
//     grows with every write; and deleted keys' records, compacted
//     changes' hashes and the chains' stamps until Collect (the sync
//     layer's GC), or memory grows with every delete and every change.
//
// The state keeps the byte slices of the requests it applies (keys and
// values are not copied), and the events and responses it returns share
// them: neither side may modify them afterwards. Everything else returned
// (responses, events, KeyValues) is the caller's to change.
//
// Requests follow etcd v3.7.3's checks and apply code to the error value,
// header revision and quirk; see kv.go for the references.
package core
