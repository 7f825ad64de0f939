package grpcapi_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend/memory"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/registrar/grpcapi"
	"github.com/aethermesh/aether/registrar/replica"
)

// chanSender is a stream that hands what is sent to a channel.
type chanSender struct {
	ctx context.Context
	out chan *registrarv1.EndpointEvent
}

func (c *chanSender) Send(ev *registrarv1.EndpointEvent) error { c.out <- ev; return nil }
func (c *chanSender) SendMsg(m any) error                      { return c.Send(m.(*registrarv1.EndpointEvent)) }
func (c *chanSender) Context() context.Context                 { return c.ctx }

// startedRegistrar is a registrar over the in-memory model store, its
// snapshot loaded; it ends with t.
func startedRegistrar(t *testing.T) *registrar.Registrar {
	t.Helper()
	r, err := registrar.New(registrar.Options{Region: "r1", ClusterName: "c1", WriteQueueLimit: 1 << 20, Logger: quietLog()}, memory.New(memory.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return r
}

// Once a stream's start is sent, the stream no longer holds it: a
// snapshot of every endpoint a stream follows, kept for the stream's life,
// would be marked by every collection.
func TestStreamLetsItsStartGo(t *testing.T) {
	r := startedRegistrar(t)
	var first string
	for i := range 50 {
		_, v, err := r.Register(&registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
			Ip: fmt.Sprintf("10.2.0.%d", i), Ports: []*registryv1.Port{{Name: "http", Port: 80}},
			State: registryv1.State_STATE_SERVING, Weight: 1})
		if err != nil {
			t.Fatal(err)
		}
		if i == 9 {
			first = v
		}
	}
	h := grpcapi.NewHandler(r)
	for _, from := range []string{"", first} {
		resume := from != ""
		sub, err := r.Subscribe(nil, from)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		st := &chanSender{ctx: ctx, out: make(chan *registrarv1.EndpointEvent, 100)}
		stop := make(chan error)
		done := make(chan error)
		go func() { done <- grpcapi.ServeUntil(h, st, sub, stop) }()
		// The start: a snapshot of all 50, or the 40 missed events and a
		// bookmark.
		for got := 0; got < 50; {
			ev := <-st.out
			got += len(ev.GetEndpoints())
			if ev.GetType() == registrarv1.EndpointEvent_PROGRESS {
				if !resume {
					t.Fatalf("a fresh stream got a bookmark before its snapshot")
				}
				got = 50
			}
		}
		stop <- errors.New("test over")
		<-done
		cancel()
		if left := sub.TakeStart(); left.Snapshot != nil || left.Missed != nil {
			t.Errorf("resume %v: the subscription still holds %d endpoints and %d events the stream sent", resume, len(left.Snapshot), len(left.Missed))
		}
		sub.Close()
		if !errors.Is(sub.Err(), replica.ErrClosed) {
			t.Errorf("closed subscription: Err %v, want ErrClosed", sub.Err())
		}
	}
}
