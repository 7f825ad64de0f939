package client

import (
	"errors"
	"testing"

	"github.com/aethermesh/aether/registry"
)

// TestWritesRefuseAsTheRegistrarWould pins what the client says about a
// write it refuses before sending: the registrar's field names and reasons
// for the endpoint's parts, the client's own setting for a foreign origin.
// Nothing is queued for a refused write.
func TestWritesRefuseAsTheRegistrarWould(t *testing.T) {
	c := newClient(t, Config{Addrs: []string{freeAddr(t)}})
	foreign := ep("web", "10.0.0.1", 80)
	foreign.Region = "r9"
	for _, tc := range []struct {
		name  string
		write func() error
		msg   string
	}{
		{"unregister foreign region", func() error { i := id("web", "10.0.0.1"); i.Region = "r9"; return c.Unregister(i) },
			`client: unregister: region: "r9" is not this client's region "r1" (Config.Region)`},
		{"drain foreign cluster", func() error { i := id("web", "10.0.0.1"); i.Cluster = "c9"; return c.Drain(i) },
			`client: drain: cluster: "c9" is not this client's cluster "c1" (Config.Cluster)`},
		{"register foreign region", func() error { return c.Register(foreign) },
			`client: register: endpoint.region: "r9" is not this client's region "r1" (Config.Region)`},
		{"unregister bad ip", func() error { return c.Unregister(id("web", "not-an-ip")) },
			`client: unregister: ip: ip "not-an-ip" is not an IPv4 or IPv6 address`},
		{"drain no service", func() error { return c.Drain(id("", "10.0.0.1")) },
			`client: drain: service: service must not be empty`},
		{"unregister no protocol", func() error { i := id("web", "10.0.0.1"); i.Protocol = 0; return c.Unregister(i) },
			`client: unregister: protocol: protocol must be set (one of http, h2c, grpc, tcp)`},
	} {
		err := tc.write()
		var fe *registry.FieldError
		if err == nil || err.Error() != tc.msg || !errors.As(err, &fe) {
			t.Errorf("%s: %v\nwant the FieldError %s", tc.name, err, tc.msg)
		}
		if !Permanent(err) {
			t.Errorf("%s: %v is not permanent", tc.name, err)
		}
	}
	if n := c.PendingWrites(); n != 0 {
		t.Errorf("refused writes were queued: %d", n)
	}
}
