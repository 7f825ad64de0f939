package dynamodb

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/aethermesh/aether/backend/backendtest"
	"github.com/aethermesh/aether/internal/testutil/dynalite"
)

// client is a DynamoDB client of endpoint with static test credentials
// (dynalite checks that requests are signed, not by whom).
func client(endpoint string) *ddb.Client {
	return ddb.New(ddb.Options{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider("test", "test", ""),
		BaseEndpoint: aws.String(endpoint),
		Retryer:      NewRetryer(),
	})
}

var tables atomic.Int64

// newTable creates a fresh table on cli for one test.
func newTable(t backendtest.T, cli *ddb.Client, shards int) string {
	t.Helper()
	name := fmt.Sprintf("aether-%d-%d", time.Now().UnixNano()%1e9, tables.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := CreateTable(ctx, cli, name, shards); err != nil {
		t.Fatalf("create table: %v", err)
	}
	return name
}

// testWindow is the settle window of tests that do not set one: long,
// so that a write slowed by a loaded machine (the race detector, tests in
// parallel) is not cut off at half of it and reported unsettled to a test
// that expects it to land in one call.
const testWindow = 20 * time.Second

func open(t backendtest.T, cli *ddb.Client, table string, opts Options) *Store {
	t.Helper()
	if opts.Window == 0 {
		opts.Window = testWindow
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, cli, table, opts)
	if err != nil {
		t.Fatalf("open table %s: %v", table, err)
	}
	return s
}

func ctxFor(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func startDynalite(t testing.TB) *ddb.Client {
	return client(dynalite.Start(t).Endpoint)
}
