package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// Attribute names. Short, because every attribute name counts against an
// item's 400 KB and against the read capacity of every poll.
const (
	attrKey       = "pk" // the table's hash key: the v1 key (origin first), or a meta/lease key
	attrValue     = "v"  // the serialized endpoint or node (absent: a tombstone)
	attrRev       = "r"  // the revision of the item's current version: the index's sort key
	attrShard     = "s"  // the change shard (hash of the key): the index's hash key
	attrHLC       = "h"  // the write stamp's clock reading
	attrWriter    = "w"  // "." + the write stamp's writer (a prefix keeps "" writable and the order)
	attrPrevValue = "pv" // the previous version's value (a string "-": absent)
	attrPrevRev   = "pr" // the previous version's revision (0: absent before)
	attrExpire    = "x"  // a tombstone's TTL attribute (epoch seconds); DynamoDB may delete it late
	attrLease     = "l"  // a node record's lease id
	attrLeaseExp  = "le" // a lease item's expiry (unix milliseconds)
	attrLeaseTTL  = "lt" // a lease item's granted TTL (milliseconds)
	attrShards    = "n"  // the meta item: the number of change shards
	attrSchema    = "sv" // the meta item: the schema version
)

// metaKey is the item holding the revision counter and the table's shape.
// It sorts outside registry.Root, and no registry key starts with "!".
const metaKey = "!meta"

// leasePrefix is where lease items live, outside registry.Root.
const leasePrefix = "!lease/"

// ChangesIndex is the global secondary index the incremental poll reads:
// hash key the shard, range key the revision.
const ChangesIndex = "changes"

// schemaVersion is the table layout this package reads and writes.
const schemaVersion = 1

// DefaultShards is the number of change shards a new table gets: enough
// that no single index partition key takes more than a fraction of the
// write rate (DynamoDB throttles one partition key value at about 1,000
// writes/s), few enough that an idle poll (one Query per shard) costs a
// handful of read units.
const DefaultShards = 8

// ErrTable marks a table that is missing or not shaped as this backend
// needs; the message names the fix.
var ErrTable = errors.New("dynamodb table not usable")

// CreateTable creates table with the schema the backend needs: hash key
// pk (string), the changes index (hash s, range r, all attributes
// projected), TTL on x for tombstones, on-demand billing, and the meta
// item holding the revision counter and the shard count. It waits until
// the table is active. A table that already exists is checked instead and
// left as it is.
func CreateTable(ctx context.Context, cli *ddb.Client, table string, shards int) error {
	if shards <= 0 {
		shards = DefaultShards
	}
	_, err := cli.CreateTable(ctx, &ddb.CreateTableInput{
		TableName:   aws.String(table),
		BillingMode: types.BillingModePayPerRequest,
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(attrKey), AttributeType: types.ScalarAttributeTypeS},
			{AttributeName: aws.String(attrShard), AttributeType: types.ScalarAttributeTypeN},
			{AttributeName: aws.String(attrRev), AttributeType: types.ScalarAttributeTypeN},
		},
		KeySchema: []types.KeySchemaElement{{AttributeName: aws.String(attrKey), KeyType: types.KeyTypeHash}},
		GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{{
			IndexName: aws.String(ChangesIndex),
			KeySchema: []types.KeySchemaElement{
				{AttributeName: aws.String(attrShard), KeyType: types.KeyTypeHash},
				{AttributeName: aws.String(attrRev), KeyType: types.KeyTypeRange},
			},
			Projection: &types.Projection{ProjectionType: types.ProjectionTypeAll},
		}},
	})
	var inUse *types.ResourceInUseException
	switch {
	case errors.As(err, &inUse):
		// Already there: check it below.
	case err != nil:
		return fmt.Errorf("create table %s: %w", table, err)
	default:
		if err := ddb.NewTableExistsWaiter(cli, func(o *ddb.TableExistsWaiterOptions) {
			// The SDK's 20 s first delay is for AWS's creation times; a
			// local server is active at once, AWS within seconds.
			o.MinDelay, o.MaxDelay = 200*time.Millisecond, 5*time.Second
		}).Wait(ctx, &ddb.DescribeTableInput{TableName: aws.String(table)}, 5*time.Minute); err != nil {
			return fmt.Errorf("create table %s: waiting for it to become active: %w", table, err)
		}
		// TTL is best effort: a server without it (dynalite) still works,
		// the tombstones then stay until the next create-table elsewhere
		// or by hand; they are small.
		_, _ = cli.UpdateTimeToLive(ctx, &ddb.UpdateTimeToLiveInput{
			TableName:               aws.String(table),
			TimeToLiveSpecification: &types.TimeToLiveSpecification{AttributeName: aws.String(attrExpire), Enabled: aws.Bool(true)},
		})
	}
	// The meta item is created only if absent, so re-running create-table
	// on a live table never resets the revision counter.
	_, err = cli.PutItem(ctx, &ddb.PutItemInput{
		TableName: aws.String(table),
		Item: map[string]types.AttributeValue{
			attrKey:    str(metaKey),
			attrRev:    num(0),
			attrShards: num(int64(shards)),
			attrSchema: num(schemaVersion),
		},
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		return fmt.Errorf("create table %s: writing its meta item: %w", table, err)
	}
	_, err = checkTable(ctx, cli, table)
	return err
}

