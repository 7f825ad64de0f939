package server_test

import (
	"strings"
	"testing"

	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

func TestPeerWatchOptionsValidate(t *testing.T) {
	t.Parallel()
	on := registrar.Options{PeerWatch: true}
	for _, c := range []struct {
		o    server.Config
		want string
	}{
		{server.Config{PeerAdvertiseAddr: "h:1"}, "only used with --peer-watch"},
		{server.Config{Options: on, PeerWatchCACert: "ca"}, "--peer-watch-cacert is only used with --tls-cert"},
		{server.Config{Options: on, TLSCertFile: "c", TLSKeyFile: "k"}, "--peer-watch with --tls-cert needs a CA"},
	} {
		if err := c.o.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.o, err, c.want)
		}
	}
	for _, ok := range []server.Config{
		{Options: on},
		{Options: on, PeerAdvertiseAddr: "h:1", TLSCertFile: "c", TLSKeyFile: "k", PeerWatchCACert: "ca"},
		{Options: on, TLSCertFile: "c", TLSKeyFile: "k", TLSClientCAFile: "ca", TrustDomain: "example.org"},
	} {
		if err := ok.Validate(); err != nil {
			t.Errorf("valid options %+v: %v", ok, err)
		}
	}
}
