package replicator

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// fullSync makes the peer's copy of the subtree equal to the local one at a
// single local revision R, which it returns with the number of keys. It is a
// merge-join of two key-ordered paged ranges, so its memory is bounded by
// the page size, not the subtree: a key only on the local side is put, one
// only on the peer deleted, and one on both put again if its value differs
// or it is not attached to lease. Each side is read at a single revision
// (the first page's), so writes landing meanwhile — including our own to the
// peer — do not disturb the join; writes to the local side after R reach the
// peer through the watch from R+1.
func (p *peer) fullSync(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID, fenceRev int64) (rev, keys int64, err error) {
	local := &pager{cli: p.r.cfg.Local, prefix: p.r.prefix, size: p.r.cfg.PageSize, timeout: p.r.cfg.RequestTimeout, side: "local"}
	remote := &pager{cli: cli, prefix: p.r.prefix, size: p.r.cfg.PageSize, timeout: p.r.cfg.RequestTimeout, side: "peer", onErr: func(err error) { p.noteRPC(ctx, err) }}
	b := &batch{p: p, cli: cli, lease: lease, fenceRev: fenceRev}

	l, err := local.next(ctx)
	if err != nil {
		return 0, 0, err
	}
	r, err := remote.next(ctx)
	if err != nil {
		return 0, 0, err
	}
	for l != nil || r != nil {
		var c int
		switch {
		case r == nil:
			c = -1
		case l == nil:
			c = 1
		default:
			c = bytes.Compare(l.Key, r.Key)
		}
		switch {
		case c < 0: // missing on the peer
			err = b.put(ctx, l)
			keys++
		case c > 0: // gone locally
			err = b.del(ctx, r.Key)
		default:
			if !bytes.Equal(l.Value, r.Value) || clientv3.LeaseID(r.Lease) != lease {
				err = b.put(ctx, l)
			}
			keys++
		}
		if err != nil {
			return 0, 0, err
		}
		if c <= 0 {
			if l, err = local.next(ctx); err != nil {
				return 0, 0, err
			}
		}
		if c >= 0 {
			if r, err = remote.next(ctx); err != nil {
				return 0, 0, err
			}
		}
	}
	if err := b.flush(ctx); err != nil {
		return 0, 0, err
	}
	return local.rev, keys, nil
}

// pager reads a prefix in key order, size keys per Range, every page at the
// revision of the first.
type pager struct {
	cli     *clientv3.Client
	prefix  string
	size    int
	timeout time.Duration
	side    string
	onErr   func(error)

	rev     int64 // revision of the first page; 0 before it
	from    string
	buf     []*mvccpb.KeyValue
	started bool
	more    bool
}

// next returns the next key-value, or nil after the last.
func (pg *pager) next(ctx context.Context) (*mvccpb.KeyValue, error) {
	if len(pg.buf) == 0 {
		if pg.started && !pg.more {
			return nil, nil
		}
		if err := pg.fetch(ctx); err != nil {
			return nil, err
		}
		if len(pg.buf) == 0 {
			return nil, nil
		}
	}
	kv := pg.buf[0]
	pg.buf = pg.buf[1:]
	return kv, nil
}

func (pg *pager) fetch(ctx context.Context) error {
	if !pg.started {
		pg.from = pg.prefix
	}
	opts := []clientv3.OpOption{clientv3.WithRange(clientv3.GetPrefixRangeEnd(pg.prefix)), clientv3.WithLimit(int64(pg.size))}
	if pg.rev != 0 {
		opts = append(opts, clientv3.WithRev(pg.rev))
	}
	tctx, cancel := context.WithTimeout(ctx, pg.timeout)
	defer cancel()
	resp, err := pg.cli.Get(tctx, pg.from, opts...)
	if pg.onErr != nil {
		pg.onErr(err)
	}
	if err != nil {
		return fmt.Errorf("range %s subtree %s (at revision %d): %w", pg.side, pg.prefix, pg.rev, err)
	}
	if pg.rev == 0 {
		pg.rev = resp.Header.GetRevision()
	}
	pg.started = true
	pg.buf = resp.Kvs
	pg.more = resp.More && len(resp.Kvs) > 0
	if n := len(resp.Kvs); n > 0 {
		pg.from = string(resp.Kvs[n-1].Key) + "\x00"
	}
	return nil
}

// batch accumulates the writes of a full sync into Txns of MaxTxnOps.
type batch struct {
	p        *peer
	cli      *clientv3.Client
	lease    clientv3.LeaseID
	fenceRev int64
	ops      []clientv3.Op
	puts     int
	dels     int
}

func (b *batch) put(ctx context.Context, kv *mvccpb.KeyValue) error {
	b.ops = append(b.ops, clientv3.OpPut(string(kv.Key), string(kv.Value), clientv3.WithLease(b.lease)))
	b.puts++
	return b.maybeFlush(ctx)
}

func (b *batch) del(ctx context.Context, key []byte) error {
	b.ops = append(b.ops, clientv3.OpDelete(string(key)))
	b.dels++
	return b.maybeFlush(ctx)
}

func (b *batch) maybeFlush(ctx context.Context) error {
	if len(b.ops) < b.p.r.cfg.MaxTxnOps {
		return nil
	}
	return b.flush(ctx)
}

func (b *batch) flush(ctx context.Context) error {
	if len(b.ops) == 0 {
		return nil
	}
	if err := b.p.commit(ctx, b.cli, b.lease, b.fenceRev, b.ops); err != nil {
		return err
	}
	b.p.r.m.ops.WithLabelValues(b.p.cfg.Region, "put").Add(float64(b.puts))
	b.p.r.m.ops.WithLabelValues(b.p.cfg.Region, "delete").Add(float64(b.dels))
	b.ops, b.puts, b.dels = b.ops[:0], 0, 0
	return nil
}
