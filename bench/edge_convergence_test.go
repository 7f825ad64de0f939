package bench

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestEdgeConvergenceQuickRun runs the scenario at a tiny size on real
// aether edge processes through real proxies: the run converges, its
// figures are plausible (every change sent at least to the two replicas
// that lack it, more bytes per change than its value), and it renders
// into its own marks.
func TestEdgeConvergenceQuickRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := EdgeConvergence(ctx, EdgeConvergenceConfig{Changes: []int{20}, ValueBytes: []int{100}, Timeout: 30 * time.Second}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 1 {
		t.Fatalf("%d runs for one size", len(res.Runs))
	}
	run := res.Runs[0]
	t.Logf("%s", run)
	if !run.Converged() || *run.ConvergeMs < 0 || run.NotConverged != "" {
		t.Fatalf("did not converge: %+v", run)
	}
	// 40 changes written, each to reach 2 replicas.
	if run.ChangesSent < 80 || run.PushPerChange() <= float64(run.KeyBytes+run.ValueBytes) || run.WireBytes < run.PushBytes {
		t.Fatalf("implausible sync figures: %d changes sent, %d push bytes, %d wire bytes", run.ChangesSent, run.PushBytes, run.WireBytes)
	}
	if run.CutSec <= 0 || run.PollRoundMaxMs <= 0 {
		t.Fatalf("implausible times: %+v", run)
	}
	path := filepath.Join(t.TempDir(), "benchmarks.md")
	r := Report{Date: "d1", Command: "aether bench --scenario edge-convergence", EdgeConvergence: &res}
	if err := r.UpdateFile(path); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if doc := string(b); !strings.Contains(doc, edgeConvBeginMark) || !strings.Contains(doc, edgeConvEndMark) || !strings.Contains(doc, "| aether edge | 20 | 100 B |") || strings.Contains(doc, "not converged") {
		t.Fatalf("section not rendered:\n%s", doc)
	}
}

// TestEdgeConvergenceNeverHealed feeds the scenario replicas that are never
// healed: the run must come out not converged, with what the last poll
// saw, and render as not converged rather than as a time.
func TestEdgeConvergenceNeverHealed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := EdgeConvergence(ctx, EdgeConvergenceConfig{Changes: []int{10}, ValueBytes: []int{100}, Timeout: 2 * time.Second, neverHeal: true}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	run := res.Runs[0]
	if run.Converged() || !strings.Contains(run.NotConverged, "HashKV") {
		t.Fatalf("a cut never healed reported as converged: %+v", run)
	}
	md := (Report{Date: "d", Machine: "m", Command: "c", EdgeConvergence: &res}).Markdown()
	if !strings.Contains(md, "| aether edge | 10 | 100 B |") || !strings.Contains(md, "**not converged** within 2 s") || !strings.Contains(md, "Not converged (the last poll)") {
		t.Fatalf("not rendered as not converged:\n%s", md)
	}
}

// TestSocketOwner: the router names the process that dialled, and no one
// for a socket none of the given processes holds.
func TestSocketOwner(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// A real child dials (bash's /dev/tcp) and holds the socket open.
	port := ln.Addr().(*net.TCPAddr).Port
	cmd := exec.Command("bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+strconv.Itoa(port)+"; read -u 3 line")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if i, err := socketOwner(c, []int{os.Getpid(), cmd.Process.Pid}); err != nil || i != 1 {
		t.Fatalf("owner = %d, %v; want 1 (the child)", i, err)
	}
	if i, err := socketOwner(c, []int{os.Getpid()}); err == nil {
		t.Fatalf("owner = %d among processes that do not hold the socket", i)
	}
}

// TestConvergenceSection: a converged run renders its time and per-change
// figures; make-mirror's row has no sync metrics to show.
func TestConvergenceSection(t *testing.T) {
	v := 123.0
	res := EdgeConvergenceResult{Writers: 16, EtcdVersion: "3.7.3", Runs: []ConvergenceRun{
		{Server: "aether edge", Changes: 1000, Sides: 2, Receivers: 2, KeyBytes: 12, ValueBytes: 1024, CutSec: 2, ConvergeMs: &v, TimeoutSec: 60, PollMs: 5, PollRoundMaxMs: 1.5,
			ChangesSent: 5000, PushBytes: 5000 * 1100, WireBytes: 4000 * 1200},
		{Server: "etcd make-mirror", Changes: 1000, Sides: 1, Receivers: 1, KeyBytes: 12, ValueBytes: 1024, CutSec: 1, ConvergeMs: &v, TimeoutSec: 60, PollMs: 5, PollRoundMaxMs: 1, WireBytes: 1000 * 1300},
	}}
	md := (Report{Date: "d", Machine: "m", Command: "c", EdgeConvergence: &res}).Markdown()
	for _, want := range []string{
		"| aether edge | 1000 | 1 KiB | 2.0 s | 123 ms | 1.5 ms | 2.50 | 1100 B | 64 B | 1200 B |",
		"| etcd make-mirror | 1000 | 1 KiB | 1.0 s | 123 ms | 1.0 ms | n/a | n/a | n/a | 1300 B |",
		"etcdctl make-mirror",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("want %q in\n%s", want, md)
		}
	}
	if strings.Contains(md, "not converged") {
		t.Errorf("converged runs rendered as not converged:\n%s", md)
	}
}

// TestMedianRun: the median run is the figure, with the range; a run that
// does not converge stops the repeats and is the figure.
func TestMedianRun(t *testing.T) {
	at := func(v float64) *float64 { return &v }
	seq := func(runs ...ConvergenceRun) func() (ConvergenceRun, error) {
		i := 0
		return func() (ConvergenceRun, error) { i++; return runs[i-1], nil }
	}
	r, err := medianRun(3, seq(ConvergenceRun{ConvergeMs: at(30), WireBytes: 3}, ConvergenceRun{ConvergeMs: at(10), WireBytes: 1}, ConvergenceRun{ConvergeMs: at(20), WireBytes: 2}))
	if err != nil || *r.ConvergeMs != 20 || r.WireBytes != 2 || r.Repeats != 3 || r.ConvergeMinMs != 10 || r.ConvergeMaxMs != 30 {
		t.Errorf("median of 30, 10, 20 ms: %+v, %v", r, err)
	}
	r, err = medianRun(3, seq(ConvergenceRun{ConvergeMs: at(10)}, ConvergenceRun{NotConverged: "x"}, ConvergenceRun{ConvergeMs: at(20)}))
	if err != nil || r.Converged() || r.NotConverged != "x" || r.Repeats != 2 {
		t.Errorf("a run that did not converge: %+v, %v", r, err)
	}
	md := (Report{EdgeConvergence: &EdgeConvergenceResult{Runs: []ConvergenceRun{{Server: "aether edge", Changes: 1, Sides: 2, Receivers: 2, ValueBytes: 100, ConvergeMs: at(20), Repeats: 3, ConvergeMinMs: 10, ConvergeMaxMs: 30}}}}).Markdown()
	if !strings.Contains(md, "| 20 ms (10–30) |") || !strings.Contains(md, "Each row ran 3 times") {
		t.Errorf("range not rendered:\n%s", md)
	}
}
