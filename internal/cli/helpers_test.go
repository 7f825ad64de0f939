package cli

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aethermesh/aether/server"
)

// result is what one in-process run of the CLI produced.
type result struct {
	stdout, stderr string
	err            error
	served         *server.Config // what "aether registrar" passed to Serve, if it got there
}

// runCLI runs the command tree in-process with env as the whole environment
// and a fake server.Serve that returns at once.
func runCLI(t *testing.T, ctx context.Context, env map[string]string, args ...string) result {
	t.Helper()
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
	}
	var stdout, stderr bytes.Buffer
	var res result
	root := newRoot(deps{
		stdout: &stdout,
		stderr: &stderr,
		lookupEnv: func(name string) (string, bool) {
			v, ok := env[name]
			return v, ok
		},
		serve: func(_ context.Context, opts server.Config) error {
			res.served = &opts
			return nil
		},
	})
	root.SetArgs(args)
	res.err = root.ExecuteContext(ctx)
	res.stdout, res.stderr = stdout.String(), stderr.String()
	return res
}

// sentinel is a TCP listener that counts connections, for commands that
// must fail before touching the network. It never answers.
type sentinel struct {
	ln    net.Listener
	conns atomic.Int32
}

func newSentinel(t *testing.T) *sentinel {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &sentinel{ln: ln}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var held []net.Conn // open and silent until the test ends
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.conns.Add(1)
			held = append(held, c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
	})
	return s
}

func (s *sentinel) addr() string { return s.ln.Addr().String() }

// unusedAddr is a loopback address where nothing listens.
func unusedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
