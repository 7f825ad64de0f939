package dynamodb

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	ddb "github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/aethermesh/aether/backend"
	"github.com/aethermesh/aether/internal/retry"
)

var _ backend.Members = (*Store)(nil)

// Peer-watch membership on the expiry records of nodes.go. The members of
// one (region, cluster) are attributes of one item, "!members/<region>/
// <cluster>", one attribute per replica incarnation ("m:" + epoch, a map
// of its address and lease id), so that listing them is one consistent
// GetItem and not a Scan of the table: the table has no sort key, and a
// replica lists every PeerDiscoveryInterval. A member is live while its
// lease is, by the rule node records follow: the lease item exists and
// its expiry is in the future. The item carries no revision and no shard,
// so the changes index (a sparse index on s and r) never holds it and
// the poll never reads it; a full Scan does, and the mirror drops it
// (it is outside registry.Root).

const membersPrefix = "!members/"

// Member attribute fields.
const (
	memberAttrPrefix = "m:"
	memberAddr       = "a"
	memberLease      = "l"
)

// maxBatchGet is DynamoDB's limit of keys per BatchGetItem.
const maxBatchGet = 100

func membersKey(region, cluster string) string {
	return membersPrefix + region + "/" + cluster
}

// PutMember records m under lease, conditionally on the lease being live
// (a lapsed one fails with ErrLeaseNotFound, so no record is written
// outside a live lease; one that lapses after the check is dead by the
// rule anyway).
func (s *Store) PutMember(ctx context.Context, region, cluster string, m backend.Member, lease int64) error {
	if m.Epoch == "" {
		return errors.New("dynamodb: member record without an epoch")
	}
	key := membersKey(region, cluster)
	// The check is an update of the lease item that names the member
	// record, so the lease says what it keeps alive, as a node's does.
	_, err := s.cli.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       keyOf(leaseKey(lease)),
		UpdateExpression:          aws.String("SET mk = :mk"),
		ConditionExpression:       aws.String("attribute_exists(pk) AND le > :now"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":mk": str(key), ":now": num(s.opts.Now().UnixMilli())},
	})
	var ccf *types.ConditionalCheckFailedException
	if errors.As(err, &ccf) {
		return fmt.Errorf("dynamodb: put member %s of %s: lease %x: %w", m.Epoch, key, lease, backend.ErrLeaseNotFound)
	}
	if err != nil {
		return fmt.Errorf("dynamodb: put member %s of %s: %w", m.Epoch, key, unavailable(err))
	}
	_, err = s.cli.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                aws.String(s.table),
		Key:                      keyOf(key),
		UpdateExpression:         aws.String("SET #m = :m"),
		ExpressionAttributeNames: map[string]string{"#m": memberAttrPrefix + m.Epoch},
		ExpressionAttributeValues: map[string]types.AttributeValue{":m": &types.AttributeValueMemberM{Value: map[string]types.AttributeValue{
			memberAddr: str(m.Addr), memberLease: num(lease),
		}}},
	})
	if err != nil {
		return fmt.Errorf("dynamodb: put member %s of %s: %w", m.Epoch, key, unavailable(err))
	}
	return nil
}

