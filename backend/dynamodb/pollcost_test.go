package dynamodb

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/aethermesh/aether/backend"
)

var (
	pollCostEndpoints = flag.Int("pollcost.endpoints", 0, "run TestPollCost with this many endpoints (e.g. 100000); 0 skips it")
	pollCostWrite     = flag.String("pollcost.write", "", "rewrite the DynamoDB poll cost section of this file (docs/benchmarks.md) with the results")
)

// TestPollCost measures what one List reads at scale: the full scan, an
// idle incremental poll, and polls every 1 s and 5 s (the registrar's
// default --sync-interval) while a writer changes 100 endpoints a second
// in 100 ms batches, as the write-behind would. It is a measurement, not
// a check (docs/benchmarks.md, "DynamoDB poll cost"), so it runs only
// when asked: go test -run TestPollCost ./backend/dynamodb/ -args -pollcost.endpoints=100000
func TestPollCost(t *testing.T) {
	n := *pollCostEndpoints
	if n == 0 {
		t.Skip("a measurement: -args -pollcost.endpoints=N runs it")
	}
	start := time.Now()
	cli := startDynalite(t)
	table := newTable(t, cli, DefaultShards)
	w := open(t, cli, table, Options{Window: DefaultWindow})
	loadStart := time.Now()
	seed(t, cli, table, w, n)
	t.Logf("loaded %d endpoints in %v", n, time.Since(loadStart).Round(time.Second))

	var c clock
	s := open(t, cli, table, Options{Window: DefaultWindow, Now: c.Now})
	row := func(what string, st PollStats) string {
		return fmt.Sprintf("| %s | %d | %d | %d KB | %.1f | %.1f |", what, st.Requests, st.Items, st.Bytes>>10, st.Billed, st.Capacity)
	}
	var rows []string
	scanStart := time.Now()
	listOf(t, s)
	full, _ := s.LastPoll()
	rows = append(rows, row(fmt.Sprintf("full scan (%v)", time.Since(scanStart).Round(time.Millisecond)), full))
	c.Advance(2 * DefaultWindow)
	listOf(t, s) // the second scan a window after the first
	c.Advance(2 * DefaultWindow)
	idleStart := time.Now()
	listOf(t, s)
	idleTook := time.Since(idleStart)
	idle, _ := s.LastPoll()
	rows = append(rows, row(fmt.Sprintf("incremental poll, idle (%v, the listing of %d included)", idleTook.Round(time.Millisecond), n), idle))

	for _, every := range []time.Duration{time.Second, 5 * time.Second} {
		ctx, cancel := context.WithCancel(context.Background())
		var landed atomic.Int64
		churnStart := time.Now()
		done := make(chan struct{})
		go func() {
			defer close(done)
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			// Each tick writes what the rate owes since the start, so a
			// slow batch is made up by the next (a write-behind batches
			// whatever queued meanwhile).
			written := 0
			for gen := uint64(200); ; gen++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				owed := min(int(time.Since(churnStart).Seconds()*100)-written, 100)
				var muts []backend.Mutation
				for k := range owed {
					i := (written + k) * 7919 % n
					muts = append(muts, put(ep(fmt.Sprintf("svc-%d", i/100), i, fmt.Sprintf("n-%d", gen), gen)))
				}
				written += owed
				if len(muts) == 0 {
					continue
				}
				outs, err := w.ApplyOrdered(ctx, muts)
				if err != nil && ctx.Err() == nil {
					if !errors.Is(err, backend.ErrUnavailable) {
						t.Errorf("churn: %v", err)
					}
					// Unsettled on a loaded machine (past the settle
					// window): the rate below counts what landed.
					t.Logf("churn: %v", err)
				}
				for _, o := range outs {
					if o.Landed {
						landed.Add(1)
					}
				}
			}
		}()
		var sum PollStats
		const polls = 4
		for p := 0; p < polls+1; p++ {
			time.Sleep(every) // the poll interval being measured, not a wait for a condition
			listOf(t, s)
			st, _ := s.LastPoll()
			if p == 0 {
				continue // the first poll after idling spans the idle gap
			}
			sum.Requests += st.Requests
			sum.Items += st.Items
			sum.Bytes += st.Bytes
			sum.Billed += st.Billed
			sum.Capacity += st.Capacity
		}
		cancel()
		<-done
		rate := float64(landed.Load()) / time.Since(churnStart).Seconds()
		avg := PollStats{Requests: sum.Requests / polls, Items: sum.Items / polls, Bytes: sum.Bytes / polls, Billed: sum.Billed / polls, Capacity: sum.Capacity / polls}
		rows = append(rows, row(fmt.Sprintf("incremental poll every %v, %.0f changes/s (mean of %d)", every, rate, polls), avg))
	}
	md := "| List | requests | items read | bytes read | read units (AWS pricing) | read units (dynalite reported) |\n|---|---|---|---|---|---|\n" + joinLines(rows)
	t.Logf("\n%s", md)
	if *pollCostWrite != "" {
		writeSection(t, *pollCostWrite, n, start, md)
	}
}

