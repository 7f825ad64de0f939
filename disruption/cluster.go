package disruption

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/backend/etcd/embedetcd"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// cluster is the battery's control plane: one embedded etcd (or a
// DynamoDB table, dynamodb.go, or a Kubernetes namespace, kubernetes.go) and two registrar replicas, A and B, each on a fixed loopback address so that a
// restarted replica comes back where its clients look for it.
type cluster struct {
	dir   string
	etcd  *embedetcd.Server
	opts  server.Config // of both replicas, but for GRPCAddr
	addrs [2]string     // A, B
	regs  [2]*server.Server
	conns []*grpc.ClientConn
	drop  func() error // deletes the backend's namespace (kubernetes.go), if any
}

const (
	replicaA = 0
	replicaB = 1
)

func startCluster(ctx context.Context, cfg Config) (_ *cluster, err error) {
	dir, err := os.MkdirTemp("", "aether-disruption-")
	if err != nil {
		return nil, err
	}
	c := &cluster{dir: dir}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	c.opts = server.Config{
		HTTPAddr: "127.0.0.1:0",
		Options: registrar.Options{
			ClusterName:  "c1",
			Region:       "r1",
			SyncMode:     cfg.SyncMode,
			SyncInterval: cfg.SyncInterval,
			PeerWatch:    cfg.PeerWatch,
			Logger:       cfg.Logger,
		},
	}
	switch cfg.Backend {
	case BackendDynamoDB:
		if err = useDynamoDB(ctx, cfg, &c.opts); err != nil {
			return nil, err
		}
	case BackendKubernetes:
		if c.drop, err = useKubernetes(ctx, cfg, &c.opts); err != nil {
			return nil, err
		}
	default:
		c.etcd, err = embedetcd.Start(ctx, embedetcd.Config{
			Dir: filepath.Join(dir, "etcd"), ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", Logger: cfg.Logger,
		})
		if err != nil {
			return nil, err
		}
		c.opts.EtcdEndpoints = c.etcd.Endpoints()
	}
	for i := range c.addrs {
		if c.addrs[i], err = freeAddr(); err != nil {
			return nil, err
		}
		if err = c.start(ctx, i); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// start (re)starts replica i at its address.
func (c *cluster) start(ctx context.Context, i int) error {
	o := c.opts
	o.GRPCAddr = c.addrs[i]
	var err error
	// The port was just released by the previous replica (or by freeAddr):
	// retry briefly in case the kernel has not handed it back yet.
	for range 50 {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		c.regs[i], err = server.Start(sctx, o)
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("start registrar %s on %s: %w", "AB"[i:i+1], c.addrs[i], err)
	}
	return nil
}

// stop shuts replica i down gracefully (pending writes are persisted).
func (c *cluster) stop(i int) error {
	s := c.regs[i]
	if s == nil {
		return nil
	}
	c.regs[i] = nil
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Close(ctx); err != nil {
		return fmt.Errorf("close registrar %s: %w", "AB"[i:i+1], err)
	}
	return nil
}

// dial returns a gRPC client of replica i's address, which outlives
// restarts.
func (c *cluster) dial(i int) (registrarv1.RegistrarClient, error) {
	cc, err := grpc.NewClient(c.addrs[i], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	c.conns = append(c.conns, cc)
	return registrarv1.NewRegistrarClient(cc), nil
}

func (c *cluster) close() error {
	var errs []error
	for _, cc := range c.conns {
		cc.Close()
	}
	for i := range c.regs {
		errs = append(errs, c.stop(i))
	}
	if c.etcd != nil {
		c.etcd.Close()
	}
	if c.drop != nil {
		errs = append(errs, c.drop())
	}
	os.RemoveAll(c.dir)
	return errors.Join(errs...)
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }
