package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/aethermesh/aether/backend"
	dynamostore "github.com/aethermesh/aether/backend/dynamodb"
)

// dynamoFullScanDefault is --dynamodb-full-scan-interval's default.
const dynamoFullScanDefault = dynamostore.DefaultFullScanEvery

// Backend names (--backend).
const (
	BackendEtcd     = "etcd"
	BackendDynamoDB = "dynamodb"
)

// dynamoBackend is the registrar's store with --backend dynamodb, set
// once the table is checked: a backend.Store and backend.Leases, without
// the etcd backend's change feed and digest, so the registrar polls
// (registrar.New finds the capabilities on this type, before the store
// exists). Each listing is noted in the start-up status, and followed by
// a reap of the leases it saw lapse (dynamodb.Store.Reap): liveness
// itself needs no reap, every replica drops a lapsed node by the same
// rule, but its record is then removed by whichever replica polls first.
type dynamoBackend struct {
	*dynamostore.Store
	startup *startup
	log     *slog.Logger
}

var (
	_ backend.Store  = (*dynamoBackend)(nil)
	_ backend.Leases = (*dynamoBackend)(nil)
)

func (b *dynamoBackend) List(ctx context.Context) (backend.Listing, error) {
	l, err := b.Store.List(ctx)
	if !b.startup.isReady.Load() {
		b.startup.note(false, err)
	}
	if err == nil {
		if n, rerr := b.Store.Reap(ctx); rerr != nil {
			b.log.Warn("reaping lapsed node leases", "err", rerr)
		} else if n > 0 {
			b.log.Info("reaped lapsed node leases", "count", n)
		}
	}
	return l, err
}

// loadDynamo is load on DynamoDB: the client from the SDK's chain and the
// flags, the table checked (a missing or foreign one fails the start,
// naming the fix), the snapshot.
func (s *Server) loadDynamo(ctx context.Context) error {
	opts, log := s.opts, s.opts.Logger
	cfg := dynamostore.Config{Table: opts.DynamoDBTable, Region: opts.DynamoDBRegion, Endpoint: opts.DynamoDBEndpoint}
	cli, err := dynamostore.NewClient(ctx, cfg)
	if err != nil {
		return err
	}
	where := "table " + cfg.Table
	if cfg.Endpoint != "" {
		where += " at " + cfg.Endpoint
	}
	s.startup.waitFor("checking DynamoDB " + where)
	store, err := dynamostore.Open(ctx, cli, cfg.Table, dynamostore.Options{
		FullScanEvery: opts.DynamoDBFullScanInterval,
		Logger:        log.With("component", "dynamodb"),
	})
	if err != nil {
		return fmt.Errorf("--backend dynamodb: %w", err)
	}
	s.dynamo.Store = store
	s.startup.waitFor("loading its snapshot from DynamoDB " + where)
	if err := s.reg.Start(ctx); err != nil {
		return err
	}
	s.serving()
	return nil
}

// validateBackend checks --backend and the options that go with it.
func (c Config) validateBackend() error {
	switch c.Backend {
	case "", BackendEtcd:
		if c.DynamoDBTable != "" || c.DynamoDBRegion != "" || c.DynamoDBEndpoint != "" {
			return fmt.Errorf("--dynamodb-table, --dynamodb-region and --dynamodb-endpoint need --backend %s", BackendDynamoDB)
		}
		return nil
	case BackendDynamoDB:
		if c.DynamoDBFullScanInterval < 0 {
			return fmt.Errorf("--dynamodb-full-scan-interval must be positive")
		}
	default:
		return fmt.Errorf("--backend %q: want %s or %s", c.Backend, BackendEtcd, BackendDynamoDB)
	}
	var etcdOnly []string
	if len(c.EtcdEndpoints) > 0 {
		etcdOnly = append(etcdOnly, "--etcd-endpoints")
	}
	if len(c.PeerEtcd) > 0 {
		etcdOnly = append(etcdOnly, "--peer-etcd (DynamoDB replicates across regions through global tables)")
	}
	if c.EtcdTLSEnabled() || c.EmbeddedEtcdTLSEnabled() || c.PeerEtcdTLSEnabled() {
		etcdOnly = append(etcdOnly, "the etcd TLS flags")
	}
	switch {
	case len(etcdOnly) > 0:
		return fmt.Errorf("--backend %s runs no etcd: drop %s", BackendDynamoDB, strings.Join(etcdOnly, ", "))
	case c.DynamoDBTable == "":
		return fmt.Errorf("--backend %s needs --dynamodb-table (create it with aether dynamodb create-table)", BackendDynamoDB)
	}
	return nil
}
