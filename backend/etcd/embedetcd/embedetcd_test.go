package embedetcd

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func startServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func newClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func TestStartFreePortsAndRestartKeepsData(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data") // does not exist yet: Start creates it
	cfg := Config{Dir: dir, ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", Logger: testLogger(t)}

	began := time.Now()
	s := startServer(t, cfg)
	t.Logf("first start (new data dir) took %v", time.Since(began))

	eps := s.Endpoints()
	if len(eps) != 1 {
		t.Fatalf("Endpoints() = %v, want one URL", eps)
	}
	u, err := url.Parse(eps[0])
	if err != nil || u.Scheme != "http" || u.Hostname() != "127.0.0.1" || u.Port() == "0" || u.Port() == "" {
		t.Fatalf("Endpoints()[0] = %q, want http://127.0.0.1:<bound port>", eps[0])
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli := newClient(t, eps)
	put, err := cli.Put(ctx, "/k", "v")
	if err != nil {
		t.Fatal(err)
	}
	// What etcd advertises must be the URL that works.
	members, err := cli.MemberList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(members.Members) != 1 || len(members.Members[0].ClientURLs) != 1 || members.Members[0].ClientURLs[0] != eps[0] {
		t.Fatalf("members = %v, want one member advertising %s", members.Members, eps[0])
	}
	if got := members.Members[0].Name; got != DefaultName {
		t.Fatalf("member name = %q, want %q", got, DefaultName)
	}
	_ = cli.Close()
	s.Close()
	s.Close() // idempotent

	// New free ports on the restart: the data must not care.
	began = time.Now()
	s2 := startServer(t, cfg)
	t.Logf("restart (existing data dir) took %v", time.Since(began))
	cli2 := newClient(t, s2.Endpoints())
	get, err := cli2.Get(ctx, "/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "v" || get.Kvs[0].ModRevision != put.Header.Revision {
		t.Fatalf("after restart /k = %v, want v at revision %d", get.Kvs, put.Header.Revision)
	}
}

// TestCloseWithOpenWatchIsFastAndWatchResumes: etcd alone would make Close
// wait out its request timeout (5.5s here) for open watch streams, and end
// them as final for the client. Ours ends them as a server going away.
func TestCloseWithOpenWatchIsFastAndWatchResumes(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, ClientAddr: freeAddr(t), PeerAddr: freeAddr(t), Logger: testLogger(t)}
	s := startServer(t, cfg)
	cli := newClient(t, s.Endpoints())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	put, err := cli.Put(ctx, "/a", "1")
	if err != nil {
		t.Fatal(err)
	}
	wch := cli.Watch(ctx, "/", clientv3.WithPrefix(), clientv3.WithRev(put.Header.Revision+1))

	began := time.Now()
	s.Close()
	if took := time.Since(began); took > 2*time.Second {
		t.Fatalf("Close with an open watch took %v", took)
	}

	s2 := startServer(t, cfg) // same ports: the client reconnects by itself
	writer := newClient(t, s2.Endpoints())
	put2, err := writer.Put(ctx, "/b", "2")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case resp, ok := <-wch:
		if !ok || resp.Err() != nil || len(resp.Events) != 1 || resp.Events[0].Kv.ModRevision != put2.Header.Revision {
			t.Fatalf("watch after restart: ok=%v err=%v events=%v; want the put at %d on the same watch", ok, resp.Err(), resp.Events, put2.Header.Revision)
		}
	case <-ctx.Done():
		t.Fatal("watch did not resume after restart")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func TestClientAddrInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().String()

	_, err = Start(context.Background(), Config{Dir: t.TempDir(), ClientAddr: busy, PeerAddr: "127.0.0.1:0"})
	if err == nil {
		t.Fatal("Start succeeded on a port in use")
	}
	want := "embedded etcd: client address " + busy + " is in use; pass --embedded-etcd-addr with a free port"
	if err.Error() != want {
		t.Fatalf("err = %q\nwant  %q", err, want)
	}
	// Callers that retry on another port (etcdtest) test for the cause.
	if !errors.Is(err, syscall.EADDRINUSE) {
		t.Fatalf("err does not wrap EADDRINUSE: %#v", err)
	}
}

func TestPeerAddrInUse(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().String()

	var logs strings.Builder
	log := slog.New(slog.NewTextHandler(&logs, nil))
	_, err = Start(context.Background(), Config{Dir: t.TempDir(), ClientAddr: "127.0.0.1:0", PeerAddr: busy, Logger: log})
	if err == nil {
		t.Fatal("Start succeeded on a peer port in use")
	}
	if !strings.Contains(err.Error(), "peer address "+busy+" is in use; pass --embedded-etcd-peer-addr") {
		t.Fatalf("err = %q, want it to name peer address %s", err, busy)
	}
	// etcd's own error arrives through our logger, not as JSON on stderr.
	if out := logs.String(); !strings.Contains(out, "level=ERROR") || !strings.Contains(out, "component=etcd") || !strings.Contains(out, "address already in use") {
		t.Fatalf("etcd's error did not reach the slog logger:\n%s", out)
	}
}

func TestStartHonoursContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := Start(ctx, Config{Dir: t.TempDir(), ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0"})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

func TestSecondStartOnSameDirRefused(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", Logger: testLogger(t)}
	first := startServer(t, cfg)

	// Without the probe etcd would wait forever on the bbolt lock.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := Start(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "data dir "+dir+" is in use") {
		t.Fatalf("err = %v, want the data dir named as in use", err)
	}
	first.Close()
	startServer(t, cfg).Close()
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no dir", Config{}, "data dir is required"},
		{"bad client", Config{Dir: t.TempDir(), ClientAddr: "localhost"}, "client address \"localhost\""},
		{"bad peer port", Config{Dir: t.TempDir(), PeerAddr: "127.0.0.1:x"}, "peer address \"127.0.0.1:x\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Start(context.Background(), tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestStartTLSValidation(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Dir: dir, ClientTLS: TLS{CertFile: "c"}}, "client TLS needs both a certificate and its key"},
		{Config{Dir: dir, PeerTLS: TLS{CAFile: "ca"}}, "peer TLS client CA needs a certificate"},
		{Config{Dir: dir, ClientTLS: TLS{CertFile: dir + "/missing.pem", KeyFile: dir + "/missing-key.pem"}}, "missing.pem"},
	} {
		_, err := Start(context.Background(), c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}
