package bench

import (
	"fmt"
	"strings"
)

// replicationMarkdown renders the "Multi-region replication" section.
func (r Report) replicationMarkdown(b *strings.Builder) {
	res := r.Replication
	fmt.Fprintf(b, "### Multi-region replication (last run %s)\n\n", r.Date)
	fmt.Fprintf(b, "- Machine: %s\n- Command: `%s`\n", r.Machine, r.Command)
	if res.EtcdctlVersion != "" {
		fmt.Fprintf(b, "- make-mirror: etcdctl %s, built by the harness from `tools/etcdctl` (go.etcd.io/etcd/etcdctl/v3)\n", strings.TrimPrefix(res.EtcdctlVersion, "etcdctl version: "))
	}
	b.WriteString("\n")
	if len(res.Runs) == 0 {
		b.WriteString("No runs.\n")
		return
	}
	r0 := res.Runs[0]
	fmt.Fprintf(b, "**Setup.** Two embedded etcds on loopback, one per region (`%s`, `%s`), fresh for each tool. The tool copies `%s`'s subtree `/aether/v1/regions/%s/` into `%s`'s etcd, reaching `%s` through a user-space TCP fault proxy (the same for every tool); the harness's watchers and writers talk to both etcds directly. ",
		replOrigin, replPeer, replOrigin, replOrigin, replPeer, replPeer)
	fmt.Fprintf(b, "The aether replicator runs in-process (`replicator.Replicator`, default batching: up to %d operations per Txn); make-mirror runs as its own process with `--max-txn-ops 128`, restarted a second after any exit as a supervisor would.\n\n", 128)
	fmt.Fprintf(b, "**Burst.** %d changes (%d puts of real endpoint records, %d bytes each on average as `registry.EncodeEndpoint` writes them; %d deletes of earlier endpoints; one change in ten updates a live endpoint) by %d concurrent writers as fast as the origin etcd takes them (the rate is in the table: the mirror shares the machine's cores with both etcds and the writers). ",
		r0.BurstChanges, r0.BurstPuts, r0.AvgValueB, r0.BurstDeletes, r0.BurstWriters)
	b.WriteString("**Lag** of a change is the time a watcher on the peer etcd first shows it (or a later change of the same key: a mirror may coalesce puts of one key) minus the earliest evidence that the origin committed it (the Put or Delete returning, or a watcher on the origin seeing it). **Burst convergence** runs from the burst's last commit until the peer's copy equals the origin's subtree, keys and values.\n\n")
	if r0.PartitionSec > 0 {
		fmt.Fprintf(b, "**Partition.** The proxy then blackholes the peer (no resets: connections go silent, as in a real partition) for %.0f s while the origin takes one writer's changes at a steady %d/s; **convergence after heal** runs from the heal until the peer's copy equals the origin's subtree again, keys and values (checked by the peer watcher, confirmed by reading both etcds). ",
			r0.PartitionSec, r0.PartitionRate)
		b.WriteString("The replicator's keys live on the peer under its origin lease: a partition longer than the lease TTL expires them there (that is the design: a region that stops heartbeating disappears from its peers), and the heal then restores them by a full sync; a lease TTL longer than the partition keeps them through it. During a long partition the replicator retries its peer with a backoff capped at min(lease TTL/3, 5 s), so convergence after heal is mostly what is left of that backoff when the heal comes, plus one full sync (a diff of both copies).\n\n")
	}
	b.WriteString("| tool | origin lease | burst changes (rate) | lag p50 | lag p99 | lag max | burst convergence | partition | convergence after heal |\n|---|---|---|---|---|---|---|---|---|\n")
	var notes []string
	for _, run := range res.Runs {
		lease := "none"
		if run.LeaseTTL != "" {
			lease = run.LeaseTTL
		}
		part, heal := "—", "—"
		if run.PartitionSec > 0 {
			part = fmt.Sprintf("%.0f s, %d changes", run.PartitionSec, run.PartitionChanges)
			heal = convergedCell(run.HealConvergedMs)
		}
		lagMissing := ""
		if run.LagMissing > 0 {
			lagMissing = fmt.Sprintf(" (%d never shown)", run.LagMissing)
		}
		if run.LagCoalesced > 0 {
			lagMissing += fmt.Sprintf(" (%d changes of keys created and deleted within one batch, so never shown: none lost)", run.LagCoalesced)
		}
		fmt.Fprintf(b, "| %s | %s | %d (%.0f/s) | %.2f ms | %.2f ms | %.2f ms%s | %s | %s | %s |\n",
			run.Tool, lease, run.BurstChanges, run.BurstRatePS, run.Lag.P50, run.Lag.P99, run.Lag.Max, lagMissing, convergedCell(run.BurstConvergedMs), part, heal)
		name := run.Tool
		if run.LeaseTTL != "" {
			name += " (lease " + run.LeaseTTL + ")"
		}
		if run.PeerEmptiedAfterMs > 0 {
			notes = append(notes, fmt.Sprintf("%s: the origin lease expired on the peer %.1f s into the partition and every key of `%s` went with it; %d keys were restored after the heal.", name, run.PeerEmptiedAfterMs/1000, replOrigin, run.KeysAtHeal))
		} else if run.PartitionSec > 0 && run.LeaseTTL != "" {
			notes = append(notes, fmt.Sprintf("%s: the keys outlived the partition on the peer; %d keys at heal.", name, run.KeysAtHeal))
		}
		if run.HealConvergedMs < 0 && run.PartitionSec > 0 {
			notes = append(notes, fmt.Sprintf("%s: never converged after the heal: the peer still held %d keys the origin had deleted and %d missing or different keys.", name, run.StaleKeys, run.OtherDiffs))
		}
		for _, e := range run.Exits {
			notes = append(notes, fmt.Sprintf("%s exited %s (restarted 1 s later).", name, e))
		}
	}
	if len(notes) > 0 {
		b.WriteString("\n")
		for _, n := range notes {
			fmt.Fprintf(b, "- %s\n", n)
		}
	}
	if res.MakeMirror != "measured" {
		fmt.Fprintf(b, "\netcdctl make-mirror: %s.\n", strings.TrimSuffix(res.MakeMirror, "."))
	}
	b.WriteString("\n**Why the lag differs.** make-mirror applies the origin's changes one Txn per origin revision, one Txn at a time, so under a burst of single-key writes it falls behind by its round trips; the replicator takes whatever its watch has queued (up to 1024 events) and writes it as Txns of up to 128 operations.\n")
	b.WriteString("\n**What make-mirror lacks.** Its copies carry no lease, so the keys of a region that dies stay on its peers for ever, where the replicator's expire one lease TTL after the origin stops heartbeating. It mirrors a delete only if it is running and watching when the delete happens: it has no tombstone reconciliation, so a restart re-copies the origin's current keys but never removes keys deleted meanwhile. And when its watch revision has been compacted it exits (`mvcc: required revision has been compacted`) and can only start over the same way, where the replicator's full sync is a diff that also deletes what the origin no longer has.\n")
}

func convergedCell(msv float64) string {
	if msv < 0 {
		return "never (see below)"
	}
	return fmt.Sprintf("%.0f ms", msv)
}
