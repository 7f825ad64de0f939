package server_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// The process's defaults carry the replica's as they are, so the CLI's flags show one set of defaults wherever a field
// lives.
func TestDefaultConfigCarriesTheReplicaDefaults(t *testing.T) {
	d := server.DefaultConfig()
	want := registrar.DefaultOptions()
	// The one difference: the process turns peer-watch on, since it
	// knows the address its peers dial.
	want.PeerWatch = true
	if !reflect.DeepEqual(d.Options, want) {
		t.Errorf("DefaultConfig().Options = %+v, want registrar.DefaultOptions() with peer-watch %+v", d.Options, want)
	}
	if d.MaxStreamsPerIdentity != 64 {
		t.Errorf("DefaultConfig().MaxStreamsPerIdentity = %d, want the flag's default 64", d.MaxStreamsPerIdentity)
	}
}

// Validate checks the replica's fields and the process's, each error
// naming its flag as before the split.
func TestConfigValidateNamesTheFlag(t *testing.T) {
	cases := []struct {
		c    server.Config
		want string
	}{
		{server.Config{Options: registrar.Options{SyncMode: "push"}}, `--sync-mode "push": use watch or poll`},
		{server.Config{Options: registrar.Options{NodeTTL: time.Second}}, "--node-ttl must be at least 2s"},
		{server.Config{Options: registrar.Options{MaxEndpointsPerNode: -1}}, "--max-endpoints-per-node must be positive"},
		{server.Config{ReplicationLeaseTTL: 2 * time.Second}, "--replication-lease-ttl must be at least 3s"},
		{server.Config{MaxRecvMsgSize: 1000}, "--max-recv-msg-size must be at least 65536 bytes"},
		{server.Config{Options: registrar.Options{MaxWatchServices: -1}}, "--max-watch-services must be positive"},
		{server.Config{TLSCertFile: "c"}, "--tls-cert needs --tls-key"},
		{server.Config{EmbeddedEtcdPeerCA: "ca"}, "--embedded-etcd-peer-ca needs --embedded-etcd-peer-cert"},
	}
	for _, c := range cases {
		err := c.c.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want %q", c.c, err, c.want)
		}
	}
	if err := server.DefaultConfig().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
}

// A process started without a sync mode runs the one the replica picks
// for its backend (watch: etcd has a change feed), and reports what the
// replica runs with, defaults filled in.
func TestStartReportsTheReplicaOptions(t *testing.T) {
	etcd := etcdtest.Start(t)
	s := startRegistrar(t, etcd.Endpoints(), func(c *server.Config) { c.SyncMode = "" })
	o := s.Options()
	if o.SyncMode != registrar.SyncWatch {
		t.Errorf("SyncMode %q, want %q", o.SyncMode, registrar.SyncWatch)
	}
	if o.WriteBatchInterval != registrar.DefaultOptions().WriteBatchInterval || o.MaxStreamsPerIdentity != server.DefaultConfig().MaxStreamsPerIdentity {
		t.Errorf("defaults not filled in: %+v", o)
	}
	if got := s.Registrar().Options(); !reflect.DeepEqual(got, o.Options) {
		t.Errorf("Server.Options().Options = %+v, want the replica's %+v", o.Options, got)
	}
}
