package disruption

import (
	"context"
	"fmt"
	"time"

	dynamostore "github.com/aethermesh/aether/backend/dynamodb"
	"github.com/aethermesh/aether/registrar"
	"github.com/aethermesh/aether/server"
)

// Backends of the battery (Config.Backend).
const (
	BackendEtcd     = server.BackendEtcd
	BackendDynamoDB = server.BackendDynamoDB
)

// dynamoRegion is the region the battery's DynamoDB client names; a local
// server (dynalite) accepts any.
const dynamoRegion = "us-east-1"

// Mode names the battery's sync path as the report prints it: the
// backend, how B learns A's writes, and peer-watch.
func (c Config) Mode() string {
	m := "etcd, " + c.SyncMode + " sync"
	switch c.Backend {
	case BackendDynamoDB:
		m = "DynamoDB, " + c.SyncMode + " sync"
	case BackendKubernetes:
		m = "Kubernetes, " + c.SyncMode + " sync"
	}
	if c.PeerWatch {
		m += " + peer-watch"
	}
	return m
}

func (c Config) validateBackend() error {
	switch c.Backend {
	case BackendEtcd:
		if c.DynamoDBEndpoint != "" {
			return fmt.Errorf("disruption: DynamoDBEndpoint is for Backend %q", BackendDynamoDB)
		}
	case BackendDynamoDB:
		if c.DynamoDBEndpoint == "" {
			return fmt.Errorf("disruption: Backend %q needs DynamoDBEndpoint (a DynamoDB-compatible server such as dynalite; the battery makes a table of its own there)", BackendDynamoDB)
		}
		if c.SyncMode != registrar.SyncPoll {
			return fmt.Errorf("disruption: Backend %q has no change feed: SyncMode must be %q", BackendDynamoDB, registrar.SyncPoll)
		}
	default:
		return fmt.Errorf("disruption: Backend %q: use %s or %s", c.Backend, BackendEtcd, BackendDynamoDB)
	}
	return nil
}

// useDynamoDB creates a fresh table for the battery at cfg's endpoint and
// points the registrars' options at it. Credentials come from the AWS
// SDK's chain, as a registrar's do (for a loopback endpoint without any,
// placeholder ones: dynamodb.NewClient).
func useDynamoDB(ctx context.Context, cfg Config, o *server.Config) error {
	dc := dynamostore.Config{Table: fmt.Sprintf("aether-disruption-%d", time.Now().UnixNano()), Region: dynamoRegion, Endpoint: cfg.DynamoDBEndpoint}
	cli, err := dynamostore.NewClient(ctx, dc)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := dynamostore.CreateTable(cctx, cli, dc.Table, dynamostore.DefaultShards); err != nil {
		return fmt.Errorf("disruption: %w", err)
	}
	o.Backend, o.DynamoDBTable, o.DynamoDBRegion, o.DynamoDBEndpoint = BackendDynamoDB, dc.Table, dc.Region, dc.Endpoint
	return nil
}
