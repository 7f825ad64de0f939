package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/aethermesh/aether/internal/testutil/etcdtest"
	"github.com/aethermesh/aether/server"
)

func TestReplicationStatusAgainstRegistrars(t *testing.T) {
	t.Parallel()
	home, peer := etcdtest.Start(t), etcdtest.Start(t)

	// Off: a registrar without --peer-etcd says so.
	off := startRegistrar(t, home)
	res := runCLI(t, nil, nil, "replication", "status", "--registrar", off.addr())
	if res.err != nil || !strings.Contains(res.stdout, "replication is off in region eu") || !strings.Contains(res.stdout, "--peer-etcd") {
		t.Fatalf("status without peers: %v %q", res.err, res.stdout)
	}

	on := startRegistrar(t, home, func(o *server.Config) {
		o.PeerEtcd = []string{"us=" + peer.Endpoints()[0]}
		o.ReplicationLeaseTTL = 3 * time.Second
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		res = runCLI(t, nil, nil, "replication", "status", "--registrar", on.addr())
		lines := strings.Split(strings.TrimSpace(res.stdout), "\n")
		if res.err == nil && len(lines) == 2 && strings.HasPrefix(lines[0], "PEER") {
			f := strings.Fields(lines[1])
			// PEER REACHABLE SYNCED LEASE ...
			if f[0] == "us" && f[1] == "true" && f[2] == "true" && f[3] != "-" && strings.Contains(lines[1], "(this registrar)") {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("status never showed a synced, reachable peer: %v\n%s", res.err, res.stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	res = runCLI(t, nil, nil, "replication", "status", "--registrar", on.addr(), "-o", "json")
	if res.err != nil || !strings.Contains(res.stdout, `"enabled":true`) || !strings.Contains(res.stdout, `"region":"us"`) {
		t.Fatalf("json status: %v %q", res.err, res.stdout)
	}
	if res := runCLI(t, nil, nil, "registrar", "--peer-etcd", "us"); res.err == nil || !strings.Contains(res.err.Error(), "--peer-etcd") {
		t.Fatalf("bad --peer-etcd: %v", res.err)
	}
}
