package embedetcd

import (
	"context"
	"log/slog"
	"sort"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// slogCore carries etcd's zap records into the registrar's slog logger, so
// an embedded etcd's complaints land in the same structured stream (and the
// same level filter) as everything else instead of as raw JSON on stderr.
// Only errors and worse pass: etcd is chatty at info and warn about things
// that are routine for a one-member cluster.
type slogCore struct {
	log    *slog.Logger
	fields []zapcore.Field
	// closing is set once Close begins. etcd reports its own orderly shutdown
	// ("http: Server closed", "use of closed network connection") at error
	// level; those are not errors to an operator, so they drop to debug.
	closing *atomic.Bool
}

func newZapLogger(log *slog.Logger, closing *atomic.Bool) *zap.Logger {
	return zap.New(&slogCore{log: log.With("component", "etcd"), closing: closing})
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= zapcore.ErrorLevel }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{
		log:     c.log,
		fields:  append(append([]zapcore.Field(nil), c.fields...), fields...),
		closing: c.closing,
	}
}

func (c *slogCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *slogCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	level := slog.LevelError
	if c.closing.Load() {
		level = slog.LevelDebug
	}
	if !c.log.Enabled(context.Background(), level) {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	sort.Strings(keys) // deterministic output for humans and log tests
	attrs := make([]slog.Attr, 0, len(keys)+1)
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, enc.Fields[k]))
	}
	if ent.Caller.Defined {
		attrs = append(attrs, slog.String("etcd_caller", ent.Caller.TrimmedPath()))
	}
	c.log.LogAttrs(context.Background(), level, ent.Message, attrs...)
	return nil
}

func (c *slogCore) Sync() error { return nil }
