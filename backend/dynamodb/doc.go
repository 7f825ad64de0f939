// Package dynamodb is the DynamoDB backend of the registry: a
// backend.Store with backend.Leases, and neither a Watcher (DynamoDB has
// no change feed a registrar can use: Streams keep 24 hours per shard and
// need a consumer per shard, and global tables replicate through them)
// nor a Digester. The registrar therefore syncs by polling List (its
// --sync-mode poll path, chosen by itself when a store has no Watcher),
// and its backstop takes full listings; both are cheap here because List
// is incremental.
//
// # Table
//
// One table, made by CreateTable (`aether dynamodb create-table`):
//
//   - hash key pk (string): the v1 key (registry.EndpointID.Key, origin
//     first, as on etcd) or a node record's key, which is the item's
//     identity; v (binary) is the serialized endpoint or node exactly as
//     the etcd backend stores it. Two more kinds of item live outside
//     registry.Root: "!meta" (the revision counter, the shard count, the
//     schema version) and "!lease/<id>" (leases, below).
//   - r (number): the revision the item's current version was written at;
//     h and w: its write stamp; pv and pr: the previous version's value
//     and revision, moved there by the same conditional update.
//   - s (number): the key's change shard, fnv32a(key) mod the table's
//     shard count (DefaultShards), fixed at create-table in the meta item.
//   - the global secondary index "changes": hash s, range r, all
//     attributes projected, so a poll reads changed values straight from
//     it.
//   - x: a tombstone's TTL attribute. A delete does not delete the item: it
//     removes v and keeps the stamp, at a new revision, so every poller
//     sees the deletion in the index and no write stamped before it can
//     bring the endpoint back (backend.Store's tombstone rule). DynamoDB's
//     TTL removes it at the earliest TombstoneTTL later (often much
//     later, which only keeps the rule longer).
//
// # Revisions
//
// A batch (one ApplyOrdered, in chunks of MaxPerRevision mutations) takes
// the next revision from the meta item's counter with one conditional
// UpdateItem (ADD r 1), then writes each
// mutation as an UpdateItem conditional on its stamp being newer than the
// item's (registry.CompareStamps: hlc, then writer). So revisions are
// per table and increase with every write, whichever replica makes it. A
// write that loses its condition reads the item (dynalite does not return
// it with the failure) and reports Superseded by it; a revision allocated
// to a batch of which nothing lands is simply never seen. The counter is
// one item written once per batch per replica: at the registrar's 100 ms
// batches, ten replicas are 100 writes/s, a tenth of what DynamoDB allows
// one item. Node heartbeats share one revision per replica for 200 ms, so
// they add at most five counter writes a second per replica, whatever
// the number of nodes.
//
// The batch does not go out as BatchWriteItem, which takes no condition
// expressions and so could not keep the newest stamp against another
// replica's concurrent write, nor as TransactWriteItems, where one failed
// condition cancels all 100 actions with it (and which dynalite lacks).
// Its mutations are independent by the contract, and DynamoDB bills write
// units per item either way; they go out WriteConcurrency at a time. The
// limits are the backend's own: a value over MaxValueBytes (so that value
// and previous value fit the 400 KB item) is refused in its own
// Outcome.Err and the rest of the batch is written. Throttling
// (ProvisionedThroughputExceededException, ThrottlingException) is retried
// by the client's retryer (NewRetryer: full-jitter backoff from 25 ms, no
// client-side retry quota); what still fails is left unsettled with an
// error marked backend.ErrUnavailable, which the registrar's write-behind
// retries under a new revision: nothing acknowledged is lost.
//
// # The incremental poll, and the window
//
// List keeps a mirror of the table. The first List is a consistent Scan;
// every later one reads the counter (c), then Queries each shard of the
// changes index for r > cursor, merges what it reads (a version replaces
// the mirror's only if its revision is higher) and returns the mirror cut
// at c. An idle poll reads no item: one GetItem and one Query per shard.
// A full Scan runs every FullScanEvery as the backstop.
//
// The hazard of any allocate-then-write sequence is the poller that reads
// revision 12 before revision 11, allocated earlier by a slower writer,
// has landed: a cursor moved to 12 would skip 11 for ever. (The index is
// also only eventually consistent.) The answer here is the settle window
// W (Window, default 4 s), used on both sides with each side's own
// monotonic clock, so no two clocks are compared:
//
//   - A writer notes the time before it allocates a revision and gives
//     every write under it until W/2 after that; a write not done by then
//     fails, and its retry gets a new revision.
//   - A poller records each counter reading c with the time its answer
//     arrived. Every revision up to c was allocated before that time, so
//     W later each has landed (W/2) and reached the index (the other W/2,
//     far more than the index's usual sub-second lag). The cursor is the
//     newest reading at least W older than the previous poll's, so every
//     revision at or below it had reached the index before the previous
//     poll read it: a poll costs the changes of its interval plus W, not
//     the table. (At least W older than now would not do: with polls
//     further apart than W, the previous poll's own reading qualifies,
//     and a write allocated just before that poll and landing just after
//     it read the index would be skipped until the full scan.)
//
// What the window cannot bound is a request that the server applies
// after its client gave up on it (SigV4 lets a signed request be
// replayed for up to 5 minutes) or an index lagging more than W/2; the
// full Scan repairs either within FullScanEvery. The very first Scan has
// no reading a window old behind it, so one more Scan runs a window
// after it.
//
// A listing is cut at c using each item's two versions: a version
// written above c is replaced by the previous one if that was at or
// below c; a key written twice above c makes List poll again. So writes
// that land while a poll pages never smear the listing across revisions,
// except for writes allocated at or below c and still in flight (the
// window), which the next poll brings. For the Store's own writes even
// that does not happen: it knows which of its revisions are in flight
// (allocations pause while a listing reads the counter, so none is missed)
// and cuts its listings just below the oldest. Otherwise a registrar that
// has flushed a write and sees a listing at a later revision without it
// would take it for overwritten, and flap the endpoint until the next
// poll; another replica's write in flight is merely not shown yet.
//
// GetAt answers from the same two versions and reports a key written
// twice since the revision asked as backend.ErrCompacted. There is no
// Compact: history is forgotten by being overwritten.
//
// # Node liveness
//
// DynamoDB does not expire items on time, so Leases are items: a lease
// carries its expiry (le) and granted TTL, only KeepAliveOnce extends it
// (conditionally on it not having lapsed), and a node record names its
// lease. Every replica applies one rule to what it has read: a node whose
// lease is missing or past its expiry is gone, and List leaves it out.
// Reap (the registrar's server runs it after each poll) ends every lease
// its mirror saw lapse with an UpdateItem conditional on the expiry it
// saw: a heartbeat that landed meanwhile changed it, and wins. The rule
// compares an expiry written by one machine's clock with another's; the
// TTL must dwarf the clock skew (with the registrar's default 30 s node
// TTL, skew of a second or two is what NTP keeps).
//
// # Peer-watch membership
//
// backend.Members rides on the same leases (members.go): the member
// records of a (region, cluster) are attributes of one item,
// "!members/<region>/<cluster>", each naming its lease, so listing them is
// one consistent GetItem and a BatchGetItem of the leases, not a Scan (the
// table has no sort key). A member is live while its lease is; a record
// whose lease has ended is removed by the next listing, conditionally on
// it still naming that lease. The item has no revision or shard, so the
// changes index never holds it and no listing of the registry shows it.
package dynamodb
