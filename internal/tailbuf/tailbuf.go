// Package tailbuf is the output buffer of a child process the project
// runs (dynalite, kube-apiserver): the child's stdout and stderr write to
// it while its starter reads it for an error message or a test's log, and
// it keeps only the tail, since a long-lived child (an API server through
// a whole benchmark) may print without end and only its last lines explain
// how it died.
package tailbuf

import (
	"bytes"
	"strings"
	"sync"
)

// Bounds of a Buffer: once it holds more than Max bytes it drops all but
// the last Keep. Trimming at a high-water mark rather than at every write
// keeps the copying amortized: one copy of Keep bytes per Max-Keep written.
const (
	Max  = 4 << 20
	Keep = 1 << 20
)

// Buffer is safe for writers and readers at once. The zero value is empty
// and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p, first trimming to the last Keep bytes if the buffer is
// past Max.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.b.Len() > Max {
		rest := append([]byte(nil), b.b.Bytes()[b.b.Len()-Keep:]...)
		b.b.Reset()
		b.b.Write(rest)
	}
	return b.b.Write(p)
}

// String is what the buffer holds.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Tail is the last n lines the buffer holds.
func (b *Buffer) Tail(n int) string { return Lines(b.String(), n) }

// Reset empties the buffer (a child started again writes into it afresh).
func (b *Buffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b.Reset()
}

// Lines is the last n lines of s, without a trailing newline.
func Lines(s string, n int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) > n {
		parts = parts[len(parts)-n:]
	}
	return strings.Join(parts, "\n")
}
