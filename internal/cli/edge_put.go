package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"

	edgev1 "github.com/aethermesh/aether/api/edge/v1"
)

// newEdgePutCmd is `aether edge put`: a put that can wait until the write
// is on k replicas (extension API WaitReplicated).
func newEdgePutCmd() *cobra.Command {
	var endpoint, cacert, cert, key string
	var replicas uint32
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "put KEY VALUE",
		Short: "Put a key on an edge replica, optionally waiting until it is on k replicas",
		Long: `Puts KEY=VALUE on one edge replica (as etcdctl put does). With --replicas k
it then waits until the write is on k replicas, this one included, as far as
the replica knows from sync: the write then survives the loss of any k-1 of
them. It fails (and says so) if that does not happen within --timeout; the
write itself is acknowledged by then either way.`,
		Example: `  aether edge put --endpoint http://127.0.0.1:2379 --replicas 2 greeting hello`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			conn, err := dialEdge(endpoint, cacert, cert, key)
			if err != nil {
				return err
			}
			defer conn.Close()
			put, err := pb.NewKVClient(conn).Put(ctx, &pb.PutRequest{Key: []byte(args[0]), Value: []byte(args[1])})
			if err != nil {
				return fmt.Errorf("put: %w", err)
			}
			rev := put.GetHeader().GetRevision()
			out := cmd.OutOrStdout()
			if replicas <= 1 {
				fmt.Fprintf(out, "OK revision %d\n", rev)
				return nil
			}
			ext := edgev1.NewEdgeClient(conn)
			h, err := ext.HashOfRevision(ctx, &edgev1.HashOfRevisionRequest{Revision: rev})
			if err != nil {
				return fmt.Errorf("put at revision %d acknowledged; its change: %w", rev, err)
			}
			w, err := ext.WaitReplicated(ctx, &edgev1.WaitReplicatedRequest{Hashes: [][]byte{h.Hash}, Replicas: replicas})
			if err != nil {
				return fmt.Errorf("put at revision %d acknowledged; waiting for %d replicas: %w", rev, replicas, err)
			}
			fmt.Fprintf(out, "OK revision %d change %x on %d replicas\n", rev, h.Hash, 1+len(w.MemberIds))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&endpoint, "endpoint", "http://127.0.0.1:2379", "client URL of the replica to write to")
	f.StringVar(&cacert, "cacert", "", "CA bundle to verify an https endpoint")
	f.StringVar(&cert, "cert", "", "client certificate for an https endpoint")
	f.StringVar(&key, "key", "", "client key for an https endpoint")
	f.Uint32Var(&replicas, "replicas", 1, "wait until the write is on this many replicas, this one included")
	f.DurationVar(&timeout, "timeout", 10*time.Second, "how long to wait for the put and the replicas")
	return cmd
}