// writeSection replaces the DynamoDB poll cost section of the benchmarks
// document, between its markers (appended if absent).
func writeSection(t *testing.T, path string, n int, start time.Time, table string) {
	load, _ := os.ReadFile("/proc/loadavg")
	body := fmt.Sprintf(`%s
### DynamoDB: read cost of a poll (last run %s UTC)

Command: `+"`go test -run TestPollCost ./backend/dynamodb/ -args -pollcost.endpoints=%d -pollcost.write=$PWD/docs/benchmarks.md`"+`
(dynalite 4.0.0 on loopback; %d CPUs, load average %s at the end). One table of %d endpoints
(%d change shards, the default), seeded in bulk; one Store lists it: the full scan (the first
listing, and the backstop every 5 minutes), an idle incremental poll, and polls every 1 s and 5 s
(the registrar's default --sync-interval) while a writer changes about 100 endpoints a second in
100 ms batches. *Read units (AWS pricing)* applies DynamoDB's rule to the bytes read (per request:
rounded up to 4 KB, at least one unit, half for the index's eventually consistent reads; the
counter read is one); dynalite's own report, beside it, leaves out empty Queries and takes the
consistent Scan as eventually consistent.

%s
A poll reads the changes above its cursor, the newest counter reading at least the settle window
(4 s, backend/dynamodb's package doc) older than the previous poll's: polling every second it
reads about 5 s of changes, every 5 s the last 10 to 15 s. That overlap is what a poll pays for
never skipping a write that landed late (a cursor only a window older than now skipped, with polls
5 s apart, a write that landed just after the previous poll read the index). Idle, a poll is the counter read and one empty Query per
shard. Per hour at the 5 s interval the polls come to about 720 times the 5 s row, and the
backstop's 12 full scans to 12 times the first row: at this size the backstop, not the poll, is
most of the read bill. A writer row below 100 changes/s is dynalite saturating on a shared
2-core machine, not the rate asked.
%s`, beginMarker, start.UTC().Format("2006-01-02 15:04"), n, runtime.NumCPU(), strings.Fields(string(load) + " ?")[0], n, DefaultShards, table, endMarker)
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	doc := string(old)
	if i, j := strings.Index(doc, beginMarker), strings.Index(doc, endMarker); i >= 0 && j > i {
		doc = doc[:i] + body + doc[j+len(endMarker):]
	} else {
		doc = strings.TrimRight(doc, "\n") + "\n\n" + body + "\n"
	}
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatalf("writing %s: %v", path, err)
	}
}

const (
	beginMarker = "<!-- bench:dynamodb-poll:begin -->"
	endMarker   = "<!-- bench:dynamodb-poll:end -->"
)

// seed fills the table with n endpoints as a bulk import would: items of
// the backend's shape, all at one revision, by BatchWriteItem (25 a
// request, unprocessed items sent again), since writing them one by one
// through ApplyOrdered takes dynalite minutes per ten thousand.
func seed(t *testing.T, cli *ddb.Client, table string, s *Store, n int) {
	ctx := ctxFor(t)
	rev, err := s.allocate(ctx)
	if err != nil {
		t.Fatalf("allocate: %v", err)
	}
	defer s.landed(rev)
	var reqs []types.WriteRequest
	flush := func() {
		for len(reqs) > 0 {
			out, err := cli.BatchWriteItem(ctx, &ddb.BatchWriteItemInput{RequestItems: map[string][]types.WriteRequest{table: reqs}})
			if err != nil {
				t.Fatalf("seed: %v", err)
			}
			reqs = out.UnprocessedItems[table]
		}
	}
	for i := range n {
		e := ep(fmt.Sprintf("svc-%d", i/100), i, "n1", 100)
		ps, _, err := backend.Prepare([]backend.Mutation{put(e)})
		if err != nil {
			t.Fatalf("prepare: %v", err)
		}
		key := ps[0].Key
		reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: map[string]types.AttributeValue{
			attrKey: str(key), attrValue: bin(ps[0].Value), attrRev: num(rev), attrShard: num(s.shardOf(key)),
			attrHLC: num(100), attrWriter: str(".w1"), attrPrevValue: str("-"), attrPrevRev: num(0),
		}}})
		if len(reqs) == 25 {
			flush()
		}
	}
	flush()
}

func joinLines(rows []string) string {
	out := ""
	for _, r := range rows {
		out += r + "\n"
	}
	return out
}
