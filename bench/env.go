package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	registrarv1 "github.com/aethermesh/aether/api/registrar/v1"
	"github.com/aethermesh/aether/backend/etcd/embedetcd"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// env is one benchmark's world: an etcd and some registrars sharing it.
type env struct {
	dir        string
	etcd       *embedetcd.Server
	cli        *clientv3.Client
	registrars []*server.Server
	conns      []*grpc.ClientConn
}

func newEnv(ctx context.Context, replicas int, mut func(*registrar.Options)) (*env, error) {
	return newEnvWith(ctx, replicas, func(c *server.Config) {
		if mut != nil {
			mut(&c.Options) // the workloads tune only the replica
		}
	})
}

// newEnvWith is newEnv for a scenario that configures the registrar
// process itself (its listeners), not only the replica: mut sees each
// registrar's whole server.Config before it starts.
func newEnvWith(ctx context.Context, replicas int, mut func(*server.Config)) (_ *env, err error) {
	dir, err := os.MkdirTemp("", "aether-bench-")
	if err != nil {
		return nil, err
	}
	e := &env{dir: dir}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e.etcd, err = embedetcd.Start(ctx, embedetcd.Config{
		Dir: filepath.Join(dir, "etcd"), ClientAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", Logger: quiet,
	})
	if err != nil {
		return nil, err
	}
	e.cli, err = clientv3.New(clientv3.Config{Endpoints: e.etcd.Endpoints(), Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	for i := 0; i < replicas; i++ {
		o := server.Config{
			EtcdEndpoints: e.etcd.Endpoints(),
			GRPCAddr:      "127.0.0.1:0",
			HTTPAddr:      "127.0.0.1:0",
			Options:       registrar.Options{Logger: quiet},
		}
		if mut != nil {
			mut(&o)
		}
		s, err := server.Start(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("starting registrar %d: %w", i, err)
		}
		e.registrars = append(e.registrars, s)
	}
	return e, nil
}

func (e *env) client(i int) (registrarv1.RegistrarClient, error) {
	cc, err := grpc.NewClient(e.registrars[i].GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	e.conns = append(e.conns, cc)
	return registrarv1.NewRegistrarClient(cc), nil
}

func (e *env) close() {
	for _, c := range e.conns {
		c.Close()
	}
	for _, s := range e.registrars {
		_ = s.Close(context.Background())
	}
	if e.cli != nil {
		e.cli.Close()
	}
	if e.etcd != nil {
		e.etcd.Close()
	}
	os.RemoveAll(e.dir)
}
