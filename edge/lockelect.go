package edge

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb"
	"go.etcd.io/etcd/server/v3/proxy/grpcproxy/adapter"
	"google.golang.org/grpc"
)

// etcd also serves the Lock and Election services (what `etcdctl lock` and
// `etcdctl elect` call). They are clients of the KV, Lease and Watch API;
// etcd runs them over an in-process client (v3client), and so does this
// server: etcd's own v3lock and v3election servers, over etcd's adapters
// from this server's services to clients, no socket involved.
func (s *Server) registerLockElection(g *grpc.Server) {
	c := clientv3.NewCtxClient(context.Background())
	c.KV = clientv3.NewKVFromKVClient(adapter.KvServerToKvClient(&kvServer{s: s}), c)
	c.Lease = clientv3.NewLeaseFromLeaseClient(adapter.LeaseServerToLeaseClient(&leaseServer{s: s}), c, time.Second)
	c.Watcher = clientv3.NewWatchFromWatchClient(adapter.WatchServerToWatchClient(&watchServer{s: s}), c)
	s.inproc = c
	v3lockpb.RegisterLockServer(g, v3lock.NewLockServer(c))
	v3electionpb.RegisterElectionServer(g, v3election.NewElectionServer(c))
}
