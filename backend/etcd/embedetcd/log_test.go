package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/aethermesh/aether/internal/testutil/wait"
)

// recordHandler keeps every slog record it is given.
type recordHandler struct {
	mu   *sync.Mutex
	recs *[]slog.Record
}

func newRecordHandler() recordHandler {
	return recordHandler{mu: new(sync.Mutex), recs: new([]slog.Record)}
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	*h.recs = append(*h.recs, r.Clone())
	h.mu.Unlock()
	return nil
}
func (h recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recordHandler) WithGroup(string) slog.Handler      { return h }

func (h recordHandler) records() []slog.Record {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]slog.Record(nil), *h.recs...)
}

func describe(r slog.Record) string {
	s := fmt.Sprintf("%s %q", r.Level, r.Message)
	r.Attrs(func(a slog.Attr) bool { s += " " + a.String(); return true })
	return s
}

// TestFreshStartsLogNoErrors starts embedded etcd members on fresh data
// dirs, each until etcd has written its storage version (the step that
// races with the first backend commit, see storageVersionRace), and
// checks that none of them logged an error.
func TestFreshStartsLogNoErrors(t *testing.T) {
	const starts = 8
	for i := range starts {
		h := newRecordHandler()
		s := startServer(t, Config{
			Dir: filepath.Join(t.TempDir(), "data"), ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0",
			Logger: slog.New(h),
		})
		cli := newClient(t, s.Endpoints())
		// After a lost race etcd retries at the monitor's next wake-up,
		// at most its monitor interval (4 s) later.
		wait.For(t, "etcd to record its storage version", 15*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			st, err := cli.Status(ctx, s.Endpoints()[0])
			return err == nil && st.StorageVersion != ""
		})
		s.Close()
		demoted := 0
		for _, r := range h.records() {
			if r.Level >= slog.LevelError {
				t.Errorf("start %d: etcd logged an error: %s", i, describe(r))
			}
			if r.Message == storageVersionMsg {
				demoted++
			}
		}
		t.Logf("start %d: %d storage-version race(s) logged at debug", i, demoted)
	}
}

// TestStorageVersionRaceDemoted: the one transient error etcd logs on a
// fresh data dir goes to debug; the same message with any other error, and
// every other error, stays an error.
func TestStorageVersionRaceDemoted(t *testing.T) {
	h := newRecordHandler()
	log := newZapLogger(slog.New(h), new(atomic.Bool))
	log.Error(storageVersionMsg, zap.String("cluster-version", "3.7.0"),
		zap.Error(errors.New("cannot detect storage schema version: missing term information")))
	log.Error(storageVersionMsg, zap.String("cluster-version", "3.7.0"),
		zap.Error(errors.New("cannot create migration plan: version \"3.9\" is not supported")))
	log.Error("something else", zap.Error(errors.New("missing term information")))
	log.With(zap.String("member", "x")).Error(storageVersionMsg, zap.Error(errors.New("cannot detect storage schema version: missing term information")))

	recs := h.records()
	want := []slog.Level{slog.LevelDebug, slog.LevelError, slog.LevelError, slog.LevelDebug}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d", len(recs), len(want))
	}
	for i, r := range recs {
		if r.Level != want[i] {
			t.Errorf("record %d (%s) at %s, want %s", i, describe(r), r.Level, want[i])
		}
	}
}
