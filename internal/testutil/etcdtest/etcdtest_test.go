package etcdtest

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

func TestStopRestartKeepsDataAndEndpoints(t *testing.T) {
	c := Start(t)
	eps := c.Endpoints()
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	put, err := cli.Put(ctx, "/k", "v")
	if err != nil {
		t.Fatal(err)
	}

	c.Stop()
	// The reserved port refuses connections as a stopped server's does.
	if conn, err := net.Dial("tcp", c.ClientAddr()); err == nil {
		conn.Close()
		t.Fatal("the stopped member's client port accepted a connection")
	} else if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial the stopped member: %v, want connection refused", err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := cli.Get(short, "/k"); err == nil {
		t.Fatal("Get succeeded while etcd was stopped")
	}

	c.Restart(t)
	if got := c.Endpoints(); len(got) != 1 || got[0] != eps[0] {
		t.Fatalf("endpoints after restart = %v, want %v", got, eps)
	}
	// The same client reconnects by itself: the endpoints did not move.
	get, err := cli.Get(ctx, "/k")
	if err != nil {
		t.Fatal(err)
	}
	if len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "v" || get.Kvs[0].ModRevision != put.Header.Revision {
		t.Fatalf("after restart /k = %v, want v at revision %d", get.Kvs, put.Header.Revision)
	}
}
