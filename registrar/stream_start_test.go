package registrar

import (
	"context"
	"errors"
	"fmt"
	"testing"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	registryv1 "github.com/aethermesh/aether/api/registry/v1"
)

// chanSender is a stream that hands what is sent to a channel.
type chanSender struct {
	ctx context.Context
	out chan *registrarv1.EndpointEvent
}

func (c *chanSender) Send(ev *registrarv1.EndpointEvent) error { c.out <- ev; return nil }
func (c *chanSender) SendMsg(m any) error                      { return c.Send(m.(*registrarv1.EndpointEvent)) }
func (c *chanSender) Context() context.Context                 { return c.ctx }

// Once a stream's start is sent, the stream no longer holds it: a
// snapshot of every endpoint a stream follows, kept for the stream's life,
// would be marked by every collection.
func TestStreamLetsItsStartGo(t *testing.T) {
	r, err := New(Options{Region: "r1", ClusterName: "c1", WriteQueueLimit: 1 << 20, Logger: quietLog()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		mustRegister(t, r.st, &registryv1.ServiceEndpoint{Service: "web", Protocol: registryv1.Protocol_PROTOCOL_HTTP1,
			Ip: fmt.Sprintf("10.2.0.%d", i), Ports: []*registryv1.Port{{Name: "http", Port: 80}}, Region: "r1", Cluster: "c1",
			State: registryv1.State_STATE_SERVING, Weight: 1})
	}
	svc := &service{r: r}
	for _, resume := range []bool{false, true} {
		from := version{}
		if resume {
			from = version{epoch: r.st.Epoch(), seq: 10}
		}
		sub := r.subscribe(nil, from)
		if sub.resumed != resume || (len(sub.snapshot) == 0 && len(sub.missed) == 0) {
			t.Fatalf("resume %v: subscription resumed=%v with %d endpoints, %d events", resume, sub.resumed, len(sub.snapshot), len(sub.missed))
		}
		ctx, cancel := context.WithCancel(context.Background())
		st := &chanSender{ctx: ctx, out: make(chan *registrarv1.EndpointEvent, 100)}
		stop := make(chan error)
		done := make(chan error)
		go func() { done <- svc.serveUntil(st, sub, &registrarv1.WatchEndpointsRequest{}, stop) }()
		// The start: a snapshot of all 50, or the 40 missed events and a
		// bookmark.
		for got := 0; got < 50; {
			ev := <-st.out
			got += len(ev.GetEndpoints())
			if ev.GetType() == registrarv1.EndpointEvent_PROGRESS {
				got = 50
			}
		}
		stop <- errors.New("test over")
		<-done
		cancel()
		if sub.snapshot != nil || sub.missed != nil {
			t.Errorf("resume %v: the stream still holds %d endpoints and %d events it sent", resume, len(sub.snapshot), len(sub.missed))
		}
	}
}
