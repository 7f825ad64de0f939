package dynamodb

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	registryv1 "github.com/aethermesh/aether/api/registry/v1"
	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/registry"
)

// Node liveness without store-side leases. DynamoDB's own TTL deletes an
// item up to two days after it expires, so it cannot be what ends a node.
// Instead a lease is an item (!lease/<id>) carrying its expiry (le, unix
// ms) and granted TTL; only KeepAliveOnce moves the expiry, and a node
// record names its lease. Every replica applies the same rule to what it
// reads: a node record whose lease is missing or expired is gone (List
// leaves it out), so no replica judges a node dead on a view of its own.
// Reap then removes expired leases and their records with conditional
// deletes on the expiry that was judged: a heartbeat that lands first
// changes the expiry and wins, and the delete is refused.

func leaseKey(id int64) string { return leasePrefix + strconv.FormatInt(id, 10) }

func (s *Store) leaseLive(id int64, nowMS int64) bool {
	if id == 0 {
		return false
	}
	e, ok := s.m.entries[leaseKey(id)]
	return ok && e.leaseExp > nowMS
}

// GrantLease writes a new lease item expiring ttl from now (rounded up to
// a millisecond).
func (s *Store) GrantLease(ctx context.Context, ttl time.Duration) (int64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("dynamodb: lease id: %w", err)
	}
	id := int64(binary.BigEndian.Uint64(b[:])&(1<<62-1)) + 1
	ms := max(ttl.Milliseconds(), 1)
	rev, err := s.allocate(ctx)
	if err != nil {
		return 0, err
	}
	defer s.landed(rev)
	key := leaseKey(id)
	_, err = s.cli.PutItem(ctx, &ddb.PutItemInput{
		TableName: aws.String(s.table),
		Item: map[string]types.AttributeValue{
			attrKey: str(key), attrRev: num(rev), attrShard: num(s.shardOf(key)),
			attrLeaseExp: num(s.opts.Now().UnixMilli() + ms), attrLeaseTTL: num(ms),
		},
		ConditionExpression: aws.String("attribute_not_exists(pk)"),
	})
	if err != nil {
		return 0, fmt.Errorf("dynamodb: grant lease: %w", unavailable(err))
	}
	s.report(rev)
	return id, nil
}

// KeepAliveOnce moves a live lease's expiry to its TTL from now. A lease
// already expired stays expired: every replica may have judged it gone.
func (s *Store) KeepAliveOnce(ctx context.Context, lease int64) (time.Duration, error) {
	rev, start, err := s.sharedRevision(ctx)
	if err != nil {
		return 0, err
	}
	defer s.landed(rev)
	ctx, cancel := context.WithDeadline(ctx, start.Add(s.opts.Window/2))
	defer cancel()
	now := s.opts.Now().UnixMilli()
	key := leaseKey(lease)
	out, err := s.cli.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       keyOf(key),
		UpdateExpression:          aws.String("SET le = :now + lt, r = :r, s = :s"),
		ConditionExpression:       aws.String("attribute_exists(pk) AND le > :now"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":now": num(now), ":r": num(rev), ":s": num(s.shardOf(key))},
		ReturnValues:              types.ReturnValueAllNew,
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return 0, fmt.Errorf("dynamodb: keep lease %x alive: %w", lease, backend.ErrLeaseNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("dynamodb: keep lease %x alive: %w", lease, unavailable(err))
	}
	s.report(rev)
	return time.Duration(numAttr(out.Attributes, attrLeaseTTL)) * time.Millisecond, nil
}

// LeaseTTL reads a lease with a consistent read.
func (s *Store) LeaseTTL(ctx context.Context, lease int64) (time.Duration, time.Duration, error) {
	out, err := s.cli.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String(s.table), Key: keyOf(leaseKey(lease)), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return 0, 0, fmt.Errorf("dynamodb: lease %x: %w", lease, unavailable(err))
	}
	left := time.Duration(numAttr(out.Item, attrLeaseExp)-s.opts.Now().UnixMilli()) * time.Millisecond
	if out.Item == nil || left <= 0 {
		return 0, 0, fmt.Errorf("dynamodb: lease %x: %w", lease, backend.ErrLeaseNotFound)
	}
	return left, time.Duration(numAttr(out.Item, attrLeaseTTL)) * time.Millisecond, nil
}

// RevokeLease deletes the lease and tombstones the node records put under
// it.
func (s *Store) RevokeLease(ctx context.Context, lease int64) (int64, error) {
	key := leaseKey(lease)
	out, err := s.cli.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String(s.table), Key: keyOf(key), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return 0, fmt.Errorf("dynamodb: revoke lease %x: %w", lease, unavailable(err))
	}
	if out.Item == nil || numAttr(out.Item, attrLeaseExp) == 0 {
		return 0, nil // never granted, or already ended
	}
	return s.endLease(ctx, lease, 0, false)
}