// checkTable verifies the table's key schema, its changes index and its
// meta item, and returns the shard count. Every failure names the fix.
func checkTable(ctx context.Context, cli *ddb.Client, table string) (int, error) {
	fix := fmt.Sprintf("run `aether dynamodb create-table --dynamodb-table %s` (with the same --dynamodb-region/--dynamodb-endpoint)", table)
	out, err := cli.DescribeTable(ctx, &ddb.DescribeTableInput{TableName: aws.String(table)})
	var nf *types.ResourceNotFoundException
	if errors.As(err, &nf) {
		return 0, fmt.Errorf("%w: table %s does not exist: %s", ErrTable, table, fix)
	}
	if err != nil {
		return 0, fmt.Errorf("describe table %s: %w", table, err)
	}
	td := out.Table
	if ks := td.KeySchema; len(ks) != 1 || aws.ToString(ks[0].AttributeName) != attrKey || ks[0].KeyType != types.KeyTypeHash {
		return 0, fmt.Errorf("%w: table %s has key schema %s, want a single hash key %q (string): it was not made by this backend; %s on a new table name", ErrTable, table, describeKeys(ks), attrKey, fix)
	}
	var idx *types.GlobalSecondaryIndexDescription
	for i := range td.GlobalSecondaryIndexes {
		if aws.ToString(td.GlobalSecondaryIndexes[i].IndexName) == ChangesIndex {
			idx = &td.GlobalSecondaryIndexes[i]
		}
	}
	if idx == nil {
		return 0, fmt.Errorf("%w: table %s has no %q index, which the incremental poll reads: %s", ErrTable, table, ChangesIndex, fix)
	}
	ks := idx.KeySchema
	if len(ks) != 2 || aws.ToString(ks[0].AttributeName) != attrShard || aws.ToString(ks[1].AttributeName) != attrRev ||
		idx.Projection == nil || idx.Projection.ProjectionType != types.ProjectionTypeAll {
		return 0, fmt.Errorf("%w: table %s's %q index has keys %s, want hash %q and range %q with all attributes projected: %s on a new table name", ErrTable, table, ChangesIndex, describeKeys(ks), attrShard, attrRev, fix)
	}
	meta, err := cli.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String(table), Key: keyOf(metaKey), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return 0, fmt.Errorf("read table %s's meta item: %w", table, err)
	}
	if meta.Item == nil {
		return 0, fmt.Errorf("%w: table %s has no meta item (%q): %s", ErrTable, table, metaKey, fix)
	}
	if v := numAttr(meta.Item, attrSchema); v != schemaVersion {
		return 0, fmt.Errorf("%w: table %s has schema version %d, this registrar reads version %d", ErrTable, table, v, schemaVersion)
	}
	n := numAttr(meta.Item, attrShards)
	if n <= 0 {
		return 0, fmt.Errorf("%w: table %s's meta item has no shard count: %s", ErrTable, table, fix)
	}
	return int(n), nil
}

func describeKeys(ks []types.KeySchemaElement) string {
	s := "["
	for i, k := range ks {
		if i > 0 {
			s += " "
		}
		s += aws.ToString(k.AttributeName) + ":" + string(k.KeyType)
	}
	return s + "]"
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }
func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
func bin(b []byte) types.AttributeValue { return &types.AttributeValueMemberB{Value: b} }

func keyOf(k string) map[string]types.AttributeValue {
	return map[string]types.AttributeValue{attrKey: str(k)}
}

// numAttr is an item's number attribute, 0 when absent or not a number.
func numAttr(item map[string]types.AttributeValue, name string) int64 {
	n, ok := item[name].(*types.AttributeValueMemberN)
	if !ok {
		return 0
	}
	v, _ := strconv.ParseInt(n.Value, 10, 64)
	return v
}

// uintAttr is an item's unsigned number attribute (a stamp's clock).
func uintAttr(item map[string]types.AttributeValue, name string) uint64 {
	n, ok := item[name].(*types.AttributeValueMemberN)
	if !ok {
		return 0
	}
	v, _ := strconv.ParseUint(n.Value, 10, 64)
	return v
}

func strAttr(item map[string]types.AttributeValue, name string) (string, bool) {
	s, ok := item[name].(*types.AttributeValueMemberS)
	if !ok {
		return "", false
	}
	return s.Value, true
}

// binAttr is an item's binary attribute; ok is false when absent (or the
// "-" placeholder of an absent previous value).
func binAttr(item map[string]types.AttributeValue, name string) ([]byte, bool) {
	b, ok := item[name].(*types.AttributeValueMemberB)
	if !ok {
		return nil, false
	}
	return b.Value, true
}
