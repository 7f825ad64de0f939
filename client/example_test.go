package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/client"
)

// An agent watches the services it routes to and registers its own
// endpoint; both work whether or not a registrar is reachable right now.
func Example() {
	c, err := client.New(client.Config{
		Addrs:    []string{"10.0.0.10:9443", "10.0.0.11:9443"},
		Node:     "node-7",
		Services: []string{"payments", "ledger"},
		OnChange: func(ch client.Change) { fmt.Println(ch.Type, ch.Endpoint.Service, ch.Endpoint.Ip) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if err := c.Register(&registryv1.ServiceEndpoint{
		Service:  "payments",
		Protocol: registryv1.Protocol_PROTOCOL_GRPC,
		Ip:       "10.1.2.3",
		Ports:    []*registryv1.Port{{Port: 8443}},
	}); err != nil {
		log.Fatal(err) // invalid endpoint; nothing was queued
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	eps, err := c.Endpoints(ctx, "ledger") // shared slice: read, do not modify
	if err != nil {
		log.Print(err)
	}
	for _, ep := range eps {
		fmt.Println(ep.Ip, ep.State)
	}
}