// endLease ends a lease: its item is kept as a short-lived tombstone
// (expiry 0, a new revision, so every poller sees it end), and the node
// record put under it is tombstoned. With expired set it ends the lease
// only if its expiry is still exp, the one judged expired: a heartbeat
// that landed since moved it, and wins.
func (s *Store) endLease(ctx context.Context, lease, exp int64, expired bool) (int64, error) {
	key := leaseKey(lease)
	rev, err := s.allocate(ctx)
	if err != nil {
		return 0, err
	}
	defer s.landed(rev)
	vals := map[string]types.AttributeValue{
		":zero": num(0), ":r": num(rev), ":s": num(s.shardOf(key)), ":x": num(s.opts.Now().Add(TombstoneTTL).Unix()),
	}
	cond := "attribute_exists(pk) AND le > :zero"
	if expired {
		cond = "le = :exp"
		vals[":exp"] = num(exp)
	}
	// The lease first: once it has ended its record is dead by the rule,
	// whatever becomes of the record's tombstone below.
	out, err := s.cli.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       keyOf(key),
		UpdateExpression:          aws.String("SET le = :zero, r = :r, s = :s, x = :x"),
		ConditionExpression:       aws.String(cond),
		ExpressionAttributeValues: vals,
		ReturnValues:              types.ReturnValueAllOld,
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		if expired {
			return 0, errHeartbeatWon
		}
		return 0, nil // ended by another in between
	}
	if err != nil {
		return 0, fmt.Errorf("dynamodb: end lease %x: %w", lease, unavailable(err))
	}
	if nk, ok := strAttr(out.Attributes, "nk"); ok && strings.HasPrefix(nk, registry.Root) {
		_, err := s.cli.UpdateItem(ctx, &ddb.UpdateItemInput{
			TableName:        aws.String(s.table),
			Key:              keyOf(nk),
			UpdateExpression: aws.String("SET pv = if_not_exists(v, :nov), pr = if_not_exists(r, :zero), r = :r, s = :s, x = :x REMOVE v"),
			// Only the record still under this lease: a node that
			// re-announced under a new lease keeps its record.
			ConditionExpression: aws.String("l = :l"),
			ExpressionAttributeValues: map[string]types.AttributeValue{
				":nov": str("-"), ":zero": num(0), ":r": num(rev), ":s": num(s.shardOf(nk)),
				":x": vals[":x"], ":l": num(lease),
			},
		})
		if err != nil && !errors.As(err, &ccf) {
			// The record is dead by the rule already (its lease ended);
			// the tombstone only tidies.
			s.log.Warn("node record of an ended lease not tombstoned", "key", nk, "lease", lease, "err", err)
		}
	}
	s.report(rev)
	return rev, nil
}

// errHeartbeatWon: a reap lost the race to a heartbeat.
var errHeartbeatWon = errors.New("lease renewed since it was judged expired")

// PutNode writes a node record under a live lease.
func (s *Store) PutNode(ctx context.Context, n *registryv1.Node, lease int64) (int64, error) {
	id := registry.NodeIDOf(n)
	key, err := id.Key()
	if err != nil {
		return 0, fmt.Errorf("dynamodb: put node: %w", err)
	}
	val, err := registry.EncodeNode(n)
	if err != nil {
		return 0, fmt.Errorf("dynamodb: put node %s: %w", key, err)
	}
	if len(val) > MaxValueBytes {
		return 0, fmt.Errorf("dynamodb: node %s is %d bytes serialized, more than %d: %w", key, len(val), MaxValueBytes, backend.ErrInvalidMutation)
	}
	// Tie the lease to the record first, conditionally on the lease being
	// live: a lease that lapsed refuses, so no record is written outside
	// one (one that lapses after this is dead by the rule anyway).
	lk := leaseKey(lease)
	_, err = s.cli.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       keyOf(lk),
		UpdateExpression:          aws.String("SET nk = :nk"),
		ConditionExpression:       aws.String("attribute_exists(pk) AND le > :now"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":nk": str(key), ":now": num(s.opts.Now().UnixMilli())},
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return 0, fmt.Errorf("dynamodb: put node %s: lease %x: %w", key, lease, backend.ErrLeaseNotFound)
	}
	if err != nil {
		return 0, fmt.Errorf("dynamodb: put node %s: %w", key, unavailable(err))
	}
	rev, err := s.allocate(ctx)
	if err != nil {
		return 0, err
	}
	defer s.landed(rev)
	_, err = s.cli.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:        aws.String(s.table),
		Key:              keyOf(key),
		UpdateExpression: aws.String("SET pv = if_not_exists(v, :nov), pr = if_not_exists(r, :zero), r = :r, s = :s, v = :v, l = :l REMOVE x"),
		ExpressionAttributeValues: map[string]types.AttributeValue{
			":nov": str("-"), ":zero": num(0), ":r": num(rev), ":s": num(s.shardOf(key)), ":v": bin(val), ":l": num(lease),
		},
	})
	if err != nil {
		return 0, fmt.Errorf("dynamodb: put node %s: %w", key, unavailable(err))
	}
	s.report(rev)
	return rev, nil
}

// Reap ends every lease that the last listing saw expired, each with a
// conditional delete on the expiry it saw: a heartbeat that landed since
// wins and the lease lives on. It returns how many it ended. Any replica
// may run it (the registrar's poll does); racing reapers are harmless.
func (s *Store) Reap(ctx context.Context) (int, error) {
	now := s.opts.Now().UnixMilli()
	type exp struct{ id, exp int64 }
	var due []exp
	s.pollMu.Lock()
	for k, e := range s.m.entries {
		if !strings.HasPrefix(k, leasePrefix) || e.leaseExp > now || e.leaseExp == 0 {
			continue
		}
		id, err := strconv.ParseInt(strings.TrimPrefix(k, leasePrefix), 10, 64)
		if err != nil {
			continue
		}
		due = append(due, exp{id, e.leaseExp})
	}
	s.pollMu.Unlock()
	ended := 0
	for _, d := range due {
		switch _, err := s.endLease(ctx, d.id, d.exp, true); {
		case err == nil:
			ended++
		case errors.Is(err, errHeartbeatWon):
		default:
			return ended, err
		}
	}
	return ended, nil
}
