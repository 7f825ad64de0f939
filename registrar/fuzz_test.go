package registrar

import (
	"io"
	"log/slog"
)

// quietLog is the logger of the package's tests: they log nothing.
func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
