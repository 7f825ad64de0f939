package tailbuf

import (
	"bytes"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// A child that prints without end keeps the buffer bounded, and what it
// printed last is what the buffer holds last.
func TestBufferKeepsTheTailWithinItsBound(t *testing.T) {
	var b Buffer
	line := strings.Repeat("x", 99) + "\n"
	for i := 0; i < 3*Max/len(line); i++ {
		if _, err := b.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		// Sampled: String copies the buffer.
		if i%4096 != 0 {
			continue
		}
		if n := len(b.String()); n > Max+len(line) {
			t.Fatalf("buffer holds %d bytes after %d writes, want at most %d", n, i+1, Max+len(line))
		}
	}
	fmt.Fprintf(&b, "last words\n")
	if got := b.Tail(2); got != line[:len(line)-1]+"\nlast words" {
		t.Fatalf("Tail(2) = %q", got)
	}
	if s := b.String(); len(s) < Keep {
		t.Fatalf("buffer holds %d bytes, want at least the %d it keeps", len(s), Keep)
	}
	b.Reset()
	if b.String() != "" {
		t.Fatalf("after Reset: %q", b.String())
	}
}

// Writers (the child's stdout and stderr) and readers run at once; run
// with -race.
func TestBufferConcurrentWritersAndReaders(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				fmt.Fprintf(&b, "w%d %d\n", w, i)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 100; i++ {
			_ = b.Tail(3)
		}
	}()
	wg.Wait()
	if n := bytes.Count([]byte(b.String()), []byte("\n")); n != 2000 {
		t.Fatalf("%d lines, want 2000", n)
	}
}

func TestLines(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"", 3, ""},
		{"a\nb\nc\n", 2, "b\nc"},
		{"a\nb\nc", 5, "a\nb\nc"},
		{"a\n\n", 1, "a"},
	} {
		if got := Lines(c.in, c.n); got != c.want {
			t.Errorf("Lines(%q, %d) = %q, want %q", c.in, c.n, got, c.want)
		}
	}
}