// ListMembers reads the members of (region, cluster) and their leases,
// with consistent reads, and returns those whose lease is live, in epoch
// order. A record whose lease has ended (revoked, reaped, or gone with
// DynamoDB's TTL) is removed from the item on the way, conditionally on
// it still naming that lease; one whose lease has merely lapsed is left
// for Reap to end first, so that a replica whose clock runs behind the
// lister's, and which may still renew its lease, keeps its record.
func (s *Store) ListMembers(ctx context.Context, region, cluster string) ([]backend.Member, error) {
	key := membersKey(region, cluster)
	out, err := s.cli.GetItem(ctx, &ddb.GetItemInput{TableName: aws.String(s.table), Key: keyOf(key), ConsistentRead: aws.Bool(true)})
	if err != nil {
		return nil, fmt.Errorf("dynamodb: list members of %s: %w", key, unavailable(err))
	}
	type rec struct {
		attr  string
		m     backend.Member
		lease int64
	}
	var recs []rec
	for name, v := range out.Item {
		epoch, ok := strings.CutPrefix(name, memberAttrPrefix)
		mv, isMap := v.(*types.AttributeValueMemberM)
		if !ok || !isMap || epoch == "" {
			continue
		}
		addr, _ := strAttr(mv.Value, memberAddr)
		lease := numAttr(mv.Value, memberLease)
		if lease == 0 {
			continue // not a record this version wrote
		}
		recs = append(recs, rec{attr: name, m: backend.Member{Epoch: epoch, Addr: addr}, lease: lease})
	}
	ids := make([]int64, len(recs))
	for i, r := range recs {
		ids[i] = r.lease
	}
	leases, err := s.readLeases(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("dynamodb: list members of %s: %w", key, err)
	}
	now := s.opts.Now().UnixMilli()
	members := make([]backend.Member, 0, len(recs))
	for _, r := range recs {
		l, found := leases[r.lease]
		switch {
		case found && l.leaseExp > now:
			members = append(members, r.m)
		case !found || l.leaseExp == 0:
			s.dropMember(ctx, key, r.attr, r.lease)
		}
	}
	sort.Slice(members, func(i, j int) bool { return members[i].Epoch < members[j].Epoch })
	return members, nil
}

// readLeases reads lease items with consistent reads, BatchGetItem's 100
// keys at a time, retrying the keys the server leaves unprocessed.
func (s *Store) readLeases(ctx context.Context, ids []int64) (map[int64]entry, error) {
	seen := map[int64]bool{}
	var keys []map[string]types.AttributeValue
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			keys = append(keys, keyOf(leaseKey(id)))
		}
	}
	got := make(map[int64]entry, len(keys))
	for lo := 0; lo < len(keys); lo += maxBatchGet {
		req := map[string]types.KeysAndAttributes{s.table: {Keys: keys[lo:min(lo+maxBatchGet, len(keys))], ConsistentRead: aws.Bool(true)}}
		for attempt := 0; len(req) > 0; attempt++ {
			if attempt > 0 {
				// The retryer's backoff, applied to what the server left
				// unprocessed (throttled within an accepted request).
				d, _ := jitterBackoff{base: 25 * time.Millisecond, max: 2 * time.Second}.BackoffDelay(attempt, nil)
				if !retry.Sleep(ctx, d, nil) {
					return nil, ctx.Err()
				}
			}
			out, err := s.cli.BatchGetItem(ctx, &ddb.BatchGetItemInput{RequestItems: req})
			if err != nil {
				return nil, fmt.Errorf("reading leases: %w", unavailable(err))
			}
			for _, item := range out.Responses[s.table] {
				k, _ := strAttr(item, attrKey)
				if id, err := strconv.ParseInt(strings.TrimPrefix(k, leasePrefix), 10, 64); err == nil {
					got[id] = entryOf(item)
				}
			}
			req = out.UnprocessedKeys
		}
	}
	return got, nil
}

// dropMember removes a member record whose lease has ended, only if it
// still names that lease (the replica may have written it again under a
// new one since it was read). Best effort: a record left behind is
// judged by its lease at every listing.
func (s *Store) dropMember(ctx context.Context, key, attr string, lease int64) {
	_, err := s.cli.UpdateItem(ctx, &ddb.UpdateItemInput{
		TableName:                 aws.String(s.table),
		Key:                       keyOf(key),
		UpdateExpression:          aws.String("REMOVE #m"),
		ConditionExpression:       aws.String("#m.#l = :l"),
		ExpressionAttributeNames:  map[string]string{"#m": attr, "#l": memberLease},
		ExpressionAttributeValues: map[string]types.AttributeValue{":l": num(lease)},
	})
	var ccf *types.ConditionalCheckFailedException
	if err != nil && !errors.As(err, &ccf) {
		s.log.Debug("removing an ended member record", "key", key, "member", attr, "err", err)
	}
}
