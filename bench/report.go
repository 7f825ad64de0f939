package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"
)

// Options choose what Run measures.
type Options struct {
	Quick bool // small sizes, finishes in well under a minute
}

// Report is everything one run measured, with where and how.
type Report struct {
	Date        string            `json:"date"`
	Machine     string            `json:"machine"`
	Command     string            `json:"command"`
	Propagation PropagationResult `json:"propagation"`
	Writes      WritesResult      `json:"writes"`
}

// Run runs every scenario in turn, printing progress to w.
func Run(ctx context.Context, o Options, command string, w io.Writer) (Report, error) {
	pc := PropagationConfig{Changes: 5000, Interval: 2 * time.Millisecond}
	wc := WritesConfig{Registrations: 20000, Concurrency: 32}
	if o.Quick {
		pc = PropagationConfig{Changes: 500, Interval: 2 * time.Millisecond}
		wc = WritesConfig{Registrations: 2000, Concurrency: 16}
	}
	r := Report{Date: time.Now().UTC().Format("2006-01-02 15:04 MST"), Machine: machine(), Command: command}
	fmt.Fprintf(w, "propagation: %d registrations, one every %v, watchers on the same and on another replica...\n", pc.Changes, pc.Interval)
	var err error
	if r.Propagation, err = Propagation(ctx, pc); err != nil {
		return r, fmt.Errorf("propagation: %w", err)
	}
	fmt.Fprintf(w, "  same replica:  %s\n  cross replica: %s\n", r.Propagation.SameReplica, r.Propagation.CrossReplica)
	fmt.Fprintf(w, "writes: %d registrations, %d concurrent callers, write-behind vs direct etcd Put...\n", wc.Registrations, wc.Concurrency)
	if r.Writes, err = Writes(ctx, wc); err != nil {
		return r, fmt.Errorf("writes: %w", err)
	}
	fmt.Fprintf(w, "  write-behind: %.0f/s persisted (%.0f/s acknowledged, %d etcd revisions)\n  direct Put:   %.0f/s\n  speedup:      %.1fx\n",
		r.Writes.WriteBehindPS, r.Writes.AckPS, r.Writes.EtcdTxns, r.Writes.DirectPutPS, r.Writes.Speedup)
	return r, nil
}

// JSON is the report as one line.
func (r Report) JSON() string {
	b, _ := json.Marshal(r)
	return string(b)
}

const (
	beginMark = "<!-- bench:registrar:begin -->"
	endMark   = "<!-- bench:registrar:end -->"
)

// Markdown renders the report as the section of docs/benchmarks.md it owns.
func (r Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", beginMark)
	fmt.Fprintf(&b, "### Registrar core (last run %s)\n\n", r.Date)
	fmt.Fprintf(&b, "- Machine: %s\n- Command: `%s`\n\n", r.Machine, r.Command)
	p := r.Propagation
	fmt.Fprintf(&b, "**Propagation**: %d registrations through replica A at %.0f/s; latency from the RegisterEndpoint call to a watcher's receipt. Replica B shares A's etcd and learns of A's writes only through its etcd watch (after A's write-behind flush).\n\n", p.Changes, p.RatePerSec)
	b.WriteString("| path | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|\n")
	for _, row := range []struct {
		name string
		l    Latencies
	}{{"same replica (A → watcher on A)", p.SameReplica}, {"cross replica (A → etcd → watcher on B)", p.CrossReplica}} {
		fmt.Fprintf(&b, "| %s | %.2f ms | %.2f ms | %.2f ms | %.2f ms |\n", row.name, row.l.P50, row.l.P99, row.l.P999, row.l.Max)
	}
	wr := r.Writes
	fmt.Fprintf(&b, "\n**Write throughput**: %d registrations by %d concurrent callers, each mode against the same embedded etcd in the same run.\n\n", wr.Registrations, wr.Concurrency)
	b.WriteString("| mode | registrations/s |\n|---|---|\n")
	fmt.Fprintf(&b, "| registrar write-behind, until all persisted in etcd | %.0f |\n", wr.WriteBehindPS)
	fmt.Fprintf(&b, "| registrar write-behind, until all acknowledged | %.0f |\n", wr.AckPS)
	fmt.Fprintf(&b, "| one etcd Put per registration | %.0f |\n", wr.DirectPutPS)
	fmt.Fprintf(&b, "\nWrite-behind persisted the %d registrations in %d etcd revisions (coalesced transactions): **%.1f×** the direct-Put rate.\n", wr.Registrations, wr.EtcdTxns, wr.Speedup)
	fmt.Fprintf(&b, "%s\n", endMark)
	return b.String()
}

// UpdateFile replaces the report's section in path (creating the file if
// needed), leaving the rest of the document alone.
func (r Report) UpdateFile(path string) error {
	old, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	doc := string(old)
	sec := r.Markdown()
	if i, j := strings.Index(doc, beginMark), strings.Index(doc, endMark); i >= 0 && j > i {
		doc = doc[:i] + sec + strings.TrimPrefix(doc[j+len(endMark):], "\n")
	} else {
		if doc == "" {
			doc = "# Benchmarks\n\n"
		}
		doc = strings.TrimRight(doc, "\n") + "\n\n" + sec
	}
	return os.WriteFile(path, []byte(doc), 0o644)
}

// machine describes this host: CPU model, cores, memory, OS and Go.
func machine() string {
	cpu := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %d kB", &kb); err == nil {
			mem = fmt.Sprintf(", %.0f GiB RAM", float64(kb)/(1<<20))
		}
	}
	return fmt.Sprintf("%s, %d cores%s, %s/%s, %s", cpu, runtime.NumCPU(), mem, runtime.GOOS, runtime.GOARCH, runtime.Version())
}

