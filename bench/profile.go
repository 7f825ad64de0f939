package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime/pprof"
	"strings"
	"sync"
	"time"
)

// ProfileEnv names a directory to which the fanout scenario writes CPU
// profiles of every measured phase: of etcd, registrars A and B (all
// started with --enable-pprof) and of the load generator itself. It is
// for finding where a step's time goes, e.g.
//
//	AETHER_BENCH_PROFILE=/tmp/prof go run ./cmd/aether bench --scenario fanout --out ""
//	go tool pprof -top /tmp/prof/design-scale-p0-registrar-B.pprof
const ProfileEnv = "AETHER_BENCH_PROFILE"

// profileDir is ProfileEnv's directory, "" when profiling is off.
func profileDir() string { return os.Getenv(ProfileEnv) }

// profiler collects one phase's CPU profiles.
type profiler struct {
	dir, prefix string
	wg          sync.WaitGroup
	mu          sync.Mutex
	errs        []error
	self        *os.File
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// startProfiles begins CPU profiles of d: of each named pprof HTTP base
// URL's process and of this process. It returns nil when profiling is off.
func startProfiles(ctx context.Context, label string, phase int, d time.Duration, targets map[string]string) *profiler {
	dir := profileDir()
	if dir == "" {
		return nil
	}
	if label == "" {
		label = "step"
	}
	p := &profiler{dir: dir, prefix: fmt.Sprintf("%s-p%d-", unsafeName.ReplaceAllString(label, "-"), phase)}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.errs = append(p.errs, err)
		return p
	}
	secs := max(1, int(d.Round(time.Second)/time.Second))
	for name, base := range targets {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.fail(p.fetch(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", base, secs), name))
		}()
	}
	f, err := os.Create(p.path("loadgen"))
	if err == nil {
		if err = pprof.StartCPUProfile(f); err == nil {
			p.self = f
		} else {
			f.Close()
		}
	}
	p.fail(err)
	return p
}

func (p *profiler) path(name string) string {
	return filepath.Join(p.dir, p.prefix+unsafeName.ReplaceAllString(name, "-")+".pprof")
}

func (p *profiler) fail(err error) {
	if err != nil {
		p.mu.Lock()
		p.errs = append(p.errs, err)
		p.mu.Unlock()
	}
}

func (p *profiler) fetch(ctx context.Context, url, name string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile of %s: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile of %s: %s", name, resp.Status)
	}
	f, err := os.Create(p.path(name))
	if err != nil {
		return err
	}
	if _, err = io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("profile of %s: %w", name, err)
	}
	return f.Close()
}

// stop ends this process's profile, waits for the others and says where
// they are (or what failed) on w. A nil profiler does nothing.
func (p *profiler) stop(w io.Writer) {
	if p == nil {
		return
	}
	if p.self != nil {
		pprof.StopCPUProfile()
		p.fail(p.self.Close())
	}
	p.wg.Wait()
	if len(p.errs) > 0 {
		var msgs []string
		for _, err := range p.errs {
			msgs = append(msgs, err.Error())
		}
		fmt.Fprintf(w, "    profiles: %s\n", strings.Join(msgs, "; "))
		return
	}
	fmt.Fprintf(w, "    profiles: %s*.pprof\n", filepath.Join(p.dir, p.prefix))
}
